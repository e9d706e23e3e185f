"""The run's one seed formula: where each of its random streams starts.

What every rank must draw alike (the initial weights) starts from the run's seed; what must differ by rank
(dropout) from the seed and the rank; a resume that cannot restore the saved streams (another world size) moves
that by the step, so it does not replay the first steps' draws.
"""
from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import torch


# The largest seed torch's generators take (64 bits unsigned): data.shuffle_seed's bound.
MAX_SEED = 2**64 - 1
# train.seed's: each rank's and step's stream (seed_for: seed · 1000 + rank + 7919 · step) stays within MAX_SEED.
MAX_RUN_SEED = MAX_SEED // 1000 - 2**40


def seed_for(seed: int, rank: Optional[int] = None, step: int = 0) -> int:
    """The seed of one stream: `seed` for every rank alike (rank None), else one per rank, moved by `step`."""
    if rank is None:
        return seed
    return seed * 1000 + rank + 7919 * step


def seed_all(seed: int) -> None:
    """Seed torch's and numpy's global generators."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    """This process's RNG states (DeepSpeed saves none; dropout needs them for exact resume)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class RunRng:
    """A rank's random streams during training, a stateful part of every checkpoint, started and moved by `seed_for`.

    `state_dict` is this rank's streams; a checkpoint keeps every rank's (the manager gathers them). A resume on the
    same world size restores this rank's; on another, where the saved streams do not map onto the ranks, each rank
    starts afresh from the seed formula moved by the step.
    """

    def __init__(self, seed: int, rank: int, world: int) -> None:
        self.seed, self.rank, self.world = seed, rank, world

    def start(self) -> None:
        """Seed this rank's streams for a run's first step (dropout differs per rank)."""
        seed_all(seed_for(self.seed, self.rank))

    def state_dict(self) -> dict[str, Any]:
        """This rank's streams now."""
        return rng_state()

    def load_state_dict(self, per_rank: list[dict[str, Any]], step: int) -> None:
        """Continue from a checkpoint's streams, one per saved rank; `step`: where the run resumes."""
        if len(per_rank) == self.world:
            set_rng_state(per_rank[self.rank])
        else:
            seed_all(seed_for(self.seed, self.rank, step))
