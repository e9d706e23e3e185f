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

TRAIN = 3.0


def encoder_forward(config, seq_len: int) -> float:
    """Forward FLOPs per token of the config's encoder (BERT, ELECTRA or ModernBERT layout) at this sequence length."""
    from model.backbones import backbone_for

    return backbone_for("modernbert" if config.model_type == "modernbert" else "bert").encoder_flops(config, seq_len)


def mlm_head_forward(config, embedding_size: int | None = None) -> float:
    """Forward FLOPs per predicted token of a transform + tied-decoder MLM head."""
    h = config.hidden_size
    e = embedding_size or h
    return 2 * h * e + 2 * e * config.vocab_size


def mlm_forward(config, seq_len: int, mask_prob: float) -> float:
    """Forward FLOPs per input token of an encoder with a sparse MLM head at the masked fraction."""
    return encoder_forward(config, seq_len) + mask_prob * mlm_head_forward(config, getattr(config, "embedding_size", None))


def peak_tflops(precision: str) -> float:
    """Dense peak TFLOP/s of the local accelerator for this precision (0 when unknown, e.g. a CPU)."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    name = torch.cuda.get_device_name()
    # Dense bf16/fp16 and fp32 (non-tensor-core) peaks from the vendors' data sheets.
    table = {"H100 PCIe": (756.0, 51.0), "H100": (989.0, 67.0), "H200": (989.0, 67.0), "A100": (312.0, 19.5),
             "L40S": (362.0, 91.6), "L40": (181.0, 90.5), "L4": (121.0, 30.3), "A10G": (70.0, 31.2),
             "A10": (125.0, 31.2), "V100": (125.0, 15.7)}
    for key in sorted(table, key=len, reverse=True):  # "L40S" before "L40" before "L4"
        if key in name:
            half, fp32 = table[key]
            return half if precision in ("bf16", "fp16") else fp32
    return 0.0
