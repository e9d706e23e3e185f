"""benchmarks/gpu_paths.py's runs on a CPU, with the real trainer: the optimizer comparison (here DeepSpeedCPUAdam
against torch's AdamW, the CPU side of optimizer.impl=deepspeed) and the fp16 check's stop and resume (here in fp32,
fp16 being refused on a CPU) start valid configs that train and log every step, and come out as on a GPU node."""
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
