"""The ranks of tests/process/test_grad_buckets.py (`buckets OUT` or `engine OUT`; RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the launch): each saves what it saw to OUT/<what><rank>.pt for the test to compare."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from pretrain.engine.grad_buckets import GradientBuckets


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 8)
        self.scale = nn.Parameter(torch.ones(8, dtype=torch.float16))  # a bucket of its own dtype
        self.second = nn.Linear(8, 8)
        self.only_rank0 = nn.Linear(8, 3)  # registered last: its bucket is the first to launch

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        h = torch.tanh(self.first(x)) * self.scale.float()
        out = self.second(h).pow(2).sum()
        return out + self.only_rank0(h).sum() if rank == 0 else out


class _RegisteredBackwards(nn.Module):
    """Layers registered last to first: the parameters' reverse order is the opposite of backward's."""

    def __init__(self) -> None:
        super().__init__()
        self.last, self.middle, self.first = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.middle(torch.tanh(self.first(x))))).pow(2).sum()


def _grads(net: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def bucket_rank(rank: int, out: str) -> None:
    """Two nets' gradients through the buckets, with what each rank computed by itself."""
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = _Net()
    buckets = GradientBuckets(list(net.parameters()), world=2, bucket_bytes=64)  # a few parameters per bucket
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 + rank))
    net(x, rank).backward()  # inside the accumulation: nothing is reduced
    inside = _grads(net)
    net(x * 2, rank).backward()  # what this rank's two micro-batches add up to, before the reduction
    own = _grads(net)
    net.zero_grad(set_to_none=True)
    net(x, rank).backward()
    buckets.arm()
    net(x * 2, rank).backward()
    launched = [b.work is not None for b in buckets.buckets]  # before finish(): during backward
    buckets.finish()
    result = {"own": own, "reduced": _grads(net), "inside": inside, "buckets": len(buckets.buckets), "launched": launched}

    # Backward finishes `first` last, though the parameters' reverse order puts it first: the first reduced step
    # holds every bucket back until the end; after it, the buckets follow the order seen.
    torch.manual_seed(1)
    net = _RegisteredBackwards()
    on_arrival = []
    net.first.weight.register_post_accumulate_grad_hook(
        lambda p: on_arrival.append(sum(b.work is not None for b in buckets.buckets)))  # runs before the buckets' hook
    buckets = GradientBuckets(list(net.parameters()), world=2, bucket_bytes=1)  # one parameter per bucket
    for _ in range(2):
        net.zero_grad(set_to_none=True)
        buckets.arm()
        net(x).backward()
        result.setdefault("reordered_own", _grads(net))
        buckets.finish()
    result.update(reordered=_grads(net), launched_when_first_arrived=on_arrival)
    net.zero_grad(set_to_none=True)
    net(x).backward()  # the second step's own gradients, for its expected mean
    result["reordered_own_2"] = _grads(net)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def engine_rank(rank: int, out: str) -> None:
    """DeepSpeed's engine at stage 0, fp32, accumulation 2, with and without the buckets: the all-reduces per step."""
    from core.distributed import init_distributed
    from pretrain.engine.deepspeed_engine import build_engine

    init_distributed(120)

    class Objective(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 4)])  # compile regions

        def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
            h = batch["x"]
            for layer in self.layers:
                h = torch.tanh(layer(h))
            return h.pow(2).mean(), {}

    calls = []
    real = dist.all_reduce

    def counted(*args, **kwargs):  # the real collective, counted
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_reduce = counted
    config = {"train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 2, "train_batch_size": 20,
              "zero_optimization": {"stage": 0}, "gradient_clipping": 1.0, "steps_per_print": 1 << 30}
    counts, weights = {}, {}
    for name, size, compile in (("deepspeed", 0, False), ("buckets", 64, False), ("buckets_compiled", 64, "layers")):
        torch.manual_seed(0)
        model = Objective()
        engine = build_engine(model, torch.optim.AdamW(model.parameters(), lr=1e-2), None, dict(config), 2,
                              compile=compile, grad_buckets_bytes=size)
        per_micro = []
        for step in range(4):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(100 * step + rank))
            calls.clear()
            engine.micro_step({"x": x}, boundary=step % 2 == 1)
            per_micro.append(len(calls))
        counts[name] = per_micro
        weights[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if engine.buckets is not None:
            counts["buckets_per_step"] = len(engine.buckets.buckets)
    torch.save({"counts": counts, "weights": weights}, Path(out) / f"engine{rank}.pt")


if __name__ == "__main__":
    {"buckets": bucket_rank, "engine": engine_rank}[sys.argv[1]](int(os.environ["RANK"]), sys.argv[2])
