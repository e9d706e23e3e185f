"""`train.zero_stage: auto`: the lowest ZeRO stage whose model states fit, and why.

ZeRO partitions what data parallelism replicates: stage 1 the optimizer states, 2 the gradients too,
3 the weights too. Each costs per-step host work and communication (a hook per parameter, flattening,
gathering, and at stages 1-2 a host read of the gradient norm every step, which on a GPU waits for the
device's queue), so a model that fits does best with the least of it. Alone on one rank, no stage
partitions anything and stage 0 is always the choice. Over several ranks stage 0 is chosen where its unsharded
states fit and its gradients can be all-reduced in buckets during backward (pretrain/engine/grad_buckets.py, as
torch's DDP does); without the buckets DeepSpeed's stage 0 reduces every gradient after backward, and stage 1
overlaps instead. A run that resumes keeps the stage its checkpoints were saved with (DeepSpeed cannot change it
on resume).
"""
from __future__ import annotations

import os
from typing import Optional

# Bytes per parameter of the model states before partitioning: an fp32 weight (or a half weight plus
# its fp32 master), its gradient, and Adam's two fp32 moments. A frozen parameter holds its weight only.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 4, 4, 8
# The share of a device's memory the model states may take; the rest is for activations and buffers.
STATE_SHARE = 0.5
# Stage 0's gradient buckets hold a flat copy of each bucket from its launch to the end of backward
# (pretrain/engine/grad_buckets.py): by then, a second copy of every gradient.
BUCKET_BYTES = GRAD_BYTES


def model_state_bytes(trainable: int, frozen: int, stage: int, world: int) -> float:
    """Bytes of weights, gradients and optimizer states one rank holds at this ZeRO stage."""
    weights = WEIGHT_BYTES * (trainable + frozen) / (world if stage >= 3 else 1)
    grads = GRAD_BYTES * trainable / (world if stage >= 2 else 1)
    optimizer = OPTIMIZER_BYTES * trainable / (world if stage >= 1 else 1)
    return weights + grads + optimizer


def device_memory_bytes(local_ranks: int) -> tuple[float, str]:
    """This rank's share of its device's memory: the GPU's, or the machine's RAM split over its local ranks."""
    import torch

    if torch.cuda.is_available():
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "GPU memory"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / max(local_ranks, 1), f"RAM / {max(local_ranks, 1)} local rank(s)"


def choose_stage(trainable: int, frozen: int, world: int, memory: float, memory_name: str = "memory",
                 resumed_stage: Optional[int] = None, buckets: bool = False) -> tuple[int, str]:
    """(stage, reason): the checkpoint's stage on resume; else 0 alone; else the lowest stage whose states fit, 0
    over several ranks only where `buckets` (its gradients can be all-reduced in buckets during backward)."""
    if resumed_stage is not None:
        return resumed_stage, f"the run's checkpoints were saved at stage {resumed_stage}"
    gib = 2**30
    if world == 1:
        need = model_state_bytes(trainable, frozen, 0, 1)
        return 0, (f"one rank: no stage partitions anything ({need / gib:.2f} GiB of weights, gradients and "
                   f"optimizer states against {memory / gib:.1f} GiB of {memory_name})")
    if buckets:
        need = model_state_bytes(trainable, frozen, 0, world) + BUCKET_BYTES * trainable
        if need <= STATE_SHARE * memory:
            return 0, (f"{world} ranks: nothing sharded, the model states and the gradient buckets' copy take "
                       f"{need / gib:.2f} GiB per rank and fit in half of {memory / gib:.1f} GiB of {memory_name}; "
                       "the gradients are all-reduced in buckets during backward, with none of ZeRO's per-parameter work")
    for stage in (1, 2, 3):
        need = model_state_bytes(trainable, frozen, stage, world)
        if need <= STATE_SHARE * memory or stage == 3:
            fits = "fit" if need <= STATE_SHARE * memory else "do not fit even sharded: expect to run out of memory"
            sharded = {1: "optimizer states", 2: "optimizer states and gradients",
                       3: "optimizer states, gradients and weights"}[stage]
            return stage, (f"{world} ranks: with the {sharded} sharded, the model states take {need / gib:.2f} GiB "
                           f"per rank and {fits} in half of {memory / gib:.1f} GiB of {memory_name}")
    raise AssertionError("unreachable")
