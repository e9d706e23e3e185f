"""Rank-0 run log: a progress line with ETA on stdout, the same in train.log, scalars in TensorBoard and metrics.jsonl."""
from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Optional

from core.errors import refused_for_room
from core.jsonl import cut_partial_line, rewind_jsonl
from core.process_life import to_stdout
from pretrain.run_dir import TENSORBOARD, RunDir


def _fmt_eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(0.0, seconds))))


class RunLogger:
    """Writes only on rank 0; every other rank gets a logger that does nothing."""

    def __init__(self, run_dir: RunDir, max_steps: int, enabled: bool, report_to: tuple[str, ...] = (TENSORBOARD,),
                 config: Optional[dict] = None, branch: Optional[str] = None) -> None:
        self.enabled = enabled
        self.max_steps = max_steps
        self._writer = None
        self._text = self._jsonl = None
        self.trackers = None
        self._held: list[tuple[int, dict[str, float], str]] = []  # rows for the trackers, until the rewind
        if enabled:
            run_dir.root.mkdir(parents=True, exist_ok=True)  # the logs come first: the run files wait for training
            self.tb_dir = run_dir.tensorboard
            if TENSORBOARD in report_to:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.tb_dir))
            self._text = open(run_dir.text_log, "a", buffering=1)
            # A row a kill cut short is cut off before one is appended onto it (a resume's row comes before the rewind).
            cut_partial_line(run_dir.metrics)
            self._jsonl = open(run_dir.metrics, "a", buffering=1)
            if set(report_to) - {TENSORBOARD}:
                from pretrain.observe.trackers import Trackers

                self.trackers = Trackers(run_dir, list(report_to), config or {}, branch)

    def rewind(self, step: int) -> None:
        """Forget what a previous attempt logged after `step` (it is redone): metrics.jsonl and TensorBoard."""
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self._jsonl.close()
        path = self._jsonl.name
        rows = rewind_jsonl(Path(path), step)
        self._jsonl = open(path, "a", buffering=1)
        if self.trackers is not None:
            if rows:
                self.trackers.resumed(max(row["step"] for row in rows))
            self.trackers.open()
            for held in self._held:
                self.trackers.log(*held, new=True)
            self._held.clear()
        if self._writer is not None:
            self._writer.close()
            # TensorBoard drops events at or after purge_step that earlier sessions wrote.
            self._writer = SummaryWriter(str(self.tb_dir), purge_step=step + 1)

    def info(self, message: str) -> None:
        """A plain message to stdout and train.log."""
        if not self.enabled:
            return
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        to_stdout(line)  # a console that hung up (its SIGHUP may be a moment behind) takes no line: train.log does
        if self._text.closed:  # after a close that raised (the run's error is recorded after it): stdout has the line
            return
        try:
            self._text.write(line + "\n")
        except OSError as exc:  # the run folder's disk is full: stdout has the line, and the save says so in its own
            if refused_for_room(exc) is None:
                raise

    def scalars(self, step: int, values: dict[str, float], prefix: str, before_rewind: bool = False) -> None:
        """Scalars to TensorBoard, metrics.jsonl and the trackers; a row `before_rewind` (what a resume found) goes to
        the trackers once the rewind knows which steps their runs already have (`Trackers.log`'s new rows)."""
        if not self.enabled:
            return
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(f"{prefix}/{key}", value, step)
        if self.trackers is not None and before_rewind:
            self._held.append((step, values, prefix))
        elif self.trackers is not None:
            self.trackers.log(step, values, prefix)
            self._tracker_warnings()
        self._jsonl.write(json.dumps({"step": step, "split": prefix, **values}) + "\n")

    def progress(self, step: int, metrics: dict[str, float], sec_per_step: Optional[float]) -> None:
        """The progress line: step, loss, lr, throughput, ETA."""
        if not self.enabled:
            return
        eta = _fmt_eta((self.max_steps - step) * sec_per_step) if sec_per_step else "?"
        extra = ""
        if "model_tflops_per_device" in metrics:
            extra += f" | {metrics['model_tflops_per_device']:.2f} TFLOP/s/dev"
        if "mfu" in metrics:
            extra += f" | MFU {100 * metrics['mfu']:.1f}%"
        self.info(
            f"step {step}/{self.max_steps} | loss {metrics['loss']:.4f} | lr {metrics['lr']:.2e} | "
            f"{metrics.get('tokens_per_s', 0.0):,.0f} tok/s | {metrics.get('samples_per_s', 0.0):.1f} samples/s{extra} | "
            f"ETA {eta}"
        )

    def _tracker_warnings(self) -> None:
        """Log what the trackers' services did since the last look (a failure, a recovery)."""
        for line in self.trackers.messages():
            self.info(f"warning: {line}")

    def close(self, exit_code: int = 0) -> None:
        """End the tracked runs (as failed where `exit_code` is not 0), then flush and close the files; once, each part
        whatever the one before it raised."""
        if not self.enabled or self._text.closed:
            return
        try:
            if self.trackers is not None:  # first: bounded in time, and on none of the run's disks, which may be full
                self.trackers.close(exit_code)
                self._tracker_warnings()
        finally:
            try:
                if self._writer is not None:
                    self._writer.flush()
                    self._writer.close()
            finally:
                self._text.close()
                self._jsonl.close()
