"""How a process ends with the one that started it, how a command ends on SIGTERM or a hang-up, and what it does
with a terminal that hung up: so that neither a killed parent's workers nor a stopped command's temporary files
outlive them, and a closed ssh session does not turn the clean-up into a crash."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Mapping

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The standard streams that were a terminal when `note_terminal_outputs` ran: once the terminal hangs up, every write
# to it fails with EIO and isatty() says False, so they must be known before.
_terminal_outputs: tuple[int, ...] = ()


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


def note_terminal_outputs() -> None:
    """Remember which of stdout and stderr are a terminal now, for `leave_terminal` after a hang-up."""
    global _terminal_outputs
    _terminal_outputs = tuple(fd for fd in (1, 2) if os.isatty(fd))


def leave_terminal() -> None:
    """Point stdout and stderr, where `note_terminal_outputs` found a terminal, at /dev/null (what nohup does).

    After a hang-up (a closed ssh session, a killed tmux pane) every write to that terminal fails with EIO, so the
    save or clean-up that the SIGHUP starts would fail at its first progress line."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in _terminal_outputs:
            os.dup2(null, fd)
    finally:
        os.close(null)


def exit_on_termination() -> None:
    """Make SIGTERM (SLURM's time limit and scancel, a plain `kill`) and SIGHUP (a closed terminal) raise
    SystemExit(128 + the signal) in the main thread, so a command's clean-up (`finally`, `except BaseException`:
    temporary folders, worker pools) runs as it does for Ctrl-C; by default either signal ends the process where it
    stands."""
    note_terminal_outputs()

    def stop(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):  # SLURM repeats SIGTERM: the clean-up it starts must finish
            signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGHUP:
            leave_terminal()
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
