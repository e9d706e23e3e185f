"""Torch's report of a loader worker a StartWatch killed is an attempt lost, in both forms torch gives it and wherever
it is chained; any other worker's death is not."""
from core.errors import AttemptLostError
from data_pipeline import loader_worker
from data_pipeline.loader_worker import start_failure


def test_torchs_reports_of_a_killed_worker_are_an_attempt_lost(monkeypatch):
    monkeypatch.setitem(loader_worker._NEVER_STARTED, 4242, 60.0)
    from_sigchld = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    from_wait = RuntimeError("DataLoader worker (pid(s) 17, 4242) exited unexpectedly")
    for report in (from_sigchld, from_wait):
        lost = start_failure(report)
        assert isinstance(lost, AttemptLostError)
        assert "loader worker(s) 4242 of this rank did not start within 60 s" in str(lost) and "gh-112275" in str(lost)
    try:  # raised where the rank's main thread was: inside a collective, a save, another library's wrapper
        try:
            raise from_sigchld
        except RuntimeError as exc:
            raise ValueError("wrapped") from exc
    except ValueError as wrapped:
        assert isinstance(start_failure(wrapped), AttemptLostError)
    given = AttemptLostError("given")
    assert start_failure(given) is given


def test_another_workers_death_or_error_is_not(monkeypatch):
    monkeypatch.setitem(loader_worker._NEVER_STARTED, 4242, 60.0)
    assert start_failure(RuntimeError("DataLoader worker (pid 4243) is killed by signal: Killed. ")) is None
    assert start_failure(RuntimeError("DataLoader worker (pid(s) 42) exited unexpectedly")) is None
    assert start_failure(RuntimeError("something else 4242")) is None
    assert start_failure(None) is None
