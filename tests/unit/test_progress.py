"""The run's counters: a rank may read them alone (a getter that ran a collective would hang a rank that read it
while the others did not); summing the ranks' counts is the explicit, collective `sync`."""
import torch

from core import distributed as dist
from pretrain.observe.progress import Progress


def test_reading_the_state_runs_no_collective(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "control_all_reduce_sum", lambda t: calls.append(t) or t)
    progress = Progress()
    progress.count(4, torch.tensor(500))
    progress.step = 1
    assert progress.state_dict() == {"step": 1, "samples_seen": 0, "tokens_seen": 0, "elapsed_s": 0.0}
    assert calls == []  # read alone: nothing waits on another rank
    progress.sync()
    assert len(calls) == 1 and progress.state_dict()["samples_seen"] == 4 and progress.state_dict()["tokens_seen"] == 500


def test_a_restored_state_reads_back_unchanged():
    progress = Progress()
    progress.load_state_dict({"step": 7, "samples_seen": 56, "tokens_seen": 7000, "elapsed_s": 12.5})
    assert progress.state_dict() == {"step": 7, "samples_seen": 56, "tokens_seen": 7000, "elapsed_s": 12.5}
