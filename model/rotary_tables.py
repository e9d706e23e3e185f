"""ModernBERT's rotary cos/sin read from tables built once, instead of computed from the positions at every call.

transformers computes cos(p · f) and sin(p · f) for every position p at each forward. Eagerly that is a few
small kernels; in a compiled graph the compiler inlines the computation into each kernel that applies it to Q and
K, so every element of every head evaluates its own cos and sin, in forward and again in backward (what that cost
on a GPU, and what the tables give back: BENCHMARKS.md, "Rotary tables"). A table indexed by the position ids is
a load there. The tables hold what transformers' own forward gives for positions 0 .. max_position_embeddings - 1,
in float32; they are buffers the state dict does not keep, so checkpoints and exports do not
change, and a model loaded in transformers computes what the tables hold.

They are computed on the device that trains: a CPU's and a GPU's cos and sin can differ in the last bit, so tables
made on one and moved to the other would not be what transformers computes there. A DeepSpeed config that sets
`data_types.buffer_dtype` casts buffers to 16 bits; transformers then derives its cos and sin from rounded
frequencies, while the tables, made before, keep the float32 model's values, rounded once.
"""
from __future__ import annotations

import types
from typing import Optional

import torch
from torch import nn
from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding


def _tabulable(module: nn.Module) -> bool:
    """Whether `module` is transformers 5's ModernBERT rotary embedding with fixed frequencies for each layer
    kind (the default rope type; the dynamic types change their frequencies with the input's length)."""
    kinds = getattr(module, "layer_types", None)
    rope_types = getattr(module, "rope_type", None)
    return (isinstance(module, ModernBertRotaryEmbedding) and bool(kinds) and isinstance(rope_types, dict)
            and set(rope_types) == set(kinds) and all(rope_types[kind] == "default" for kind in kinds))


def _table_forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ModernBertRotaryEmbedding.forward, read from the tables: cos and sin at `position_ids`, in `x`'s dtype."""
    cos = getattr(self, f"{layer_type}_cos_table")[position_ids]
    sin = getattr(self, f"{layer_type}_sin_table")[position_ids]
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotary_tables(module: ModernBertRotaryEmbedding, kind: str,
                  device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin of layer kind `kind` at every position the model takes, in float32, from transformers' own
    forward run once on `device` (by default where the module's frequencies are)."""
    device = getattr(module, f"{kind}_inv_freq").device if device is None else torch.device(device)
    # Its own forward, not a copy of its formula: versions of transformers compute the product of positions and
    # frequencies differently (elementwise, or as a matmul), and the tables must be what the installed one gives.
    positions = torch.arange(module.max_seq_len_cached, device=device)[None]
    cos, sin = ModernBertRotaryEmbedding.forward(module, torch.zeros(1, device=device), positions, kind)
    return cos[0], sin[0]


def tabulate_rotary(model: nn.Module, device: Optional[torch.device] = None) -> int:
    """Give every ModernBERT rotary embedding in `model` its tables, computed on `device` (the one that will train;
    by default where the model is), and the forward that reads them; how many."""
    changed = 0
    for module in model.modules():
        if not _tabulable(module) or getattr(module.forward, "__func__", None) is _table_forward:
            continue
        with torch.no_grad():
            for kind in module.layer_types:
                cos, sin = rotary_tables(module, kind, device)
                module.register_buffer(f"{kind}_cos_table", cos, persistent=False)
                module.register_buffer(f"{kind}_sin_table", sin, persistent=False)
        module.forward = types.MethodType(_table_forward, module)
        changed += 1
    return changed
