"""Where a benchmark's figures came from: the CPU (its model, bf16 flags, cores) or the GPU, the versions that matter,
and the commit. Every results file carries this record."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Optional

from benchmarks.arguments import REPO
from pretrain.engine.hardware import cpu_flags, cpu_name

BF16_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")  # what decides precision: auto on a CPU


def machine() -> dict:
    """CPU model and bf16 flags, or the GPU, and the versions that matter (a package not installed reads None)."""
    import torch

    flags = cpu_flags()
    return {"cpu": cpu_name(), "cpu_flags": " ".join(f for f in BF16_FLAGS if f in flags), "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__, "deepspeed": installed("deepspeed"), "transformers": installed("transformers"),
            "python": platform.python_version(), "commit": git_commit()}


def installed(package: str) -> Optional[str]:
    """The installed version of a distribution, read from its metadata (not imported); None when absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """The checkout's commit (with '+dirty' when it has changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"
