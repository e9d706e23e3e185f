"""Stage 0's gradient buckets (pretrain/engine/grad_buckets.py) on two real gloo ranks: each gradient is the mean of
the ranks' own, computed here from the gradients each rank sends back; a parameter only one rank's graph used is
averaged with the other's zeros, and the ranks still agree on the order of their collectives; a backward inside the
accumulation reduces nothing; buckets launch while backward runs, in the order rank 0 saw the gradients arrive once
the first reduced step has shown it; and in the DeepSpeed engine the buckets replace DeepSpeed's own reduction. The
whole trainer with the buckets against DeepSpeed's own reduction: test_engine_configs.py."""
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port
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


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
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


def _mean_of(r0: dict, r1: dict, mine: torch.Tensor, name: str) -> torch.Tensor:
    other = r1.get(name, torch.zeros_like(mine))
    return (r0[name].double() + other.double()) / 2


def test_buckets_average_every_gradient_over_the_ranks_and_launch_during_backward(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["buckets"] >= 4
    assert "only_rank0.weight" in r0["own"] and "only_rank0.weight" not in r1["own"]
    for name, mine in r0["reduced"].items():
        tolerance = 1e-3 if mine.dtype == torch.float16 else 1e-6
        assert torch.allclose(mine.double(), _mean_of(r0["own"], r1["own"], mine, name), rtol=tolerance, atol=0), name
        assert torch.equal(mine, r1["reduced"][name]), name  # both ranks step from the same gradient
    # Without the ranks' average in between, each rank's first backward kept its own gradient.
    assert not torch.equal(r0["inside"]["first.weight"], r1["inside"]["first.weight"])
    # Rank 0 had every bucket on its way before backward ended; rank 1, which never gets only_rank0's gradient, held
    # them all behind that parameter's bucket (the order both keep).
    assert all(r0["launched"]) and not any(r1["launched"])
    # The reordered net: at most the bucket of first.bias was out when first.weight arrived in the first step; in
    # the second, the four of `last` and `middle` were.
    for r in (r0, r1):
        assert r["launched_when_first_arrived"][0] <= 1 and r["launched_when_first_arrived"][1] >= 4, r
    for key in ("reordered_own", "reordered_own_2"):
        assert r0[key].keys() == r1[key].keys() == r0["reordered"].keys()
    for name, mine in r0["reordered"].items():
        expected = _mean_of(r0["reordered_own_2"], r1["reordered_own_2"], mine, name)
        assert torch.allclose(mine.double(), expected, rtol=1e-6, atol=0), name


def _engine_rank(rank: int, port: int, out: str) -> None:
    """DeepSpeed's engine at stage 0, fp32, accumulation 2, with and without the buckets: the all-reduces per step."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
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


def test_in_deepspeeds_engine_the_buckets_replace_its_own_reduction_eager_and_compiled(tmp_path):
    """Also under train.compile=layers: the hooks sit on the parameters, outside the compiled regions."""
    mp.spawn(_engine_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"engine{rank}.pt") for rank in (0, 1)]
    for result in results:
        counts = result["counts"]
        assert counts["deepspeed"] == [0, 1, 0, 1]  # one flat all-reduce after each boundary's backward
        n = counts["buckets_per_step"]
        assert n >= 2 and counts["buckets"] == counts["buckets_compiled"] == [0, n, 0, n]  # nothing of DeepSpeed's
        a, b, compiled = (result["weights"][k] for k in ("deepspeed", "buckets", "buckets_compiled"))
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert all(torch.allclose(a[k], compiled[k], rtol=1e-5, atol=1e-7) for k in a)
    # The ranks' batches differ; only the average keeps their weights equal.
    for k, v in results[0]["weights"]["buckets_compiled"].items():
        assert torch.equal(v, results[1]["weights"]["buckets_compiled"][k]), k
