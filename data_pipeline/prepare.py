"""`prepare`: raw text → tokenizer → packed sequences → train/validation MDS shards + manifest."""
from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Iterator

from data_pipeline.config import PrepareConfig
from data_pipeline.packing import FullPacker
from data_pipeline.raw_text import DataInputError, ReadStats, iter_documents
from data_pipeline.shards import SplitWriter, prepare_output, publish, token_dtype, write_manifest
from data_pipeline.tokenizer import (
    copy_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
    train_sentencepiece,
)
from pretrain.config_io import config_to_dict

log = logging.getLogger("data_pipeline")
ENCODE_BATCH = 1000
SPLITS = ("train", "validation")


def _batched(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _build_tokenizer(cfg: PrepareConfig, tok_dir: Path) -> None:
    if cfg.tokenizer.pretrained:
        copy_pretrained_tokenizer(cfg.tokenizer.pretrained, tok_dir)
        return
    stats = ReadStats()
    t0 = time.time()
    model = train_sentencepiece(iter_documents(cfg.sources, cfg.encoding_errors, stats), cfg.tokenizer, cfg.seed)
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
        backend = tok.backend_tokenizer
        vocab_size = len(tok)
        dtype = token_dtype(vocab_size)
        val_every = round(1 / cfg.val_fraction) if cfg.val_fraction > 0 else 0

        stats = ReadStats()
        writers = {s: SplitWriter(tmp_dir / s, dtype, cfg.compression, cfg.shard_size_limit) for s in SPLITS}
        packers = {s: FullPacker(cfg.seq_len, tok.cls_token_id, tok.sep_token_id) for s in SPLITS}
        doc_counts = {s: 0 for s in SPLITS}
        index = 0
        for batch in _batched(iter_documents(cfg.sources, cfg.encoding_errors, stats), ENCODE_BATCH):
            for enc in backend.encode_batch(batch, add_special_tokens=False):
                split = "validation" if val_every and index % val_every == val_every - 1 else "train"
                doc_counts[split] += 1
                index += 1
                for seq in packers[split].add(enc.ids):
                    writers[split].write(seq)
        if stats.documents == 0:
            raise DataInputError(
                "the corpus is empty: no source yielded any text ("
                + ", ".join(f"{s.kind}:{s.path}" for s in cfg.sources) + ")"
            )
        for split in SPLITS:
            for seq in packers[split].flush():
                writers[split].write(seq)
        counts = {s: {**writers[s].close(), "documents": doc_counts[s]} for s in SPLITS}
        if counts["train"]["sequences"] == 0:
            raise DataInputError("the corpus produced no training sequence")
        manifest = {
            "format": "contrastive-pretrain/mds-v1",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command or " ".join(shlex.quote(a) for a in sys.argv),
            "tokenizer": {"path": "tokenizer", "hash": tokenizer_hash(tok_dir), "vocab_size": vocab_size,
                          "pad_id": tok.pad_token_id, "cls_id": tok.cls_token_id, "sep_id": tok.sep_token_id,
                          "mask_id": tok.mask_token_id, "special_ids": sorted(set(tok.all_special_ids))},
            "seq_len": cfg.seq_len,
            "packing": cfg.packing,
            "token_dtype": dtype.name,
            "splits": counts,
            "replaced_characters": stats.replaced_characters,
            "sources": [config_to_dict(s) for s in cfg.sources],
            "config": config_to_dict(cfg),
        }
        write_manifest(tmp_dir, manifest)
        publish(tmp_dir, final_dir)
        log.info(
            "prepared %d train / %d validation sequences (%d documents, %d tokens) in %.1fs -> %s",
            counts["train"]["sequences"], counts["validation"]["sequences"], stats.documents,
            counts["train"]["tokens"] + counts["validation"]["tokens"], time.time() - t0, final_dir,
        )
        return final_dir
    except BaseException:
        import shutil

        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
