"""Stage 0's gradient buckets (pretrain/engine/grad_buckets.py) on two real gloo ranks: each gradient is the mean of
the ranks' own, computed here from the gradients each rank sends back; a parameter only one rank's graph used is
averaged with the other's zeros, and the ranks still agree on the order of their collectives; a backward inside the
accumulation reduces nothing. The whole trainer with the buckets against DeepSpeed's own reduction:
test_engine_configs.py."""
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
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


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = _Net()
    buckets = GradientBuckets(list(net.parameters()), world=2, bucket_bytes=64)  # a few parameters per bucket
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 + rank))
    net(x, rank).backward()  # inside the accumulation: nothing is reduced
    inside = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net(x * 2, rank).backward()  # what this rank's two micro-batches add up to, before the reduction
    own = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad(set_to_none=True)
    net(x, rank).backward()
    buckets.arm()
    net(x * 2, rank).backward()
    buckets.finish()
    reduced = {n: p.grad.clone() for n, p in net.named_parameters()}
    torch.save({"own": own, "reduced": reduced, "inside": inside, "buckets": len(buckets.buckets)},
               Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_buckets_average_every_gradient_over_the_ranks(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["buckets"] >= 4
    assert "only_rank0.weight" in r0["own"] and "only_rank0.weight" not in r1["own"]
    for name, mine in r0["reduced"].items():
        other = r1["own"].get(name, torch.zeros_like(mine))
        expected = (r0["own"][name].double() + other.double()) / 2
        tolerance = 1e-3 if mine.dtype == torch.float16 else 1e-6
        assert torch.allclose(mine.double(), expected, rtol=tolerance, atol=0), name
        assert torch.equal(mine, r1["reduced"][name]), name  # both ranks step from the same gradient
    # Without the ranks' average in between, each rank's first backward kept its own gradient.
    assert not torch.equal(r0["inside"]["first.weight"], r1["inside"]["first.weight"])
