"""TrackerSender: a tracker's rows go out in order from a thread; a failing service delays them, bounded, and says so;
the tracked run is ended from the same thread after its last row, within the stop's deadline."""
from __future__ import annotations

import re
import threading
import time

from pretrain.observe import tracker_sender, trackers
from pretrain.observe.tracker_sender import TrackerSender
from pretrain.observe.trackers import Trackers
from pretrain.run_dir import RunDir


class Service:
    """A tracker's service: while `down` is set, a row it is sent waits for `release` and is refused; `end` is
    recorded after the rows it got (`hang` makes it never return)."""

    def __init__(self) -> None:
        self.down, self.release, self.hang = threading.Event(), threading.Event(), threading.Event()
        self.got: list = []
        self.trying: list[int] = []

    def send(self, step: int, row: dict[str, float]) -> None:
        self.trying.append(step)
        if self.down.is_set():
            self.release.wait()
            raise ConnectionError("service unavailable")
        self.got.append(step)

    def end(self) -> None:
        if self.hang.is_set():
            threading.Event().wait()
        self.got.append("end")


def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_rows_wait_in_order_while_the_service_is_down_and_the_oldest_are_dropped_past_the_bound(monkeypatch):
    monkeypatch.setattr(tracker_sender, "MAX_WAITING", 5)
    service = Service()
    sender = TrackerSender("svc", service.send, (ConnectionError,), retry_first_s=0.05, end=service.end)
    sender.put(1, {"x": 1.0})
    _until(lambda: service.got == [1])
    service.down.set()
    sender.put(2, {"x": 2.0})
    _until(lambda: service.trying[-1:] == [2])  # step 2 is in the service's hands: it stays the head
    for step in range(3, 10):  # 8 rows into a bound of 5 beside the head being tried: 3, 4 and 5 are dropped
        sender.put(step, {"x": float(step)})
    service.down.clear()
    service.release.set()
    _until(lambda: sender.waiting() == 0)
    assert service.got == [1, 2, 6, 7, 8, 9]
    said = sender.messages()
    assert said[0] == "svc: 5 rows wait to be sent: dropping the oldest (they are in metrics.jsonl)"
    assert said[1].startswith("svc: could not send step 2 (service unavailable); training goes on")
    assert said[2] == "svc: sending again after 1 failed try (4 row(s) waiting, 3 dropped as too many waited)"
    assert len(said) == 3
    assert sender.stop(time.monotonic() + 5, time.monotonic() + 10) == 0
    assert service.got[-1] == "end" and sender.messages() == []


def test_a_stop_waits_a_bounded_time_and_names_the_rows_it_leaves():
    service = Service()
    service.down.set()
    service.release.set()
    sender = TrackerSender("svc", service.send, (), retry_first_s=30.0, end=service.end)
    for step in (3, 4):
        sender.put(step, {"x": 0.0})
    _until(sender.failing)
    start = time.monotonic()
    assert sender.stop(time.monotonic() + 1.5, time.monotonic() + 10) == 2
    assert time.monotonic() - start < 5
    said = sender.messages()
    # An error outside the tracker's refusals may be a bug: its traceback is kept.
    assert "Traceback (most recent call last)" in said[0] and "ConnectionError: service unavailable" in said[0]
    assert said[-1] == ("svc: 2 row(s) (steps 3-4) not sent before the run ended: the service did not take them "
                        "(they are in metrics.jsonl)")
    _until(lambda: service.got == ["end"])  # the run is still ended, without the rows
    sender.put(5, {"x": 0.0})  # after the stop: not sent, and no error
    assert sender.waiting() == 0


def test_a_row_in_the_services_hands_at_the_stop_is_counted_by_whether_it_went():
    """The row being sent when the stop's time for rows runs out: it is not named unsent if the service then takes
    it (before the deadline), and is if the service never answers."""
    for answers in (True, False):
        release, got = threading.Event(), []

        def slow(step: int, row: dict[str, float]) -> None:
            release.wait(5 if answers else 30)
            if answers:
                got.append(step)

        sender = TrackerSender("svc", slow, ())
        for step in (8, 9):
            sender.put(step, {"x": 0.0})
        timer = threading.Timer(1.5, release.set) if answers else None  # the service answers after rows_by
        if timer:
            timer.start()
        left = sender.stop(time.monotonic() + 0.5, time.monotonic() + (4 if answers else 1.5))
        said = sender.messages()
        if answers:
            assert got == [8] and left == 1, (got, said)
            assert said == ["svc: 1 row(s) (step 9) not sent before the run ended: the service did not take them "
                            "(they are in metrics.jsonl)"]
        else:
            assert left == 2 and said[0].startswith("svc: 2 row(s) (steps 8-9) not sent before the run ended"), said
        release.set()


def test_a_stop_cuts_a_long_backoff_short_so_a_service_back_meanwhile_gets_the_rows():
    """A service that failed long ago waits a backoff of up to a minute; the stop's deadline is 15 s. The stop retries
    at once (and each second), so a service back by then takes every row."""
    service = Service()
    service.down.set()
    service.release.set()
    sender = TrackerSender("svc", service.send, (ConnectionError,), retry_first_s=60.0, end=service.end)
    sender.put(7, {"x": 7.0})
    _until(sender.failing)
    service.down.clear()
    start = time.monotonic()
    assert sender.stop(time.monotonic() + 20, time.monotonic() + 25) == 0
    assert time.monotonic() - start < 10
    assert service.got == [7, "end"]
    assert re.fullmatch(r"svc: sending again after 1 failed try \(0 row\(s\) waiting\)", sender.messages()[-1])


def test_a_service_that_hangs_ending_the_run_is_left_at_the_deadline_and_said():
    service = Service()
    service.hang.set()
    sender = TrackerSender("svc", service.send, (), end=service.end)
    sender.put(1, {"x": 1.0})
    start = time.monotonic()
    assert sender.stop(time.monotonic() + 1.0, time.monotonic() + 2.0) == 0
    assert time.monotonic() - start < 5 and service.got == [1]
    assert sender.messages() == ["svc: the service did not answer before the run ended: its tracked run may not be "
                                 "marked ended (it stays resumable)"]


def test_trackers_stop_side_by_side_so_a_service_that_is_down_takes_no_time_from_another(monkeypatch, tmp_path):
    """MLflow's service down and W&B's back after a failure (in a long backoff): at the run's end both are stopped at
    once, so W&B's row goes out in the close's time instead of waiting out MLflow's share, and both runs are ended."""
    monkeypatch.setattr(trackers, "CLOSE_ROWS_S", 3.0)
    monkeypatch.setattr(trackers, "CLOSE_WAIT_S", 6.0)
    down, back = Service(), Service()
    for service in (down, back):
        service.down.set()
        service.release.set()
    both = Trackers(RunDir(tmp_path / "run"), [], {})
    both.senders = {"down": TrackerSender("down", down.send, (ConnectionError,), end=down.end),
                    "back": TrackerSender("back", back.send, (ConnectionError,), retry_first_s=60.0, end=back.end)}
    for sender in both.senders.values():
        sender.put(1, {"x": 1.0})
    _until(lambda: all(sender.failing() for sender in both.senders.values()))
    back.down.clear()
    both.close()
    assert back.got == [1, "end"] and down.got == ["end"]
    said = both.messages()
    assert any(line.startswith("down: 1 row(s) (step 1) not sent") for line in said), said
    assert not any(line.startswith("back: 1 row(s)") for line in said), said


def test_a_library_that_raises_system_exit_stops_its_sender_said_and_the_run_goes_on():
    """A library's SystemExit in the sender's thread (W&B patches sys.exit) ended the thread unsaid: the rows piled up
    for the whole run and the end-of-run line blamed the service. Now the log says the sender stopped and why, rows put
    after it are not kept, and the stop is at once."""
    sent: list[int] = []

    def send(step: int, row: dict[str, float]) -> None:
        if step == 2:
            raise SystemExit(1)
        sent.append(step)

    sender = TrackerSender("lib", send, retry_first_s=0.01)
    for step in (1, 2, 3):
        sender.put(step, {"loss": float(step)})
    _until(lambda: not sender.waiting())
    sender.put(4, {"loss": 4.0})
    start = time.monotonic()
    assert sender.stop(time.monotonic() + 5, time.monotonic() + 5) == 0
    assert time.monotonic() - start < 1 and sent == [1]
    said = sender.messages()
    assert len(said) == 1 and said[0].startswith("lib: will not send step 2 or any later row (Traceback"), said
    assert "SystemExit: 1" in said[0] and said[0].endswith("the library stopped its sender (a bug) (the rows are in "
                                                          "metrics.jsonl)"), said


def test_an_end_that_raises_system_exit_is_said():
    """Ending the tracked run is the library's call too: its SystemExit is said, not the thread's silent death."""
    def end() -> None:
        raise SystemExit(3)

    sender = TrackerSender("lib", lambda step, row: None, end=end)
    sender.stop(time.monotonic() + 5, time.monotonic() + 5)
    said = sender.messages()
    assert len(said) == 1 and said[0].startswith("lib: could not end its tracked run (Traceback"), said
    assert said[0].endswith("SystemExit: 3): the library stopped its sender (a bug)"), said
