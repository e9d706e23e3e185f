"""Preemption: signals and deadlines become a flag that all ranks agree on at a step boundary, which ends the run
with EXIT_PREEMPTED, or EXIT_INTERRUPTED after a Ctrl-C (pretrain/lifecycle/exit_status.py, the table of exit codes)."""
from __future__ import annotations

import datetime
import math
import os
import shutil
import subprocess
import time
from typing import Optional

import torch

from core import distributed as dist
from pretrain.lifecycle import signals


def parse_duration(text: str) -> float:
    """Seconds from "3600", "90m", "05:00" (minutes:seconds), "23:30:00", or SLURM's day forms "1-12", "1-12:30" and
    "1-12:30:00"."""
    text = text.strip()
    if not text:
        return 0.0
    if text[-1] in "smhd" and text[:-1].replace(".", "", 1).isdigit():
        return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]
    days = 0
    parts = [float(p) for p in text.split("-", 1)[-1].split(":")]
    if "-" in text:  # SLURM's D-H, D-H:M and D-H:M:S: after the days come hours first
        days = int(text.split("-", 1)[0])
        parts += [0.0] * (3 - len(parts))
    while len(parts) < 3:  # M:S and H:M:S (a bare number is seconds)
        parts.insert(0, 0.0)
    hours, minutes, seconds = parts
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if not math.isfinite(total):  # float() reads "nan" and "inf": a deadline that never comes
        raise ValueError(f"not a finite duration: {text!r}")
    return total


def run_deadline(start_time: float, max_wall_time: str, use_slurm_deadline: bool) -> Optional[float]:
    """The earlier of `train.max_wall_time` after the start and the SLURM job's end (epoch seconds), or None."""
    candidates = [start_time + parse_duration(max_wall_time)] if max_wall_time else []
    if use_slurm_deadline and (end := slurm_end_time()) is not None:
        candidates.append(end)
    return min(candidates) if candidates else None


def slurm_end_time() -> Optional[float]:
    """The current SLURM job's end time (epoch seconds), or None outside SLURM or when unknown."""
    try:  # set by newer SLURM releases; a value that is no time is asked of squeue instead
        end = float(os.environ.get("SLURM_JOB_END_TIME", "nan"))
        if math.isfinite(end):
            return end
    except ValueError:
        pass
    job = os.environ.get("SLURM_JOB_ID")
    if not job or shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=20).stdout.strip()
        return datetime.datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


class PreemptionGuard:
    """Turns SIGUSR1/SIGTERM/SIGHUP/SIGINT and the deadline into one decision per step, the same on every rank."""

    def __init__(self, deadline: Optional[float], margin_s: float) -> None:
        self.deadline = deadline
        self.margin_s = margin_s
        self.reason: Optional[str] = None
        signals.catch()  # already done by `python -m pretrain train`; needed when the trainer is used as a library

    def poll(self, step_seconds: float, save_seconds: float, save_due: bool) -> tuple[bool, bool]:
        """(stop, save) agreed by all ranks: stop if any rank got a signal or the deadline is near;
        save if any rank says a time-based save is due. One small all-reduce per step, on the CPU."""
        signals.training_started()  # from here SIGTERM, SIGHUP and SIGINT ask for a save and a stop, as SIGUSR1 does
        self.reason = self.reason or signals.first_received()
        local = self.reason is not None
        if not local and self.deadline is not None:
            # Stop while one more step and a save (with margin) still fit before the deadline.
            if time.time() + 2 * step_seconds + save_seconds + self.margin_s >= self.deadline:
                self.reason = "deadline"
                local = True
        flags = dist.control_all_reduce_sum(torch.tensor([1.0 if local else 0.0, 1.0 if save_due else 0.0], dtype=torch.float64))
        stop, save = bool(flags[0] > 0), bool(flags[1] > 0)
        if stop:  # every rank is here: agree on one reason, rank 0's if it has one, else the first rank's that does
            reasons = dist.all_gather_object(self.reason)
            rank, reason = next((r, why) for r, why in enumerate(reasons) if why is not None)
            self.reason = reason if rank == 0 else f"{reason} on rank {rank}"
        return stop, save

    @property
    def interrupted(self) -> bool:
        """Whether the agreed reason is a Ctrl-C (SIGINT): a person asked this run to stop, not a scheduler to pause
        it."""
        return self.reason is not None and self.reason.split(" on rank ")[0] == "SIGINT"
