"""Mixtures of sources prepared with worker processes: the manifest records what each gave, and the shards hold it."""
import json
import re

from conftest import kjv_chapters, write_hub_download
from core.config_io import load_config
from data_pipeline.config import PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.dataset_dir import DatasetDir


def test_prepare_records_the_mixture(tmp_path):
    chapters = kjv_chapters(400)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    a.write_text("".join(json.dumps({"text": c}) + "\n" for c in chapters[:300]))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": chapters[100:400]}), b)
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'out'}", "tokenizer.vocab_size=300", "seq_len=64", "max_documents=240",
        f"sources=[{{kind: json, path: '{a}', weight: 3}}, {{kind: parquet, path: '{b}', text_column: content, weight: 1}}]"])
    manifest = json.loads(DatasetDir(prepare(cfg)).manifest.read_text())
    docs = [s["documents"] for s in manifest["sources"]]
    assert sum(docs) == 240 and abs(docs[0] / 240 - 0.75) < 0.08
    assert [s["weight"] for s in manifest["sources"]] == [3.0, 1.0]


def test_all_exhausted_repeats_a_small_source_until_the_large_one_is_read(tmp_path):
    """mixture_stopping=all_exhausted: the large source is read once, whole, and the small one again and again (whole
    passes, then part of one); the shards hold each document as often as the manifest says. Uncompressed shards on
    the way: a local dataset's default (compression: auto), recorded as written."""
    from streaming import StreamingDataset
    from transformers import AutoTokenizer

    from data_pipeline.loader import shared_memory_registration

    chapters = kjv_chapters(66)
    small, large = chapters[:6], chapters[6:]
    a, b = tmp_path / "small.txt", tmp_path / "large.jsonl"
    a.write_text("\n\n".join(small) + "\n", encoding="utf-8")
    b.write_text("".join(json.dumps({"text": c}) + "\n" for c in large), encoding="utf-8")
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'out'}", "tokenizer.vocab_size=300", "tokenizer.character_coverage=1.0", "seq_len=64",
        "mixture_stopping=all_exhausted", "num_workers=2",
        f"sources=[{{kind: text, path: '{a}'}}, {{kind: json, path: '{b}'}}]"])
    out = DatasetDir(prepare(cfg))
    manifest = json.loads(out.manifest.read_text())
    docs = [s["documents"] for s in manifest["sources"]]
    assert docs[1] == len(large) and docs[0] >= 2 * len(small), docs  # equal weights: about 60 draws of the small one
    shards = sorted(p.name for p in out.root.rglob("shard.*"))
    assert shards and all(name.endswith(".mds") for name in shards), shards  # no .zstd
    assert manifest["config"]["compression"] is None

    tok = AutoTokenizer.from_pretrained(str(out.tokenizer), local_files_only=True)
    text = ""
    for split in ("train", "validation"):
        with shared_memory_registration():
            ds = StreamingDataset(local=str(out.root / split), shuffle=False, batch_size=1)
        text += "\x00" + "".join(tok.decode(ds[i]["input_ids"], skip_special_tokens=True) for i in range(ds.num_samples))
    text = re.sub(r"\s+", "", text)
    counts = [text.count(re.sub(r"\s+", "", d)) for d in small]
    passes = docs[0] // len(small)
    # Whole passes, then the first documents once more.
    assert sum(counts) == docs[0] and set(counts) <= {passes, passes + 1} and counts == sorted(counts, reverse=True), (
        counts, docs)
    assert all(text.count(re.sub(r"\s+", "", d)) == 1 for d in large)


def test_a_hub_source_is_read_offline_from_the_folder_it_was_downloaded_to(tmp_path, monkeypatch):
    """`kind: hub` with `path` a downloaded copy: the named config and split, read with the hub's own layout and no
    network (HF_DATASETS_OFFLINE=1), alone and mixed with a file; a path that is no such folder is one line."""
    import pytest

    from core.errors import InputDataError, MissingFileError

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    chapters = kjv_chapters(60)
    # Named relatively, and like one of datasets' own loaders (hf download ... --local-dir parquet).
    snap = "parquet"
    write_hub_download(tmp_path / snap, {"en": {"train": {"text": chapters[:10]}},
                                         "kjv": {"train": {"text": chapters[10:50]},
                                                 "validation": {"text": chapters[50:60]}}})
    base = ["tokenizer.vocab_size=300", "tokenizer.character_coverage=1.0", "seq_len=64", "num_workers=1"]
    out = DatasetDir(prepare(load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'alone'}", *base, f"sources=[{{kind: hub, path: '{snap}', name: kjv, split: train}}]"])))
    manifest = json.loads(out.manifest.read_text())
    assert [s["documents"] for s in manifest["sources"]] == [40]  # kjv's train split: not en, not validation

    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(chapters[:3]) + "\n", encoding="utf-8")
    mixed = load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'mixed'}", *base, "mixture_stopping=all_exhausted",
        f"sources=[{{kind: hub, path: '{snap}', name: kjv}}, {{kind: text, path: '{small}'}}]"])
    docs = [s["documents"] for s in json.loads(DatasetDir(prepare(mixed)).manifest.read_text())["sources"]]
    assert docs[0] == 40 and docs[1] >= 2 * 3, docs  # the hub source read whole (after its counting pass)

    for path, error, text in [(tmp_path / "none", MissingFileError, "does not exist"),
                              (small, InputDataError, "is a file")]:
        cfg = load_config(PrepareConfig, None, [f"output_dir={tmp_path / 'bad'}", *base,
                                                f"sources=[{{kind: hub, path: '{path}'}}]"])
        with pytest.raises(error, match=f"hub dataset.*'{path}'.*{text}"):
            prepare(cfg)
    cfg = load_config(PrepareConfig, None, [f"output_dir={tmp_path / 'bad'}", *base,
                                            f"sources=[{{kind: hub, path: '{snap}', name: fr}}]"])
    with pytest.raises(InputDataError, match=f"hub dataset '{snap}' \\(fr\\) could not be loaded: .*fr"):
        prepare(cfg)
    assert not (tmp_path / "bad").exists()
