"""How a process ends with the one that started it, and how a command ends on SIGTERM: so that neither a killed
parent's workers nor a stopped command's temporary files outlive them."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Mapping

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Have the kernel send `sig` (SIGKILL unless named) to this process when the thread that started it ends; if the
    parent is already gone, send it now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:  # it died before the kernel was told
        os.kill(os.getpid(), sig)


def started_by_launcher(environ: Mapping[str, str]) -> bool:
    """Whether torchrun (TORCHELASTIC_RUN_ID) or the deepspeed launcher's per-node process (CROSS_RANK, LOCAL_SIZE)
    started this process; not a LOCAL_RANK alone, which a shell profile or an image may set for a plain run."""
    return "TORCHELASTIC_RUN_ID" in environ or ("CROSS_RANK" in environ and "LOCAL_SIZE" in environ)


def exit_on_sigterm() -> None:
    """Make SIGTERM (SLURM's time limit and scancel, a plain `kill`) raise SystemExit(143) in the main thread, so a
    command's clean-up (`finally`, `except BaseException`: temporary folders, worker pools) runs as it does for
    Ctrl-C; by default the signal ends the process where it stands."""
    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # SLURM repeats it: the clean-up it starts must finish
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
