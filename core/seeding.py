"""The run's one seed formula: where each of its random streams starts.

What every rank must draw alike (the initial weights) starts from the run's seed; what must differ by rank
(dropout) from the seed and the rank; a resume that cannot restore the saved streams (another world size) moves
that by the step, so it does not replay the first steps' draws.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def seed_for(seed: int, rank: Optional[int] = None, step: int = 0) -> int:
    """The seed of one stream: `seed` for every rank alike (rank None), else one per rank, moved by `step`."""
    if rank is None:
        return seed
    return seed * 1000 + rank + 7919 * step


def seed_all(seed: int) -> None:
    """Seed torch's and numpy's global generators."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
