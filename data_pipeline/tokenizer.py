"""Train a sentencepiece model and save it as a Hugging Face fast-tokenizer folder (or reuse an existing one)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from core.errors import InputDataError, MissingFileError
from core.json_file import read_json
from data_pipeline.config import TokenizerConfig

if TYPE_CHECKING:  # annotations only: torch and transformers are imported where they are used
    import torch
    from transformers import PreTrainedTokenizerBase

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
SPM_FILE = "spm.model"


# sentencepiece's own default: a longer sentence is skipped whole, without error (its one warning is below the log
# level it is given here). Lines are cut to fit instead.
MAX_SENTENCE_BYTES = 4192


def sentence_pieces(line: str, limit: int = MAX_SENTENCE_BYTES) -> list[str]:
    """`line` cut into pieces of at most `limit` UTF-8 bytes, at the last whitespace that fits (a word longer than
    that at a character boundary), so that sentencepiece skips none of its text."""
    data = line.encode("utf-8")
    pieces, start = [], 0
    while len(data) - start > limit:
        end = start + limit
        while data[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte: cutting here would split a character
            end -= 1
        cut = max(data.rfind(b" ", start + 1, end + 1), data.rfind(b"\t", start + 1, end + 1))
        cut = cut if cut > start else end
        pieces.append(data[start:cut].decode("utf-8"))
        start = cut
        while start < len(data) and data[start] in b" \t":
            start += 1
    if start < len(data):
        pieces.append(data[start:].decode("utf-8"))
    return pieces


def train_sentencepiece(documents: Iterable[str], cfg: TokenizerConfig, seed: int = 0) -> bytes:
    """Train a sentencepiece model on (a bounded sample of) the documents; return the serialized model."""
    import sentencepiece as spm

    sample = []
    for i, doc in enumerate(documents):
        if i >= cfg.max_training_documents:
            break
        # sentencepiece reads sentences: a line is one, cut to its length limit.
        sample.extend(piece for line in doc.splitlines() if line.strip() for piece in sentence_pieces(line))
    if not sample:
        raise InputDataError("the corpus is empty: no document has any text to train a tokenizer on")
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,
        model_type=cfg.model_type,
        vocab_size=cfg.vocab_size,
        character_coverage=cfg.character_coverage,
        byte_fallback=cfg.byte_fallback,
        normalization_rule_name="nmt_nfkc_cf" if cfg.lowercase else "nmt_nfkc",
        pad_id=0,
        pad_piece=PAD,
        unk_id=1,
        unk_piece=UNK,
        bos_id=-1,
        eos_id=-1,
        control_symbols=[CLS, SEP, MASK],
        hard_vocab_limit=False,
        max_sentence_length=MAX_SENTENCE_BYTES,
        num_threads=2,
        minloglevel=2,
    )
    return model.getvalue()


def bpe_merges(pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """A sentencepiece BPE model's merges: every split of a piece into two pieces of the vocabulary, ranked by the
    merged piece's score (highest first), then the longer left part, the longer right part, vocabulary order."""
    ids = {piece: i for i, (piece, _) in enumerate(pieces)}
    ranked = [(-score, -cut, cut - len(piece), ids[piece], ids[piece[:cut]], ids[piece[cut:]], piece[:cut], piece[cut:])
              for piece, score in pieces for cut in range(1, len(piece))
              if piece[:cut] in ids and piece[cut:] in ids]
    return [(left, right) for *_, left, right in sorted(ranked)]


def _fast_tokenizer_from_spm(model_bytes: bytes):
    """Build a `tokenizers.Tokenizer` equivalent to the sentencepiece model (as transformers' SpmConverter does).

    Written against `tokenizers` and sentencepiece's protobuf only: transformers' converter changed its interface
    between 4.x and 5.x."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, Unigram

    proto = model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    byte_fallback = proto.trainer_spec.byte_fallback
    if proto.trainer_spec.model_type == 1:
        tok = Tokenizer(Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=byte_fallback))
    else:
        tok = Tokenizer(BPE({p: i for i, (p, _) in enumerate(vocab)}, bpe_merges(vocab), unk_token=UNK, fuse_unk=True,
                            byte_fallback=byte_fallback))
    charsmap = proto.normalizer_spec.precompiled_charsmap
    steps = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "▁")]
    tok.normalizer = normalizers.Sequence(([normalizers.Precompiled(charsmap)] if charsmap else []) + steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tok


def save_tokenizer(model_bytes: bytes, out_dir: Path, model_max_length: int) -> None:
    """Write a folder with tokenizer.json, tokenizer_config.json and the sentencepiece model."""
    from transformers import PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_fast_tokenizer_from_spm(model_bytes),
        pad_token=PAD,
        unk_token=UNK,
        cls_token=CLS,
        sep_token=SEP,
        mask_token=MASK,
        model_max_length=model_max_length,
    )
    fast.save_pretrained(str(out_dir))
    make_portable(out_dir)
    (out_dir / SPM_FILE).write_bytes(model_bytes)


# transformers 5 saves a tokenizer.json-only tokenizer under a class name 4.x does not know; 4.x's name for it is
# one that 5.x reads as the same backend, with the same ids.
PORTABLE_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def make_portable(folder: Path) -> None:
    """Name the tokenizer class in a folder's tokenizer_config.json so that transformers 4.x and 5.x both load it."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in PORTABLE_CLASSES:
        config["tokenizer_class"] = PORTABLE_CLASSES[config["tokenizer_class"]]
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# The files a Hugging Face tokenizer folder may hold (a model folder's weights and configs are not copied).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
                   "vocab.json", "merges.txt", SPM_FILE, "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
# transformers' special-token attributes, in its order; `all_special_ids` is these plus additional_special_tokens.
SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
NEEDED = ("pad_token", "cls_token", "sep_token", "mask_token")


def copy_pretrained_tokenizer(src: str, out_dir: Path) -> None:
    """Copy an existing tokenizer folder's tokenizer files after checking that it has the specials we need.

    A folder with a tokenizer.json that names its special tokens is copied as it is (tokenizer_ids reads it); one
    without (slow-only files), or that leaves its specials to its class's defaults (a hub BERT folder), goes through
    AutoTokenizer, which converts and saves it with them named.
    """
    src_dir = Path(src)
    if not src_dir.is_dir():
        raise MissingFileError(f"tokenizer folder not found: {src}")
    if not (src_dir / "tokenizer.json").is_file() or any(name not in _special_tokens(src_dir) for name in NEEDED):
        tok = load_tokenizer(src_dir)
        missing = [name for name in NEEDED if getattr(tok, name) is None]
        if missing:
            raise InputDataError(f"tokenizer '{src}' lacks {', '.join(missing)}; MLM-style pre-training needs them")
        tok.save_pretrained(str(out_dir))
        make_portable(out_dir)
        return
    tokenizer_ids(src_dir)  # names what is missing before anything is copied
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            shutil.copy2(src_dir / name, out_dir / name)
    make_portable(out_dir)


def _special_tokens(folder: Path) -> dict[str, list[str]]:
    """Special-token strings by attribute, as transformers reads them: tokenizer_config.json, then
    special_tokens_map.json over it (a value is a string or an {"content": ...} dict)."""
    merged: dict = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            try:
                merged.update({k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if v is not None})
            except (OSError, ValueError) as exc:
                raise InputDataError(f"tokenizer file '{path}' cannot be read: {exc}") from exc
    content = lambda v: v.get("content") if isinstance(v, dict) else v  # noqa: E731
    out = {attr: [content(merged[attr])] for attr in SPECIAL_ATTRIBUTES if content(merged.get(attr))}
    extra = merged.get("additional_special_tokens") or []
    out["additional_special_tokens"] = [content(v) for v in extra if content(v)]
    return out


def tokenizer_ids(path: str | Path) -> dict:
    """The ids `prepare` records for a tokenizer folder (cls, sep, pad, mask, unk or None, vocabulary size, every
    special id).

    Read with the `tokenizers` library when the folder has a tokenizer.json (a prepare run then never imports
    transformers, whose import is most of its serial start-up); otherwise through AutoTokenizer. Both give
    what `AutoTokenizer` reports (tests/unit/test_tokenizer.py checks them against each other).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise MissingFileError(f"tokenizer folder not found: {folder}")
    if not (folder / "tokenizer.json").is_file():
        return _loaded_ids(load_tokenizer(folder))
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the Rust library raises a bare Exception for an unreadable file
        raise InputDataError(f"'{folder / 'tokenizer.json'}' is not a tokenizer file the tokenizers library can read: {exc}") from exc
    specials = _special_tokens(folder)
    if any(name not in specials for name in NEEDED):
        # Left to the tokenizer class's defaults (a hub BERT folder names none of its specials): AutoTokenizer's.
        tok = load_tokenizer(folder)
        missing = [name for name in NEEDED if getattr(tok, name) is None]
        if missing:
            raise InputDataError(f"tokenizer '{folder}' lacks {', '.join(missing)}; MLM-style pre-training needs them")
        return _loaded_ids(tok)
    ids = {attr: [backend.token_to_id(t) for t in tokens] for attr, tokens in specials.items()}
    unknown = [f"{attr}={tok!r}" for attr, tokens in specials.items() for tok, i in zip(tokens, ids[attr]) if i is None]
    if unknown:
        raise InputDataError(f"tokenizer '{folder}' names special tokens its vocabulary lacks: {', '.join(unknown)}")
    return {"cls_id": ids["cls_token"][0], "sep_id": ids["sep_token"][0], "pad_id": ids["pad_token"][0],
            "mask_id": ids["mask_token"][0], "unk_id": ids.get("unk_token", [None])[0],
            "vocab_size": backend.get_vocab_size(with_added_tokens=True),
            "special_ids": sorted({i for values in ids.values() for i in values})}


def _loaded_ids(tok: PreTrainedTokenizerBase) -> dict:
    """`tokenizer_ids` of a tokenizer AutoTokenizer loaded."""
    return {"cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id, "vocab_size": len(tok), "pad_id": tok.pad_token_id,
            "mask_id": tok.mask_token_id, "unk_id": tok.unk_token_id, "special_ids": sorted(set(tok.all_special_ids))}


def has_tokenizer(folder: str | Path) -> bool:
    """Whether a folder holds a tokenizer's own files (a model folder may hold weights and config alone)."""
    return any((Path(folder) / name).is_file() for name in ("tokenizer.json", "vocab.txt", SPM_FILE, "spiece.model",
                                                            "tokenizer_config.json"))


def vocabulary(path: str | Path) -> tuple[dict[str, int], dict]:
    """A tokenizer folder's token -> id map (added tokens included) and its special ids, as AutoTokenizer loads it
    (the specials a folder leaves to its class's defaults included)."""
    tok = load_tokenizer(path)
    return tok.get_vocab(), _loaded_ids(tok)


def vocabulary_difference(a: str | Path, b: str | Path) -> str | None:
    """How two tokenizer folders map text to ids differently (the first difference found, named), or None when they
    agree on every token's id and the special ids a model's embeddings and heads are trained with."""
    (vocab_a, ids_a), (vocab_b, ids_b) = vocabulary(a), vocabulary(b)
    for key in ("vocab_size", "pad_id", "cls_id", "sep_id", "mask_id"):
        if ids_a[key] != ids_b[key]:
            return f"{key} {ids_a[key]} against {ids_b[key]}"
    moved = sorted(t for t in vocab_a.keys() & vocab_b.keys() if vocab_a[t] != vocab_b[t])
    only = sorted(vocab_a.keys() ^ vocab_b.keys())
    if moved:
        return f"{len(moved)} token(s) with other ids ({moved[0]!r}: {vocab_a[moved[0]]} against {vocab_b[moved[0]]})"
    if only:
        return f"{len(only)} token(s) in one vocabulary only ({only[0]!r})"
    return None


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer folder with AutoTokenizer, offline, with a clear error when it is not one."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"tokenizer folder not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        # What AutoTokenizer raises for a folder it cannot read; the Rust tokenizers library's parse errors are plain
        # Exceptions (transformers 4 lets them through). Any other type is a bug, kept as it is.
        if not isinstance(exc, (OSError, ValueError, KeyError)) and type(exc) is not Exception:
            raise
        raise InputDataError(f"'{path}' is not a tokenizer folder AutoTokenizer can load: {exc}") from exc


def tokenizer_hash(path: str | Path) -> str:
    """Hash of the files that define a tokenizer folder (what a model's vocabulary depends on)."""
    digest = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file():
            digest.update(f.name.encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def check_tokenizer_folder(folder: str | Path, names: Iterable[str] | None = None,
                           advice: str = "copy it back whole from its prepared dataset, or prepare that again") -> None:
    """Refuse a tokenizer folder that is missing, lacks a file (`names`, or else every tokenizer file), or holds a
    JSON file that does not parse; cheap (no tokenizer is built), so a run checks it before it writes anything."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"tokenizer folder '{folder}' is missing; {advice}")
    if names is None:
        names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        if not names:
            raise MissingFileError(f"tokenizer folder '{folder}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                                   f"{advice}")
    for name in names:
        path = folder / name
        if not path.exists():
            raise MissingFileError(f"tokenizer file '{path}' is missing; {advice}")
        # A truncated JSON file would otherwise be copied into the run and refused only when the model is exported.
        if name.endswith(".json") and path.is_file():
            read_json(path, "tokenizer file", advice)


def copy_tokenizer_folder(src: str | Path, dst: str | Path) -> None:
    """Copy a tokenizer folder's files (used to make run and export folders self-contained), each file whole; a
    missing or damaged source is refused before `dst` is touched."""
    check_tokenizer_folder(src)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(src).iterdir()):
        if not f.is_file():
            continue
        # Under a temporary name first: a copy cut short never leaves a half file that the tokenizer hash then reads.
        tmp = dst / f".{f.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            shutil.copy2(f, tmp)
            tmp.replace(dst / f.name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def word_start_table(tok: PreTrainedTokenizerBase) -> torch.Tensor:
    """Bool tensor over the vocabulary: does this token begin a word?

    WordPiece marks continuations with `##`; sentencepiece marks word starts with `▁`; byte-level
    BPE (RoBERTa, GPT-2) with `Ġ`. Punctuation pieces without the marker join the preceding word,
    as whole-word masking of such vocabularies does elsewhere too. A vocabulary with none of these
    conventions is refused rather than masked wrongly.
    """
    import torch

    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    if any(t.startswith("##") for t in vocab):
        starts = [not t.startswith("##") for t in vocab]
    else:
        marker = max(("▁", "Ġ"), key=lambda m: sum(t.startswith(m) for t in vocab))
        if sum(t.startswith(marker) for t in vocab) < 0.05 * len(vocab):
            raise InputDataError("cannot tell word starts in this vocabulary (no ##, ▁ or Ġ convention): "
                             "whole_word and span masking need one; use masking.strategy=bert")
        starts = [t.startswith(marker) for t in vocab]
    return torch.tensor(starts, dtype=torch.bool)


def make_encoder(tok_dir: str | Path, threads: int = 0) -> Callable[[list[str]], list[list[int]]]:
    """A fast `list[str] -> list[list[int]]` encoder without special tokens, for `prepare`.

    For a tokenizer trained here (its folder holds spm.model), sentencepiece's own C++ encoder
    gives the same ids as the HF fast tokenizer (the tests check this), faster (BENCHMARKS.md, "Data preparation
    throughput and scaling"). Either way,
    text that looks like a special token ("[MASK]") is encoded as ordinary text: corpus text never
    injects special tokens into the training data.
    """
    import os

    tok_dir = Path(tok_dir)
    threads = threads or os.cpu_count() or 1
    if (tok_dir / SPM_FILE).is_file():
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(tok_dir / SPM_FILE))
        return lambda texts: sp.encode(texts, num_threads=threads)
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    # Saved tokenizer.json files often carry padding/truncation settings (MiniLM's truncate at 128):
    # a document must never be cut or padded here.
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True  # literal "[MASK]" in the corpus stays text
    return lambda texts: [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
