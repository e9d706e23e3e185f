"""Learning-rate schedule, parameter groups, where DeepSpeed's ops are built, and an op that does not build: one line
(the GPU's FusedAdam and FusedLamb included), any other error a bug."""
import os
import subprocess
import sys

import pytest
import torch

from core.errors import SetupError
from pretrain.config import OptimizerConfig, ScheduleConfig
from pretrain.engine.optim import (build_optimizer, build_scheduler, load_op, lr_factor, ops_build_in_this_venv,
                                   param_groups, reset_schedule, schedule_warning)


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


def test_no_decay_on_bias_and_layernorm():
    decay, no_decay = param_groups(_model(), 0.01)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


def test_warmup_then_linear_and_cosine():
    cfg = ScheduleConfig(warmup_steps=10, decay="linear", min_lr_ratio=0.1)
    assert [lr_factor(s, 110, cfg) for s in (0, 9)] == [0.1, 1.0]
    assert abs(lr_factor(60, 110, cfg) - (0.1 + 0.9 * 0.5)) < 1e-12
    assert abs(lr_factor(110, 110, cfg) - 0.1) < 1e-12
    cos = ScheduleConfig(warmup_steps=0, decay="cosine")
    assert abs(lr_factor(50, 100, cos) - 0.5) < 1e-12


def test_resume_follows_the_current_schedule():
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3))
    sched = build_scheduler(opt, 100, ScheduleConfig(warmup_steps=10))
    for _ in range(40):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    # Same config: identical lr after loading and resetting.
    opt2 = build_optimizer(model, OptimizerConfig(lr=1e-3))
    sched2 = build_scheduler(opt2, 100, ScheduleConfig(warmup_steps=10))
    sched2.load_state_dict(saved)
    reset_schedule(sched2, 100, ScheduleConfig(warmup_steps=10), 1e-3)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    # A longer run and a new peak: the loaded pickle must not win.
    opt3 = build_optimizer(model, OptimizerConfig(lr=2e-3))
    sched3 = build_scheduler(opt3, 1000, ScheduleConfig(warmup_steps=10))
    sched3.load_state_dict(saved)
    reset_schedule(sched3, 1000, ScheduleConfig(warmup_steps=10), 2e-3)
    want = 2e-3 * lr_factor(40, 1000, ScheduleConfig(warmup_steps=10))
    assert abs(opt3.param_groups[0]["lr"] - want) < 1e-15
    opt3.step()
    sched3.step()
    assert abs(opt3.param_groups[0]["lr"] - 2e-3 * lr_factor(41, 1000, ScheduleConfig(warmup_steps=10))) < 1e-15


def test_constant_holds_the_peak_after_warmup():
    cfg = ScheduleConfig(warmup_steps=4, decay="constant", min_lr_ratio=0.1)
    assert [lr_factor(s, 100, cfg) for s in (0, 1, 3, 4, 50, 99, 100)] == [0.25, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_a_warmup_longer_than_the_run_is_said_in_the_log():
    """Warmup 56 (the demo's) over an 8-step run: the lr ends at 8/56 of its peak and never decays."""
    cfg = ScheduleConfig(warmup_steps=56)
    assert schedule_warning(8, cfg) == ("warning: schedule.warmup_steps (56) >= train.max_steps (8): the lr warms up "
                                        "for the whole run, to 0.143 of optimizer.lr at its last step, and never decays")
    assert "to 1 of optimizer.lr" in schedule_warning(56, cfg)  # the peak at the last step, and no decay
    assert schedule_warning(56, cfg) is not None and schedule_warning(57, cfg) is None
    assert schedule_warning(8, ScheduleConfig(warmup_steps=0)) is None


def test_polynomial_decay():
    cfg = ScheduleConfig(warmup_steps=0, decay="polynomial", power=2.0, min_lr_ratio=0.0)
    assert abs(lr_factor(25, 100, cfg) - 0.75 ** 2) < 1e-12


def test_lamb_matches_the_formula_in_float64():
    import math

    from pretrain.engine.optim import Lamb

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
    ref = p.detach().clone().numpy().copy()
    opt = Lamb([p], lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)
    m = [[0.0] * 3 for _ in range(5)]
    v = [[0.0] * 3 for _ in range(5)]
    for step in range(1, 4):
        grad = torch.randn(5, 3, dtype=torch.float64)
        p.grad = grad.clone()
        opt.step()
        g = grad.numpy()
        u = [[0.0] * 3 for _ in range(5)]
        for i in range(5):
            for j in range(3):
                m[i][j] = 0.9 * m[i][j] + 0.1 * g[i][j]
                v[i][j] = 0.999 * v[i][j] + 0.001 * g[i][j] ** 2
                m_hat, v_hat = m[i][j] / (1 - 0.9 ** step), v[i][j] / (1 - 0.999 ** step)
                u[i][j] = m_hat / (math.sqrt(v_hat) + 1e-6) + 0.1 * ref[i][j]
        w_norm = math.sqrt(sum(ref[i][j] ** 2 for i in range(5) for j in range(3)))
        u_norm = math.sqrt(sum(u[i][j] ** 2 for i in range(5) for j in range(3)))
        for i in range(5):
            for j in range(3):
                ref[i][j] -= 0.01 * (w_norm / u_norm) * u[i][j]
    assert torch.allclose(p.detach(), torch.tensor(ref), rtol=1e-12, atol=0)


def test_deepspeed_lamb_on_cpu_is_a_clear_error():
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="optimizer.impl=torch"):
        build_optimizer(_model(), OptimizerConfig(name="lamb", impl="deepspeed"))


def test_warmup_stable_decay():
    cfg = ScheduleConfig(warmup_steps=10, decay="wsd", decay_fraction=0.2, min_lr_ratio=0.0)
    assert lr_factor(0, 100, cfg) == 0.1 and lr_factor(9, 100, cfg) == 1.0
    assert [lr_factor(s, 100, cfg) for s in (10, 50, 79)] == [1.0, 1.0, 1.0]  # stable until the last 20 steps
    assert abs(lr_factor(90, 100, cfg) - 0.5) < 1e-12 and lr_factor(100, 100, cfg) == 0.0


def test_ops_build_in_the_venvs_own_folder_unless_told_otherwise(monkeypatch):
    """torch's default folder is shared by every venv of the user: an op is built and loaded in the venv's own, the
    folder `make` builds it in, unless TORCH_EXTENSIONS_DIR says where (a test's, a cluster's per-CPU folder)."""
    assert sys.prefix != sys.base_prefix  # the suite runs in the project's venv
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")  # the undo then restores the variable, or its absence
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert ops_build_in_this_venv() == os.path.join(sys.prefix, "torch_extensions") == os.environ["TORCH_EXTENSIONS_DIR"]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/scratch/ops-epyc")
    assert ops_build_in_this_venv() == "/scratch/ops-epyc" == os.environ["TORCH_EXTENSIONS_DIR"]


def _deepspeed_exception(name: str, text: str) -> Exception:
    """One of DeepSpeed's op-builder exceptions, imported when the test runs: importing DeepSpeed's op builder sets
    variables in os.environ (one of them random), and at collection that would keep every later launch of this pytest
    worker from being forked from the preloaded server (tests/helpers/preloaded.py)."""
    from deepspeed.ops.op_builder import builder

    return getattr(builder, name)(text)


def _failed_build() -> RuntimeError:
    """What torch's JIT build raises when nvcc fails: ninja's output in the message, its exit as the cause."""
    try:
        try:
            raise subprocess.CalledProcessError(1, ["ninja", "-v"])
        except subprocess.CalledProcessError as ninja:
            raise RuntimeError(
                "Error building extension 'fused_adam': [1/3] /usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=fused_adam "
                "-O3 -c multi_tensor_adam.cu -o multi_tensor_adam.cuda.o\nFAILED: multi_tensor_adam.cuda.o\n"
                "multi_tensor_adam.cu(3): error: identifier \"__nv_bfloat16\" is undefined\n1 error detected") from ninja
    except RuntimeError as err:
        return err


@pytest.mark.parametrize("raised, said", [
    (_failed_build(), "(multi_tensor_adam.cu(3): error: identifier \"__nv_bfloat16\" is undefined)"),
    # torch's build with no toolkit: CUDA_HOME unset, before any compiler runs
    (OSError("CUDA_HOME environment variable is not set. Please set it to your CUDA install root."),
     "(OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.)"),
    (RuntimeError("Error building extension 'fused_adam': [1/3] /usr/local/cuda/bin/nvcc -c x.cu\n"
                  "nvcc fatal   : Unsupported gpu architecture 'compute_100'"),
     "(nvcc fatal   : Unsupported gpu architecture 'compute_100')"),
    (RuntimeError("Error building extension 'fused_lamb': /bin/sh: 1: /usr/local/cuda/bin/nvcc: not found"),
     "(Error building extension 'fused_lamb': /bin/sh: 1: /usr/local/cuda/bin/nvcc: not found)"),
    # a linker's warning before its error: the error is the line
    (RuntimeError("Error building extension 'fused_adam': [3/3] c++ fused_adam.o -o fused_adam.so\n/usr/bin/ld: "
                  "warning: libcuda.so.1, needed by x.so, not found\ncollect2: error: ld returned 1 exit status"),
     "(collect2: error: ld returned 1 exit status)"),
    # an op built for another torch
    (ImportError("fused_adam.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"),
     "(ImportError: fused_adam.so: undefined symbol: _ZN3c104cuda9SetDeviceEi)"),
    (("MissingCUDAException", "CUDA_HOME does not exist, unable to compile CUDA op(s)"),
     "(MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s))"),
    (("CUDAMismatchException", ">- DeepSpeed Op Builder: Installed CUDA version 12.1 does not match the version torch "
                               "was compiled with 12.8"), "Installed CUDA version 12.1 does not match")])
def test_an_op_that_does_not_build_is_one_line(raised, said):
    def load():
        raise _deepspeed_exception(*raised) if isinstance(raised, tuple) else raised

    with pytest.raises(SetupError) as caught:
        load_op(load, "FusedAdam", "optimizer.impl=deepspeed on a GPU", "use optimizer.impl=torch")
    line = str(caught.value)
    assert line.startswith("optimizer.impl=deepspeed on a GPU needs DeepSpeed's FusedAdam op, which did not build here ")
    assert said in line and line.endswith(": use optimizer.impl=torch") and "\n" not in line, line


@pytest.mark.parametrize("raised", [TypeError("load() got an unexpected keyword argument 'verbose'"),
                                    RuntimeError("CUDA error: an illegal memory access was encountered")])
def test_another_error_while_the_op_loads_stays_a_bug(raised):
    def load():
        raise raised

    with pytest.raises(type(raised)) as caught:
        load_op(load, "FusedAdam", "optimizer.impl=deepspeed on a GPU", "use optimizer.impl=torch")
    assert caught.value is raised
    loaded = []
    assert load_op(lambda: loaded.append(1), "FusedAdam", "x", "y") is None and loaded == [1]
