"""ZeRO stage 0 over several ranks: the gradients averaged in buckets while backward still runs.

DeepSpeed's stage 0 all-reduces every gradient in one pass after backward (`buffered_allreduce_fallback`), so the
network waits for the last layer's gradients and the device waits for the network. torch's DDP instead files each
gradient into a bucket as autograd finishes it and launches the bucket's all-reduce as soon as it is full, so the
reductions of the last layers run while the first layers' backward computes. This module does that for the
DeepSpeed engine at stage 0 (where DeepSpeed's own reduction is turned off), with DeepSpeed's arithmetic: the
gradients summed over ranks, then multiplied by 1 / world, and a gradient no rank's graph produced reduced as zeros.

Buckets are launched in one order on every rank: a bucket that is ready before an earlier one waits for it, so two
ranks never enter different collectives, even where their graphs differ from batch to batch. The first order is the
parameters' in reverse; after the first reduced backward every rank takes the order in which rank 0 saw the
gradients arrive (as DDP rebuilds its buckets), so a parameter registered late but finished last, or one the graph
never uses, does not hold back the buckets after it.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

# torch DDP's default bucket size: large enough that a reduction is not dominated by its launch, small enough that
# the first one starts early in backward.
BUCKET_BYTES = 25 * 2**20


class _Bucket:
    """Parameters of one dtype and device whose gradients travel in one flat all-reduce."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.ready: set[int] = set()
        self.flat: Optional[torch.Tensor] = None  # only from its launch to the end of the step
        self.work: Any = None

    @property
    def complete(self) -> bool:
        """Every parameter of the bucket has its gradient for this step."""
        return len(self.ready) == len(self.params)

    def views(self) -> list[torch.Tensor]:
        """Each parameter's slice of the flat buffer, shaped as the parameter."""
        out, offset = [], 0
        for p in self.params:
            out.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return out


class GradientBuckets:
    """Averages the gradients of `params` over a process group, overlapping backward (see the module)."""

    def __init__(self, params: list[nn.Parameter], world: int, bucket_bytes: int = BUCKET_BYTES,
                 group: Optional[Any] = None) -> None:
        self.world = world
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.params = list({id(p): p for p in params if p.requires_grad and p.numel()}.values())
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._build(list(reversed(range(len(self.params)))))
        self._arrivals: Optional[list[int]] = []  # this rank's order of arrival, until the buckets are rebuilt
        self._next = 0  # the first bucket not yet launched
        self._armed = False
        for p in self.params:  # for the parameters' life: the engine keeps its buckets as long
            p.register_post_accumulate_grad_hook(self._on_gradient)

    def arm(self) -> None:
        """The next backward ends the accumulation: reduce each bucket as its gradients become final."""
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.work = bucket.flat = None
        self._next = 0
        self._armed = True

    def finish(self) -> None:
        """After the armed backward: launch what is left in order, wait for every bucket and write the averages back."""
        if not self._armed:
            return
        self._armed = False
        self._launch_in_order(all_left=True)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.mul_(1.0 / self.world)
            torch._foreach_copy_([p.grad for p in bucket.params], bucket.views())
            bucket.work = bucket.flat = None
        if self._arrivals is not None:
            self._rebuild()

    def _build(self, order: list[int]) -> None:
        """Buckets of about `bucket_bytes` over the parameters in `order` (indices), split by dtype and device."""
        self.buckets: list[_Bucket] = []
        filling: dict[tuple[torch.dtype, torch.device], tuple[list[nn.Parameter], int]] = {}
        for i in order:
            p = self.params[i]
            members, size = filling.get((p.dtype, p.device), ([], 0))
            members.append(p)
            size += p.numel() * p.element_size()
            if size >= self.bucket_bytes:
                self.buckets.append(_Bucket(members))
                members, size = [], 0
            filling[(p.dtype, p.device)] = (members, size)
        self.buckets.extend(_Bucket(members) for members, _ in filling.values() if members)
        self._bucket_of = {id(p): bucket for bucket in self.buckets for p in bucket.params}

    def _rebuild(self) -> None:
        """Every rank's buckets in the order rank 0's gradients arrived in, the parameters it did not use last."""
        seen = set(self._arrivals)
        order = [self._arrivals + [i for i in reversed(range(len(self.params))) if i not in seen]]
        torch.distributed.broadcast_object_list(order, src=0, group=self.group)
        self._arrivals = None
        self._build(order[0])

    def _on_gradient(self, param: nn.Parameter) -> None:
        if not self._armed:
            return  # a micro-batch inside the accumulation: its gradients are not final yet
        bucket = self._bucket_of[id(param)]
        if id(param) in bucket.ready:
            raise RuntimeError("a parameter's gradient was accumulated twice in one backward; "
                               "train.overlap_grad_reduce needs one backward per micro-batch")
        bucket.ready.add(id(param))
        if self._arrivals is not None:
            self._arrivals.append(self._index[id(param)])
        self._launch_in_order(all_left=False)

    def _launch_in_order(self, all_left: bool) -> None:
        """Launch the buckets from the first not launched on, in order: while each is complete, or (`all_left`) all."""
        while self._next < len(self.buckets) and (all_left or self.buckets[self._next].complete):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        for p in bucket.params:
            if p.grad is None:  # unused by this rank's graph: zeros, as DeepSpeed's own reduction gives it
                p.grad = torch.zeros_like(p)
        bucket.flat = torch.empty(sum(p.numel() for p in bucket.params), dtype=bucket.params[0].dtype,
                                  device=bucket.params[0].device)
        torch._foreach_copy_(bucket.views(), [p.grad for p in bucket.params])
        bucket.work = torch.distributed.all_reduce(bucket.flat, group=self.group, async_op=True)
