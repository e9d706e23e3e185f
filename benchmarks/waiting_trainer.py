"""`python -m pretrain` with the host waiting for the device once a step: the trainer as it was before c94c865.

Until then the metric window put each step's values in name order by indexing a device tensor with a Python list,
a copy from pageable host memory that waited for the device's queue at the end of every step (an H200 profile,
BENCHMARKS.md "A host sync a step"). `gpu_throughput.py --host-wait-each-step` runs this to put what removing it
gained beside the trainer as it is, in one call: a `torch.cuda.synchronize()` at the same point of the step, a
no-op on a CPU.

    python -m benchmarks.waiting_trainer train --config ...      # as python -m pretrain
"""
from __future__ import annotations


def wait_each_step() -> None:
    """Make every Trainer.train_step end with the host waiting for the device's queue."""
    import torch

    from pretrain.trainer import Trainer

    original = Trainer.train_step

    def train_step(self) -> None:
        original(self)
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    Trainer.train_step = train_step


if __name__ == "__main__":
    import runpy
    import sys

    wait_each_step()
    print("benchmarks.waiting_trainer: every training step ends with the host waiting for the device", file=sys.stderr)
    runpy.run_module("pretrain", run_name="__main__", alter_sys=True)  # as `python -m pretrain`, with its argv
