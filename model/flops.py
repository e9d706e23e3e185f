"""FLOP counts for MFU. Matmuls only (2 FLOPs per multiply-add); embeddings, norms and softmax are ignored.

Per token, one BERT layer's forward costs 8H² (Q, K, V and output projections) + 4HI (the two FFN
matrices) + 4SH (attention scores QKᵀ and the weighted sum over S positions); relative positions
add 2SH per relative term, ModernBERT's GeGLU costs 6HI and its local layers attend over the
window only (model/backbones/). An MLM head costs
2H² (transform) + 2HV (decoder) per *predicted* token: with the sparse head that is the masked
fraction, not every token. Training costs 3× the forward (the backward is about twice the forward);
a forward without gradient (ELECTRA/COCO-LM sampling, the TaCL teacher) costs 1×.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: counting FLOPs needs no transformers import
    from transformers import PretrainedConfig

TRAIN = 3.0


def encoder_forward(config: PretrainedConfig, seq_len: int) -> float:
    """Forward FLOPs per token of the config's encoder (BERT, ELECTRA, ModernBERT or ALBERT layout) at this sequence length."""
    from model.backbones import backbone_for

    # ELECTRA's models have BERT's layout.
    return backbone_for("bert" if config.model_type == "electra" else config.model_type).encoder_flops(config, seq_len)


def mlm_head_forward(config: PretrainedConfig, embedding_size: int | None = None) -> float:
    """Forward FLOPs per predicted token of a transform + tied-decoder MLM head."""
    h = config.hidden_size
    e = embedding_size or h
    return 2 * h * e + 2 * e * config.vocab_size


def mlm_forward(config: PretrainedConfig, seq_len: int, mask_prob: float) -> float:
    """Forward FLOPs per input token of an encoder with a sparse MLM head at the masked fraction."""
    return encoder_forward(config, seq_len) + mask_prob * mlm_head_forward(config, getattr(config, "embedding_size", None))
