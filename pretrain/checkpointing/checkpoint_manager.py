"""The run's checkpoints over its stateful parts: when to save, what a save holds beside the engine's tensors (the
loader's position, every rank's RNG streams, the progress counters), and the restore of all of them.

It is handed the parts once (pretrain/run.py); `save(step, last, hurry)` and `restore()` take nothing more. Which checkpoint to
resume is chosen before the engine exists (resume_choice.py); everything about checkpoint folders (tags, markers,
hashes, damaged copies) lives in checkpoint_dir.py and checkpoint.py.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

import yaml

from core import distributed as dist
from core.atomic_files import write_text_atomic
from core.config_io import config_changes, config_hash, config_to_dict
from core.errors import ConfigError, UserError
from core.seeding import RunRng
from data_pipeline.loader import LoaderConfig, check_loader_partition
from data_pipeline.shards import data_fingerprint
from pretrain.checkpointing.checkpoint_dir import META
from pretrain.checkpointing.parameter_layout import (built_groups, built_layout, group_differences, layout_differences,
                                                     layout_refusal, saved_groups, saved_layout)
from pretrain.checkpointing.remote_checkpoints import Upload
from pretrain.checkpointing.resume_choice import ResumeChoice
from pretrain.config import RunConfig
from pretrain.engine.deepspeed_engine import Engine
from pretrain.lifecycle.exit_status import record_progress
from pretrain.observe.logger import RunLogger
from pretrain.observe.progress import Progress
from pretrain.run_dir import CONFIG_FILE, DATA_MANIFEST_FILE, RunDir

# A resume's note names at most this many changed config keys.
MAX_CHANGES_SHOWN = 12
# Keys whose launch value a resume does not take: the loader's state carries them, and streaming reads the sample order
# on from where the checkpoint left it only with the values that order was drawn with.
KEPT_FROM_CHECKPOINT = ("data.num_canonical_nodes", "data.shuffle_seed", "data.shuffle", "data.shuffle_algo")


class CheckpointManager:
    """Save and restore the engine, the loader, the progress counters and the RNG streams, and say when a save is due."""

    def __init__(self, cfg: RunConfig, run_dir: RunDir, choice: ResumeChoice, run_files: dict[str, str], *,
                 engine: Engine, loader, progress: Progress, rng: RunRng, log: RunLogger) -> None:
        self.cfg, self.run_dir, self.choice, self.run_files = cfg, run_dir, choice, run_files
        self.folder = choice.folder
        self.engine, self.loader, self.progress, self.rng, self.log = engine, loader, progress, rng, log
        self.rank, self.world = dist.rank(), dist.world_size()
        self._longest_save = 0.0
        self.last_save_time = time.time()
        self._upload: Optional[Upload] = None  # rank 0's upload in the background
        self._upload_save_s = 0.0  # the seconds its checkpoint took to save

    # ---- when to save -----------------------------------------------------------------
    @property
    def longest_save(self) -> float:
        """The longest save so far, its upload included: what the preemption guard budgets for the attempt's last
        save. An upload still running in the background counts with the seconds it has taken so far."""
        upload = self._upload
        running = self._upload_save_s + min(upload.elapsed, upload.bound_s) if upload is not None else 0.0
        return max(self._longest_save, running)

    def minutes_due(self) -> bool:
        """Whether train.save_every_minutes have passed since the last save (rank 0's clock; the ranks agree on it
        through the preemption guard's per-step exchange)."""
        minutes = self.cfg.train.save_every_minutes
        return bool(minutes) and self.rank == 0 and time.time() - self.last_save_time >= 60 * minutes

    def save_due(self, step: int, asked: bool) -> bool:
        """Whether to save after `step`: every train.save_every steps, at max_steps, or when asked (a stop, a
        preemption, a time-based save)."""
        return asked or step % self.cfg.train.save_every == 0 or step == self.cfg.train.max_steps

    def _record_new_data(self, step: int) -> None:
        """Rank 0 appends the switch to other data to the run's data history (the old dataset first, if unrecorded)."""
        now, previous = json.loads(self.run_files[DATA_MANIFEST_FILE]), self.choice.previous_data
        self.log.info(f"resuming at step {step} on new data (train.allow_new_data): dataset {data_fingerprint(now)} replaces "
                 f"{data_fingerprint(previous)}; its sample order starts afresh")
        if self.rank != 0:
            return
        path = self.run_dir.data_history
        rows = path.read_text() if path.is_file() else json.dumps(self._history_row(previous, 0)) + "\n"
        write_text_atomic(path, rows + json.dumps(self._history_row(now, step)) + "\n")

    def _history_row(self, manifest: dict[str, Any], step: int) -> dict[str, Any]:
        return {"from_step": step, "dataset": data_fingerprint(manifest), "tokenizer": manifest["tokenizer"].get("hash"),
                "sources": [s.get("path") for s in manifest.get("sources", [])], "splits": manifest.get("splits")}

    # ---- save and restore -------------------------------------------------------------
    def _client_state(self) -> dict[str, Any]:
        self.progress.sync()  # every rank saves, so every rank is here: the totals then hold every step done
        return {
            "version": 1,
            **self.progress.state_dict(),  # step, samples_seen, tokens_seen, elapsed_s
            "world_size": self.world,
            "config_hash": config_hash(self.cfg),
            "loader": self.loader.state_dict(),
            # Streaming's state is global (the same on every rank); each rank's copy is kept to check that.
            "loader_per_rank": dist.all_gather_object(self.loader.state_dict()),
            # Lets ds_to_universal convert ZeRO-1/2 checkpoints for a resume on another world size.
            "universal_checkpoint_info": {"universal_checkpoint_version": 0.4},
            "rng": dist.all_gather_object(self.rng.state_dict()),
        }

    def save(self, step: int, last: bool = False, hurry: bool = False) -> None:
        """Checkpoint `step` on every rank (the progress counters are at it); rank 0 then uploads it
        (train.checkpoint_remote): in the background while training goes on, or, for the save that ends the attempt
        (`last`), while the others wait. The previous checkpoint's upload ends first; with `hurry` (a preemption, a
        deadline), the attempt's last save gives it up instead of waiting for it: its own checkpoint, uploaded next,
        is newer."""
        if self.choice.remote is not None:
            # It must not outlast its local copy (this save prunes to keep_last), nor run beside this one's upload.
            self._settle("given up for the newer checkpoint this stop saves" if last and hurry else None,
                         after=self.cfg.train.init_timeout_s)
        t0 = time.perf_counter()
        meta = {"step": step, "world_size": self.world, "zero_stage": self.engine.zero_stage,
                "precision": self.cfg.train.precision, "bf16_weights": self.engine.bf16_weights}
        tag = self.engine.save_checkpoint(self.folder.root, step, self._client_state(), self.cfg.train.keep_last,
                                          run_files={**self.run_files, META: json.dumps(meta) + "\n"})
        saved_s = time.perf_counter() - t0
        self.log.info(f"saved checkpoint {self.folder.tag(tag)} in {saved_s:.1f}s")
        if self.rank == 0:  # (every save of an attempt follows a step of it: progress)
            self._record_progress(step)
        if self.choice.remote is not None and last:
            self._while_others_wait(lambda: self._end_upload(self._start_upload(tag, saved_s), None),
                                    f"uploading checkpoint {tag}", after=self.cfg.train.init_timeout_s)
        elif self.choice.remote is not None and self.rank == 0:
            self._upload = self._start_upload(tag, saved_s)
        # What the preemption guard budgets for the last save before a deadline (a background upload's seconds join it
        # when it ends), and where train.save_every_minutes counts from.
        self._longest_save = max(self._longest_save, time.perf_counter() - t0)
        self.last_save_time = time.time()

    def _record_progress(self, step: int) -> None:
        """Tell the batch script this attempt got past its start (its crash count restarts there); a status folder
        that cannot take it costs the job a forgiven crash, not the run."""
        try:
            record_progress(step)
        except OSError as exc:
            self.log.info(f"warning: the attempt's progress could not be recorded in PRETRAIN_STATUS_DIR ({exc})")

    def _start_upload(self, tag: str, saved_s: float) -> Upload:
        """Rank 0 starts mirroring a saved checkpoint to the bucket."""
        self._upload_save_s = saved_s
        return Upload(self.choice.remote, tag, self.cfg.train.keep_last, self.cfg.train.checkpoint_upload_timeout_s)

    def _end_upload(self, upload: Optional[Upload], give_up: Optional[str]) -> None:
        """Wait for an upload within its bound (or give it up at once, `give_up` saying why) and say how it went. A
        failure is logged, not fatal: the local copy is whole, and the next save uploads its own checkpoint."""
        if upload is None:
            return
        remote = self.choice.remote
        try:
            files, seconds, pruned = upload.wait(give_up)
        except UserError as exc:
            self.log.info(f"warning: checkpoint {upload.tag} was not uploaded to {remote.url}: {exc}")
            self.log.scalars(self.progress.step, {"checkpoint_upload_failed": 1.0}, "checkpoint")
            seconds = upload.elapsed
        else:
            self.log.info(f"uploaded checkpoint {upload.tag} to {remote.url} ({files} files, {seconds:.1f}s)"
                          + (f"; pruned {', '.join(pruned)} there" if pruned else ""))
        self._longest_save = max(self._longest_save, self._upload_save_s + seconds)

    def _settle(self, give_up: Optional[str], after: float) -> None:
        """Rank 0 ends its background upload (see `_end_upload`) while the others wait for it, as long as it may take."""
        upload, self._upload = self._upload, None

        def settle() -> None:
            if upload is not None and give_up is None and not upload.done:
                self.log.info(f"waiting for the upload of checkpoint {upload.tag} to {self.choice.remote.url} "
                              f"({upload.elapsed:.0f}s so far)")
            self._end_upload(upload, give_up)

        self._while_others_wait(settle, "waiting for a checkpoint's upload", after=after)

    def _while_others_wait(self, upload_work: Callable[[], None], doing: str, after: float) -> None:
        """Rank 0 does `upload_work` while the others wait at a collective. They wait longer than rank 0 may upload
        (train.checkpoint_upload_timeout_s): a slow bucket is rank 0's warning, not a peer lost at the usual bound
        (`after`)."""
        bound = self.cfg.train.checkpoint_upload_timeout_s + self.cfg.train.init_timeout_s
        with dist.long_wait(bound, after=after):
            dist.from_rank0(upload_work, doing)

    def poll_upload(self) -> None:
        """Say how rank 0's background upload went once it has ended (no collective). Called after the step's metrics
        rows are logged: a tracker refuses a row at an earlier step than one it has. One past its bound is given up. An
        upload that ended on a bug is left to the next save, where every rank raises its error, not rank 0 alone."""
        upload = self._upload
        if upload is None or (not upload.done and upload.elapsed < upload.bound_s) or upload.ended_on_a_bug:
            return
        self._upload = None
        self._end_upload(upload, None)

    def finish_upload(self) -> None:
        """Wait for rank 0's background upload, the others with it: the attempt stops on the checkpoint it uploads."""
        if self.choice.remote is not None:
            self._settle(None, after=self.cfg.train.step_timeout_s)

    def restore(self) -> None:
        """Continue from the chosen checkpoint, if any (branching or converting it first): weights, optimizer,
        schedule, loader, RNG streams, counters."""
        choice = self.choice
        tag = choice.resume_tag
        if tag is None:  # nothing to resume, or train.resume=never over an empty folder
            check_loader_partition(self.loader)
            return
        self._check_layout(tag)  # before commit: a refused resume branches and converts nothing
        choice.commit()
        state = self.engine.load_checkpoint(self.folder.root, choice.load_tag)
        if choice.load_tag != tag:
            loaded = self.engine.load_untrained_state(self.folder.root, tag)
            self.log.info(f"loaded {loaded} buffer(s) and frozen parameter(s) from {tag} itself (the universal copy "
                          "holds the trained parameters only)")
        choice.discard_universal()
        if state.get("config_hash") != config_hash(self.cfg):
            changes = self._changes(tag)
            # (Not on new data, train.allow_new_data: its order starts afresh, with the launch's values.)
            kept = [c for c in changes if c.split(" ", 1)[0] in KEPT_FROM_CHECKPOINT and choice.previous_data is None]
            applied = [c for c in changes if c not in kept]
            if applied or not kept:
                self.log.info(f"note: the config differs from the one checkpoint {tag} was saved with{_listed(applied)}; "
                              "the current one applies")
            if kept:
                self.log.info(f"note: {', '.join(c.split(' ', 1)[0] for c in kept)} differ from checkpoint {tag}'s "
                              f"({', '.join(kept)}), but the loader's state keeps the checkpoint's: the sample order "
                              "resumes as it started (a new run takes the new values)")
        self.progress.load_state_dict(state)
        if choice.previous_data is None:
            self.loader.load_state_dict(state["loader"])
            # streaming takes these from the state in the process that iterates; the next epoch's loader workers are
            # made from this process's copy, which would draw that epoch's order with the launch's values instead.
            order = {**self._saved_order(tag), **state["loader"]}
            for key in ("num_canonical_nodes", "shuffle_seed", "initial_physical_nodes", "shuffle", "shuffle_algo"):
                if key in order:
                    setattr(self.loader.dataset, key, order[key])
        else:  # train.allow_new_data: the new dataset is read from its start
            self._record_new_data(self.progress.step)
        check_loader_partition(self.loader)  # with the checkpoint's canonical nodes and its first node count
        self.rng.load_state_dict(state["rng"], self.progress.step)  # one per saved rank
        self._report(tag)

    def _check_layout(self, tag: str) -> None:
        """Refuse a checkpoint whose parameters are not the built model's (an option, or the code, that builds the
        model changed). Rank 0 reads the checkpoint; every rank learns the outcome, or the others would wait on."""
        def compare() -> None:
            tag_dir, module = self.folder.tag(tag), self.engine.module
            differences = (layout_differences(saved_layout(tag_dir), built_layout(module))
                           or group_differences(saved_groups(tag_dir), built_groups(module)))
            if differences:
                raise ConfigError(layout_refusal(self.folder.tag(tag), differences, _listed(self._changes(tag))))

        dist.from_rank0(compare, f"comparing checkpoint {tag}")

    def _saved_config(self, tag: str) -> Optional[dict[str, Any]]:
        """The config a checkpoint was saved with, as a dict; None where it has none (older checkpoints)."""
        saved = self.folder.tag(tag) / CONFIG_FILE
        return (yaml.safe_load(saved.read_text(encoding="utf-8")) or {}) if saved.is_file() else None

    def _saved_order(self, tag: str) -> dict[str, Any]:
        """data.shuffle and data.shuffle_algo from the config a checkpoint was saved with (its loader state records
        them only since they are kept from it); {} where it has no config."""
        saved = self._saved_config(tag)
        if saved is None:
            return {}
        data = saved.get("data") or {}
        defaults = LoaderConfig()  # a key the saved config leaves out had its default
        return {key: data.get(key, getattr(defaults, key)) for key in ("shuffle", "shuffle_algo")}

    def _changes(self, tag: str) -> list[str]:
        """'KEY OLD -> NEW' for each key that differs from the config saved in the checkpoint (none where it has none)."""
        saved = self._saved_config(tag)
        return [] if saved is None else config_changes(saved, config_to_dict(self.cfg))

    def _report(self, tag: str) -> None:
        """Log what the resume found and did: branch notes, damaged checkpoints set aside, a download."""
        choice, log = self.choice, self.log
        for note in choice.notes:
            log.info(note)
        for bad, why in choice.damaged:
            log.info(f"checkpoint {self.folder.tag(bad)} is damaged ({why}): set aside as {bad}.damaged")
            log.scalars(self.progress.step, {"damaged_checkpoint_step": float(bad.removeprefix("step_"))}, "resume",
                        before_rewind=True)
        if choice.fetched == tag:
            log.info(f"downloaded checkpoint {tag} from {choice.remote.url} (no intact local checkpoint was as new)")
        log.info(f"resumed from {self.folder.tag(tag)} at step {self.progress.step}")


def _listed(changes: list[str]) -> str:
    """' (KEY OLD -> NEW, ...)', at most MAX_CHANGES_SHOWN of them, or ''."""
    shown = ", ".join(changes[:MAX_CHANGES_SHOWN]) + (f", and {len(changes) - MAX_CHANGES_SHOWN} more"
                                                      if len(changes) > MAX_CHANGES_SHOWN else "")
    return f" ({shown})" if changes else ""
