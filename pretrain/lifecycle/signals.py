"""The preemption signals, caught from the first line of `python -m pretrain train`.

Kept free of heavy imports: importing torch, DeepSpeed and transformers takes ~10 s, and a
SIGUSR1 that SLURM sends in that window would otherwise kill the process (Python's default
action), which the batch script would read as a crash instead of a preemption.
"""
from __future__ import annotations

import signal
from typing import Optional

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_received: list[str] = []


def _handle(signum, frame) -> None:
    # Only record: a signal during a save (or a second one) must not interrupt it.
    _received.append(signal.Signals(signum).name)


def catch() -> None:
    """From now on SIGUSR1/SIGTERM only set a flag that the trainer polls once per step."""
    # SLURM signals every process of a task, not only the trainer. A helper that execs (the
    # resource tracker that streaming's shared memory starts) resets handlers to the default,
    # which kills it on SIGUSR1, but keeps "ignored": so start it while the signals are ignored.
    from multiprocessing import resource_tracker

    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    resource_tracker.ensure_running()
    for sig in SIGNALS:
        signal.signal(sig, _handle)


def first_received() -> Optional[str]:
    """Name of the first preemption signal caught so far, or None."""
    return _received[0] if _received else None


def ignore() -> None:
    """Ignore SIGUSR1/SIGTERM at the OS level from here to the process's exit."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
