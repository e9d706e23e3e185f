"""Optimizer parameter groups and the learning-rate schedule."""
from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from typing import Any, Callable, Optional

import torch
from torch import nn

from model.backbones.base import weight_decays
from pretrain.config import OptimizerConfig, ScheduleConfig


def param_group_names(model: nn.Module) -> list[list[str]]:
    """The trained parameters' names in the optimizer's two groups, in order: decayed weights, then biases, norms and
    other 1-d parameters without decay (`weight_decays`)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if weight_decays(name, param) else no_decay).append(name)
    return [decay, no_decay]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The optimizer's two parameter groups (`param_group_names`), the first with `weight_decay`, the second with none."""
    params = dict(model.named_parameters())
    decay, no_decay = ([params[n] for n in names] for names in param_group_names(model))
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB as the paper gives it (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2):

    m, v as Adam with bias correction; u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p;
    p -= lr * (||p|| / ||u||) * u, with the trust ratio 1 when either norm is 0.

    Not DeepSpeed's FusedLamb (optimizer.impl=deepspeed), which divides the raw moments, clamps the trust ratio to
    [0.01, 10] and multiplies the step by sqrt(1 - beta2^t) / (1 - beta1^t) after it (benchmarks/gpu_paths.py).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One LAMB update of every parameter with a gradient."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** state["step"])
                v_hat = v / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, offload: bool = False) -> torch.optim.Optimizer:
    """The configured optimizer over the two parameter groups (a CPU one when ZeRO offloads it)."""
    groups = param_groups(model, cfg.weight_decay)
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.impl == "torch":
        # fused: one kernel over all tensors; on a CPU it steps several times faster than torch's default for-loop
        # and foreach, as fast as DeepSpeedCPUAdam, and as deterministic (BENCHMARKS.md, issue 15; optimizer_step.py).
        return torch.optim.AdamW(groups, fused=True, **kwargs) if cfg.name == "adamw" else Lamb(groups, **kwargs)
    ops_build_in_this_venv()
    if not torch.cuda.is_available() or offload:
        if cfg.name == "lamb":
            from core.errors import ConfigError

            raise ConfigError("optimizer.impl=deepspeed with name=lamb needs a GPU without optimizer offload "
                              "(FusedLamb is a CUDA kernel); use optimizer.impl=torch")
        return cpu_adam(groups, kwargs)
    # CUDA ops built on first use with the node's nvcc (CUDA_HOME); a prebuilt DeepSpeed (DS_BUILD_OPS=1) has them.
    toolkit = f"or give the node a CUDA toolkit for torch's CUDA {torch.version.cuda} (nvcc, CUDA_HOME)"
    who = "optimizer.impl=deepspeed on a GPU"
    if cfg.name == "adamw":
        from deepspeed.ops.adam import FusedAdam
        from deepspeed.ops.op_builder import FusedAdamBuilder

        load_op(lambda: FusedAdamBuilder().load(), "FusedAdam", who,
                f"use optimizer.impl=torch (torch's fused AdamW), {toolkit}")
        return FusedAdam(groups, adam_w_mode=True, **kwargs)
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.op_builder import FusedLambBuilder

    load_op(lambda: FusedLambBuilder().load(), "FusedLamb", who,
            f"use optimizer.impl=torch (the project's LAMB: the paper's update, not FusedLamb's), {toolkit}")
    return FusedLamb(groups, **kwargs)


def ops_build_in_this_venv() -> Optional[str]:
    """Point torch's JIT op builds at the virtual environment's own `torch_extensions` (what `make` builds into),
    unless TORCH_EXTENSIONS_DIR is set or this is no venv; the folder used, or None for torch's default.

    torch's default folder is shared by every venv of the user, and ninja rebuilds an op there (a minute or two)
    whenever another venv built it last with its own paths."""
    if "TORCH_EXTENSIONS_DIR" not in os.environ and sys.prefix != sys.base_prefix:
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")
    return os.environ.get("TORCH_EXTENSIONS_DIR")


def cpu_adam(groups: list[dict], kwargs: dict) -> torch.optim.Optimizer:
    """DeepSpeedCPUAdam over `groups`; a C++ op that did not build (no compiler, no headers) is named in one line."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import CPUAdamBuilder

    load_op(loaded(CPUAdamBuilder), "CPU Adam", "optimizer.impl=deepspeed on a CPU or with optimizer offload",
            "use optimizer.impl=torch (torch's fused AdamW, as fast on a CPU)")
    return DeepSpeedCPUAdam(groups, adamw_mode=True, **kwargs)


def load_op(load: Callable[[], object], name: str, who: str, instead: str) -> None:
    """`load()`: DeepSpeed's op `name` built on first use and imported (the optimizer made next finds it loaded). One
    that cannot be (no compiler or headers, no nvcc or CUDA_HOME, a build for another torch) is a SetupError naming
    why in one line; only the build is inside, so an error in making the optimizer stays a bug."""
    from deepspeed.ops.op_builder.builder import CUDAMismatchException, MissingCUDAException

    try:
        load()
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError, MissingCUDAException,
            CUDAMismatchException) as err:
        if isinstance(err, RuntimeError) and "CUDA error" in str(err):  # the device's fault, not the build's
            raise
        from core.errors import SetupError

        raise SetupError(f"{who} needs DeepSpeed's {name} op, which did not build here ({build_error(err)}): "
                         f"{instead}") from err


def loaded(builder: Callable[[], Any]) -> Callable[[], object]:
    """What builds and imports the CPU op of `builder()` (for `load_op`), py-cpuinfo answering its questions once
    (`ask_cpuinfo_once`; DeepSpeed's CUDA ops ask none)."""

    def load() -> object:
        ask_cpuinfo_once()
        return builder().load()

    return load


def ask_cpuinfo_once() -> None:
    """Make py-cpuinfo answer once per process. Each of its answers is a fresh Python interpreter that sleeps a second
    to time the clock, and DeepSpeed's CPU ops ask three times (the build's two flags, then the optimizer) about a CPU
    that does not change."""
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed then reads lscpu
        return
    if getattr(cpuinfo.get_cpu_info, "asked_once", False):
        return
    ask = functools.cache(cpuinfo.get_cpu_info)

    def get_cpu_info() -> dict:
        return dict(ask())  # a shallow copy: a caller that sets a key does not set it for the next

    get_cpu_info.asked_once = True
    cpuinfo.get_cpu_info = get_cpu_info


def build_error(err: BaseException) -> str:
    """The line that says why a C++ op's build failed: the compiler's first 'error:' line anywhere in the chain of
    causes (DeepSpeed's own message says only that the op failed), else nvcc's 'fatal' line, else a 'not found' one,
    else the innermost cause's first line."""
    chain = [err]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    # A compiler's "error:" first (a linker's "not found" warning may come before it), nvcc's "fatal", a shell's
    # "nvcc: not found".
    for mark in ("error:", "fatal", "not found"):
        for exc in chain:
            for line in str(exc).splitlines():
                if mark in line.lower():
                    return line.strip()
    first = (str(chain[-1]).strip().splitlines() or [""])[0]
    return f"{type(chain[-1]).__name__}: {first}"


def optimizer_note(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> str:
    """The log's line naming the optimizer class that steps the weights."""
    kind = type(optimizer).__name__
    if kind == "AdamW" and optimizer.defaults.get("fused"):
        kind = "torch's fused AdamW"
    built = f", its op in {os.environ['TORCH_EXTENSIONS_DIR']}" if cfg.impl == "deepspeed" and os.environ.get(
        "TORCH_EXTENSIONS_DIR") else ""
    return f"optimizer {kind} (optimizer.name={cfg.name}, optimizer.impl={cfg.impl}{built})"


def replay_step_products(optimizer: Optional[torch.optim.Optimizer]) -> int:
    """DeepSpeedCPUAdam restored from a checkpoint: its native beta powers rebuilt as an unbroken run made them; the step.

    Its C++ side keeps beta1**t and beta2**t as float products, multiplied in once per step; a new process at step t
    computes them with pow(beta, t) instead, which rounds differently, so a resumed run drifted from the uninterrupted
    one by a few ulps a step. Its update over empty tensors at steps 1..t multiplies them in as that run did."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    if not isinstance(optimizer, DeepSpeedCPUAdam):
        return 0
    # One count for every state: always at ZeRO 1-3 (flat partitions). At stage 0 a parameter with no gradient in
    # some steps lags; the uninterrupted run's products then came from pow as well, in an order not replayed here.
    steps = {int(s["step"]) for s in optimizer.state.values() if "step" in s}
    if len(steps) != 1:
        return 0
    group, empty = optimizer.param_groups[0], torch.empty(0)
    beta1, beta2 = group["betas"]
    (last,) = steps
    for step in range(1, last + 1):
        optimizer.ds_opt_adam.adam_update(optimizer.opt_id, step, group["lr"], beta1, beta2, group["eps"],
                                          group["weight_decay"], group["bias_correction"], empty, empty, empty, empty)
    return last


def schedule_warning(max_steps: int, cfg: ScheduleConfig) -> Optional[str]:
    """A line for the log when the warmup lasts the whole run (no decay; a longer one never reaches the peak lr),
    else None."""
    if cfg.warmup_steps < max_steps:
        return None
    return (f"warning: schedule.warmup_steps ({cfg.warmup_steps}) >= train.max_steps ({max_steps}): the lr warms up "
            f"for the whole run, to {lr_factor(max_steps - 1, max_steps, cfg):.3g} of optimizer.lr at its last step, "
            "and never decays")


def lr_factor(step: int, max_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warmup, then decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    decay_start = cfg.warmup_steps
    if cfg.decay == "wsd":  # warmup-stable-decay: constant, then linear over the last decay_fraction of the run
        decay_start = max(cfg.warmup_steps, max_steps - round(cfg.decay_fraction * max_steps))
        if step < decay_start:
            return 1.0
    progress = min(1.0, (step - decay_start) / max(1, max_steps - decay_start))
    if cfg.decay in ("linear", "wsd"):
        shape = 1.0 - progress
    elif cfg.decay == "polynomial":
        shape = (1.0 - progress) ** cfg.power
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


class ScheduleFactor:
    """Picklable lr lambda (LambdaLR saves callable objects' state with the scheduler)."""

    def __init__(self, max_steps: int, cfg: ScheduleConfig) -> None:
        self.max_steps = max_steps
        self.cfg = cfg

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.max_steps, self.cfg)


def build_scheduler(optimizer: torch.optim.Optimizer, max_steps: int,
                    cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR that DeepSpeed steps once per optimizer step and saves in its checkpoints."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, ScheduleFactor(max_steps, cfg))


def reset_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, max_steps: int, cfg: ScheduleConfig,
                   lr: float) -> None:
    """Make a loaded scheduler follow the current config.

    LambdaLR's state_dict pickles the lambda's fields and the base lrs, so loading a checkpoint
    would silently bring back the old max_steps, schedule and peak lr. With an unchanged config
    this sets exactly the values the checkpoint held.
    """
    factor = ScheduleFactor(max_steps, cfg)
    groups = scheduler.optimizer.param_groups
    scheduler.lr_lambdas = [factor for _ in groups]
    scheduler.base_lrs = [lr for _ in groups]
    for group in groups:
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]
