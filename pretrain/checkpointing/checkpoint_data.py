"""Checkpoint files read as data only: `torch.load(weights_only=True)` with the few plain types that DeepSpeed and
the trainer write, so a file that carries code is refused instead of run.

DeepSpeed reads its own files with the pickle loader (resume, `zero_to_fp32`, `ds_to_universal`). Export and resume
first read every file of the tag here, since a checkpoint may have come from elsewhere (a bucket others can write
to, a copied run folder): README, "What is refused, what is trusted".
"""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from core.distributed import import_deepspeed
from core.errors import CheckpointError


def plain_types() -> list[Any]:
    """The classes besides tensors and Python containers that checkpoints hold: each is rebuilt from its fields,
    none runs code of the file's choosing."""
    import numpy as np

    import_deepspeed()
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from pretrain.config import ScheduleConfig

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    # RNG states. numpy 1.x pickles arrays under numpy.core, numpy 2 under numpy._core: a run's checkpoints stay
    # readable across an upgrade (each name is the same function).
    numpy_arrays = [(_reconstruct, "numpy.core.multiarray._reconstruct"),
                    (_reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    deepspeed_state = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]  # ZeRO optimizer state
    return [*numpy_arrays, *deepspeed_state, ScheduleConfig]  # the LR schedule's fields, in the scheduler's state


EXPORT_TRUST = "Export it with --trust-checkpoint only if you trust where it came from"


def read_as_data(path: str | Path, how_to_trust: str = EXPORT_TRUST) -> Any:
    """A checkpoint file's contents, loaded without running code; a file that holds more than data is refused
    (`how_to_trust` ends the message: the option that reads it anyway)."""
    if not zipfile.is_zipfile(path):  # torch's pre-1.6 format, or no checkpoint: only the pickle loader reads it
        raise CheckpointError(f"checkpoint file '{path}' is not a zip archive, the format torch.save writes (damaged, "
                              f"or torch's old format, which only the pickle loader reads): refused unread. {how_to_trust}")
    try:
        with torch.serialization.safe_globals(plain_types()):
            # Memory-mapped: the check reads the pickled structure, and a tensor's bytes only if someone uses them.
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        found = str(exc).split("Unsupported global: GLOBAL ", 1)[-1].split(" ", 1)[0] if "GLOBAL " in str(exc) else "an object"
        raise CheckpointError(
            f"checkpoint file '{path}' holds more than weights and plain data ({found}), which loading would run as "
            f"code: refused unread. {how_to_trust}") from None


def check_tag_is_data(folder: Path, how_to_trust: str = EXPORT_TRUST) -> None:
    """Read every .pt file of a checkpoint tag as data (before DeepSpeed reads them with pickle)."""
    for path in sorted(Path(folder).rglob("*.pt")):
        read_as_data(path, how_to_trust)
