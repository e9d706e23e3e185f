"""TrackerSender: a tracker's rows go out in order from a thread; a failing service delays them, bounded, and says so."""
from __future__ import annotations

import threading
import time

from pretrain.observe import tracker_sender
from pretrain.observe.tracker_sender import TrackerSender


class Service:
    """A tracker's service that refuses rows while `down` is set."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.got: list[int] = []

    def send(self, step: int, row: dict[str, float]) -> None:
        if self.down.is_set():
            raise ConnectionError("service unavailable")
        self.got.append(step)


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_rows_wait_in_order_while_the_service_is_down_and_the_oldest_are_dropped_past_the_bound(monkeypatch):
    monkeypatch.setattr(tracker_sender, "MAX_WAITING", 5)
    service = Service()
    sender = TrackerSender("svc", service.send, (ConnectionError,), retry_first_s=1.0)
    sender.put(1, {"x": 1.0})
    _until(lambda: service.got == [1])
    service.down.set()
    sender.put(2, {"x": 2.0})
    _until(sender.failing)
    said = sender.messages()
    assert len(said) == 1 and said[0].startswith("svc: could not send step 2 (service unavailable); training goes on")
    for step in range(3, 10):  # within the 1 s backoff: 8 rows into a bound of 5, step 2 is being tried, so 3, 4 and 5 go
        sender.put(step, {"x": float(step)})
    service.down.clear()
    _until(lambda: sender.waiting() == 0)
    assert service.got == [1, 2, 6, 7, 8, 9]
    assert sender.messages() == ["svc: sending again after 1 failed try (4 row(s) waiting, 3 dropped as too many "
                                 "waited)"]
    assert sender.stop(1.0) == 0


def test_a_stop_waits_a_bounded_time_and_names_the_rows_it_leaves():
    service = Service()
    service.down.set()
    sender = TrackerSender("svc", service.send, (), retry_first_s=30.0)  # a backoff far past the stop's wait
    for step in (3, 4):
        sender.put(step, {"x": 0.0})
    _until(sender.failing)
    start = time.monotonic()
    assert sender.stop(1.5) == 2
    assert time.monotonic() - start < 5
    said = sender.messages()
    # An error outside the tracker's refusals may be a bug: its traceback is kept.
    assert "Traceback (most recent call last)" in said[0] and "ConnectionError: service unavailable" in said[0]
    assert said[-1] == ("svc: 2 row(s) (steps 3-4) not sent before the run ended: the service did not take them "
                        "(they are in metrics.jsonl)")
    assert service.got == []
