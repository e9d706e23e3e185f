"""Outputs are never half-written: files and folders are written under a temporary name, then renamed."""
from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

from core.errors import OutputExistsError


def write_text_atomic(path: Path, text: str, fsync: bool = False) -> None:
    """Write a text file under a temporary name and rename it into place (fsync first when asked)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    tmp.replace(path)


def save_figure_atomic(fig, path: Path, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG under a temporary name and rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    tmp.replace(path)


def check_overwrite(final_dir: Path, overwrite: bool) -> None:
    """Refuse to clobber an existing output unless asked."""
    if final_dir.exists() and not overwrite:
        raise OutputExistsError(f"output folder '{final_dir}' already exists; pass --overwrite to replace it")


def _remove_debris(final_dir: Path) -> None:
    """Temporary folders that killed writers on this host left beside `final_dir` (their pid is gone)."""
    host = socket.gethostname()
    for tmp in final_dir.parent.glob(f".{final_dir.name}.tmp-{host}-*"):
        try:
            pid = int(tmp.name[len(f".{final_dir.name}.tmp-{host}-"):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def prepare_output(final_dir: Path, overwrite: bool) -> Path:
    """Refuse to clobber an existing output unless asked; return a fresh temporary folder beside it."""
    check_overwrite(final_dir, overwrite)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_debris(final_dir)
    tmp = final_dir.with_name(f".{final_dir.name}.tmp-{socket.gethostname()}-{os.getpid()}-{int(time.time())}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def publish(tmp_dir: Path, final_dir: Path) -> None:
    """Swap a finished temporary folder into place; an old dataset is removed only after that."""
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
        final_dir.rename(old)
        tmp_dir.rename(final_dir)
        shutil.rmtree(old)
    else:
        tmp_dir.rename(final_dir)
