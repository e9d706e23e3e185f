"""What a batch is and how it leaves a loader worker: masking then padding per batch (`MaskingCollate`, seeded per
sample), and one byte buffer per batch for the trip to the training process (`PackedBatch`).

Masking happens in the loader's collate (in its worker processes when `num_workers` > 0): each sample is masked with
a generator seeded by (seed, stream, epoch, sample id). A sample's mask is then a function of which sample it is and
which pass over the data, not of the rank, the step, the batch it shares or the number of ranks, so a resumed run (on
any number of nodes) masks the same way. Nothing here imports streaming (data_pipeline/loader.py reads the shards).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from data_pipeline.masking import build_prediction_index

SampleTransform = Callable[[dict[str, torch.Tensor], torch.Generator], dict[str, torch.Tensor]]
EVAL_STREAM = 1 << 30  # keeps evaluation masks apart from training masks
# A batch's flag (a Python bool): more picks than its budget, so its `prediction_index` is wider than the run's other
# batches'. A compiled step runs it eagerly (model/objectives/base.py) rather than compile a graph for it on one rank.
OVER_BUDGET = "predictions_over_budget"

# What each per-token column is padded with; per-sample columns (sample_id, pair_label) are stacked.
# Every `*input_ids` column (the input, its clean copy, COCO-LM's crop, DeCLUTR's positives) pads with the pad id.
PAD_VALUES = {"labels": -100, "attention_mask": 0, "token_type_ids": 0, "crop_attention_mask": 0,
              "target_labels": -100}


def unpadded_key(mask: str) -> str:
    """The batch's flag for one attention-mask column: True when none of its positions is padding."""
    return f"{mask}_unpadded"


def mark_unpadded(batch: dict[str, Any]) -> dict[str, Any]:
    """Add a Python bool per attention-mask column, read here on the host: whether the column is all ones.

    An encoder handed no mask for such a column computes the same (transformers drops an all-ones mask itself, but
    only after reading it back from the device, which on a GPU makes the host wait once per forward). A plain bool
    leaves the loader as it is and reaches the objective on the host (`Objective.encoder_mask`).
    """
    for key in [k for k in batch if k.endswith("attention_mask")]:
        batch[unpadded_key(key)] = bool(batch[key].all())
    return batch


def sample_seed(seed: int, stream: int, epoch: int, sample_id: int) -> int:
    """Seed of one sample's masking: a function of which sample in which pass, never of rank, step or batch."""
    return int(np.random.SeedSequence([seed, stream, epoch, sample_id]).generate_state(1, dtype=np.uint64)[0] >> 1)


class MaskingCollate:
    """The loader's collate_fn: mask each sample at its own length with its own seeded generator, then pad.

    `transform=None` pads only. `per_epoch=False` (validation) gives a sample the same mask in every
    pass, so evaluations compare. A batch whose rows list `masked_positions` also gets `prediction_index`, its
    picks' flat positions padded to the batch's budget `batch_slots(rows, seq_len)` (data_pipeline/masking.py
    `batch_prediction_slots`; every row's slots when None), or, with more picks than that, to every row's slots and
    `OVER_BUDGET` set. Picklable, so it runs in the loader's worker processes.
    """

    def __init__(self, transform: Optional[SampleTransform], pad_id: int, seed: int = 0, stream: int = 0,
                 per_epoch: bool = True, batch_slots: Optional[Callable[[int, int], int]] = None) -> None:
        self.transform, self.pad_id, self.seed, self.stream, self.per_epoch = transform, pad_id, seed, stream, per_epoch
        self.batch_slots = batch_slots

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """A padded batch of masked samples (the transform's columns plus sample_id and pair_label), with a flag per
        attention mask that says whether it padded any row (`mark_unpadded`)."""
        rows = []
        for s in samples:
            ids = torch.from_numpy(np.asarray(s["input_ids"], dtype=np.int64))[None]
            one = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            if "token_type_ids" in s:
                one["token_type_ids"] = torch.from_numpy(np.asarray(s["token_type_ids"], dtype=np.int64))[None]
            if self.transform is None:
                rows.append(one)
                continue
            epoch = int(s.get("epoch", 0)) if self.per_epoch else 0
            generator = torch.Generator().manual_seed(sample_seed(self.seed, self.stream, epoch, int(s["sample_id"])))
            rows.append(self.transform(one, generator))
        batch = {}
        for key in rows[0]:
            # Each column padded to its own widest row, in every dimension: views (crop, positives) may be shorter
            # than the input, and XLNet's perm_mask [L, L] and target_mapping [P, L] are 2-D per sample.
            shape = [max(r[key].shape[d] for r in rows) for d in range(1, rows[0][key].dim())]
            value = self.pad_id if key.endswith("input_ids") else PAD_VALUES.get(key, 0)
            out = torch.full((len(rows), *shape), value, dtype=rows[0][key].dtype)
            for i, r in enumerate(rows):
                out[i][tuple(slice(0, n) for n in r[key].shape[1:])] = r[key][0]
            batch[key] = out
        batch["sample_id"] = torch.tensor([int(s["sample_id"]) for s in samples], dtype=torch.long)
        if "pair_label" in samples[0]:
            batch["pair_label"] = torch.tensor([int(s["pair_label"]) for s in samples], dtype=torch.long)
        if "masked_positions" in batch:
            rows, most = batch["masked_positions"].shape[0], batch["masked_positions"].numel()
            slots = min(self.batch_slots(rows, batch["labels"].shape[1]), most) if self.batch_slots else most
            batch["prediction_index"] = build_prediction_index(batch["labels"], slots, most)
            batch[OVER_BUDGET] = len(batch["prediction_index"]) > slots
        return mark_unpadded(batch)


INLINE_BATCH_BYTES = 256 * 1024  # a packed batch up to this size leaves a worker as bytes (PackedBatch.__reduce__)


class PackedBatch:
    """A batch's tensors laid out in one byte buffer, so that it leaves a loader worker as one block.

    A DataLoader worker hands each tensor of a batch to the training process as its own shared-memory
    block, and the training process fetches every block's file descriptor from the worker with a
    socket round trip, in the training process's time, at every step (BENCHMARKS.md, "Host overhead of a step").
    One buffer costs one round trip, and a small one none (`__reduce__`);
    the columns come back as views of it, so pinning (on a GPU) pins one block too.
    """

    __slots__ = ("buffer", "layout", "rows", "flags")

    def __init__(self, buffer: torch.Tensor, layout: tuple, rows: int, flags: tuple) -> None:
        self.buffer, self.layout, self.rows, self.flags = buffer, layout, rows, flags

    @classmethod
    def pack(cls, batch: dict[str, Any]) -> "PackedBatch":
        """Copy every column into one uint8 buffer, each at an 8-byte aligned offset (any dtype can view it); the
        batch's plain Python values (its flags) travel beside the buffer as they are."""
        columns = {key: value for key, value in batch.items() if isinstance(value, torch.Tensor)}
        layout, offset = [], 0
        for key, value in columns.items():
            nbytes = value.numel() * value.element_size()
            layout.append((key, value.dtype, tuple(value.shape), offset, nbytes))
            offset += -(-nbytes // 8) * 8
        buffer = torch.empty(offset, dtype=torch.uint8)
        for (_, _, _, start, nbytes), value in zip(layout, columns.values()):
            buffer[start:start + nbytes] = value.contiguous().reshape(-1).view(torch.uint8)
        rows = len(next(iter(columns.values()))) if columns else 0
        flags = tuple((key, value) for key, value in batch.items() if key not in columns)
        return cls(buffer, tuple(layout), rows, flags)

    def unpack(self) -> dict[str, Any]:
        """The columns, as views of the buffer, then the flags."""
        return {**{key: self.buffer[start:start + nbytes].view(dtype).view(shape)
                   for key, dtype, shape, start, nbytes in self.layout}, **dict(self.flags)}

    def __reduce__(self):
        # A small batch crosses the worker's pipe as bytes: the training process then skips the socket round trip
        # that fetches a shared block's file descriptor. Up to INLINE_BATCH_BYTES that is faster; a large batch is
        # faster as shared memory (BENCHMARKS.md, "Host overhead of a step").
        if self.buffer.numel() <= INLINE_BATCH_BYTES:
            return _unpickle_inline, (self.buffer.numpy().tobytes(), self.layout, self.rows, self.flags)
        return PackedBatch, (self.buffer, self.layout, self.rows, self.flags)

    def pin_memory(self) -> "PackedBatch":
        """The same batch in page-locked memory (the DataLoader's pinning thread calls this)."""
        return PackedBatch(self.buffer.pin_memory(), self.layout, self.rows, self.flags)


def _unpickle_inline(data: bytes, layout: tuple, rows: int, flags: tuple) -> PackedBatch:
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return PackedBatch(buffer, layout, rows, flags)


class PackingCollate:
    """A collate run in a loader worker whose batch travels to the training process as a PackedBatch."""

    def __init__(self, collate: Callable) -> None:
        self.collate = collate

    def __call__(self, samples: list[dict[str, Any]]) -> PackedBatch:
        """The wrapped collate's batch, packed."""
        return PackedBatch.pack(self.collate(samples))
