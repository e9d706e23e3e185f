"""The run's counters: steps done, what was seen, time spent training. A stateful part of every checkpoint."""
from __future__ import annotations

from typing import Any

import torch

from core import distributed as dist


class Progress:
    """Where the run is and what it has seen, over all ranks.

    The trainer counts each micro-batch into it on its own rank (a host tensor: no read in the hot loop);
    `sync`, a collective every rank calls, sums the ranks' counts since the last sync into the run's totals.
    `state_dict` only reads them, so one rank may call it alone: whoever saves syncs first.
    """

    def __init__(self) -> None:
        self.step = 0
        self.elapsed = 0.0
        self._samples_seen = 0
        self._tokens_seen = 0
        self._samples = 0  # this rank's, since the last sum
        self._tokens = torch.zeros((), dtype=torch.int64)

    def count(self, samples: int, tokens: torch.Tensor) -> None:
        """Add one micro-batch of this rank: its sequences, and its non-padding tokens (a host tensor, not read here)."""
        self._samples += samples
        self._tokens = self._tokens + tokens

    def sync(self) -> None:
        """Add every rank's counts since the last sync to the totals (collective: every rank calls it)."""
        local = torch.tensor([self._samples, int(self._tokens)], dtype=torch.int64)
        summed = dist.control_all_reduce_sum(local)
        self._samples_seen += int(summed[0])
        self._tokens_seen += int(summed[1])
        self._samples, self._tokens = 0, torch.zeros((), dtype=torch.int64)

    @property
    def samples_seen(self) -> int:
        """Sequences trained on, all ranks, as of the last sync."""
        return self._samples_seen

    @property
    def tokens_seen(self) -> int:
        """Non-padding tokens trained on, all ranks, as of the last sync."""
        return self._tokens_seen

    def state_dict(self) -> dict[str, Any]:
        """The totals as of the last sync (no collective: a checkpoint syncs before it reads them)."""
        return {"step": self.step, "samples_seen": self._samples_seen, "tokens_seen": self._tokens_seen,
                "elapsed_s": self.elapsed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's totals."""
        self.step, self.elapsed = state["step"], state["elapsed_s"]
        self._samples_seen, self._tokens_seen = state["samples_seen"], state["tokens_seen"]
        self._samples, self._tokens = 0, torch.zeros((), dtype=torch.int64)
