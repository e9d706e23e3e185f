"""How a process ends with the one that started it, how a command ends on SIGTERM or a hang-up, and what it does
with a terminal that hung up: so that neither a killed parent's workers nor a stopped command's temporary files
outlive them, and a closed ssh session does not turn the clean-up into a crash."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping, NoReturn, Optional

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The standard streams found to be a terminal: once the terminal hangs up, every write to it fails with EIO and
# isatty() says False, so they must be known before.
_terminal_outputs: set[int] = set()


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
    """Remember which of stdout and stderr are a terminal now, beside those an earlier call found (one that has hung
    up since says it is none), for `leave_terminal` and `dead_output`."""
    _terminal_outputs.update(fd for fd in (1, 2) if os.isatty(fd))


TERMINAL_SIGNALS = (signal.SIGHUP, signal.SIGINT)  # a closed terminal and Ctrl-C: they reach a whole process group


@contextlib.contextmanager
def terminal_signals_held() -> Iterator[None]:
    """SIGHUP and SIGINT blocked in this thread while it starts children, which inherit the block through fork and
    exec: a closed terminal's hang-up or a Ctrl-C reaches a child only once it has said what it does with one
    (`leave_terminal_signals_to_the_parent`), not while it is still importing. This process gets them when the block
    ends, or at once through another thread."""
    from multiprocessing import resource_tracker

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set(TERMINAL_SIGNALS))
    try:
        # Started here (a queue would start it), the resource tracker inherits the block, so a hang-up spares it; but
        # starting it unblocks SIGINT and SIGTERM behind it (multiprocessing's own choice): the mask again, for the
        # children.
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_SETMASK, set(before) | set(TERMINAL_SIGNALS))
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def leave_terminal_signals_to_the_parent() -> None:
    """Ignore SIGHUP and SIGINT from now on, those held since start (`terminal_signals_held`) included: the parent
    decides (it saves, or stops and cleans up), and its death or its SIGTERM ends this child."""
    for sig in TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(TERMINAL_SIGNALS))


def hang_up_ignored() -> bool:
    """Whether SIGHUP is ignored now: started under nohup (or by a parent that ignores it), the hang-up is not meant
    for this process, and a handler must not be put in the place of that choice."""
    return signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def drop_output(fd: int) -> None:
    """Point `fd` at /dev/null (what nohup does for a terminal), and the other standard stream too where it writes to
    the same file (`2>&1 | tee`): an output whose reader is gone fails every write."""
    same = [other for other in (1, 2) if other != fd and _same_file(fd, other)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for target in [fd, *same]:
            os.dup2(null, target)
    finally:
        os.close(null)


def _same_file(fd: int, other: int) -> bool:
    try:
        return os.path.sameopenfile(fd, other)
    except OSError:  # `other` is closed
        return False


def _drop_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):  # no descriptor left to open /dev/null with: the writes fail as they would have
        drop_output(fd)


def leave_terminal() -> None:
    """Drop stdout and stderr where `note_terminal_outputs` found a terminal; never raises.

    After a hang-up (a closed ssh session, a killed tmux pane) every write to that terminal fails with EIO, so the
    save or clean-up that the SIGHUP starts would fail at its first progress line."""
    for fd in sorted(_terminal_outputs):
        _drop_quietly(fd)


def _dead_output(exc: OSError, fd: int) -> bool:
    """Whether `exc`, raised writing to `fd`, says that its reader is gone: a pipe's (EPIPE: the `tee` that a hang-up
    ended with the terminal), or a terminal's that hung up (EIO); not a disk's EIO."""
    return exc.errno == errno.EPIPE or (exc.errno == errno.EIO and fd in _terminal_outputs)


def _write(stream, line: Optional[str]) -> None:
    """`line` (None: only the flush) on `stream`, flushed; a stream whose reader is gone goes to /dev/null from here
    (what it still holds with it: it cannot fail the interpreter's last flush either). Other errors go on."""
    try:
        if line is not None:
            print(line, file=stream)
        stream.flush()
    except OSError as exc:
        fd = stream.fileno()
        if not _dead_output(exc, fd):
            raise
        _drop_quietly(fd)


def to_stdout(line: str) -> None:
    """Print `line` on stdout, flushed, or nowhere once stdout's reader is gone (a hung-up terminal, the pipe to a
    `tee` that ended with it): train.log and the status files keep what matters."""
    _write(sys.stdout, line)


def flush_stdout() -> None:
    """Flush stdout before an exit; never raises: what it held is lost where it cannot be written, not the exit."""
    with contextlib.suppress(OSError):
        _write(sys.stdout, None)


def to_stderr(line: str) -> None:
    """Print `line` on stderr, flushed; never raises: an output that refuses it (its reader gone, its disk full)
    cannot fail what the caller does next: an exit code, a status file."""
    with contextlib.suppress(OSError):
        _write(sys.stderr, line)


def end_interrupted() -> NoReturn:
    """The exit handlers, one line on stderr, then death by SIGINT: how a command ends after a Ctrl-C once its clean-up
    ran (a shell reads 130 and stops its script or loop there, which it would not for an exit code)."""
    logging = sys.modules.get("logging")
    if logging is not None:  # a library interrupted in its imports logs its exit report at the root logger's level
        logging.disable(logging.CRITICAL)
    atexit._run_exitfuncs()  # multiprocessing's among them: its queues' semaphores, else reported leaked
    to_stderr("interrupted (Ctrl-C): stopped; what it had not finished writing is removed")
    flush_stdout()
    die_of(signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # not reached: the signal's default action ends the process


def die_of(sig: signal.Signals) -> None:
    """Restore the default action of `sig` and send it to this process, from any thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(sig, signal.SIG_DFL)
    else:  # Python lets only the main thread set a handler, and it may be blocked: ask the C library directly
        ctypes.CDLL(None).signal(int(sig), 0)  # 0 is SIG_DFL
    os.kill(os.getpid(), sig)


def exit_on_termination() -> None:
    """Make SIGTERM (SLURM's time limit and scancel, a plain `kill`) and SIGHUP (a closed terminal; unless ignored, as
    under nohup) raise SystemExit(128 + the signal) in the main thread, so a command's clean-up (`finally`,
    `except BaseException`: temporary folders, worker pools) runs as it does for Ctrl-C; by default either signal
    ends the process where it stands. A Ctrl-C raises KeyboardInterrupt once (`end_interrupted` then ends the
    command); a second one ends it at once."""
    note_terminal_outputs()
    caught = (signal.SIGTERM,) if hang_up_ignored() else (signal.SIGTERM, signal.SIGHUP)

    def stop(signum: int, frame: object) -> None:
        for sig in caught:  # SLURM repeats SIGTERM: the clean-up it starts must finish
            signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGHUP:
            leave_terminal()
            # A pipe to a `tee` that ended with the terminal: what stdout still holds would fail the interpreter's
            # last flush, and turn the exit into 120.
            flush_stdout()
        raise SystemExit(128 + signum)

    for sig in caught:
        signal.signal(sig, stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it was ignored from the start
        signal.signal(signal.SIGINT, _interrupt_once)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Defer this process's Python handlers of SIGINT, SIGTERM and SIGHUP to the end of the block, for a command's
    imports: raised inside a C extension's initialisation (numpy's, torch's), a KeyboardInterrupt or SystemExit
    leaves the module half made, and the command ends on a traceback of the next import, or an abort, instead of its
    clean-up. The signals that came are acted on when the block ends, in order; a second Ctrl-C still ends the
    process at once (its death leaves nothing half made to trip on)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread runs handlers
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    handlers = {sig: handler for sig, handler in handlers.items() if callable(handler)}
    came: list[int] = []
    deferring = True

    def defer(signum: int, frame: object) -> None:
        if not deferring:  # between the block's end and its handler's return (a restore cut short)
            handlers[signum](signum, frame)
        elif signum == signal.SIGINT and signum in came:
            die_of(signal.SIGINT)
        else:
            came.append(signum)

    try:
        for sig in handlers:
            signal.signal(sig, defer)
        yield
    finally:
        deferring = False
        for sig, handler in handlers.items():
            if signal.getsignal(sig) is defer:  # not one the block set itself
                signal.signal(sig, handler)
        for signum in came:
            handlers[signum](signum, None)


def _interrupt_once(signum: int, frame: object) -> None:
    # The first Ctrl-C starts the clean-up (KeyboardInterrupt); a second one ends the process at once, by SIGINT,
    # without the line that says the clean-up ran.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    raise KeyboardInterrupt


def process_start_time() -> float:
    """When this process started (epoch seconds, to a clock tick): now, less the time since /proc's start tick, where
    Linux has them, else now. A wall-time budget counts its start-up (imports, a checkpoint's download) too."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(after_name[19])  # field 22, starttime (since boot): the fields after the name start at field 3
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        now = time.time()
        return min(now, now - (uptime - ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError):
        return time.time()
