"""The preemption signals, caught from the first line of `python -m pretrain train`.

Kept free of heavy imports: importing torch, DeepSpeed and transformers takes seconds, and a
SIGUSR1 that SLURM sends in that window would otherwise kill the process (Python's default
action), which the batch script would read as a crash instead of a preemption.

A SIGHUP (a closed ssh session or terminal, which torchrun forwards to its ranks) asks for the same as a SIGTERM,
from a process whose terminal is gone: the standard streams that were one are pointed at /dev/null first, or the
save's first progress line would fail with EIO. Under nohup (SIGHUP ignored at the start) it stays ignored.

A SIGINT (Ctrl-C, which torchrun forwards to its ranks too) asks for the same save and stop, and then ends the
process by SIGINT, as an interrupted program does (a shell's loop stops there); a second one ends it at once, without
saving. Started with SIGINT ignored (a background job of a script), it stays ignored.

A SIGTERM is different before training starts: there is nothing to save yet, and whoever sent it
(srun once another task died, torchrun ending its other workers, scancel) wants the process gone.
Python runs its handlers only between bytecodes, and a rank waiting at the rendezvous for a peer that
died sits in C++ for the whole start-up timeout, until SLURM's or torchrun's SIGKILL 30 s later. So until
the trainer first polls, a thread woken through the signal wake-up fd (which the C-level handler writes
at once) ends the process by that signal itself (SIGTERM, SIGHUP or SIGINT).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Optional

from core.process_life import (die_of, flush_stdout, hang_up_ignored, leave_terminal, note_terminal_outputs,
                               to_stderr)

SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # those that end the process at once before training starts
_caught: Optional[tuple[signal.Signals, ...]] = None  # SIGNALS, less SIGHUP/SIGINT where ignored at the first `catch`
_received: list[str] = []
_wakeup: Optional[tuple[int, int]] = None  # (read, write) ends of the wake-up pipe its watching thread reads
_training = False  # set at the trainer's first poll: from then on SIGTERM/SIGHUP/SIGINT ask for a save and a stop
_ending = threading.Lock()  # held by the one thread that ends the process (`_end`): any other waits for the death
# How long `_end` may write before the death comes anyway: a status folder on a hung file system, a stderr pipe that
# nobody reads, must not keep alive a process that a person or a launcher asked to end now.
LAST_RESORT_S = 10.0


def _handle(signum, frame) -> None:
    # Only record: a signal during a save (or a second one) must not interrupt it. (A person's second Ctrl-C ends
    # the process from the wake-up thread.)
    if signum == signal.SIGHUP:
        leave_terminal()
    if signum == signal.SIGINT and _training:
        if "SIGINT" in _received:  # the wake-up thread ends the process, also while this thread sits in C++
            return
        if _rank() == "0":
            # os.write, not print: a handler that prints while the main thread is inside a print to the same stream
            # fails it with "reentrant call".
            with contextlib.suppress(OSError):
                os.write(2, b"Ctrl-C (SIGINT): saving a checkpoint at the end of this step, then stopping\n")
    _received.append(signal.Signals(signum).name)


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _ignored_at_start(sig: signal.Signals) -> bool:
    """Whether `sig` was ignored when this process started (nohup's SIGHUP, a script's background job's SIGINT): then
    it is not meant for this process, and a handler must not be put in the place of that choice."""
    if sig == signal.SIGHUP:
        return hang_up_ignored()
    return sig == signal.SIGINT and signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def catch(command_line: bool = False) -> None:
    """From now on SIGUSR1/SIGTERM/SIGHUP (and SIGINT on the `command_line`) only set a flag that the trainer polls
    once per step. On the `command_line` (`python -m pretrain train`, whose process ends with its run) a SIGTERM,
    SIGHUP or SIGINT before the trainer's first poll ends the process at once, and so does a second SIGINT after it; a
    library caller (a notebook) keeps its KeyboardInterrupt. The first call decides which signals are taken."""
    # SLURM signals every process of a task, not only the trainer. A helper that execs (the
    # resource tracker that streaming's shared memory starts) resets handlers to the default,
    # which kills it on SIGUSR1, but keeps "ignored": so start it while the signals are ignored.
    from multiprocessing import resource_tracker

    global _caught
    if _caught is None:
        _caught = tuple(sig for sig in SIGNALS if not _ignored_at_start(sig) and (command_line or sig != signal.SIGINT))
    note_terminal_outputs()
    # Once the handlers are in and the tracker runs (the trainer's guard calls again), no ignoring: a signal that
    # came in that window (SLURM sends its USR1 once) would be thrown away by the kernel.
    if not (all(signal.getsignal(sig) is _handle for sig in _caught) and _tracker_running(resource_tracker)):
        for sig in _caught:
            signal.signal(sig, signal.SIG_IGN)
        resource_tracker.ensure_running()
        for sig in _caught:
            signal.signal(sig, _handle)
    if command_line and _wakeup is None and not _training:
        _watch_for_endings()


def _tracker_running(resource_tracker: Any) -> bool:
    """Whether this process's multiprocessing resource tracker was started and has not exited."""
    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    if pid is None:
        return False
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _watch_for_endings() -> None:
    """Start the thread that ends the process on a SIGTERM, SIGHUP or SIGINT before training, and on a second SIGINT
    during it, woken by the C-level handler's write (at once, wherever the main thread is)."""
    global _wakeup
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    _wakeup = (read_end, write_end)
    threading.Thread(target=_end_on_wake_up, args=(read_end,), name="signals-that-end", daemon=True).start()


def _end_on_wake_up(read_end: int) -> None:
    interrupts = 0  # SIGINTs since training started
    try:
        while True:
            woken_by = os.read(read_end, 64)
            if not woken_by:  # the write end was closed: training started, and SIGINT is not taken
                return
            if _training:
                interrupts += woken_by.count(signal.SIGINT)
                if interrupts >= 2:
                    _interrupted_again()
                continue
            ending = [sig for sig in ENDING if sig in woken_by]
            if ending:
                if signal.SIGHUP in ending:  # before the line below, which the hung-up terminal would refuse
                    leave_terminal()
                terminated(-1, None, ending[0])
    finally:
        os.close(read_end)


def _interrupted_again() -> None:
    """A second Ctrl-C during training: a person who will not wait for the save. End now, by SIGINT."""
    _end(signal.SIGINT, f"interrupted again: rank {_rank()} of {os.environ.get('WORLD_SIZE', '1')} ends now by "
         "SIGINT; the last complete checkpoint stands", error="SIGINT")


def terminated(step: int, error: Optional[str], sig: signal.Signals = signal.SIGTERM) -> None:
    """Ended by `sig` (`error`: what broke then, or None before the first step): the status file and one line, this
    node's shared memory released, then die of the signal (srun and torchrun read a task that died of it as ended by
    them, not as one that failed)."""
    when = f"at step {step}" if step >= 0 else "before its first step"
    after = f"then {error}" if error else "no step was run, nothing to save"
    who = f"rank {_rank()} of {os.environ.get('WORLD_SIZE', '1')} {when}"
    if sig == signal.SIGINT:
        line = f"interrupted: {who} by SIGINT (Ctrl-C); {after}"
    else:
        line = (f"terminated: {who} by {sig.name} (the job was ended; a rank that stopped on its own says why in its "
                f"log); {after}")
    _end(sig, line, error=error or sig.name, step=step)


def _end(sig: signal.Signals, line: str, **status: object) -> None:
    """The status "terminated" with `status`, `line` on stderr, this node's shared memory released, then death by
    `sig`, whatever of the rest fails or however long it hangs (`LAST_RESORT_S`). Once: a second caller (the wake-up
    thread and the main thread's error path) waits for that death."""
    _ending.acquire()  # never released: the holder ends the process
    try:
        last_resort = threading.Timer(LAST_RESORT_S, die_of, (sig,))
        last_resort.daemon = True
        last_resort.start()
        from pretrain.lifecycle.exit_status import write_status

        write_status("terminated", **status)
        to_stderr(line)
        loader = sys.modules.get("data_pipeline.loader")  # only once the run got that far; importing it costs seconds
        if loader is not None:
            loader.release_shared_memory()  # dying of the signal skips streaming's exit handler, which would do it
        flush_stdout()
    finally:  # even when the status or the line could not be written
        die_of(sig)


def training_started() -> None:
    """From the trainer's first poll on, a SIGTERM, SIGHUP or SIGINT is a request to save and stop at the next step
    boundary; the wake-up thread stays only to end the process on a second SIGINT."""
    global _training, _wakeup
    _training = True
    if _wakeup is None or signal.SIGINT in (_caught or ()):
        return
    write_end = _wakeup[1]
    _wakeup = None
    current = signal.set_wakeup_fd(-1)
    if current != write_end:  # someone else's since ours: leave theirs in place
        signal.set_wakeup_fd(current)
    os.close(write_end)  # the thread reads the end of the pipe, closes its end and returns


def _forget_in_child() -> None:
    # A forked child (a loader worker) keeps the C-level wake-up fd, so its signals would end the parent, and its
    # copy of the write end would keep the parent's thread from ever reading the end of the pipe.
    global _wakeup
    if _wakeup is not None:
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
        for end in _wakeup:
            os.close(end)
        _wakeup = None


os.register_at_fork(after_in_child=_forget_in_child)


def first_received() -> Optional[str]:
    """Name of the first preemption signal caught so far, or None."""
    return _received[0] if _received else None


def sigterm_received() -> bool:
    """Whether a SIGTERM was caught, whatever came before it: srun, SLURM or torchrun is ending the job, and what
    breaks after it (a loader worker terminated with the rank) is their doing, not a bug of this rank. (After a
    SIGHUP or SIGINT, which the loader workers ignore, what breaks is a failure as any other.)"""
    return "SIGTERM" in _received


def ignore() -> None:
    """Ignore SIGUSR1/SIGTERM/SIGHUP/SIGINT at the OS level from here to the process's exit."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
