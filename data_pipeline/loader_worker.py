"""What a loader worker does first: tie its life to the rank that forked it, and let go of that rank's connections.

A worker is forked from its rank after the process group exists, so it starts with copies of the rank's gloo and
TCPStore sockets. When the rank is killed (SIGKILL, the OOM killer, a segfault), an orphaned worker kept those
connections open, so the peers saw no reset and waited for their step timeout; and a worker whose queue's pipe
was full blocked in its feeder thread forever, holding its memory and the rank's resource tracker alive.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import select
import signal
import socket
import struct
import threading
import time
from typing import Iterable, Optional

from core.errors import AttemptLostError
from core.process_life import die_with_parent, leave_terminal_signals_to_the_parent

_PID = struct.Struct("<i")
# The workers a StartWatch killed, with the timeout they missed: torch then reports them dead, as "DataLoader worker
# (pid N) is killed by signal" from its SIGCHLD handler, wherever the rank's main thread is, or as "DataLoader worker
# (pid(s) N) exited unexpectedly" from its wait for a batch.
_NEVER_STARTED: dict[int, float] = {}
_TORCH_WORKER_PIDS = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\)")


def start_worker(parent_pid: int, started_fd: int, worker_id: int) -> None:
    """A DataLoader `worker_init_fn` (bound to its rank's pid and its StartWatch's descriptor by functools.partial)."""
    die_with_parent(parent_pid)
    close_network_sockets()
    leave_stopping_to_the_rank(parent_pid)
    os.write(started_fd, _PID.pack(os.getpid()))  # one write of 4 bytes to a pipe: whole, whatever the others do


class StartWatch:
    """Whether each loader worker a rank forks starts; one that does not is killed (and recorded for `start_failure`).

    A forked child can deadlock before any of its code runs, in the interpreter's own after-fork step, when a thread
    of the rank held the interpreter's thread-state lock at the fork (CPython gh-112275, fixed in 3.11.10 and 3.12; seen
    here on 3.11.7 in a SLURM test). The rank then waits for its first batch until the job's time limit. A worker
    that has not said it started within `timeout_s` is killed instead, and torch's report of its death, wherever it
    surfaces, is an attempt lost (`start_failure`: exit 76, requeue, resume from the last checkpoint)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.read_fd, self.started_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._started: set[int] = set()
        self._lock = threading.Lock()  # one iterator's workers after another's: never two readers of the pipe
        self._state = threading.Lock()  # guards the two below
        self._waits = 0
        self._closed = False

    def watch(self, pids: Iterable[int]) -> None:
        """Expect these workers, just forked (children not yet reaped: their pids are theirs), to start; wait in a
        thread of its own."""
        handles = {pid: _pidfd(pid) for pid in pids}  # now, not at the deadline: a pid may be reused by then
        with self._state:
            self._waits += 1
        threading.Thread(target=self._wait, args=(handles,), name="loader-worker-starts", daemon=True).start()

    def close(self) -> None:
        """Give the pipe back (its loader is gone), at once or when the last wait on it ends."""
        with self._state:
            idle, self._closed = self._waits == 0 and not self._closed, True
        if idle:
            self._close_pipe()

    def _close_pipe(self) -> None:
        for fd in (self.read_fd, self.started_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wait(self, handles: dict[int, Optional[int]]) -> None:
        pids = set(handles)
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._lock:
                # poll, not select: a rank with many files open (shards, sockets, a GPU's handles) gets the pipe a
                # descriptor above 1023, which select() refuses.
                poller = select.poll()
                poller.register(self.read_fd, select.POLLIN)
                while pids - self._started and (left := deadline - time.monotonic()) > 0:
                    if poller.poll(math.ceil(left * 1000)):
                        data = os.read(self.read_fd, 4096)
                        self._started.update(pid for (pid,) in _PID.iter_unpack(data[:len(data) // 4 * 4]))
                stuck = sorted(pids - self._started)
                self._started -= pids
            for pid in stuck:
                _NEVER_STARTED[pid] = self.timeout_s  # before the kill: torch's report of it must find it named
                _kill(pid, handles[pid])
        finally:
            for handle in handles.values():
                if handle is not None:
                    os.close(handle)
            with self._state:
                self._waits -= 1
                last = self._closed and self._waits == 0
            if last:
                self._close_pipe()


def _pidfd(pid: int) -> Optional[int]:
    """A descriptor that names this process whatever later reuses its pid (None where the system has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Python or kernel), or already reaped
        return None


def _kill(pid: int, handle: Optional[int]) -> None:
    try:
        if handle is not None:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        pass


def start_failure(exc: Optional[BaseException]) -> Optional[AttemptLostError]:
    """The attempt lost that `exc` reports, from anywhere in its chain: an AttemptLostError, or torch's report of the
    death of a worker a StartWatch killed; None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AttemptLostError):
            return exc
        named = _TORCH_WORKER_PIDS.search(str(exc)) if isinstance(exc, RuntimeError) else None
        killed = [int(p) for p in re.findall(r"\d+", named.group(1)) if int(p) in _NEVER_STARTED] if named else []
        if killed:
            return AttemptLostError(
                f"loader worker(s) {', '.join(map(str, killed))} of this rank did not start within "
                f"{_NEVER_STARTED[killed[0]]:g} s (data.worker_start_timeout_s): the forked process deadlocked before "
                "running (CPython gh-112275, fixed in Python 3.11.10 and 3.12), and was killed")
        exc = exc.__cause__ or exc.__context__
    return None


def leave_stopping_to_the_rank(parent_pid: int) -> None:
    """End on a SIGTERM from the rank only; ignore SIGUSR1, SIGHUP, SIGINT and anyone else's SIGTERM: they are the
    rank's to act on.

    SLURM's preemption, scancel and time limit signal every process of the job step, torchrun the process group of
    each rank (SIGHUP and SIGINT too), and a closed terminal's shell or a Ctrl-C its job's process group (the rank
    holds both while it forks its workers, `terminal_signals_held`). torch's worker dies of a SIGTERM
    its rank did not send, so the rank's next batch failed before the rank reached the step boundary where it saves.
    The rank's own SIGTERM (the loader's shutdown, and multiprocessing's at exit, which then waits for the worker)
    still ends it at once, as torch's handler did; and the rank's death ends it through `die_with_parent`. SIGTERM
    is blocked here, before the worker starts any thread, and a thread of its own takes each one with its sender.
    This needs forked workers (the loader's, and Python 3.11's default), whose parent is the rank."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    leave_terminal_signals_to_the_parent()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_end_on_sigterm_from, args=(parent_pid,), name="sigterm-from-rank", daemon=True).start()


def _end_on_sigterm_from(parent_pid: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent_pid:
            os._exit(0)


def close_network_sockets() -> int:
    """Close every TCP/IP socket this process inherited (a worker reads local shards and opens its own connections
    to object storage); Unix sockets and pipes, which the DataLoader uses, stay. Returns how many were closed."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except FileNotFoundError:  # no procfs: nothing to enumerate
        return 0
    closed = 0
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket, or the listing's own descriptor, already closed
            continue
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.close()
            closed += 1
        else:
            sock.detach()
    return closed
