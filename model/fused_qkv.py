"""Q, K and V of an attention layer as one matmul over its three weights, concatenated at each call.

transformers' BertSelfAttention (and ELECTRA's copy of it) projects the same input three times with [H, H] weights;
one [3H, H] matmul reads the input once and launches one kernel (what it is worth: BENCHMARKS.md, "Kernel levers").
The parameters stay the three Linear layers transformers defines, so checkpoints and exports keep its layout and
load natively, and each weight's gradient comes back through the concatenation. ZeRO-3 gathers a parameter when its
own module runs, which a fused call skips: the training config refuses the two together.
"""
from __future__ import annotations

import types
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert import modeling_bert
from transformers.models.electra.modeling_electra import ElectraSelfAttention

# transformers 5's classes and attention interface (TrainConfig refuses train.fused_qkv under 4.x, whose
# BertSelfAttention computes its scores itself and has subclasses per kernel).
SELF_ATTENTION_CLASSES = (modeling_bert.BertSelfAttention, ElectraSelfAttention)


def fused_qkv_forward(self: modeling_bert.BertSelfAttention | ElectraSelfAttention, hidden_states: torch.Tensor,
                      attention_mask: Optional[torch.Tensor] = None, cache: Any = None,
                      **kwargs: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """BertSelfAttention.forward for an encoder (no cache), with Q, K and V from one matmul."""
    if cache is not None or kwargs.get("past_key_values") is not None:
        raise RuntimeError("a fused Q/K/V layer is an encoder's: it takes no key/value cache")
    kwargs.pop("past_key_values", None)
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])
    bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
    query, key, value = (t.view(shape).transpose(1, 2) for t in F.linear(hidden_states, weight, bias).chunk(3, dim=-1))
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, modeling_bert.eager_attention_forward)
    out, weights = attend(self, query, key, value, attention_mask, dropout=self.dropout.p if self.training else 0.0,
                          scaling=self.scaling, **kwargs)
    return out.reshape(*hidden_states.shape[:-1], -1).contiguous(), weights


def fuse_qkv(model: nn.Module) -> int:
    """Give every BERT-layout self-attention of an encoder in `model` the fused forward; how many it changed."""
    fused = 0
    for module in model.modules():
        if type(module) in SELF_ATTENTION_CLASSES and not module.is_decoder:
            module.forward = types.MethodType(fused_qkv_forward, module)
            fused += 1
    return fused
