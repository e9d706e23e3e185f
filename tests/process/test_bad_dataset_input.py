"""A damaged prepared dataset or source is one line naming the file, exit 2 (verify, train, prepare's workers)."""
import gzip
import json
import re
import shutil

import pytest
from conftest import REPO, TINY_MODEL, kjv_chapters, run_cli

from core.errors import InputDataError, MissingFileError
from data_pipeline.cli import main as data_main
from data_pipeline.dataset_dir import DatasetDir


@pytest.fixture
def copy(prepared, tmp_path):
    """A copy of the prepared dataset to damage."""
    return shutil.copytree(prepared, tmp_path / "data")


def _edit_manifest(path, change):
    manifest = json.loads(path.read_text())
    change(manifest)
    return json.dumps(manifest).encode()


def _one_error_line(err: str, *needles: str) -> None:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


# (file, new bytes or a function of the file's path giving them, what the message says)
DAMAGE = {
    "index {}": ("index", b"{}", "is corrupt: it is not a JSON object with a 'shards' list"),
    "index not UTF-8": ("index", b'\xff\xfe{"shards": []}', "is not UTF-8"),
    "index shard outside the split": ("index", lambda p: p.read_bytes().replace(b'"part-00000/', b'"../../'),
                                      "no plain relative"),
    "manifest []": ("manifest", b"[]", "holds a JSON list, not an object"),
    "manifest {}": ("manifest", b"{}", "no 'splits' object"),
    "manifest not UTF-8": ("manifest", b"\xff\xfe{}", "is not UTF-8"),
    "manifest sequences": ("manifest",
                           lambda p: _edit_manifest(p, lambda m: m["splits"]["train"].update(sequences="many")),
                           "'splits.train.sequences' is not a count"),
    "manifest pad id": ("manifest", lambda p: _edit_manifest(p, lambda m: m["tokenizer"].pop("pad_id")),
                        "'tokenizer.pad_id' is missing"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_dataset_metadata_is_refused_in_one_line_naming_the_file(copy, capsys, case):
    """index.json and manifest.json are read in one place each (shard_files, read_manifest), by verify and by a
    launch (verify_split_once, then read_manifest): a wrong structure used to be a KeyError or AttributeError, bytes
    that are not UTF-8 a UnicodeDecodeError."""
    from data_pipeline.shard_record import verify_split_once
    from data_pipeline.shards import read_manifest, shard_files

    which, damage, says = DAMAGE[case]
    path = DatasetDir(copy).index("train") if which == "index" else DatasetDir(copy).manifest
    path.write_bytes(damage(path) if callable(damage) else damage)
    calls = ([lambda: shard_files(path.parent), lambda: verify_split_once(path.parent)] if which == "index"
             else [lambda: read_manifest(copy)])
    for call in calls:
        with pytest.raises(InputDataError, match=re.escape(f"'{path}'")):
            call()
    assert data_main(["verify", str(copy)]) == 2
    _one_error_line(capsys.readouterr().err, f"'{path}'", says)


def test_a_dataset_whose_tokenizer_is_gone_or_truncated_is_refused_naming_it(copy, capsys):
    """Checked where the manifest is read, so a launch refuses it before it writes anything (it used to fail copying the
    folder into the run, or, with tokenizer.json or the sentencepiece model truncated, train and leave the run's export
    to fail)."""
    from data_pipeline.shards import read_manifest

    folder = DatasetDir(copy).tokenizer
    binary = next(p for p in sorted(folder.iterdir()) if p.suffix != ".json")  # what no JSON parse can check
    kept = binary.read_bytes()
    recorded = json.loads(DatasetDir(copy).manifest.read_text())["tokenizer"]["hash"]
    binary.write_bytes(kept[:100])
    says = f"tokenizer folder '{folder}' holds tokenizer "
    with pytest.raises(InputDataError, match=re.escape(says) + f"[0-9a-f]{{16}}, not the {recorded} its dataset's"):
        read_manifest(copy)
    assert data_main(["verify", str(copy)]) == 2
    _one_error_line(capsys.readouterr().err, says, f"the dataset '{copy}' is incomplete or damaged")
    binary.write_bytes(kept)
    read_manifest(copy)
    stray = folder / ".DS_Store"  # a file the dataset's copy picked up on the way: named, not blamed on the others
    stray.write_bytes(b"\0\0\0\1Bud1")
    with pytest.raises(InputDataError, match=re.escape(f"tokenizer folder '{folder}' holds .DS_Store, which prepare did "
                                                       "not write (its manifest lists ")):
        read_manifest(copy)
    stray.unlink()

    tokenizer_json = DatasetDir(copy).tokenizer / "tokenizer.json"
    tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    with pytest.raises(InputDataError, match=re.escape(f"tokenizer file '{tokenizer_json}' is not valid JSON")):
        read_manifest(copy)
    shutil.rmtree(DatasetDir(copy).tokenizer)
    with pytest.raises(MissingFileError, match=re.escape(f"the dataset '{copy}' is incomplete")):
        read_manifest(copy)


def test_train_refuses_a_truncated_dataset_tokenizer_in_one_line_and_writes_no_run(copy, tmp_path):
    tokenizer_json = DatasetDir(copy).tokenizer / "tokenizer.json"
    tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    run = tmp_path / "run"
    proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={copy}",
                                f"train.output_dir={run}", *TINY_MODEL, "train.micro_batch_size=4",
                                "train.global_batch_size=8", "train.max_steps=2", "train.eval_every=0"], check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and f"'{tokenizer_json}' is not valid JSON" in lines[0], lines
    assert not run.exists()


def test_a_truncated_source_read_by_prepare_workers_is_one_line(prepared, corpus_file, tmp_path, capsys):
    """Two parts and two worker processes (the tokenizer is copied, so only the workers read the sources): the
    worker's error reaches the command line as one line naming the file, and no dataset is left."""
    cut = tmp_path / "cut.txt.gz"
    packed = gzip.compress("\n\n".join(kjv_chapters(30)).encode())
    cut.write_bytes(packed[: len(packed) // 2])
    out = tmp_path / "out"
    rc = data_main(["prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={out}",
                    f"sources=[{{kind: text, path: '{corpus_file},{cut}'}}]", "num_workers=2",
                    f"tokenizer.pretrained={DatasetDir(prepared).tokenizer}"])
    assert rc == 2
    _one_error_line(capsys.readouterr().err, f"'{cut}' is truncated or corrupt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.txt.gz"]


def test_a_hub_id_offline_is_refused_at_once_in_one_line_saying_what_to_do(tmp_path, monkeypatch, capsys):
    """README's sources example names a hub id; on an offline compute node prepare stops before any work with one
    line that says how to download it or what to pass instead, and writes nothing."""
    monkeypatch.chdir(tmp_path)  # a folder named as the id would be taken as its download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    rc = data_main(["prepare", "--config", str(REPO / "data_pipeline/configs/demo.yaml"), f"output_dir={out}",
                    "sources=[{kind: hub, path: wikimedia/wikipedia, name: 20231101.en, split: train}]"])
    assert rc == 2
    _one_error_line(capsys.readouterr().err, "hub dataset 'wikimedia/wikipedia' cannot be reached (offline?)",
                    "hf download wikimedia/wikipedia --repo-type dataset --local-dir DIR",
                    "or pass local files instead")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_index_is_named_also_with_hash_checks_off(copy):
    from data_pipeline.loader import LoaderConfig
    from data_pipeline.run_data import open_dataset

    index = DatasetDir(copy).index("train")
    index.write_bytes(b"{}")
    # Without the project's own read, streaming reads the index itself and fails with KeyError: 'version'.
    with pytest.raises(InputDataError, match=re.escape(f"{index}")):
        open_dataset(LoaderConfig(path=str(copy), verify_hashes=False))
