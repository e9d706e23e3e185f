"""The training loop: a step, and the questions it asks after each one (log? evaluate? save? stop?).

The trainer knows no objective: the objective's forward takes a batch and returns
(loss, metrics), and batches come from the loader already masked (data_pipeline.batches.MaskingCollate),
so the training process only moves them to the device. It builds nothing: pretrain/run.py, the composition
root, hands it the engine, the loader, the checkpoint manager over the stateful parts, the validator, the
counters, the sample audit, the logger and the metrics reporter.
"""
from __future__ import annotations

import time
import traceback
from typing import Any, Iterator, Optional

import torch

from core import distributed as dist
from core.errors import InputDataError, refused_for_room
from core.process_life import to_stderr
from data_pipeline.dataset_dir import DatasetDir
from pretrain.checkpointing.checkpoint_dir import tag_for
from pretrain.checkpointing.checkpoint_manager import CheckpointManager
from pretrain.config import RunConfig
from pretrain.engine.deepspeed_engine import Engine, to_device
from pretrain.lifecycle.exit_status import exit_code_for, write_status_or_warn
from pretrain.observe.logger import RunLogger
from pretrain.observe.metrics import MetricsReporter
from pretrain.lifecycle.preemption import PreemptionGuard, run_deadline
from pretrain.observe.progress import Progress
from pretrain.run_dir import FAILED, PREEMPTED, RunDir
from pretrain.observe.sample_audit import SampleAudit
from pretrain.validation import Validator


class Trainer:
    """Runs `max_steps` optimizer steps of whatever the engine's objective is, resuming where a run stopped."""

    def __init__(self, cfg: RunConfig, *, engine: Engine, loader, checkpoints: CheckpointManager,
                 validator: Optional[Validator], metrics: MetricsReporter, log: RunLogger, progress: Progress,
                 audit: SampleAudit, run_dir: RunDir, run_files: dict[str, str], start_time: float) -> None:
        self.cfg, self.engine, self.loader, self.checkpoints = cfg, engine, loader, checkpoints
        self.validator, self.metrics, self.log, self.progress = validator, metrics, log, progress
        self.audit, self.run_dir, self.run_files, self.start_time = audit, run_dir, run_files, start_time
        self.accum, self.device = engine.accumulation, engine.device
        self._iter: Optional[Iterator] = None
        self.seq_len = 0

    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.progress.step

    def _next_batch(self) -> dict[str, torch.Tensor]:
        empty_passes = 0
        while True:
            if self._iter is None:
                self._iter = iter(self.loader)  # a new iterator is a new epoch for streaming
                empty_passes += 1
            try:
                return next(self._iter)
            except StopIteration:
                # One empty pass is a run resumed exactly at the end of a pass (its loader state says every sample
                # of that pass was taken); two in a row are a split too small for one batch.
                if empty_passes == 2:
                    raise InputDataError("the training split yields no full batch per epoch: prepare more data or lower "
                                         "train.micro_batch_size") from None
                self._iter = None

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_device(batch, self.device)

    def train_step(self) -> None:
        """One optimizer step over `accum` micro-batches; its metrics stay on the device until the next drain."""
        step = self.step + 1
        host: dict[str, Any] = {"lr": self.engine.lr(), "tokens": 0.0, "samples": 0.0, "data_wait_s": 0.0}
        sample_ids = []
        self.engine.module.begin_step(step)
        for micro in range(self.accum):
            t0 = time.perf_counter()
            batch = self._next_batch()
            host["data_wait_s"] += time.perf_counter() - t0
            if self.audit.enabled:
                sample_ids.append(batch["sample_id"].tolist())
            # Counted on the host batch before it moves, and read at the drain or a save: no device sync.
            tokens, samples = batch["attention_mask"].sum(), batch["input_ids"].shape[0]
            self.progress.count(samples, tokens)
            host["tokens"] += tokens
            host["samples"] += samples
            loss, metrics = self.engine.micro_step(self._to_device(batch), boundary=micro == self.accum - 1)
            self.metrics.window.add({"loss": loss, **metrics})
        self.progress.step = step
        self.seq_len = batch["input_ids"].shape[1]
        if sample_ids:
            self.audit.record(step, sample_ids)
        grad_norm = self.engine.grad_norm()
        if grad_norm is not None:
            host["grad_norm"] = grad_norm  # a float, or a device tensor read at the drain
        loss_scale = self.engine.loss_scale()
        if self.cfg.train.precision == "fp16" and loss_scale is not None:
            host["loss_scale"] = loss_scale
        self.metrics.window.end_step(step, host)

    def fit(self) -> str:
        """Train until max_steps, stop_after steps, preemption or a Ctrl-C; return 'finished', 'stopped', 'preempted' or
        'interrupted'."""
        max_steps = self.cfg.train.max_steps
        start_step = self._resume()
        if self.step >= max_steps:
            self.log.info(f"nothing to do: step {self.step} >= max_steps {max_steps}")
            self.log.close()
            return "finished"
        guard = self._begin()
        status, run_start = "finished", time.perf_counter()
        # The guard's handlers stay installed after the loop: a signal that arrives while the
        # process shuts down must not kill it before it exits with its status code.
        while self.step < max_steps:
            step_seconds = self._timed_step(first=self.step == start_step)
            stopping = bool(self.cfg.train.stop_after) and self.step - start_step >= self.cfg.train.stop_after
            if self._report((time.perf_counter() - run_start) / (self.step - start_step), stopping):
                self.checkpoints.poll_upload()  # after the rows up to this step
            preempt, time_save = guard.poll(step_seconds, self.checkpoints.longest_save, self.checkpoints.minutes_due())
            if self.checkpoints.save_due(self.step, stopping or time_save or preempt):
                last = stopping or preempt or self.step >= max_steps
                self._save(last, hurry=preempt)
                if not last:  # a signal, or the deadline, during the save: stop on the checkpoint just written (once
                    # its upload is in), not one step and a second save later
                    preempt, _ = guard.poll(step_seconds, self.checkpoints.longest_save, False)
                    if preempt:
                        self.checkpoints.finish_upload()
            if preempt and self.step < max_steps:  # the last step done: finished, nothing to requeue
                status = self._preempted(guard)
                break
            if stopping and self.step < max_steps:
                status = "stopped"
                self.log.info(f"stopping after {self.step - start_step} steps (train.stop_after) at step {self.step}")
                break
        self.progress.sync()
        self.log.info(f"{status} at step {self.step}: {self.progress.samples_seen} samples, "
                      f"{self.progress.tokens_seen} tokens, {self.progress.elapsed:.0f}s of training")
        self.log.close()
        return status

    def _resume(self) -> int:
        """Write the run files, continue from the chosen checkpoint (if any); this attempt's markers and later records
        are cleared."""
        if dist.rank() == 0:  # the run folder is self-contained for export from here on
            self.run_dir.write_run_files(self.run_files, DatasetDir(self.cfg.data.path).tokenizer)
            # This attempt is the one that counts now: cleared before the restore's first collective, so that no
            # rank's FAILED written after it goes too.
            self.run_dir.marker(PREEMPTED).unlink(missing_ok=True)
            self.run_dir.marker(FAILED).unlink(missing_ok=True)
        self.checkpoints.restore()
        # Whatever an earlier attempt logged after this step (or before its first checkpoint) is redone.
        self.audit.rewind(self.step)
        self.log.rewind(self.step)
        return self.step

    def _begin(self) -> PreemptionGuard:
        """The preemption guard for this attempt's deadline, and the line that says what is about to run."""
        cfg = self.cfg.train
        guard = PreemptionGuard(run_deadline(self.start_time, cfg.max_wall_time, cfg.use_slurm_deadline),
                                cfg.deadline_margin_s)
        self.log.info(
            f"training {type(self.engine.module).__name__} on {dist.world_size()} rank(s), accumulation {self.accum}, "
            f"global batch {cfg.global_batch_size}, from step {self.step} to {cfg.max_steps}"
            + (f", deadline in {guard.deadline - time.time():.0f}s" if guard.deadline else ""))
        self.metrics.rates.reset()
        return guard

    def _timed_step(self, first: bool) -> float:
        """One optimizer step; its seconds. After the first, a rank that does not answer in step_timeout_s is dead."""
        t_step = time.perf_counter()
        self.train_step()
        step_seconds = time.perf_counter() - t_step
        if first:
            # Every rank is past its first step (its slowest: set-up, data, compilation). A barrier first, or the
            # fastest rank would time out waiting for the others' first step.
            dist.barrier()
            dist.set_timeout(self.cfg.train.step_timeout_s)
        self.progress.elapsed += step_seconds
        return step_seconds

    def _report(self, sec_per_step: float, stopping: bool) -> bool:
        """At logging steps the metrics leave the device (the progress line with the pace); at evaluation steps,
        validation. Whether the metrics rows up to this step are logged."""
        cfg = self.cfg.train
        log_due = self.step % cfg.log_every == 0 or self.step == cfg.max_steps or stopping
        eval_due = bool(cfg.eval_every) and self.validator is not None and self.step % cfg.eval_every == 0
        if log_due or eval_due:
            self.metrics.drain(self.step, self.seq_len, sec_per_step if log_due else None)
        if eval_due:
            with dist.long_wait(cfg.init_timeout_s, after=cfg.step_timeout_s), self.metrics.rates.paused():
                val = {**self.validator(), "train_seconds": self.progress.elapsed}
            self.log.scalars(self.step, val, "validation")
            self.log.info(f"validation at step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in val.items()))
        return log_due or eval_due

    def _save(self, last: bool, hurry: bool) -> None:
        """Checkpoint this step on every rank (the step's metrics are logged first, so the log covers the checkpoint);
        `last` when the attempt ends on it, `hurry` when a signal or the deadline ends it."""
        self.metrics.drain(self.step, self.seq_len, None)
        with dist.long_wait(self.cfg.train.init_timeout_s, after=self.cfg.train.step_timeout_s), \
                self.metrics.rates.paused():  # may take minutes
            self.checkpoints.save(self.step, last, hurry)

    def _preempted(self, guard: PreemptionGuard) -> str:
        """Mark the run preempted, or interrupted by a Ctrl-C (its checkpoint is saved either way), on every rank before
        any exits; the status."""
        status = "interrupted" if guard.interrupted else "preempted"
        ending = ("stopping (the same command resumes)" if guard.interrupted else "exiting with code 75")
        self._mark(PREEMPTED, f"{status} ({guard.reason}) at step {self.step}: checkpoint saved, {ending}",
                   reason=guard.reason, deadline=guard.deadline, checkpoint=tag_for(self.step))
        # Every rank says so before any exits: srun --kill-on-bad-exit ends the others at the first exit 75.
        write_status_or_warn(status, step=self.step)
        dist.barrier()
        return status

    def mark_failed(self, exc: BaseException) -> None:
        """Record that the run stopped on an error (its type, message, step and rank) and end its logs before the error
        propagates; a marker that cannot be written (the disk that stopped the run is full) is logged, and the error
        goes on. Ending the logs waits for the trackers at most as long as at any run's end (CLOSE_WAIT_S).

        Every rank that fails writes it (the peers of one that failed alone only lose it, exit 76, and write none):
        rank 0's record replaces another's, which goes only where there is none. So an error every rank raises (a
        divergence) or relays (rank 0's, through a collective) is rank 0's, and one of another rank's alone is its."""
        try:
            self._mark(FAILED, f"failed at step {self.step}: {type(exc).__name__}: {exc}", on_this_rank=True,
                       error=type(exc).__name__, message=str(exc)[:2000], rank=dist.rank())
        except OSError as marker_error:  # not to the run folder's log either: it is on the same disk
            to_stderr(f"warning: the {FAILED} marker could not be written ({marker_error})")
        try:  # the rows that wait (the diverged step's) go to the trackers, whose runs end as failed, not left running
            self.log.close(exit_code_for(exc))
        except Exception as close_error:  # the run's own error is the one to raise: this one is said
            no_room = refused_for_room(close_error)
            to_stderr(f"warning: the run's logs could not be closed ({no_room})" if no_room is not None else
                      f"warning: the run's logs could not be closed:\n{traceback.format_exc().rstrip()}")

    def _mark(self, marker: str, line: str, on_this_rank: bool = False, **fields: Any) -> None:
        """Rank 0 writes a run-folder marker (PREEMPTED, FAILED) with the step and time, and `on_this_rank` another
        rank where the run has none; the log gets `line`."""
        if on_this_rank or dist.rank() == 0:
            self.run_dir.write_marker(marker, {"step": self.step, "time": time.time(), **fields},
                                      replace=dist.rank() == 0)
        self.log.info(line)
