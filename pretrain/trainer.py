"""The training loop: DeepSpeed engine, step-seeded batch transform, checkpoints with exact resume, logging.

The trainer knows nothing about objectives: the model's forward takes a batch and returns
(loss, metrics), and the batch transform (masking) is a callable given a seeded generator.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
from torch import nn

from core import distributed as dist
from core.atomic_files import write_text_atomic
from core.config_io import config_hash
from core.errors import CheckpointError, ConfigError, InputDataError
from model.diagnostics import headline
from pretrain import checkpoint as ckpt
from pretrain.config import RunConfig
from pretrain.ds_config import build_ds_config
from pretrain.hardware import device_peak_tflops
from pretrain.logger import RunLogger
from pretrain.metrics import MetricWindow, Rates, reduce_means
from pretrain.optim import build_optimizer, build_scheduler, reset_schedule
from pretrain.preemption import FAILED, PREEMPTED, PreemptionGuard, parse_duration, slurm_end_time

BatchTransform = Callable[[dict[str, torch.Tensor], torch.Generator], dict[str, torch.Tensor]]
EVAL_STREAM = 1 << 30  # keeps evaluation seeds apart from training seeds


def step_seed(seed: int, step: int, micro: int, rank: int) -> int:
    """Seed of the generator that transforms one micro-batch: a function of where it is, not of history."""
    return int(np.random.SeedSequence([seed, step, micro, rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


class Trainer:
    """Runs `max_steps` optimizer steps of whatever objective `model` is, resuming where a run stopped."""

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        transform: BatchTransform,
        train_loader,
        eval_loader=None,
        run_files: Optional[dict[str, str]] = None,
        eval_transform: Optional[BatchTransform] = None,
        unigram_entropy: Optional[float] = None,
        notes: tuple[str, ...] = (),
    ) -> None:
        import deepspeed

        self.cfg = cfg
        self.transform = transform
        # Validation shows every picked token as [MASK] (see data_pipeline.masking.evaluation_masking).
        self.eval_transform = eval_transform or transform
        self.unigram_entropy = unigram_entropy
        self.run_files = run_files or {}
        self.loader = train_loader
        self.eval_loader = eval_loader
        self.rank = dist.rank()
        self.world = dist.world_size()
        self.run_dir = Path(cfg.train.output_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        ds_config = build_ds_config(cfg, self.world)
        self.accum = ds_config["gradient_accumulation_steps"]
        self.zero_stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
        self.damaged_checkpoints: list[tuple[str, str]] = []
        self.resume_tag, self.load_tag = self._plan_resume(ds_config)
        offload = bool(ds_config.get("zero_optimization", {}).get("offload_optimizer"))
        optimizer = build_optimizer(model, cfg.optimizer, offload=offload)
        scheduler = build_scheduler(optimizer, cfg.train.max_steps, cfg.schedule)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self.device = self.engine.device
        self.log = RunLogger(self.run_dir, cfg.train.max_steps, enabled=self.rank == 0)
        self.step = 0
        self.samples_seen = 0
        self.tokens_seen = 0
        self.window, self.rates = MetricWindow(), Rates()
        self.elapsed = 0.0
        self._iter: Optional[Iterator] = None
        self.start_time = time.time()
        self.last_save_time = self.start_time
        self.longest_save = 0.0
        self.seq_len = 0
        for note in notes:  # what the run's builder decided for the user (e.g. the precision `auto` picked)
            self.log.info(note)
        self.peak_tflops, peak_source = cfg.train.peak_tflops, "train.peak_tflops"
        if not self.peak_tflops:
            self.peak_tflops, peak_source = device_peak_tflops(cfg.train.precision)
        self.log.info(f"MFU against {self.peak_tflops:.3g} TFLOP/s per device ({peak_source})")
        # Dropout differs per rank; a resume overwrites this with the saved states.
        torch.manual_seed(cfg.train.seed * 1000 + self.rank)
        np.random.seed((cfg.train.seed * 1000 + self.rank) % 2**32)

    # ---- data -------------------------------------------------------------------------
    def _next_batch(self) -> dict[str, torch.Tensor]:
        fresh = False
        while True:
            if self._iter is None:
                self._iter = iter(self.loader)  # a new iterator is a new epoch for streaming
                fresh = True
            try:
                return next(self._iter)
            except StopIteration:
                if fresh:
                    raise InputDataError("the training split yields no full batch per epoch: prepare more data or lower "
                                         "train.micro_batch_size") from None
                self._iter = None

    def _sample_log(self) -> Path:
        return self.run_dir / "samples" / f"rank{self.rank}.jsonl"

    def _truncate_sample_log(self, last_step: int) -> None:
        """Drop the records of steps after the checkpoint we resume from (they will be redone).

        Each rank rewinds its own file; rank 0 also rewinds those of ranks that an elastic resume
        onto fewer ranks left behind, so the audit never shows a step twice.
        """
        paths = [self._sample_log()]
        if self.rank == 0:
            paths += [p for p in self._sample_log().parent.glob("rank*.jsonl") if int(p.stem[4:]) >= self.world]
        for path in paths:
            if path.is_file():
                keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= last_step]
                write_text_atomic(path, "".join(line + "\n" for line in keep))

    # ---- checkpoints ------------------------------------------------------------------
    def _pick_checkpoint(self) -> Optional[str]:
        """The tag to resume from: train.resume_from, or the newest complete one whose files match their hashes.

        Rank 0 checks the files and sets damaged newer checkpoints aside (TAG.damaged); every rank gets its answer.
        """
        wanted = self.cfg.train.resume_from
        tag, damaged, error = None, [], ""
        if self.rank == 0:
            if wanted:
                tag = ckpt.tag_for(int(wanted)) if wanted.isdigit() else wanted
                if not (self.ckpt_dir / tag / ckpt.COMPLETE).is_file():
                    error = (f"train.resume_from={wanted}: no complete checkpoint {tag} in {self.ckpt_dir} "
                             f"(complete: {', '.join(ckpt.complete_tags(self.ckpt_dir)) or 'none'})")
                elif problem := ckpt.damage(self.ckpt_dir, tag):
                    error = f"train.resume_from={wanted}: checkpoint {self.ckpt_dir / tag} is damaged: {problem}"
            else:
                tag, damaged = ckpt.newest_intact(self.ckpt_dir, set_aside=True)
                if tag is None and damaged:
                    error = (f"every checkpoint in {self.ckpt_dir} is damaged ("
                             + "; ".join(f"{t}: {why}" for t, why in damaged)
                             + "); they were renamed to TAG.damaged. Start again with a new train.output_dir, "
                             "or restore a good copy")
        tag, damaged, error = dist.broadcast_object(tag, damaged, error)
        if error:
            raise CheckpointError(error)
        self.damaged_checkpoints = damaged  # logged once the run's logger exists (it is made after the engine)
        return tag

    def _plan_resume(self, ds_config: dict) -> tuple[Optional[str], Optional[str]]:
        """Which tag to resume from and which to load: a universal copy when the world size changed.

        Runs before deepspeed.initialize, because loading a universal checkpoint is a config flag.
        """
        if self.cfg.train.resume == "never":
            tag = ckpt.latest_complete(self.ckpt_dir)
            return tag, tag
        tag = self._pick_checkpoint()
        if tag is None:
            return tag, tag
        meta = ckpt.read_meta(self.ckpt_dir, tag)
        if meta.get("zero_stage", self.zero_stage) != self.zero_stage:
            raise ConfigError(
                f"checkpoint {self.ckpt_dir / tag} was saved with ZeRO stage {meta['zero_stage']} but this run uses "
                f"stage {self.zero_stage} ({self.cfg.train.deepspeed_config}); DeepSpeed cannot change the stage on "
                "resume: keep the stage, or export the weights and start a new run from them (model.init_from)"
            )
        if meta.get("world_size", self.world) == self.world:
            return tag, tag
        error = ""
        if self.rank == 0:
            print(f"checkpoint {tag} was saved on {meta['world_size']} rank(s); converting it to a universal "
                  f"checkpoint to resume on {self.world}", flush=True)
            try:
                ckpt.convert_to_universal(self.ckpt_dir, tag)
            except Exception as exc:  # every rank must learn of it, or the others wait forever
                error = str(exc) or type(exc).__name__
        (error,) = dist.broadcast_object(error)
        if error:
            raise RuntimeError(error)
        ds_config.setdefault("checkpoint", {})["load_universal"] = True
        return tag, ckpt.universal_tag(tag)


    def _client_state(self) -> dict[str, Any]:
        return {
            "version": 1,
            "step": self.step,
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "elapsed_s": self.elapsed,
            "world_size": self.world,
            "config_hash": config_hash(self.cfg),
            "loader": self.loader.state_dict(),
            # Streaming's state is global (the same on every rank); each rank's copy is kept to check that.
            "loader_per_rank": dist.all_gather_object(self.loader.state_dict()),
            # Lets ds_to_universal convert ZeRO-1/2 checkpoints for a resume on another world size.
            "universal_checkpoint_info": {"universal_checkpoint_version": 0.4},
            "rng": dist.all_gather_object(ckpt.rng_state()),
        }

    def save(self) -> None:
        """Checkpoint the current step on every rank."""
        t0 = time.perf_counter()
        meta = {"step": self.step, "world_size": self.world, "zero_stage": self.zero_stage,
                "precision": self.cfg.train.precision}
        tag = ckpt.save(self.engine, self.ckpt_dir, self.step, self._client_state(), self.cfg.train.keep_last,
                        run_files={**self.run_files, ckpt.META: json.dumps(meta) + "\n"})
        seconds = time.perf_counter() - t0
        self.longest_save = max(self.longest_save, seconds)
        self.last_save_time = time.time()
        self.log.info(f"saved checkpoint {self.ckpt_dir / tag} in {seconds:.1f}s")

    def _deadline(self) -> Optional[float]:
        cfg = self.cfg.train
        candidates = []
        if cfg.max_wall_time:
            candidates.append(self.start_time + parse_duration(cfg.max_wall_time))
        if cfg.use_slurm_deadline and (end := slurm_end_time()) is not None:
            candidates.append(end)
        return min(candidates) if candidates else None

    def maybe_resume(self) -> None:
        """Continue from the newest complete checkpoint in the output folder, if any."""
        tag = self.resume_tag
        if self.cfg.train.resume == "never":
            if tag is not None:
                raise ConfigError(f"train.resume=never but '{self.ckpt_dir}' already holds checkpoints ({tag}); "
                                  "use a new train.output_dir, or resume=auto to continue")
            return
        if tag is None:
            return
        state = ckpt.load(self.engine, self.ckpt_dir, self.load_tag)
        if self.load_tag != tag:
            dist.barrier()  # every rank has read the universal copy: it is no longer needed
            if self.rank == 0:
                import shutil

                shutil.rmtree(self.ckpt_dir / self.load_tag, ignore_errors=True)
        if state.get("config_hash") != config_hash(self.cfg):
            self.log.info("note: the config differs from the one the checkpoint was saved with; the current one applies")
        reset_schedule(self.engine.lr_scheduler, self.cfg.train.max_steps, self.cfg.schedule, self.cfg.optimizer.lr)
        self.step = state["step"]
        self.samples_seen = state["samples_seen"]
        self.tokens_seen = state["tokens_seen"]
        self.elapsed = state["elapsed_s"]
        self.loader.load_state_dict(state["loader"])
        if state["world_size"] == self.world:
            ckpt.set_rng_state(state["rng"][self.rank])
        else:
            torch.manual_seed(self.cfg.train.seed * 1000 + self.rank + 7919 * self.step)
        for bad, why in self.damaged_checkpoints:
            self.log.info(f"checkpoint {self.ckpt_dir / bad} is damaged ({why}): set aside as {bad}.damaged")
            self.log.scalars(self.step, {"damaged_checkpoint_step": float(bad.removeprefix("step_"))}, "resume")
        self.log.info(f"resumed from {self.ckpt_dir / tag} at step {self.step}")

    # ---- loop -------------------------------------------------------------------------
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self) -> None:
        """One optimizer step over `accum` micro-batches; its metrics stay on the device until `_flush`."""
        step = self.step + 1
        host: dict[str, Any] = {"lr": float(self.engine.get_lr()[0]), "tokens": 0.0, "samples": 0.0, "data_wait_s": 0.0}
        sample_ids = []
        for micro in range(self.accum):
            t0 = time.perf_counter()
            batch = self._next_batch()
            host["data_wait_s"] += time.perf_counter() - t0
            if self.cfg.train.record_samples:
                sample_ids.append(batch["sample_id"].tolist())
            generator = torch.Generator().manual_seed(step_seed(self.cfg.train.seed, step, micro, self.rank))
            batch = self.transform(batch, generator)
            # Counted on the host batch before it moves, and read at the flush: no device sync.
            host["tokens"] += batch["attention_mask"].sum()
            host["samples"] += batch["input_ids"].shape[0]
            loss, metrics = self.engine(self._to_device(batch))
            self.engine.backward(loss)
            self.engine.step()
            self.window.add({"loss": loss, **metrics})
        self.step = step
        self.seq_len = batch["input_ids"].shape[1]
        if sample_ids:
            path = self._sample_log()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(json.dumps({"step": step, "sample_ids": sample_ids}) + "\n")
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is not None:
            host["grad_norm"] = grad_norm  # a float, or a device tensor read at the flush
        loss_scale = getattr(self.engine.optimizer, "cur_scale", None) or getattr(self.engine.optimizer, "loss_scale", None)
        if self.cfg.train.precision == "fp16" and loss_scale is not None:
            host["loss_scale"] = loss_scale
        self.window.end_step(step, host)

    def _drain(self, sec_per_step: Optional[float]) -> None:
        """Read the window's metrics (one all-reduce), log a row per step, and the progress line if given its pace."""
        rows = self.window.flush(self.world)
        for _, metrics in rows:
            self.tokens_seen += int(metrics["tokens"])
            self.samples_seen += int(metrics["samples"])
            metrics["data_wait_s"] /= self.world
        self.rates.add(rows)
        if sec_per_step is not None and rows:
            last = rows[-1][1]
            last.update(self.rates.take())
            self._throughput(last)
            self.log.progress(self.step, last, sec_per_step)
        for step, metrics in rows:
            self.log.scalars(step, {k: v for k, v in metrics.items() if k not in ("tokens", "samples")}, "train")

    def _throughput(self, metrics: dict[str, float]) -> None:
        """Model TFLOP/s per device, MFU when the device's peak is known, and peak memory (max over ranks)."""
        flops_fn = getattr(self.engine.module, "flops_per_token", None)
        if flops_fn is not None and self.seq_len:
            per_device = flops_fn(self.seq_len, self.cfg.masking.mask_prob) * metrics["tokens_per_s"] / self.world / 1e12
            metrics["model_tflops_per_device"] = per_device
            if self.peak_tflops:
                metrics["mfu"] = per_device / self.peak_tflops
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        metrics["peak_memory_gib"] = max(dist.all_gather_object(peak))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean metrics over `eval_batches` validation batches (same batches and masks every time)."""
        self.engine.eval()
        sums: dict[str, torch.Tensor] = {}
        n = 0
        for i, batch in zip(range(self.cfg.train.eval_batches), self.eval_loader):
            generator = torch.Generator().manual_seed(step_seed(self.cfg.train.seed, EVAL_STREAM, i, self.rank))
            loss, metrics = self.engine(self._to_device(self.eval_transform(batch, generator)))
            for key, value in {"loss": loss, **metrics}.items():
                sums[key] = sums[key] + value.double() if key in sums else value.double()
            n += 1
        self.engine.train()
        if not n:
            return {}
        out = reduce_means(sums, n * self.world)
        return {**out, **headline(out, self.unigram_entropy)}

    def fit(self) -> str:
        """Train until max_steps, stop_after steps, or preemption; return 'finished', 'stopped' or 'preempted'."""
        cfg = self.cfg.train
        self.maybe_resume()
        if self.rank == 0:  # this attempt is the one that counts now
            (self.run_dir / PREEMPTED).unlink(missing_ok=True)
            (self.run_dir / FAILED).unlink(missing_ok=True)
        # Whatever an earlier attempt logged after this step (or before its first checkpoint) is redone.
        self._truncate_sample_log(self.step)
        self.log.rewind(self.step)
        start_step = self.step
        if self.step >= cfg.max_steps:
            self.log.info(f"nothing to do: step {self.step} >= max_steps {cfg.max_steps}")
            return "finished"
        guard = PreemptionGuard(self._deadline(), cfg.deadline_margin_s)
        self.log.info(
            f"training {type(self.engine.module).__name__} on {self.world} rank(s), accumulation {self.accum}, "
            f"global batch {cfg.global_batch_size}, from step {self.step} to {cfg.max_steps}"
            + (f", deadline in {guard.deadline - time.time():.0f}s" if guard.deadline else "")
        )
        self.rates.reset()
        run_start = time.perf_counter()
        status = "finished"
        # The guard's handlers stay installed after the loop: a signal that arrives while the
        # process shuts down must not kill it before it exits with its status code.
        while self.step < cfg.max_steps:
            t_step = time.perf_counter()
            self.train_step()
            step_seconds = time.perf_counter() - t_step
            self.elapsed += step_seconds
            stopping = bool(cfg.stop_after) and self.step - start_step >= cfg.stop_after
            log_due = self.step % cfg.log_every == 0 or self.step == cfg.max_steps or stopping
            eval_due = bool(cfg.eval_every) and self.eval_loader is not None and self.step % cfg.eval_every == 0
            if log_due or eval_due:
                self._drain((time.perf_counter() - run_start) / (self.step - start_step) if log_due else None)
            if eval_due:
                val = {**self.evaluate(), "train_seconds": self.elapsed}
                self.log.scalars(self.step, val, "validation")
                self.log.info(f"validation at step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in val.items()))
            minutes_due = bool(cfg.save_every_minutes) and self.rank == 0 and (
                time.time() - self.last_save_time >= 60 * cfg.save_every_minutes)
            preempt, time_save = guard.poll(step_seconds, self.longest_save, minutes_due)
            if self.step % cfg.save_every == 0 or self.step == cfg.max_steps or stopping or time_save or preempt:
                self._drain(None)  # the checkpoint records the tokens seen
                self.save()
            if preempt and self.step < cfg.max_steps:  # the last step done: finished, nothing to requeue
                status = "preempted"
                self._mark_preempted(guard.reason, guard.deadline)
                break
            if stopping and self.step < cfg.max_steps:
                status = "stopped"
                self.log.info(f"stopping after {self.step - start_step} steps (train.stop_after) at step {self.step}")
                break
        self.log.info(
            f"{status} at step {self.step}: {self.samples_seen} samples, {self.tokens_seen} tokens, "
            f"{self.elapsed:.0f}s of training"
        )
        self.log.close()
        return status

    def mark_failed(self, exc: BaseException) -> None:
        """Rank 0 records that the run stopped on an error (its type, message and step) before the error propagates."""
        if self.rank == 0:
            write_text_atomic(self.run_dir / FAILED, json.dumps({
                "step": self.step, "time": time.time(), "error": type(exc).__name__, "message": str(exc)[:2000]}) + "\n")
        self.log.info(f"failed at step {self.step}: {type(exc).__name__}: {exc}")

    def _mark_preempted(self, reason: Optional[str], deadline: Optional[float]) -> None:
        """Rank 0 records that this run stopped early with a complete checkpoint, why, and the deadline it kept."""
        if self.rank == 0:
            write_text_atomic(self.run_dir / PREEMPTED, json.dumps({
                "step": self.step, "reason": reason, "time": time.time(), "deadline": deadline,
                "checkpoint": ckpt.tag_for(self.step)}) + "\n")
        self.log.info(f"preempted ({reason}) at step {self.step}: checkpoint saved, exiting with code 75")
        dist.barrier()
