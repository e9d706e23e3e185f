"""Learning-rate schedule and parameter groups."""
import torch

from pretrain.config import OptimizerConfig, ScheduleConfig
from pretrain.optim import build_optimizer, build_scheduler, lr_factor, param_groups, reset_schedule


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
