"""The run's checkpoints: which one to resume from, when to save, and what is saved beside the engine's
tensors (the loader's position, every rank's RNG states, the progress counters).

The trainer hands it the engine, the loader and the counters at save and restore, and asks it whether a
save is due; everything about checkpoint folders (tags, markers, hashes, damaged copies, world-size
conversion) lives here and in checkpoint.py.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional


from core import distributed as dist
from core.atomic_files import write_text_atomic
from core.config_io import config_hash
from core.errors import CheckpointError, ConfigError, UserError
from core.seeding import seed_all, seed_for
from data_pipeline.shards import data_fingerprint
from pretrain import checkpoint as ckpt
from pretrain.checkpoint_data import check_tag_is_data
from pretrain.checkpoint_dir import META, CheckpointDir, as_tag, universal_tag
from pretrain.config import RunConfig
from pretrain.optim import reset_schedule
from pretrain.progress import Progress
from pretrain.resume_checks import check_resume
from pretrain.run_dir import DATA_MANIFEST_FILE, RunDir


@dataclass(frozen=True)
class ResumePlan:
    """The chosen checkpoint, as the engine's set-up needs it: what it was saved with ({} when nothing is resumed) and
    whether it loads as a universal checkpoint (a DeepSpeed config flag, so known before deepspeed.initialize)."""

    meta: dict[str, Any]
    load_universal: bool = False


class CheckpointManager:
    """The run's checkpoints: choose the one to resume, decide when to save, save, restore."""

    def __init__(self, cfg: RunConfig, run_dir: RunDir, run_files: Optional[dict[str, str]] = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.folder = CheckpointDir(run_dir.checkpoints)
        self.rank, self.world = dist.rank(), dist.world_size()
        self.run_files = run_files or {}
        self.damaged: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.following_branch = False
        self.resume_tag: Optional[str] = None
        self.load_tag: Optional[str] = None
        self.longest_save = 0.0
        self.last_save_time = time.time()
        self.remote = None  # RemoteCheckpoints with train.checkpoint_remote, made by choose_checkpoint
        self.fetched: Optional[str] = None
        self.previous_data: Optional[dict[str, Any]] = None  # the checkpoint's manifest when the data changed
        self.plan = ResumePlan({})  # the chosen checkpoint's meta, and whether it loads through a universal copy

    # ---- which checkpoint -------------------------------------------------------------
    def choose_checkpoint(self) -> ResumePlan:
        """Pick the checkpoint to resume and check this launch against it (resume=never, tokenizer, data, objective,
        shape, ZeRO stage); what it was saved with, and whether it loads as a universal checkpoint.

        Runs before the DeepSpeed config is built: `auto` settings follow what the checkpoint was saved with. Rank 0
        fetches from the bucket, checks the files and sets damaged newer checkpoints aside (TAG.damaged); every rank
        gets its answer. The run's own checkpoints move (a train.resume_from branch, a universal copy) only when the
        trainer starts (`restore`), once everything is built.
        """
        train = self.cfg.train
        if train.checkpoint_remote:
            from pretrain.remote_checkpoints import RemoteCheckpoints

            self.remote = RemoteCheckpoints(train.checkpoint_remote, self.folder)
            if not train.resume_from and train.resume != "never":
                self.fetched = self.remote.fetch_for_resume()
        if train.resume == "never":
            if (latest := self.folder.latest()) is not None:
                raise ConfigError(f"train.resume=never but '{self.folder.root}' already holds checkpoints ({latest}); "
                                  "use a new train.output_dir, or resume=auto to continue")
            return self.plan
        branched_from: set[str] = set()
        if train.resume_from:
            as_tag(train.resume_from)  # a malformed value is refused on every rank, not on rank 0 while the rest wait
            if self.run_dir.branches.is_file():
                branched_from = {json.loads(row)["from"] for row in self.run_dir.branches.read_text().splitlines()}
        picked = self._pick(branched_from) if self.rank == 0 else (None, [], "", "")
        tag, damaged, error, note = dist.broadcast_object(*picked)
        if error:
            raise CheckpointError(error)
        self.damaged, self.notes = damaged, [note] if note else []  # logged at restore, once the run's logger exists
        self.following_branch = bool(note)
        self.resume_tag = self.load_tag = tag
        if tag is None:
            return self.plan
        meta = self.folder.meta(tag)
        self.previous_data = check_resume(self.folder.tag(tag), self.run_files, train.allow_new_data)
        if train.zero_stage != "auto" and meta.get("zero_stage", int(train.zero_stage)) != int(train.zero_stage):
            raise ConfigError(
                f"checkpoint {self.folder.tag(tag)} was saved with ZeRO stage {meta['zero_stage']} but this run uses "
                f"stage {train.zero_stage} (train.zero_stage); DeepSpeed cannot change the stage on "
                "resume: keep the stage, or export the weights and start a new run from them (model.init_from)")
        # A resume keeps the checkpoint's stage; stage 0 saves whole weights and optimizer states, which any number of
        # ranks loads, and a partitioned stage on another number of ranks loads through a universal copy.
        universal = meta.get("world_size", self.world) != self.world and meta.get("zero_stage", 0) != 0
        self.plan = ResumePlan(meta, load_universal=universal)
        return self.plan

    def _pick(self, branched_from: set[str]) -> tuple:
        """Rank 0's choice (`CheckpointDir.pick`), its files read as data first unless train.trust_checkpoint: DeepSpeed
        and the universal conversion unpickle them, and pickle runs what a file asks it to."""
        tag, damaged, error, note = self.folder.pick(self.cfg.train.resume_from, branched_from)
        if tag is not None and not error and not self.cfg.train.trust_checkpoint:
            try:
                check_tag_is_data(self.folder.tag(tag), "Resume from it with train.trust_checkpoint=true only if you "
                                                        "trust where it came from")
            except CheckpointError as exc:
                error = str(exc)
        return tag, damaged, error, note

    def _commit(self) -> None:
        """Go ahead with the chosen checkpoint, everything built: branch for train.resume_from, and make the universal
        copy to load when the world size changed (`ResumePlan.load_universal`, which the DeepSpeed config carries)."""
        tag = self.resume_tag
        if self.cfg.train.resume_from and not self.following_branch:  # the checks passed: only now may it move anything
            self._branch(tag)
        if not self.plan.load_universal:
            return
        meta = self.plan.meta
        error = ""
        if self.rank == 0:
            print(f"checkpoint {tag} was saved on {meta['world_size']} rank(s); converting it to a universal "
                  f"checkpoint to resume on {self.world}", flush=True)
            try:
                ckpt.convert_to_universal(self.folder.root, tag)
            except Exception as exc:  # every rank must learn of it, or the others wait forever
                error = str(exc) or type(exc).__name__
        (error,) = dist.broadcast_object(error)
        if error:
            raise RuntimeError(error)
        self.load_tag = universal_tag(tag)

    def _branch(self, tag: str) -> None:
        """Rank 0 moves the checkpoints after train.resume_from aside (kept, not deleted) and records the branch, so
        that an automatic resume (a requeue) follows the branch."""
        if self.rank == 0:
            later, aside = self.folder.set_aside_after(tag)
            if later:
                self.notes.append(f"branching from {tag} (train.resume_from): {', '.join(later)} moved aside to {aside}")
            # Recorded even when nothing moved: once the branch has saved, a requeue resumes the branch, not the tag.
            row = {"from": tag, "moved_aside": later, "to": aside.name if later else None, "time": time.time()}
            with open(self.run_dir.branches, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        dist.barrier()

    # ---- when to save -----------------------------------------------------------------
    def minutes_due(self) -> bool:
        """Whether train.save_every_minutes have passed since the last save (rank 0's clock; the ranks agree on it
        through the preemption guard's per-step exchange)."""
        minutes = self.cfg.train.save_every_minutes
        return bool(minutes) and self.rank == 0 and time.time() - self.last_save_time >= 60 * minutes

    def save_due(self, step: int, asked: bool) -> bool:
        """Whether to save after `step`: every train.save_every steps, at max_steps, or when asked (a stop, a
        preemption, a time-based save)."""
        return asked or step % self.cfg.train.save_every == 0 or step == self.cfg.train.max_steps

    def _record_new_data(self, step: int, log) -> None:
        """Rank 0 appends the switch to other data to the run's data history (the old dataset first, if unrecorded)."""
        now = json.loads(self.run_files[DATA_MANIFEST_FILE])
        log.info(f"resuming at step {step} on new data (train.allow_new_data): dataset {data_fingerprint(now)} replaces "
                 f"{data_fingerprint(self.previous_data)}; its sample order starts afresh")
        if self.rank != 0:
            return
        path = self.run_dir.data_history
        rows = path.read_text() if path.is_file() else json.dumps(self._history_row(self.previous_data, 0)) + "\n"
        write_text_atomic(path, rows + json.dumps(self._history_row(now, step)) + "\n")

    def _history_row(self, manifest: dict[str, Any], step: int) -> dict[str, Any]:
        return {"from_step": step, "dataset": data_fingerprint(manifest), "tokenizer": manifest["tokenizer"].get("hash"),
                "sources": [s.get("path") for s in manifest.get("sources", [])], "splits": manifest.get("splits")}

    # ---- save and restore -------------------------------------------------------------
    def _client_state(self, loader, progress: Progress) -> dict[str, Any]:
        progress.sync()  # every rank saves, so every rank is here: the totals then hold every step done
        return {
            "version": 1,
            **progress.state_dict(),  # step, samples_seen, tokens_seen, elapsed_s
            "world_size": self.world,
            "config_hash": config_hash(self.cfg),
            "loader": loader.state_dict(),
            # Streaming's state is global (the same on every rank); each rank's copy is kept to check that.
            "loader_per_rank": dist.all_gather_object(loader.state_dict()),
            # Lets ds_to_universal convert ZeRO-1/2 checkpoints for a resume on another world size.
            "universal_checkpoint_info": {"universal_checkpoint_version": 0.4},
            "rng": dist.all_gather_object(ckpt.rng_state()),
        }

    def save(self, engine, loader, progress: Progress, log) -> None:
        """Checkpoint the current step on every rank."""
        t0 = time.perf_counter()
        meta = {"step": progress.step, "world_size": self.world, "zero_stage": engine.zero_optimization_stage(),
                "precision": self.cfg.train.precision, "bf16_weights": engine.bfloat16_enabled()}
        tag = ckpt.save(engine, self.folder.root, progress.step, self._client_state(loader, progress), self.cfg.train.keep_last,
                        run_files={**self.run_files, META: json.dumps(meta) + "\n"})
        seconds = time.perf_counter() - t0
        self.longest_save = max(self.longest_save, seconds)
        self.last_save_time = time.time()
        log.info(f"saved checkpoint {self.folder.tag(tag)} in {seconds:.1f}s")
        if self.remote is not None:
            if self.rank == 0:
                self._upload(tag, log)
            dist.barrier()  # the others wait here, under the save's long timeout, not in the next step's short one

    def _upload(self, tag: str, log) -> None:
        """Mirror a saved checkpoint to the bucket. A failure is logged, not fatal: the local copy is whole, and the
        next save uploads its own checkpoint."""
        try:
            files, seconds, pruned = self.remote.upload(tag, self.cfg.train.keep_last)
        except UserError as exc:
            log.info(f"warning: checkpoint {tag} was not uploaded to {self.remote.url}: {exc}")
            log.scalars(int(tag.removeprefix("step_")), {"checkpoint_upload_failed": 1.0}, "checkpoint")
            return
        log.info(f"uploaded checkpoint {tag} to {self.remote.url} ({files} files, {seconds:.1f}s)"
                 + (f"; pruned {', '.join(pruned)} there" if pruned else ""))

    def restore(self, engine, loader, progress: Progress, log) -> None:
        """Continue from the chosen checkpoint, if any (branching or converting it first): weights, optimizer,
        schedule, loader, RNG, counters."""
        tag = self.resume_tag
        if tag is None:  # nothing to resume, or train.resume=never over an empty folder
            return
        self._commit()
        state = ckpt.load(engine, self.folder.root, self.load_tag)
        if self.load_tag != tag:
            dist.barrier()  # every rank has read the universal copy: it is no longer needed
            if self.rank == 0:
                shutil.rmtree(self.folder.tag(self.load_tag), ignore_errors=True)
        if state.get("config_hash") != config_hash(self.cfg):
            log.info("note: the config differs from the one the checkpoint was saved with; the current one applies")
        reset_schedule(engine.lr_scheduler, self.cfg.train.max_steps, self.cfg.schedule, self.cfg.optimizer.lr)
        progress.load_state_dict(state)
        if self.previous_data is None:
            loader.load_state_dict(state["loader"])
        else:  # train.allow_new_data: the new dataset is read from its start
            self._record_new_data(progress.step, log)
        if state["world_size"] == self.world:
            ckpt.set_rng_state(state["rng"][self.rank])
        else:
            seed_all(seed_for(self.cfg.train.seed, self.rank, progress.step))
        for note in self.notes:
            log.info(note)
        for bad, why in self.damaged:
            log.info(f"checkpoint {self.folder.tag(bad)} is damaged ({why}): set aside as {bad}.damaged")
            log.scalars(progress.step, {"damaged_checkpoint_step": float(bad.removeprefix("step_"))}, "resume")
        if self.fetched == tag:
            log.info(f"downloaded checkpoint {tag} from {self.remote.url} (no local checkpoint was as new)")
        log.info(f"resumed from {self.folder.tag(tag)} at step {progress.step}")
