"""The layout of a run's checkpoint folder, in one place (as run_dir.py is the run folder's): which tags are
complete, which are intact, what each was saved with, and its world-size-independent copy.

    checkpoints/
      step_NNNNNNNN/            DeepSpeed's files, the run files, meta.json, COMPLETE (written last: sizes, hashes)
      step_NNNNNNNN.damaged/    a complete tag whose files no longer match their hashes, set aside on resume
      step_NNNNNNNN_universal/  DeepSpeed's universal copy of a tag, made to resume on another world size
      latest                    DeepSpeed's pointer to the newest tag, for its own tools
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

COMPLETE = "COMPLETE"
META = "meta.json"
LATEST = "latest"
TAG_RE = re.compile(r"^step_(\d{8})$")


def tag_for(step: int) -> str:
    """Checkpoint tag of an optimizer step (zero-padded so names sort by step)."""
    return f"step_{step:08d}"


def file_manifest(folder: Path) -> dict[str, list]:
    """[size, xxh64] of every file in a checkpoint folder (its marker excepted), by relative path."""
    import xxhash

    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != COMPLETE:
            digest = xxhash.xxh64()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(chunk)
            out[str(path.relative_to(folder))] = [path.stat().st_size, digest.hexdigest()]
    return out


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
        actual = file_manifest(folder)
        for name, (_, digest) in recorded.items():
            if actual[name][1] != digest:
                return f"{name} does not match the hash recorded when it was saved"
        return None

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
        return None, damaged

    def meta(self, tag: str) -> dict[str, Any]:
        """What a tag was saved with (world size, ZeRO stage, precision); {} for older checkpoints."""
        path = self.root / tag / META
        return json.loads(path.read_text()) if path.is_file() else {}

    def remove_stale(self, newest: str, keep_last: int) -> None:
        """Keep the `keep_last` newest complete tags; remove older ones and the unmarked debris of killed saves."""
        for old in self.complete_tags()[:-keep_last]:
            shutil.rmtree(self.root / old, ignore_errors=True)
        for debris in self.root.iterdir():
            if TAG_RE.match(debris.name) and debris.name < newest and not (debris / COMPLETE).is_file():
                shutil.rmtree(debris, ignore_errors=True)


def universal_tag(tag: str) -> str:
    """Name of the universal (world-size independent) copy of a tag."""
    return f"{tag}_universal"
