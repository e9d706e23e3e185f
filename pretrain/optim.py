"""Optimizer parameter groups and the learning-rate schedule."""
from __future__ import annotations

import math

import torch
from torch import nn

from pretrain.config import OptimizerConfig, ScheduleConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and biases/LayerNorm/1-d parameters without decay (as BERT does)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """torch AdamW: on CPU it needs no compiled op, and DeepSpeed's ZeRO wraps it."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)


def lr_factor(step: int, max_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warmup, then decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    shape = 1.0 - progress if cfg.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


class ScheduleFactor:
    """Picklable lr lambda (LambdaLR saves callable objects' state with the scheduler)."""

    def __init__(self, max_steps: int, cfg: ScheduleConfig) -> None:
        self.max_steps = max_steps
        self.cfg = cfg

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.max_steps, self.cfg)


def build_scheduler(optimizer: torch.optim.Optimizer, max_steps: int, cfg: ScheduleConfig):
    """A LambdaLR that DeepSpeed steps once per optimizer step and saves in its checkpoints."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, ScheduleFactor(max_steps, cfg))


def reset_schedule(scheduler, max_steps: int, cfg: ScheduleConfig, lr: float) -> None:
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
