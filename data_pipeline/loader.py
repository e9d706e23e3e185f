"""Streaming loader over prepared MDS shards: deterministic elastic order, resumable state, padded batches.

Determinism: the global sample order depends only on the shuffle seed and algorithm and on
`num_canonical_nodes`, which is fixed in the config, so 1, 2 or 4 ranks walk the same global
order. `StreamingDataLoader.state_dict()` records how far that order was consumed, and a loader
given that state resumes mid-epoch without reading the skipped samples.

Remote data: with `remote: s3://bucket/dataset` (or gs://, oci://, ...), shards are fetched on
demand by mosaicml-streaming into `path` (a local cache); the manifest and tokenizer are fetched
when training starts. This path is untested here (no network); it is streaming's own code.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from core.errors import MissingFileError
from data_pipeline.shards import MANIFEST, read_manifest


@dataclass
class LoaderConfig:
    """Where the prepared data is and how it is shuffled and read."""

    path: str = "runs/data"
    # Optional remote copy of the prepared folder; `path` is then the local cache.
    remote: Optional[str] = None
    shuffle: bool = True
    shuffle_seed: int = 1234
    shuffle_algo: str = "py1e"
    # Fixed, so the global sample order does not depend on how many nodes read it.
    num_canonical_nodes: int = 1
    num_workers: int = 0
    # Check local shard files against their recorded hashes when training starts.
    verify_hashes: bool = True
    # With `remote` set, a killed run's shared memory blocks the next run that reuses its local cache
    # ("Reused local directory"): remove streaming's segments at start. This removes every streaming
    # segment on the machine, so turn it off when other streaming jobs share the node. Without
    # `remote`, leftovers block nothing and are never removed.
    clean_stale_shared_memory: bool = True


def fetch_metadata(cfg: LoaderConfig) -> None:
    """With a remote dataset, download its manifest and tokenizer into the local cache (idempotent)."""
    if not cfg.remote:
        return
    from streaming.base.storage import download_file

    local = Path(cfg.path)
    if not (local / MANIFEST).is_file():
        download_file(f"{cfg.remote.rstrip('/')}/{MANIFEST}", str(local / MANIFEST), timeout=120)
    for name in read_manifest(local)["tokenizer"]["files"]:
        if not (local / "tokenizer" / name).is_file():
            download_file(f"{cfg.remote.rstrip('/')}/tokenizer/{name}", str(local / "tokenizer" / name), timeout=120)


def collate(samples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad samples to the longest one; carry segment ids, pair labels and sample ids when present."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = np.full((len(samples), width), pad_id, dtype=np.int64)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = s["input_ids"]
    input_ids = torch.from_numpy(ids)
    batch = {
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad_id).long(),
        "sample_id": torch.tensor([int(s["sample_id"]) for s in samples], dtype=torch.long),
    }
    if "token_type_ids" in samples[0]:
        types = np.zeros((len(samples), width), dtype=np.int64)
        for row, s in enumerate(samples):
            types[row, : len(s["token_type_ids"])] = s["token_type_ids"]
        batch["token_type_ids"] = torch.from_numpy(types)
    if "pair_label" in samples[0]:
        batch["pair_label"] = torch.tensor([int(s["pair_label"]) for s in samples], dtype=torch.long)
    return batch


def _indexed_dataset_class():
    from streaming import StreamingDataset

    class IndexedStreamingDataset(StreamingDataset):
        """A StreamingDataset whose samples carry their global index as `sample_id`.

        The index is the sample's position in the split, so it stays unique when several
        prepare workers' shards are merged, and it identifies samples across resumes.
        """

        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            item = super().get_item(sample_id, retry)
            item["sample_id"] = sample_id
            return item

    return IndexedStreamingDataset


@contextlib.contextmanager
def shared_memory_registration():
    """Hold a machine-wide lock (local leaders) while streaming picks and creates its shared memory.

    streaming has every rank scan for the first free prefix, then the local leader creates it and
    the other ranks open it: two runs starting together on one machine (two jobs on a node, two
    test workers) pick the same prefix (FileExistsError), or a rank scans while another run's leader
    is creating and so picks another prefix than its own leader ("shared memory registered does not
    match local leader"). The leader takes the lock, then a barrier lets the other ranks scan only
    while it holds it. Only leaders lock, so a run's own ranks never wait on each other for it.
    """
    handle = None
    if is_local_leader():
        handle = open(Path(tempfile.gettempdir()) / "contrastive_pretrain_streaming.lock", "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
        yield
    finally:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def clean_stale_shared_memory(cfg: LoaderConfig) -> None:
    """Remove streaming's shared memory left by killed runs, where it would block this one (see LoaderConfig)."""
    if not (cfg.remote and cfg.clean_stale_shared_memory):
        return
    from streaming.base.util import clean_stale_shared_memory as clean

    with shared_memory_registration():  # cleaning creates and unlinks every name it probes
        clean()


def build_dataset(cfg: LoaderConfig, split: str, batch_size: int, shuffle: Optional[bool] = None):
    """A StreamingDataset over one split of a prepared dataset."""
    split_dir = Path(cfg.path) / split
    if not cfg.remote and not (split_dir / "index.json").is_file():
        raise MissingFileError(f"no '{split}' split in '{cfg.path}' (missing {split_dir / 'index.json'})")
    with shared_memory_registration():
        return _indexed_dataset_class()(
            remote=f"{cfg.remote.rstrip('/')}/{split}" if cfg.remote else None,
            local=str(split_dir),
            batch_size=batch_size,
            shuffle=cfg.shuffle if shuffle is None else shuffle,
            shuffle_seed=cfg.shuffle_seed,
            shuffle_algo=cfg.shuffle_algo,
            num_canonical_nodes=cfg.num_canonical_nodes,
            validate_hash="xxh64" if cfg.remote and cfg.verify_hashes else None,
        )


def build_loader(cfg: LoaderConfig, split: str, batch_size: int, shuffle: Optional[bool] = None):
    """A StreamingDataLoader whose `state_dict()` resumes mid-epoch without replaying batches."""
    from streaming import StreamingDataLoader

    pad_id = read_manifest(cfg.path)["tokenizer"]["pad_id"]
    dataset = build_dataset(cfg, split, batch_size, shuffle)
    return StreamingDataLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=partial(collate, pad_id=pad_id),
        num_workers=cfg.num_workers,
        # Every rank must take the same number of steps, or the collectives hang.
        drop_last=True,
        persistent_workers=False,
        # Without its own generator, each new iterator draws a seed from the global torch RNG and
        # shifts every dropout mask after it; a resumed run creates its iterator at another point.
        generator=torch.Generator().manual_seed(cfg.shuffle_seed),
    )


def is_local_leader() -> bool:
    """True on one process per node (streaming's and torchrun's LOCAL_RANK)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0
