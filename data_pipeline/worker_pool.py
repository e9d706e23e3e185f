"""A pool of spawned processes that pull tasks from one queue: each worker reads its own input.

The main process sends only small task descriptions (a part to read), never documents, so it stays
idle and the work scales with the number of processes. A user error found by a worker is raised in
the main process as it is; any other failure, or a worker that dies, stops the pool with the
worker's traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import traceback
from typing import Any, Callable, Iterable

from core.errors import UserError, no_room_error
from core.process_life import die_with_parent, leave_terminal_signals_to_the_parent, terminal_signals_held

Task = Callable[[Any, Any], Any]  # (shared, item) -> result; a module-level function, so it pickles


def available_cpus() -> int:
    """CPUs this process may run on (SLURM's --cpus-per-task and taskset included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _worker(parent_pid: int, shared: Any, inbox, outbox) -> None:
    # Killed, the parent would leave its workers waiting for work forever (each holds its inbox's pipe open).
    die_with_parent(parent_pid)
    # A closed terminal's hang-up and a Ctrl-C reach the whole process group: the parent decides (it stops and cleans
    # up), and its death ends this worker. Held since the start (the parent's terminal_signals_held): one during the
    # imports too.
    leave_terminal_signals_to_the_parent()
    while (job := inbox.get()) is not None:
        fn, key, item = job
        try:
            result = fn(shared, item)
            pickle.dumps(result)  # a result that cannot be sent would be dropped by the queue: fail here instead
            outbox.put(("ok", key, result))
        except UserError as exc:
            outbox.put(("user_error", key, exc))
        except BaseException as exc:  # a full disk is the user's to fix; anything else is a bug, sent as its traceback
            full = no_room_error(exc)
            outbox.put(("user_error", key, full) if full is not None else ("error", key, traceback.format_exc()))


class WorkerPool:
    """`map` tasks over `workers` processes (in this process when workers == 1)."""

    def __init__(self, workers: int, shared: Any) -> None:
        self.workers = workers
        self.shared = shared
        self._procs: list = []
        if workers > 1:
            ctx = mp.get_context("spawn")  # fork after datasets/fsspec threads started can deadlock
            # The queues may start multiprocessing's resource tracker, which would die of a hang-up; the workers
            # take theirs in hand once started.
            with terminal_signals_held():
                self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
                self._procs = [ctx.Process(target=_worker, args=(os.getpid(), shared, self._inbox, self._outbox),
                                           daemon=True) for _ in range(workers)]
                for p in self._procs:
                    p.start()

    def map(self, fn: Task, items: Iterable[Any], on_result: Callable[[int, Any], None] | None = None,
            ahead: int | None = None) -> list[Any]:
        """Results of fn(shared, item) in the items' order; `on_result(i, result)` as each one ends; at most `ahead`
        items handed out whose `on_result` has not returned (what their results occupy until then stays bounded)."""
        items = list(items)
        results: dict[int, Any] = {}
        if not self._procs:
            for i, item in enumerate(items):
                results[i] = fn(self.shared, item)
                if on_result:
                    on_result(i, results[i])
            return [results[i] for i in range(len(items))]
        limit, sent = len(items) if ahead is None else max(ahead, 1), 0

        def hand_out() -> None:
            nonlocal sent
            while sent < len(items) and sent - len(results) < limit:
                self._inbox.put((fn, sent, items[sent]))
                sent += 1

        hand_out()
        while len(results) < len(items):
            try:
                status, key, payload = self._outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"a prepare worker died (exit code {dead[0].exitcode})")
                continue
            if status == "user_error":
                raise payload
            if status == "error":
                raise RuntimeError(f"a prepare worker failed:\n{payload}")
            results[key] = payload
            if on_result:
                on_result(key, payload)
            hand_out()
        return [results[i] for i in range(len(items))]

    def close(self, failed: bool = False) -> None:
        """Stop the workers: politely after success, at once after a failure."""
        for p in self._procs:
            if failed and p.is_alive():
                p.terminate()
            elif p.is_alive():
                self._inbox.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if self._procs:
            # Tasks still queued for terminated workers would keep the queue's feeder thread (and
            # so the interpreter's exit) waiting.
            for q in (self._inbox, self._outbox):
                q.cancel_join_thread()
                q.close()
        self._procs = []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
