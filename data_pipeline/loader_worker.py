"""What a loader worker does first: tie its life to the rank that forked it, and let go of that rank's connections.

A worker is forked from its rank after the process group exists, so it starts with copies of the rank's gloo and
TCPStore sockets. When the rank is killed (SIGKILL, the OOM killer, a segfault), an orphaned worker kept those
connections open, so the peers saw no reset and waited for their step timeout; and a worker whose queue's pipe
was full blocked in its feeder thread forever, holding its memory and the rank's resource tracker alive.
"""
from __future__ import annotations

import os
import signal
import socket
import threading

from core.process_life import die_with_parent


def start_worker(parent_pid: int, worker_id: int) -> None:
    """A DataLoader `worker_init_fn` (bound to its rank's pid with functools.partial)."""
    die_with_parent(parent_pid)
    close_network_sockets()
    leave_stopping_to_the_rank(parent_pid)


def leave_stopping_to_the_rank(parent_pid: int) -> None:
    """End on a SIGTERM from the rank only; ignore SIGUSR1 and anyone else's SIGTERM: they are the rank's to act on.

    SLURM's preemption, scancel and time limit signal every process of the job step, torchrun the process group
    of each rank. torch's worker dies of a SIGTERM its rank did not send, so the rank's next batch failed before
    the rank reached the step boundary where it saves. The rank's own SIGTERM (the loader's shutdown, and
    multiprocessing's at exit, which then waits for the worker) still ends it at once, as torch's handler did; and
    the rank's death ends it through `die_with_parent`. SIGTERM is blocked here, before the worker starts any
    thread, and a thread of its own takes each one with its sender. This needs forked workers (the loader's, and
    Python 3.11's default), whose parent is the rank."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
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
