"""Which checkpoint a launch resumes: picked (rank 0) and checked against the launch before the engine is built, since
`auto` settings follow what it was saved with; then, once everything is built, the train.resume_from branch or the
universal copy for another world size that resuming it takes."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

from core import distributed as dist
from core.errors import CheckpointError, ConfigError, UserError
from core.jsonl import append_jsonl, read_jsonl
from pretrain.checkpointing import checkpoint as ckpt
from pretrain.checkpointing.checkpoint_data import check_tag_is_data
from pretrain.checkpointing.checkpoint_dir import CheckpointDir, as_tag, universal_tag
from pretrain.config import RunConfig
from pretrain.checkpointing.resume_checks import check_resume
from pretrain.run_dir import RunDir


@dataclass(frozen=True)
class ResumePlan:
    """The chosen checkpoint, as the engine's set-up needs it: what it was saved with ({} when nothing is resumed) and
    whether it loads as a universal checkpoint (a DeepSpeed config flag, so known before deepspeed.initialize)."""

    meta: dict[str, Any]
    load_universal: bool = False


class ResumeChoice:
    """Which checkpoint this launch resumes, checked against the launch before the engine is built; and, once
    everything is built, the branch or the universal copy that resuming it takes (`commit`)."""

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
        self.remote = None  # RemoteCheckpoints with train.checkpoint_remote, made by choose
        self.fetched: Optional[str] = None
        self.previous_data: Optional[dict[str, Any]] = None  # the checkpoint's manifest when the data changed
        self.plan = ResumePlan({})  # the chosen checkpoint's meta, and whether it loads through a universal copy

    def choose(self) -> ResumePlan:
        """Pick the checkpoint to resume and check this launch against it (resume=never, tokenizer, data, objective,
        shape, ZeRO stage); what it was saved with, and whether it loads as a universal checkpoint.

        Runs before the DeepSpeed config is built: `auto` settings follow what the checkpoint was saved with. Rank 0
        fetches from the bucket, checks the files and sets damaged newer checkpoints aside (TAG.damaged); every rank
        gets its answer. The run's own checkpoints move (a train.resume_from branch, a universal copy) only at
        `commit`, once everything is built.
        """
        train = self.cfg.train
        if train.checkpoint_remote:
            from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints

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
                branched_from = {row["from"] for row in read_jsonl(self.run_dir.branches)}
        tag, damaged, note = dist.from_rank0(lambda: self._pick(branched_from), "choosing the checkpoint to resume")
        self.damaged, self.notes = damaged, [note] if note else []  # logged at the restore, by the checkpoint manager
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

    def _pick(self, branched_from: set[str]) -> tuple[Optional[str], list[tuple[str, str]], str]:
        """Rank 0's choice (`CheckpointDir.pick`: tag, damaged tags, branch note), its files read as data first unless
        train.trust_checkpoint: DeepSpeed and the universal conversion unpickle them, and pickle runs what a file asks
        it to."""
        tag, damaged, error, note = self.folder.pick(self.cfg.train.resume_from, branched_from)
        if error:
            raise CheckpointError(error)
        if tag is not None and not self.cfg.train.trust_checkpoint:
            check_tag_is_data(self.folder.tag(tag), "Resume from it with train.trust_checkpoint=true only if you "
                                                    "trust where it came from")
        return tag, damaged, note

    @property
    def branching_from(self) -> Optional[str]:
        """The checkpoint this launch branches from (train.resume_from, not yet followed by a requeue), else None."""
        return self.resume_tag if self.cfg.train.resume_from and not self.following_branch else None

    def commit(self) -> None:
        """Go ahead with the chosen checkpoint, everything built: branch for train.resume_from, and make the universal
        copy to load when the world size changed (`ResumePlan.load_universal`, which the DeepSpeed config carries)."""
        tag = self.resume_tag
        if self.cfg.train.resume_from and not self.following_branch:  # the checks passed: only now may it move anything
            self._branch(tag)
        if not self.plan.load_universal:
            return
        dist.from_rank0(lambda: self._convert(tag), f"converting checkpoint {tag} to a universal one")
        self.load_tag = universal_tag(tag)

    def _convert(self, tag: str) -> None:
        """Rank 0 writes the universal copy of `tag`."""
        print(f"checkpoint {tag} was saved on {self.plan.meta['world_size']} rank(s); converting it to a universal "
              f"checkpoint to resume on {self.world}", flush=True)
        ckpt.convert_to_universal(self.folder.root, tag)

    def discard_universal(self) -> None:
        """Remove the universal copy once every rank has loaded it."""
        if self.load_tag != self.resume_tag:
            dist.barrier()
            if self.rank == 0:
                shutil.rmtree(self.folder.tag(self.load_tag), ignore_errors=True)

    def _branch(self, tag: str) -> None:
        """Rank 0 moves the checkpoints after train.resume_from aside (kept, not deleted) and records the branch, so
        that an automatic resume (a requeue) follows the branch."""
        def set_aside() -> None:
            later, aside = self.folder.set_aside_after(tag)
            if later:
                self.notes.append(f"branching from {tag} (train.resume_from): {', '.join(later)} moved aside to {aside}")
            if self.remote is not None:
                try:
                    dropped = self.remote.forget_after(tag)
                except UserError as exc:  # as for an upload: the local branch is whole, the bucket's state is said
                    dropped = []
                    self.notes.append(f"warning: the checkpoints after {tag} in {self.remote.url} could not be "
                                      f"checked or taken out of it ({exc}); a resume from the bucket may take them")
                if dropped:
                    self.notes.append(f"branching from {tag}: {', '.join(dropped)} in {self.remote.url} no longer count "
                                      "as checkpoints (their markers deleted; the local copies are kept aside)")
            # Recorded even when nothing moved: once the branch has saved, a requeue resumes the branch, not the tag.
            row = {"from": tag, "moved_aside": later, "to": aside.name if later else None, "time": time.time()}
            append_jsonl(self.run_dir.branches, row)

        dist.from_rank0(set_aside, f"branching from checkpoint {tag}")
