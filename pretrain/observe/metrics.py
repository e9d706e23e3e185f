"""Training metrics kept on the device and read once per logging window: no host sync in the hot loop.

Each step's loss terms and metrics are summed over its micro-batches as device tensors; nothing is
turned into a Python number until `flush`, which runs one all-reduce for every step of the window
and returns each step's rank-averaged values (TensorBoard and metrics.jsonl still get a row per
step). Counts the host knows anyway (tokens and samples of the loader's CPU batch, seconds waited
for data) travel in the same all-reduce; per-step values that are the same on every rank (lr, grad
norm) are kept as they are and read at the flush.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Iterator, Optional, Union

import torch

from core import distributed as dist
from core.errors import DivergedError

# Host-side per-step counts: summed over ranks, not averaged.
TOTALS = ("tokens", "samples", "data_wait_s")
Scalar = Union[float, torch.Tensor]


class MetricWindow:
    """Per-step sums of micro-batch metrics for the steps since the last flush."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, list[str], torch.Tensor, dict[str, Scalar], int]] = []
        self._sums: dict[str, torch.Tensor] = {}
        # The open step's micro-batch sums as one float64 vector (keys in `_keys`): two kernels per micro-batch,
        # not two per metric.
        self._keys: tuple[str, ...] = ()
        self._vector: Optional[torch.Tensor] = None
        self._micro = 0

    def add(self, values: dict[str, torch.Tensor]) -> None:
        """Add one micro-batch's scalars, left on their device."""
        # In name order from the start: every rank's vectors line up in the flush's all-reduce, and the step's close
        # needs no reordering (indexing a device tensor by a Python list copies the list from pageable host memory,
        # which on a GPU waits for the device's queue).
        keys = tuple(sorted(values))
        if self._vector is not None and keys != self._keys:
            self._fold()  # another set of names than the earlier micro-batches': sum by name from here
        # Stacked in the values' common dtype (exact for fp32 and bf16), then summed in float64: the logged numbers
        # equal what float(value) summed in Python gave.
        vector = torch.stack([values[k].detach().reshape(()) for k in keys]).to(torch.float64) if keys else None
        if self._vector is None:
            self._keys, self._vector = keys, vector
        elif vector is not None:
            self._vector = self._vector + vector
        self._micro += 1

    def _fold(self) -> None:
        """Move the open vector into the per-name sums."""
        if self._vector is not None:
            for i, key in enumerate(self._keys):
                value = self._vector[i]
                self._sums[key] = self._sums[key] + value if key in self._sums else value
        self._keys, self._vector = (), None

    def end_step(self, step: int, host: dict[str, Scalar]) -> None:
        """Close the step: its device sums, its TOTALS counts and its rank-wide values (lr, grad norm)."""
        if not self._sums and self._vector is not None:  # the usual case: one vector, already in name order
            keys, stacked = list(self._keys), self._vector
        else:
            self._fold()
            keys = sorted(self._sums)
            stacked = torch.stack([self._sums[k] for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)
        self._steps.append((step, keys, stacked, dict(host), max(self._micro, 1)))
        self._sums, self._keys, self._vector, self._micro = {}, (), None, 0

    def __len__(self) -> int:
        return len(self._steps)

    def take_means(self, world: int) -> dict[str, float]:
        """The open sums averaged over their micro-batches and ranks, read at once (evaluation's one sync), then cleared."""
        self._fold()
        keys = sorted(self._sums)
        if not keys:
            return {}
        reduced = dist.all_reduce_sum(torch.stack([self._sums[k] for k in keys])).tolist()
        divisor = self._micro * world
        self._sums, self._micro = {}, 0
        return {k: v / divisor for k, v in zip(keys, reduced)}

    def flush(self, world: int) -> list[tuple[int, dict[str, float]]]:
        """(step, metrics) for every closed step, averaged over micro-batches and ranks, with one all-reduce."""
        if not self._steps:
            return []
        device = next((s.device for _, _, s, _, _ in self._steps if s.numel()), torch.device("cpu"))
        totals = torch.tensor([[float(host.get(k, 0.0)) for k in TOTALS] for *_, host, _ in self._steps], dtype=torch.float64)
        vector = torch.cat([*(s.to(device) for _, _, s, _, _ in self._steps), totals.reshape(-1).to(device)])
        reduced = dist.all_reduce_sum(vector).tolist()  # the window's one host sync
        out, offset = [], 0
        for step, keys, _, host, micro in self._steps:
            metrics = {k: v / (micro * world) for k, v in zip(keys, reduced[offset: offset + len(keys)])}
            offset += len(keys)
            metrics.update({k: float(v) for k, v in host.items() if k not in TOTALS})
            out.append((step, metrics))
        for i, (_, metrics) in enumerate(out):
            metrics.update(zip(TOTALS, reduced[offset + i * len(TOTALS): offset + (i + 1) * len(TOTALS)]))
        self._steps = []
        return out


class Rates:
    """Tokens, samples and data wait of the flushed steps since the last progress line, as rates."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new window now."""
        self.start, self.tokens, self.samples, self.wait = time.perf_counter(), 0.0, 0.0, 0.0

    def add(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Count flushed steps (totals over ranks; data wait per rank)."""
        for _, metrics in rows:
            self.tokens += metrics["tokens"]
            self.samples += metrics["samples"]
            self.wait += metrics["data_wait_s"]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time spent inside out of the window: a validation or a save is not training's pace, and counted
        in, it lowered tokens/s and MFU in every window after one."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - began

    def take(self) -> dict[str, float]:
        """tokens/s, samples/s and the fraction of wall time spent waiting for data; then a new window."""
        span = max(time.perf_counter() - self.start, 1e-9)
        out = {"tokens_per_s": self.tokens / span, "samples_per_s": self.samples / span, "data_wait_fraction": self.wait / span}
        self.reset()
        return out


class MetricsReporter:
    """What step metrics become: a TensorBoard / metrics.jsonl row per step, and at logging steps the
    progress line with tokens/s, model TFLOP/s, MFU, data wait and peak memory.

    `must_be_finite` names the values that stop the run when a step's is inf or NaN (at the drain, before
    any checkpoint of that step): bf16 and fp32 steps are not skipped on overflow, so a diverged step
    would otherwise train on and be saved. fp16 skips an overflowing step and lowers its loss scale
    (DeepSpeed's own rule), so there only the loss must stay finite.
    """

    def __init__(self, log, world: int, flops_per_token: Optional[Callable[[int], float]], peak_tflops: float,
                 precision: str) -> None:
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be resolved to fp32, bf16 or fp16, not {precision!r}")
        self.log, self.world = log, world
        self.flops_per_token, self.peak_tflops = flops_per_token, peak_tflops
        self.must_be_finite = ("loss",) if precision == "fp16" else ("loss", "grad_norm")
        self.window, self.rates = MetricWindow(), Rates()

    def drain(self, step: int, seq_len: int, sec_per_step: Optional[float]) -> None:
        """Read the window (one all-reduce), log its rows and, given the pace, the progress line at `step`."""
        rows = self.window.flush(self.world)
        for _, metrics in rows:
            metrics["data_wait_s"] /= self.world
        self.rates.add(rows)
        if sec_per_step is not None and rows:
            last = rows[-1][1]
            last.update(self.rates.take())
            self._throughput(last, seq_len)
            self.log.progress(step, last, sec_per_step)
        for step, metrics in rows:
            self.log.scalars(step, {k: v for k, v in metrics.items() if k not in ("tokens", "samples")}, "train")
        for step, metrics in rows:  # after the rows are logged, so the diverged step is on record
            bad = [f"{key} {metrics[key]}" for key in self.must_be_finite if key in metrics and not math.isfinite(metrics[key])]
            if bad:
                # The newest checkpoint holds the update that produced this step's values, so it may be the one
                # that diverged: the advice names an earlier one.
                raise DivergedError(f"training diverged at step {step}: {', '.join(bad)}; nothing of step {step} is "
                                    "saved, but the newest checkpoint may hold the weights that diverged: resume from "
                                    "an earlier one (train.resume_from=TAG) with a lower optimizer.lr or a longer "
                                    "schedule.warmup_steps")

    def _throughput(self, metrics: dict[str, float], seq_len: int) -> None:
        """Model TFLOP/s per device, MFU against the peak, and peak memory (max over ranks)."""
        if self.flops_per_token is not None and seq_len:
            per_device = self.flops_per_token(seq_len) * metrics["tokens_per_s"] / self.world / 1e12
            metrics["model_tflops_per_device"] = per_device
            if self.peak_tflops:
                metrics["mfu"] = per_device / self.peak_tflops
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        metrics["peak_memory_gib"] = max(dist.all_gather_object(peak))
