"""Streaming loader over prepared MDS shards: deterministic order, resumable state, padded batches."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from data_pipeline.shards import read_manifest


@dataclass
class LoaderConfig:
    """Where the prepared data is and how it is shuffled and read."""

    path: str = "runs/data"
    shuffle: bool = True
    shuffle_seed: int = 1234
    shuffle_algo: str = "py1e"
    # Fixed, so the global sample order does not depend on how many nodes read it.
    num_canonical_nodes: int = 1
    num_workers: int = 0


def collate(samples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of samples to the longest one; keep each sample's id for auditing the order."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = np.full((len(samples), width), pad_id, dtype=np.int64)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = s["input_ids"]
    input_ids = torch.from_numpy(ids)
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad_id).long(),
        "sample_id": torch.tensor([int(s["sample_id"]) for s in samples], dtype=torch.long),
    }


def build_dataset(cfg: LoaderConfig, split: str, batch_size: int, shuffle: Optional[bool] = None):
    """A StreamingDataset over one split of a prepared dataset."""
    from streaming import StreamingDataset

    split_dir = Path(cfg.path) / split
    if not (split_dir / "index.json").is_file():
        raise FileNotFoundError(f"no '{split}' split in '{cfg.path}' (missing {split_dir / 'index.json'})")
    return StreamingDataset(
        local=str(split_dir),
        batch_size=batch_size,
        shuffle=cfg.shuffle if shuffle is None else shuffle,
        shuffle_seed=cfg.shuffle_seed,
        shuffle_algo=cfg.shuffle_algo,
        num_canonical_nodes=cfg.num_canonical_nodes,
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
