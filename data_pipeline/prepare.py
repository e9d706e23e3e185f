"""`prepare`: raw text → tokenizer → packed sequences → train/validation MDS shards + manifest.

The main process reads the (mixed) sources and assigns each document to a split; N workers
tokenize, pack and write their own MDS shards (`<split>/part-NNNNN/`), which are merged into one
index per split. With one worker everything runs in this process.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Iterator

from core.atomic_files import prepare_output, publish
from core.config_io import config_to_dict
from core.errors import InputDataError, UserError
from data_pipeline.config import PrepareConfig
from data_pipeline.mixture import mix
from data_pipeline.packing import DocumentPacker, FullPacker, PairPacker
from data_pipeline.raw_text import ReadStats, iter_source
from data_pipeline.sentences import split_sentences
from data_pipeline.shards import SplitWriter, token_dtype, write_manifest
from data_pipeline.tokenizer import (
    copy_pretrained_tokenizer,
    load_tokenizer,
    make_encoder,
    save_tokenizer,
    tokenizer_hash,
    train_sentencepiece,
)

log = logging.getLogger("data_pipeline")
BATCH_DOCS = 512
SPLITS = ("train", "validation")
Batch = list[tuple[int, str, str]]  # (document index, split, text)


def _source_name(cfg: PrepareConfig, i: int) -> str:
    s = cfg.sources[i]
    return f"{s.kind}:{s.path}" + (f" ({s.name})" if s.name else "")


def _documents(cfg: PrepareConfig, stats: ReadStats, per_source: list[int]) -> Iterator[str]:
    """The mixture of all sources, capped at max_documents."""
    def open_source(i: int) -> Iterator[str]:
        return iter_source(cfg.sources[i], cfg.encoding_errors, stats)

    names = [_source_name(cfg, i) for i in range(len(cfg.sources))]
    stream = mix(open_source, [s.weight for s in cfg.sources], cfg.seed, cfg.mixture_stopping, names)
    for count, (source, doc) in enumerate(stream):
        if cfg.max_documents and count >= cfg.max_documents:
            return
        per_source[source] += 1
        yield doc


def _batches(cfg: PrepareConfig, docs: Iterable[str], doc_counts: dict[str, int]) -> Iterator[Batch]:
    """Number the documents, assign every k-th to validation, and group them into batches."""
    val_every = round(1 / cfg.val_fraction) if cfg.val_fraction > 0 else 0
    batch: Batch = []
    for index, text in enumerate(docs):
        split = "validation" if val_every and index % val_every == val_every - 1 else "train"
        doc_counts[split] += 1
        batch.append((index, split, text))
        if len(batch) == BATCH_DOCS:
            yield batch
            batch = []
    if batch:
        yield batch


def _make_packer(cfg: PrepareConfig, ids: dict[str, int], worker: int, split: str):
    if cfg.packing == "full":
        return FullPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"])
    if cfg.packing == "document":
        return DocumentPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"])
    seed = [cfg.seed, worker, SPLITS.index(split)]
    return PairPacker(cfg.seq_len, ids["cls_id"], ids["sep_id"], cfg.pair_task, cfg.short_seq_prob,
                      cfg.nsp_document_pool, seed)


def write_shards(cfg: PrepareConfig, tok_dir: Path, ids: dict[str, int], out_dir: Path, worker: int,
                 batches: Iterable[Batch]) -> dict[str, dict[str, int]]:
    """Tokenize, pack and write the given batches into `out_dir/<split>[/part-NNNNN]`; return counts.

    `ids` holds cls_id, sep_id and vocab_size, so a worker never needs to import transformers.
    """
    encode = make_encoder(tok_dir, threads=max(1, (os.cpu_count() or 1) // cfg.num_workers))
    dtype = token_dtype(ids["vocab_size"])
    suffix = f"part-{worker:05d}" if cfg.num_workers > 1 else ""
    packers = {s: _make_packer(cfg, ids, worker, s) for s in SPLITS}
    writers = {s: SplitWriter(out_dir / s / suffix, packers[s].columns, dtype, cfg.compression, cfg.shard_size_limit)
               for s in SPLITS}
    for batch in batches:
        for split in SPLITS:
            docs = [(i, text) for i, s, text in batch if s == split]
            if not docs:
                continue
            if cfg.packing == "pairs":
                sentences = [split_sentences(text) for _, text in docs]
                flat = encode([s for sents in sentences for s in sents])
                pos = 0
                for (doc_id, _), sents in zip(docs, sentences):
                    ids = flat[pos:pos + len(sents)]
                    pos += len(sents)
                    for sample in packers[split].add(doc_id, ids):
                        writers[split].write(sample)
            else:
                for (doc_id, _), ids in zip(docs, encode([t for _, t in docs])):
                    for sample in packers[split].add(doc_id, ids):
                        writers[split].write(sample)
    for split in SPLITS:
        for sample in packers[split].flush():
            writers[split].write(sample)
    return {s: writers[s].close() for s in SPLITS}


def _worker_main(cfg: PrepareConfig, tok_dir: Path, ids: dict[str, int], out_dir: Path, worker: int, inbox, outbox) -> None:
    """A worker process: batches arrive on inbox until None; counts (or a traceback) go to outbox."""
    def batches() -> Iterator[Batch]:
        while (batch := inbox.get()) is not None:
            yield batch

    try:
        outbox.put(("ok", worker, write_shards(cfg, tok_dir, ids, out_dir, worker, batches())))
    except UserError as exc:  # the user's mistake, found by a worker: the main process raises it as it is
        outbox.put(("user_error", worker, exc))
    except BaseException:
        outbox.put(("error", worker, traceback.format_exc()))


def _run_workers(cfg: PrepareConfig, tok_dir: Path, ids: dict[str, int], out_dir: Path, batches: Iterable[Batch]) -> list[dict]:
    """Spread batches round-robin over worker processes; fail fast if one dies."""
    ctx = mp.get_context("spawn")  # fork after datasets/fsspec threads started can deadlock
    threads = max(1, (os.cpu_count() or 1) // cfg.num_workers)
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's thread pool, per worker
    inboxes = [ctx.Queue(maxsize=4) for _ in range(cfg.num_workers)]
    outbox = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(cfg, tok_dir, ids, out_dir, w, inboxes[w], outbox), daemon=True)
             for w in range(cfg.num_workers)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}

    def check() -> None:
        while True:
            try:
                status, worker, payload = outbox.get_nowait()
            except queue.Empty:
                break
            if status == "user_error":
                raise payload
            if status == "error":
                raise RuntimeError(f"prepare worker {worker} failed:\n{payload}")
            results[worker] = payload
        dead = [w for w, p in enumerate(procs) if not p.is_alive() and w not in results]
        if dead:
            raise RuntimeError(f"prepare worker {dead[0]} died (exit code {procs[dead[0]].exitcode})")

    def put(w: int, item) -> None:
        while True:
            try:
                inboxes[w].put(item, timeout=1.0)
                return
            except queue.Full:
                check()

    try:
        for n, batch in enumerate(batches):
            put(n % cfg.num_workers, batch)
        for w in range(cfg.num_workers):
            put(w, None)
        while len(results) < cfg.num_workers:
            try:
                status, worker, payload = outbox.get(timeout=1.0)
            except queue.Empty:
                check()
                continue
            if status == "user_error":
                raise payload
            if status == "error":
                raise RuntimeError(f"prepare worker {worker} failed:\n{payload}")
            results[worker] = payload
    finally:
        failed = len(results) < cfg.num_workers
        for p in procs:
            if p.is_alive() and failed:
                p.terminate()
            p.join(timeout=10)
        if failed:
            # Batches still buffered for dead workers would keep each queue's feeder thread (and
            # so the interpreter's exit) waiting forever.
            for q in inboxes:
                q.cancel_join_thread()
                q.close()
    return [results[w] for w in range(cfg.num_workers)]


def _merge(out_dir: Path, per_worker: list[dict]) -> dict[str, dict[str, int]]:
    from streaming.base.util import merge_index

    for split in SPLITS:
        merge_index(str(out_dir / split), keep_local=True)
    return {s: {k: sum(w[s][k] for w in per_worker) for k in ("sequences", "tokens")} for s in SPLITS}


def _build_tokenizer(cfg: PrepareConfig, tok_dir: Path) -> None:
    if cfg.tokenizer.pretrained:
        copy_pretrained_tokenizer(cfg.tokenizer.pretrained, tok_dir)
        return
    t0 = time.time()
    model = train_sentencepiece(_documents(cfg, ReadStats(), [0] * len(cfg.sources)), cfg.tokenizer, cfg.seed)
    log.info("trained a %s tokenizer (vocab %d) in %.1fs", cfg.tokenizer.model_type, cfg.tokenizer.vocab_size, time.time() - t0)
    save_tokenizer(model, tok_dir, model_max_length=cfg.seq_len)


def prepare(cfg: PrepareConfig, command: str | None = None) -> Path:
    """Build the dataset folder described by `cfg`; return its path."""
    final_dir = Path(cfg.output_dir)
    tmp_dir = prepare_output(final_dir, cfg.overwrite)
    try:
        t0 = time.time()
        tok_dir = tmp_dir / "tokenizer"
        _build_tokenizer(cfg, tok_dir)
        tok = load_tokenizer(tok_dir)
        ids = {"cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id, "vocab_size": len(tok)}
        stats = ReadStats()
        per_source = [0] * len(cfg.sources)
        doc_counts = {s: 0 for s in SPLITS}
        batches = _batches(cfg, _documents(cfg, stats, per_source), doc_counts)
        if cfg.num_workers == 1:
            counts = write_shards(cfg, tok_dir, ids, tmp_dir, 0, batches)
        else:
            counts = _merge(tmp_dir, _run_workers(cfg, tok_dir, ids, tmp_dir, batches))
        if stats.documents == 0:
            raise InputDataError(
                "the corpus is empty: no source yielded any text (" + ", ".join(_source_name(cfg, i) for i in range(len(cfg.sources))) + ")"
            )
        if counts["train"]["sequences"] == 0:
            raise InputDataError("the corpus produced no training sequence")
        for split in SPLITS:
            counts[split]["documents"] = doc_counts[split]
        manifest = {
            "format": "contrastive-pretrain/mds-v1",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command or " ".join(shlex.quote(a) for a in sys.argv),
            "tokenizer": {
                "path": "tokenizer", "hash": tokenizer_hash(tok_dir), "vocab_size": len(tok),
                "pad_id": tok.pad_token_id, "cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id,
                "mask_id": tok.mask_token_id, "special_ids": sorted(set(tok.all_special_ids)),
                "files": sorted(p.name for p in tok_dir.iterdir()),
            },
            "seq_len": cfg.seq_len,
            "packing": cfg.packing,
            "pair_task": cfg.pair_task if cfg.packing == "pairs" else None,
            "token_dtype": token_dtype(len(tok)).name,
            "splits": counts,
            "replaced_characters": stats.replaced_characters,
            "sources": [{**config_to_dict(s), "documents": n} for s, n in zip(cfg.sources, per_source)],
            "num_workers": cfg.num_workers,
            "config": config_to_dict(cfg),
        }
        write_manifest(tmp_dir, manifest)
        publish(tmp_dir, final_dir)
        total_tokens = counts["train"]["tokens"] + counts["validation"]["tokens"]
        elapsed = time.time() - t0
        log.info(
            "prepared %d train / %d validation sequences (%d documents, %d tokens, %.1f MB of text) in %.1fs -> %s",
            counts["train"]["sequences"], counts["validation"]["sequences"], stats.documents, total_tokens,
            stats.characters / 1e6, elapsed, final_dir,
        )
        return final_dir
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
