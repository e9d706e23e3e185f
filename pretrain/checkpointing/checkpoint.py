"""Saving and loading a checkpoint: DeepSpeed's files per tag, the run files beside them, a completion marker
written last with every file's size and hash; the fp32 weights of any stage; the universal copy.

Which tags exist, are complete and intact is the folder's own knowledge (checkpoint_dir.py)."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

from core import distributed as dist
from core.atomic_files import fsync_tree, room_refusal, write_text_atomic
from core.errors import CheckpointError, NoSpaceError, refused_for_room
from pretrain.checkpointing.checkpoint_dir import COMPLETE, LATEST, CheckpointDir, file_manifest, tag_for, universal_tag

if TYPE_CHECKING:  # annotations only: deepspeed is imported where an engine is built
    from deepspeed import DeepSpeedEngine


def save(engine: DeepSpeedEngine, ckpt_dir: Path, step: int, client_state: dict[str, Any], keep_last: int,
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
    with _named_if_no_room(ckpt_dir, tag):
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)

    # save_checkpoint ends with a barrier, so every rank's files are written here.
    def mark_complete() -> None:
        with _named_if_no_room(ckpt_dir, tag):
            for name, text in (run_files or {}).items():
                write_text_atomic(ckpt_dir / tag / name, text)
            fsync_tree(ckpt_dir / tag)  # a marked checkpoint must survive a crash of the machine
            # Sizes and hashes let a resume tell a damaged copy (a full disk, a bad transfer) from a good one.
            marker = {"step": step, "time": time.time(), "files": file_manifest(ckpt_dir / tag)}
            write_text_atomic(ckpt_dir / tag / COMPLETE, json.dumps(marker) + "\n", fsync=True)
        write_text_atomic(ckpt_dir / LATEST, tag)  # DeepSpeed's own pointer, for its tools
        CheckpointDir(ckpt_dir).remove_stale(tag, keep_last)

    # The others learn of a failure here at once, not at their next collective's timeout.
    dist.from_rank0(mark_complete, f"marking checkpoint {tag} complete")
    return tag


@contextlib.contextmanager
def _named_if_no_room(ckpt_dir: Path, tag: str) -> Iterator[None]:
    """A failure of the block for want of room becomes the NoSpaceError that names the checkpoint; any other goes on."""
    try:
        yield
    except Exception as exc:
        full = no_room_to_save(exc, ckpt_dir, tag)
        if full is None:
            raise
        raise full from exc


def no_room_to_save(exc: BaseException, ckpt_dir: Path, tag: str) -> Optional[NoSpaceError]:
    """The error to stop with when a save failed for want of room (a full disk, a quota, a file size limit), which
    the user must fix before any attempt can save; None when the failure was something else."""
    room = refused_for_room(exc)
    if room is None and not dist.is_peer_failure(exc):
        room = room_refusal(ckpt_dir / tag if (ckpt_dir / tag).is_dir() else ckpt_dir)
    if room is None:
        return None
    newest = CheckpointDir(ckpt_dir).latest()
    return NoSpaceError(
        f"checkpoint {tag} could not be written in {ckpt_dir}: {room.strerror or room}. It does not count (no "
        f"{COMPLETE} marker), and the next save removes what it wrote; the newest complete checkpoint is "
        f"{newest or 'none'}. Free space (or lower train.keep_last, or choose another train.output_dir), then run "
        "the same command again")


def load(engine: DeepSpeedEngine, ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Load model, optimizer and scheduler state into the engine; return the client state."""
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        raise CheckpointError(f"checkpoint '{ckpt_dir / tag}' could not be loaded (missing or corrupt files)")
    return client_state


# DeepSpeed's file of the module's whole state at stages 0-2 (at stage 3 each rank writes a placeholder instead).
MODULE_STATES = "mp_rank_00_model_states.pt"
# ZeRO-3: rank 0's module-states file (every name, empty placeholders; the trainer's client state is in it too).
ZERO3_MODULE_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"


def rank0_module_states(tag_dir: Path) -> Optional[Path]:
    """The module-states file rank 0 wrote for a tag, whatever its ZeRO stage; None when there is none."""
    for name in (MODULE_STATES, ZERO3_MODULE_STATES):
        if (tag_dir / name).is_file():
            return tag_dir / name
    return None


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


def untrained_state(ckpt_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """A checkpoint's module entries, for what DeepSpeed's universal load leaves out (buffers, frozen parameters).

    Stages 0-2 keep the whole module in one file, read memory-mapped (only the entries copied are read); ZeRO-3
    spreads frozen parameters over every rank's files, consolidated as the export does, without its progress lines.
    """
    folder = Path(ckpt_dir) / tag
    if (folder / MODULE_STATES).is_file():
        # With pickle, as DeepSpeed's own load of the same files: a resume checks the tag first (checkpoint_data).
        return torch.load(folder / MODULE_STATES, map_location="cpu", weights_only=False, mmap=True)["module"]
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fp32_weights(ckpt_dir, tag)


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Convert a tag with DeepSpeed's ds_to_universal (once; rank 0 only); return the universal tag."""
    import io
    import sys

    from deepspeed.checkpoint import ds_to_universal

    target = ckpt_dir / universal_tag(tag)
    if (target / COMPLETE).is_file():
        return target.name
    tmp = ckpt_dir / f".{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # In this process (DeepSpeed is imported already; a subprocess would spend seconds importing it again),
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
        (ckpt_dir / "latest_universal").unlink(missing_ok=True)  # ds_to_universal's pointer to the .tmp name
    write_text_atomic(tmp / COMPLETE, json.dumps({"from": tag}) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target.name
