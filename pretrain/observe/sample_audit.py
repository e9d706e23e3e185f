"""The audit of samples trained on (train.record_samples): per rank and step, the sample ids, in the run folder.

Resume is exact when a resumed run's audit equals the uninterrupted run's; the tests compare them.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.jsonl import rewind_jsonl
from pretrain.run_dir import RunDir


class SampleAudit:
    """This rank's `samples/rank<N>.jsonl`: appended every step, rewound to the checkpoint a run resumes from."""

    def __init__(self, run_dir: RunDir, rank: int, world: int, enabled: bool) -> None:
        self.path: Path = run_dir.samples(rank)
        self.rank, self.world, self.enabled = rank, world, enabled

    def record(self, step: int, sample_ids: list) -> None:
        """Append the ids this rank trained on at `step`."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, "sample_ids": sample_ids}) + "\n")

    def rewind(self, last_step: int) -> None:
        """Drop the records of steps after the checkpoint we resume from (they will be redone).

        Each rank rewinds its own file; rank 0 also rewinds those of ranks that an elastic resume
        onto fewer ranks left behind, so the audit never shows a step twice.
        """
        paths = [self.path]
        if self.rank == 0:
            paths += [p for p in self.path.parent.glob("rank*.jsonl") if int(p.stem[4:]) >= self.world]
        for path in paths:
            rewind_jsonl(path, last_step)
