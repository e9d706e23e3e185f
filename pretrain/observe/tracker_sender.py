"""One tracker's rows sent from a thread of their own, so that its service failing or stalling mid-run costs the run
neither its steps nor its life.

A tracker's library can block for long: MLflow's client retries a server that does not answer for minutes, and its
SQLite store waits 20 s on a lock another process holds. Sent from the step loop, that wait stalls rank 0 while the
other ranks wait at the next collective until train.step_timeout_s calls rank 0's node lost, and the error that
follows would end a month-long run over a metrics service. Here a row waits in order in a bounded queue, is sent
again after a failure (backing off), and the run's log says when sending stopped and when it went on: every row is
in metrics.jsonl and TensorBoard regardless. The tracked run is ended from the same thread, after its last row, so
that ending it never races a row being sent, and a stop is bounded even when the service hangs.
"""
from __future__ import annotations

import collections
import threading
import time
import traceback
from typing import Callable, Optional

from core.errors import one_line

MAX_WAITING = 10_000  # rows kept while the service is down (a few MB); beyond, the oldest are dropped and counted
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0
RETRY_STOPPING_S = 1.0  # the backoff while stopping: the service gets tries until the stop's deadline
SENDER_THREAD = "tracker-"  # how a sender's thread is named: the tracker's name follows


def brief(line: str, limit: int = 300) -> str:
    """A service's one-line reason, cut to `limit` characters for the log."""
    return line if len(line) <= limit else line[:limit] + " [...]"


class TrackerSender:
    """Sends `send(step, row)` calls in order from a daemon thread, then `end()` once stopped; `messages` says what went
    wrong and when it recovered, for the main thread to log."""

    def __init__(self, name: str, send: Callable[[int, dict[str, float]], None],
                 refusals: tuple[type[BaseException], ...] = (), retry_first_s: float = RETRY_FIRST_S,
                 end: Optional[Callable[[], None]] = None,
                 final: Callable[[BaseException], Optional[str]] = lambda exc: None) -> None:
        self.name, self._send, self._refusals, self._retry_first_s = name, send, refusals, retry_first_s
        self._end, self._final = end, final  # final: what the user does about a failure that time will not mend
        self._rows: collections.deque[tuple[int, dict[str, float]]] = collections.deque()
        self._cond = threading.Condition()
        self._trying = False  # the head row is in the thread's hands (popped once it went through), kept by a drop
        self._stopping = False
        self._failures = 0  # failed tries of the row at the head, since the last row that went through
        self._dropped = 0  # rows dropped since the last line that counted them
        self._last_sent: Optional[dict[str, float]] = None  # the row the service took last (a stop asks of its head)
        self._said: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"{SENDER_THREAD}{name}", daemon=True)
        self._thread.start()

    def put(self, step: int, row: dict[str, float]) -> None:
        """Queue one row; returns at once (a row put after `stop` is not sent)."""
        with self._cond:
            if self._stopping:
                return
            if len(self._rows) >= MAX_WAITING:
                del self._rows[1 if self._trying else 0]
                if not self._dropped:
                    self._said.append(f"{self.name}: {MAX_WAITING:,} rows wait to be sent: dropping the oldest "
                                      "(they are in metrics.jsonl)")
                self._dropped += 1
            self._rows.append((step, row))
            self._cond.notify()

    def messages(self) -> list[str]:
        """What happened since the last call (failures, recoveries, drops), one line each."""
        with self._cond:
            said, self._said = self._said, []
        return said

    def said(self, line: str) -> None:
        """Add a line of the caller's to the messages."""
        with self._cond:
            self._said.append(line)

    def failing(self) -> bool:
        """Whether the row at the head has failed since the last row went through."""
        with self._cond:
            return self._failures > 0

    def waiting(self) -> int:
        """Rows not yet sent."""
        with self._cond:
            return len(self._rows)

    def stop_soon(self) -> None:
        """Take no more rows, and cut the backoff short: what waits is tried at once (several senders stopped side by
        side each get the whole of `stop`'s time)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def stop(self, rows_by: float, end_by: float) -> int:
        """`stop_soon`, send what waits until `rows_by`, then end the tracked run until `end_by` (times of
        time.monotonic()); the number of rows left unsent. A thread still in the service's hands at `end_by` is left to
        it (a daemon), and said."""
        self.stop_soon()
        with self._cond:
            while self._rows and time.monotonic() < rows_by:
                self._cond.wait(max(0.0, min(0.5, rows_by - time.monotonic())))
            # The head may be in the service's hands: whether it went is known once the thread is done with it.
            in_flight = self._rows[0] if self._trying and self._rows else None
            unsent = [step for step, row in self._rows if in_flight is None or row is not in_flight[1]]
            self._rows.clear()
            self._cond.notify_all()
        self._thread.join(max(0.0, end_by - time.monotonic()))
        with self._cond:
            if in_flight is not None and self._last_sent is not in_flight[1]:
                unsent.insert(0, in_flight[0])
            dropped = f"{self._dropped} older row(s) were dropped as too many waited" if self._dropped else ""
            if unsent:
                steps = f"step {unsent[0]}" if len(unsent) == 1 else f"steps {unsent[0]}-{unsent[-1]}"
                self._said.append(f"{self.name}: {len(unsent)} row(s) ({steps}) not sent before the run ended: the "
                                  f"service did not take them{', and ' + dropped if dropped else ''} (they are in "
                                  "metrics.jsonl)")
            elif dropped:
                self._said.append(f"{self.name}: {dropped} (they are in metrics.jsonl)")
        if self._thread.is_alive():
            self.said(f"{self.name}: the service did not answer before the run ended: its tracked run may not be "
                      "marked ended (it stays resumable)")
        return len(unsent)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._rows and not self._stopping:
                    self._cond.wait()
                if not self._rows:
                    break
                step, row = self._rows[0]
                self._trying = True
            try:
                self._send(step, row)
            except BaseException as exc:  # the service's failure, or a bug: the run goes on either way
                # A library's SystemExit (W&B patches sys.exit) would end this thread unsaid, and the rows pile up.
                hint = self._hint(exc)
                if hint is not None:  # the tracked run is gone, say: no try will ever take a row, nor end it
                    self._give_up(step, exc, hint)
                    return
                self._failed(step, exc)
            else:
                self._sent(step, row)
        if self._end is not None:
            try:
                self._end()
            except BaseException as exc:  # the run's metrics are in metrics.jsonl: the service's failure ends nothing
                hint = self._hint(exc)
                self.said(f"{self.name}: could not end its tracked run ({self._detail(exc)}){': ' + hint if hint else ''}")

    def _hint(self, exc: BaseException) -> Optional[str]:
        """What the user does about a failure no later try mends, or None."""
        if not isinstance(exc, Exception):  # a library's SystemExit (W&B patches sys.exit)
            return "the library stopped its sender (a bug)"
        try:
            return self._final(exc)
        except Exception:  # a classification that fails is no reason to stop sending
            return None

    def _detail(self, exc: BaseException) -> str:
        """A refusal of the service's in one line (SQLAlchemy's quote their SQL), anything else (a bug, perhaps) with
        its whole traceback."""
        return brief(one_line(exc)) if isinstance(exc, self._refusals) else traceback.format_exc().rstrip()

    def _give_up(self, step: int, exc: BaseException, hint: str) -> None:
        with self._cond:
            self._said.append(f"{self.name}: will not send step {step} or any later row ({self._detail(exc)}): {hint} "
                              "(the rows are in metrics.jsonl)")
            self._stopping = True  # rows put from now on are not kept
            self._rows.clear()
            self._trying = False
            self._cond.notify_all()

    def _failed(self, step: int, exc: Exception) -> None:
        detail = self._detail(exc)
        with self._cond:
            self._failures += 1
            if self._failures == 1:
                self._said.append(f"{self.name}: could not send step {step} ({detail}); training goes on, and the rows "
                                  "wait to be sent again (they are also in metrics.jsonl)")
            start = time.monotonic()
            wait = min(RETRY_MAX_S, self._retry_first_s * 2 ** (self._failures - 1))
            while True:  # a stop (it notifies) cuts the backoff short
                end = start + (min(wait, RETRY_STOPPING_S) if self._stopping else wait)
                if time.monotonic() >= end or (self._stopping and not self._rows):
                    break
                self._cond.wait(end - time.monotonic())
            self._trying = False

    def _sent(self, step: int, row: dict[str, float]) -> None:
        with self._cond:
            self._trying = False
            self._last_sent = row
            if self._rows and self._rows[0][1] is row:  # not a row put after a stop cleared the one sent
                self._rows.popleft()
            if self._failures:
                dropped = f", {self._dropped} dropped as too many waited" if self._dropped else ""
                self._said.append(f"{self.name}: sending again after {self._failures} failed tr"
                                  f"{'y' if self._failures == 1 else 'ies'} ({len(self._rows)} row(s) waiting{dropped})")
                self._failures = self._dropped = 0
            self._cond.notify_all()
