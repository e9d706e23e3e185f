"""The layout of a run's checkpoint folder, in one place (as run_dir.py is the run folder's): which tags are
complete, which are intact, what each was saved with, and its world-size-independent copy.

    checkpoints/
      step_NNNNNNNN/            DeepSpeed's files, the run files, meta.json, COMPLETE (written last: sizes, hashes)
      step_NNNNNNNN.damaged/    a complete tag whose files no longer match their hashes, set aside on resume
      step_NNNNNNNN_universal/  DeepSpeed's universal copy of a tag, made to resume on another world size
      latest                    DeepSpeed's pointer to the newest tag, for its own tools
      .step_NNNNNNNN_universal.tmp, .step_NNNNNNNN.download   a conversion's or a download's copy being written
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from core.atomic_files import fsync_folder, write_text_atomic
from core.errors import ConfigError

COMPLETE = "COMPLETE"
META = "meta.json"
LATEST = "latest"
TAG_RE = re.compile(r"^step_(\d{8})$")
# What a conversion or a download killed midway leaves (finished ones are renamed, or removed once loaded), and the
# pointer DeepSpeed's ds_to_universal writes beside them: none is read again, and each holds a checkpoint's size.
LEFTOVER_RE = re.compile(r"^(\.step_\d{8}(_universal\.tmp|\.download)|step_\d{8}_universal|latest_universal)$")


def tag_for(step: int) -> str:
    """Checkpoint tag of an optimizer step (zero-padded so names sort by step)."""
    return f"step_{step:08d}"


def as_tag(wanted: str) -> str:
    """train.resume_from as a tag: a step number becomes step_NNNNNNNN, a tag is taken as written, anything else is
    refused."""
    tag = tag_for(int(wanted)) if wanted.isdigit() else wanted
    if not TAG_RE.match(tag):
        raise ConfigError(f"config key 'train.resume_from': {wanted!r} is neither a step nor a tag like step_00000750")
    return tag


def file_digest(path: Path) -> str:
    """The xxh64 of a file's bytes."""
    import xxhash

    digest = xxhash.xxh64()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_manifest(folder: Path) -> dict[str, list]:
    """[size, xxh64] of every file in a checkpoint folder (its marker excepted), by relative path."""
    return {str(path.relative_to(folder)): [path.stat().st_size, file_digest(path)]
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != COMPLETE}


@dataclass(frozen=True)
class CheckpointDir:
    """One run's folder of checkpoint tags."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def tag(self, tag: str) -> Path:
        """A tag's folder."""
        return self.root / tag

    def is_complete(self, tag: str) -> bool:
        """Whether the tag's marker, written last, is there."""
        return (self.root / tag / COMPLETE).is_file()

    def complete_tags(self) -> list[str]:
        """Tags whose completion marker exists, oldest first; half-written ones are not listed."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if TAG_RE.match(p.name) and (p / COMPLETE).is_file())

    def latest(self) -> Optional[str]:
        """The newest complete tag, or None."""
        tags = self.complete_tags()
        return tags[-1] if tags else None

    def damage(self, tag: str) -> Optional[str]:
        """What is wrong with a complete tag's files against the sizes and hashes its marker recorded (None: intact).

        Markers written before hashes were recorded carry no list; such checkpoints count as intact.
        """
        folder = self.root / tag
        try:
            recorded = json.loads((folder / COMPLETE).read_text()).get("files")
        except (OSError, ValueError) as exc:
            return f"its {COMPLETE} marker cannot be read ({exc})"
        if recorded is None:
            return None
        for name, (size, _) in recorded.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} when saved"
        for name, (_, digest) in recorded.items():
            try:
                if file_digest(folder / name) != digest:
                    return f"{name} does not match the hash recorded when it was saved"
            except OSError as exc:  # a disk that fails a read is what these hashes are kept for: damage too
                return f"{name} cannot be read ({exc.strerror or exc})"
        return None

    def point_latest(self) -> None:
        """Point DeepSpeed's `latest` (read by its zero_to_fp32.py) at the newest complete tag, after tags moved aside
        or came in from the bucket; no pointer where there is none."""
        tag = self.latest()
        if tag is None:
            (self.root / LATEST).unlink(missing_ok=True)
        elif self.root.is_dir():
            write_text_atomic(self.root / LATEST, tag)

    def newest_intact(self, set_aside: bool = False) -> tuple[Optional[str], list[tuple[str, str]]]:
        """(newest complete tag whose files match its marker, [(damaged newer tag, what is wrong), ...]).

        With `set_aside`, a damaged tag is renamed to TAG.damaged (kept for inspection, no longer a
        checkpoint), so later saves and resumes do not read it again.
        """
        damaged = []
        for tag in reversed(self.complete_tags()):
            problem = self.damage(tag)
            if problem is None:
                return tag, damaged
            damaged.append((tag, problem))
            if set_aside:
                target = self.root / f"{tag}.damaged"
                shutil.rmtree(target, ignore_errors=True)
                (self.root / tag).rename(target)
                fsync_folder(self.root)  # after a crash of the machine, no resume finds the damaged tag back in place
                self.point_latest()
        return None, damaged

    def meta(self, tag: str) -> dict[str, Any]:
        """What a tag was saved with (world size, ZeRO stage, precision); {} for older checkpoints."""
        path = self.root / tag / META
        return json.loads(path.read_text()) if path.is_file() else {}

    def pick(self, wanted: str, branched_from: set[str]) -> tuple[Optional[str], list[tuple[str, str]], str, str]:
        """The tag a resume takes: train.resume_from (`wanted`) unless a branch from it has saved since
        (`branched_from`: the tags branched from before), else the newest intact one, damaged newer ones set aside
        as TAG.damaged.

        Returns (tag or None, [(damaged tag, what is wrong)], an error for the user or "", a note for the log or "").
        """
        tag = as_tag(wanted) if wanted else ""
        if tag and not (tag in branched_from and any(t > tag for t in self.complete_tags())):
            if not self.is_complete(tag):
                return tag, [], (f"train.resume_from={wanted}: no complete checkpoint {tag} in {self.root} "
                                 f"(complete: {', '.join(self.complete_tags()) or 'none'})"), ""
            problem = self.damage(tag)
            return tag, [], (f"train.resume_from={wanted}: checkpoint {self.root / tag} is damaged: {problem}"
                             if problem else ""), ""
        note = (f"train.resume_from={wanted} was applied by an earlier attempt and its branch has saved since: "
                "resuming the branch's newest checkpoint") if tag else ""  # a requeue after the branch saved
        newest, damaged = self.newest_intact(set_aside=True)
        error = ""
        if newest is None and damaged:
            error = (f"every checkpoint in {self.root} is damaged (" + "; ".join(f"{t}: {why}" for t, why in damaged)
                     + "); they were renamed to TAG.damaged. Start again with a new train.output_dir, or restore a "
                     "good copy")
        return newest, damaged, error, note

    def set_aside_after(self, tag: str) -> tuple[list[str], Path]:
        """Move the tags after `tag` (a branch's start) into one aside-after-TAG-TIME folder, kept, not deleted; the
        tags moved and that folder (not made when nothing moved)."""
        later = sorted(p.name for p in self.root.iterdir() if TAG_RE.match(p.name) and p.name > tag)
        aside = self.root / f"aside-after-{tag}-{time.strftime('%Y%m%dT%H%M%S')}"
        if later:
            aside.mkdir()
            for name in later:
                (self.root / name).rename(aside / name)
            fsync_folder(self.root)  # the branch's start, durable before it saves over the abandoned line's steps
            self.point_latest()
        return later, aside

    def remove_stale(self, newest: str, keep_last: int) -> None:
        """Keep the `keep_last` newest complete tags; remove older ones, the unmarked debris of killed saves, and what
        killed conversions and downloads left (a save comes after the load that used any of it)."""
        for old in self.complete_tags()[:-keep_last]:
            shutil.rmtree(self.root / old, ignore_errors=True)
        for debris in self.root.iterdir():
            if TAG_RE.match(debris.name) and debris.name < newest and not (debris / COMPLETE).is_file():
                shutil.rmtree(debris, ignore_errors=True)
            elif LEFTOVER_RE.match(debris.name):
                if debris.is_dir():
                    shutil.rmtree(debris, ignore_errors=True)
                else:
                    debris.unlink(missing_ok=True)


def universal_tag(tag: str) -> str:
    """Name of the universal (world-size independent) copy of a tag."""
    return f"{tag}_universal"
