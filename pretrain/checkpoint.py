"""Checkpoints: DeepSpeed's files per tag, a completion marker written last with every file's size and hash,
resume from the newest complete checkpoint whose files still match."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from core import distributed as dist
from core.atomic_files import write_text_atomic
from core.errors import CheckpointError

COMPLETE = "COMPLETE"
TAG_RE = re.compile(r"^step_(\d{8})$")


def tag_for(step: int) -> str:
    """Checkpoint tag of an optimizer step (zero-padded so names sort by step)."""
    return f"step_{step:08d}"


def complete_tags(ckpt_dir: str | Path) -> list[str]:
    """Tags whose completion marker exists, oldest first; half-written ones are not listed."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if TAG_RE.match(p.name) and (p / COMPLETE).is_file()]
    return sorted(tags)


def latest_complete(ckpt_dir: str | Path) -> Optional[str]:
    """The newest complete tag, or None."""
    tags = complete_tags(ckpt_dir)
    return tags[-1] if tags else None


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


def damage(ckpt_dir: str | Path, tag: str) -> Optional[str]:
    """What is wrong with a complete checkpoint's files against the sizes and hashes its marker recorded (None: intact).

    Markers written before hashes were recorded carry no list; such checkpoints count as intact.
    """
    folder = Path(ckpt_dir) / tag
    try:
        recorded = json.loads((folder / COMPLETE).read_text()).get("files")
    except (OSError, ValueError) as exc:
        return f"its {COMPLETE} marker cannot be read ({exc})"
    if recorded is None:
        return None
    for name, (size, digest) in recorded.items():
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


def newest_intact(ckpt_dir: str | Path, set_aside: bool = False) -> tuple[Optional[str], list[tuple[str, str]]]:
    """(newest complete tag whose files match its marker, [(damaged newer tag, what is wrong), ...]).

    With `set_aside`, a damaged tag is renamed to TAG.damaged (kept for inspection, no longer a
    checkpoint), so later saves and resumes do not read it again.
    """
    damaged = []
    for tag in reversed(complete_tags(ckpt_dir)):
        problem = damage(ckpt_dir, tag)
        if problem is None:
            return tag, damaged
        damaged.append((tag, problem))
        if set_aside:
            target = Path(ckpt_dir) / f"{tag}.damaged"
            shutil.rmtree(target, ignore_errors=True)
            (Path(ckpt_dir) / tag).rename(target)
    return None, damaged


def rng_state() -> dict[str, Any]:
    """This process's RNG states (DeepSpeed saves none; dropout needs them for exact resume)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    """Flush every file of a checkpoint (and the folder entries) to stable storage."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(engine, ckpt_dir: Path, step: int, client_state: dict[str, Any], keep_last: int,
         run_files: Optional[dict[str, str]] = None) -> str:
    """Save on every rank; rank 0 marks the tag complete after all ranks finished, then prunes old tags.

    `run_files` (name -> text, e.g. the resolved config) are written into the tag folder, so a
    checkpoint can be exported whatever later happens to the run folder's own copies.
    """
    tag = tag_for(step)
    if dist.rank() == 0:
        # A folder of this tag without a marker is the debris of a killed save: start clean.
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)
    dist.barrier()
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    # save_checkpoint ends with a barrier, so every rank's files are written here.
    if dist.rank() == 0:
        for name, text in (run_files or {}).items():
            write_text_atomic(ckpt_dir / tag / name, text)
        _fsync_tree(ckpt_dir / tag)  # a marked checkpoint must survive a crash of the machine
        # Sizes and hashes let a resume tell a damaged copy (a full disk, a bad transfer) from a good one.
        marker = {"step": step, "time": time.time(), "files": file_manifest(ckpt_dir / tag)}
        write_text_atomic(ckpt_dir / tag / COMPLETE, json.dumps(marker) + "\n", fsync=True)
        write_text_atomic(ckpt_dir / "latest", tag)  # DeepSpeed's own pointer, for its tools
        for old in complete_tags(ckpt_dir)[:-keep_last]:
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
        # Unmarked folders of earlier steps are debris of saves that were killed.
        for debris in ckpt_dir.iterdir():
            if TAG_RE.match(debris.name) and debris.name < tag and not (debris / COMPLETE).is_file():
                shutil.rmtree(debris, ignore_errors=True)
    dist.barrier()
    return tag


def load(engine, ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Load model, optimizer and scheduler state into the engine; return the client state."""
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        raise CheckpointError(f"checkpoint '{ckpt_dir / tag}' could not be loaded (missing or corrupt files)")
    return client_state


META = "meta.json"
# DeepSpeed's file of the module's whole state at stages 0-2 (at stage 3 each rank writes a placeholder instead).
MODULE_STATES = "mp_rank_00_model_states.pt"


def fp32_weights(ckpt_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """Every weight and buffer of a checkpoint, floats in fp32, whatever its ZeRO stage and precision.

    The fp32 master partitions (ZeRO 1-3, and bf16 / fp16 optimizer wrappers) win; the module states fill in
    what they lack: everything at stage 0 (no partitions), and frozen parameters at stage 1 (DeepSpeed writes
    them to the ZeRO files from stage 2 only). At stage 0 with fp16 weights the fp32 masters are not read:
    the weights are their fp16 copies.
    """
    folder = Path(ckpt_dir) / tag
    state: dict[str, torch.Tensor] = {}
    if any(folder.glob("*zero_pp_rank_*_optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = dict(get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag))
    if (folder / MODULE_STATES).is_file():
        # With pickle, as DeepSpeed's consolidation above: export checks the tag first (checkpoint_data).
        module = torch.load(folder / MODULE_STATES, map_location="cpu", weights_only=False)["module"]
        for name, value in module.items():
            if name not in state:
                state[name] = value.float() if value.is_floating_point() else value
    if not state:
        raise CheckpointError(f"checkpoint '{folder}' has neither DeepSpeed's ZeRO files nor {MODULE_STATES}")
    return state


def read_meta(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """What a checkpoint was saved with (world size, ZeRO stage, precision); {} for older checkpoints."""
    path = Path(ckpt_dir) / tag / META
    return json.loads(path.read_text()) if path.is_file() else {}


def universal_tag(tag: str) -> str:
    """Name of the universal (world-size independent) copy of a tag."""
    return f"{tag}_universal"


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Convert a tag with DeepSpeed's ds_to_universal (once; rank 0 only); return the universal tag."""
    import contextlib
    import io
    import sys

    from deepspeed.checkpoint import ds_to_universal

    target = ckpt_dir / universal_tag(tag)
    if (target / COMPLETE).is_file():
        return target.name
    tmp = ckpt_dir / f".{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # In this process (DeepSpeed is imported already; a subprocess would spend ~8 s importing it again),
    # with one worker each, so it forks nothing.
    argv, sys.argv = sys.argv, ["ds_to_universal", "--input_folder", str(ckpt_dir / tag), "--output_folder", str(tmp),
                                "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"]
    output = io.StringIO()
    try:
        args = ds_to_universal.parse_arguments()
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            ds_to_universal.main(args)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, Exception):  # Ctrl-C or SystemExit stays what it is
            raise
        raise RuntimeError(f"converting {ckpt_dir / tag} to a universal checkpoint failed: {exc}\n{output.getvalue()[-3000:]}") from exc
    finally:
        sys.argv = argv
    write_text_atomic(tmp / COMPLETE, json.dumps({"from": tag}) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target.name
