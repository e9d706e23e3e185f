"""benchmarks/gpu_paths.py's runs on a CPU, with the real trainer: the optimizer comparison (here DeepSpeedCPUAdam
against torch's AdamW, the CPU side of optimizer.impl=deepspeed) and the fp16 check's stop and resume (here in fp32,
fp16 being refused on a CPU) start valid configs that train and log every step, and come out as on a GPU node."""
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import ForkedModuleRuns

import benchmarks.gpu_paths as gpu_paths
from benchmarks.gpu_paths import PASS, build_parser, check_fused_adam, stopped_and_resumed


@pytest.fixture(autouse=True)
def forked_runs(monkeypatch):
    """The script's `python -m pretrain train` runs forked from the preloaded server, not fresh interpreters."""
    monkeypatch.setattr(gpu_paths, "subprocess", ForkedModuleRuns())


def _args(data: Path, work: Path):
    return build_parser().parse_args(["--data", str(data), "--work", str(work), "--steps", "10", "--batch", "4"])


def test_the_optimizer_comparison_runs_both_sides_and_agrees(prepared, tmp_path):
    outcome = check_fused_adam(_args(prepared, tmp_path), tmp_path, 0)
    assert outcome.verdict == PASS, outcome.detail
    assert outcome.figures["steps_compared"] == 10 and outcome.figures["max_relative_loss_difference"] <= 1e-3


def test_the_stopped_run_resumes_to_the_uninterrupted_ones_losses(prepared, tmp_path):
    whole, resumed, failed = stopped_and_resumed(_args(prepared, tmp_path), tmp_path, 4, "train.precision=fp32")
    assert failed == "", failed
    assert [r["step"] for r in resumed.rows] == list(range(1, 11))
    # Bit for bit on a CPU, the steps after the stop included.
    assert [r["loss"] for r in resumed.rows] == [r["loss"] for r in whole.rows]
    assert "resum" in resumed.log.lower() and "step_00000004" in resumed.log, resumed.log[-2000:]


def test_a_run_past_its_time_is_ended_with_its_whole_group_and_said(prepared, tmp_path, monkeypatch):
    """`--run-timeout-s`: a run that outlasts it is killed with its session's process group (its loader worker
    included, which would otherwise keep the GPU node's CPUs), and its stderr says by what."""
    started = []

    class Recorded(ForkedModuleRuns):
        def Popen(self, *args, **kwargs):
            proc = super().Popen(*args, **kwargs)
            started.append(proc.pid)
            return proc

    monkeypatch.setattr(gpu_paths, "subprocess", Recorded())
    args = build_parser().parse_args(["--data", str(prepared), "--work", str(tmp_path), "--steps", "100000", "--batch",
                                      "4", "--run-timeout-s", "3"])
    run = gpu_paths.train(tmp_path / "endless", args)
    assert run.code == -signal.SIGKILL and run.seconds < 3 + 15, run
    assert run.errors == ["error: ended by benchmarks.gpu_paths after --run-timeout-s 3 s"], run.stderr[-2000:]
    assert run.rows, "it had not started training: the timeout ended its start-up, not a run"
    (pid,) = started
    deadline = time.monotonic() + 10
    while True:  # its group (the run, its loader worker) gone
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, f"a process of the ended run's group {pid} is still there"
        time.sleep(0.2)
