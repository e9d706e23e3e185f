"""benchmarks/waiting_trainer.py: every training step ends with one wait for the device, after the step's own work.
torch.cuda's two calls are stood in for (this machine has no GPU); the Trainer is the project's own class."""
import torch

from benchmarks.waiting_trainer import wait_each_step
from pretrain.trainer import Trainer


def test_each_step_is_followed_by_one_device_wait(monkeypatch):
    calls = []
    monkeypatch.setattr(Trainer, "train_step", lambda self: calls.append(("step", self)))  # restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: calls.append(("wait",)))
    wait_each_step()
    trainer = object.__new__(Trainer)
    Trainer.train_step(trainer)
    Trainer.train_step(trainer)
    assert calls == [("step", trainer), ("wait",), ("step", trainer), ("wait",)]
