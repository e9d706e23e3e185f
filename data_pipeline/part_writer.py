"""One part of the input in, its packed sequences out: `<split>/part-NNNNN/` shards and a done marker.

Everything here depends on the part alone (its documents, its index, the seed), never on which
worker or SLURM task runs it, so the dataset is the same for any number of processes. A part's
documents are numbered from 0 (their ids); a document goes to validation when a seeded hash of its
text falls below val_fraction, so the split does not depend on where the parts are cut, and a
document that occurs twice (repeated by the mixture, or duplicated in the corpus) never sits in both
splits.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

import xxhash

from core.atomic_files import write_text_atomic
from data_pipeline.dataset_dir import SPLITS
from data_pipeline.config import PrepareConfig
from data_pipeline.input_parts import Part
from data_pipeline.packing import DocumentPacker, FullPacker, PairPacker
from data_pipeline.raw_text import ReadStats, iter_part
from data_pipeline.sentences import split_sentences
from data_pipeline.shards import SplitWriter, token_dtype

BATCH_DOCS = 512
DONE_DIR = "parts"


@dataclass(frozen=True)
class Shared:
    """What every part needs: the config, the tokenizer and its special ids, the output folder."""

    cfg: PrepareConfig
    tok_dir: Path
    ids: dict[str, int]  # cls_id, sep_id, vocab_size: a worker never imports transformers
    out_dir: Path


@dataclass(frozen=True)
class PartJob:
    """Which documents of a part to write: all of them `passes` times, then the first `extra` once more."""

    index: int
    part: Part
    passes: int = 1
    extra: int = 0


def part_name(index: int) -> str:
    """The folder of part `index` inside each split."""
    return f"part-{index:05d}"


def done_marker(out_dir: Path, index: int) -> Path:
    """The file whose presence says that part `index` is completely written."""
    return out_dir / DONE_DIR / f"{part_name(index)}.json"


def in_validation(text: str, seed: int, below: int) -> bool:
    """True for a validation document: the text's xxh64 (seeded) is below val_fraction * 2**64."""
    return below > 0 and xxhash.xxh64_intdigest(text.encode("utf-8"), seed) < below


def count_part(shared: Shared, part: Part) -> int:
    """The number of documents in a part (read, not written)."""
    return sum(1 for _ in iter_part(shared.cfg.sources[part.source], part, shared.cfg.encoding_errors, ReadStats()))


_ENCODERS: dict[Path, Any] = {}


def _encoder(tok_dir: Path):
    from data_pipeline.tokenizer import make_encoder

    if tok_dir not in _ENCODERS:
        _ENCODERS[tok_dir] = make_encoder(tok_dir, threads=1)  # one process is one core
    return _ENCODERS[tok_dir]


def _packer(cfg: PrepareConfig, ids: dict[str, int], index: int, split: str):
    if cfg.packing == "full":
        return FullPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"])
    if cfg.packing == "document":
        return DocumentPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"])
    return PairPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"], cfg.pair_task, cfg.short_seq_prob,
                      cfg.nsp_document_pool, [cfg.seed, index, SPLITS.index(split)])


def _numbered(shared: Shared, job: PartJob, stats: ReadStats) -> Iterator[tuple[int, str]]:
    source = shared.cfg.sources[job.part.source]

    def read() -> Iterator[str]:
        return iter_part(source, job.part, shared.cfg.encoding_errors, stats)

    for _ in range(job.passes):
        yield from enumerate(read())
    if job.extra:
        yield from enumerate(islice(read(), job.extra))


def write_part(shared: Shared, job: PartJob) -> dict[str, Any]:
    """Tokenize, pack and write one part; return its counts (also kept in its done marker)."""
    cfg, out = shared.cfg, shared.out_dir
    name = part_name(job.index)
    tmp = {s: out / s / f".{name}.tmp-{os.getpid()}" for s in SPLITS}
    for path in tmp.values():
        shutil.rmtree(path, ignore_errors=True)
    encode = _encoder(shared.tok_dir)
    val_below = int(cfg.val_fraction * 2**64)
    packers = {s: _packer(cfg, shared.ids, job.index, s) for s in SPLITS}
    writers = {s: SplitWriter(tmp[s], packers[s].columns, token_dtype(shared.ids["vocab_size"]), cfg.compression,
                              cfg.shard_size_limit, shared.ids.get("unk_id")) for s in SPLITS}
    documents = {s: 0 for s in SPLITS}
    stats = ReadStats()
    docs = _numbered(shared, job, stats)
    while batch := list(islice(docs, BATCH_DOCS)):
        for split in SPLITS:
            chosen = [(i, text) for i, text in batch if in_validation(text, cfg.seed, val_below) == (split == "validation")]
            if not chosen:
                continue
            documents[split] += len(chosen)
            per_doc = _encode_documents(encode, [text for _, text in chosen], cfg.packing == "pairs")
            if cfg.packing == "full":  # no per-document columns: whole batches at once
                writers[split].write_rows(packers[split].add_many(per_doc))
                continue
            for (i, _), ids in zip(chosen, per_doc):
                doc_id = (job.index << 32) | i  # unique across parts: the part's number, then the document's
                for sample in packers[split].add(doc_id, ids):
                    writers[split].write(sample)
    counts: dict[str, Any] = {}
    for split in SPLITS:
        for sample in packers[split].flush():
            writers[split].write(sample)
        counts[split] = {**writers[split].close(), "documents": documents[split]}
    return _publish(out, name, tmp, {"part": job.index, "splits": counts, "read": vars(stats)})


def _encode_documents(encode, texts: list[str], by_sentence: bool) -> list:
    """Token ids per document; with `by_sentence` (pairs packing) a list of sentences' ids per document."""
    if not by_sentence:
        return encode(texts)
    sentences = [split_sentences(text) for text in texts]
    flat = encode([s for sents in sentences for s in sents])
    per_doc, pos = [], 0
    for sents in sentences:
        per_doc.append(flat[pos:pos + len(sents)])
        pos += len(sents)
    return per_doc


def _publish(out: Path, name: str, tmp: dict[str, Path], result: dict[str, Any]) -> dict[str, Any]:
    """Rename the part's finished splits into place, then write its done marker (last: it says the part is whole)."""
    for split in SPLITS:
        final = out / split / name
        shutil.rmtree(final, ignore_errors=True)  # a half-written copy from a killed attempt
        tmp[split].rename(final)
    marker = done_marker(out, result["part"])
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, json.dumps(result) + "\n")
    return result
