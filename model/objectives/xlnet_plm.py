"""XLNet's permutation language modelling, on transformers' XLNetLMHeadModel and its two-stream attention.

Yang et al. 2019, "XLNet" (zihangdai/xlnet, data_utils.py `_sample_mask` / `_local_perm`): for a
sampled factorization order z, maximise Σ_{t > c} log p(x_{z_t} | x_{z_<t}), predicting only the last
1/K of the order (partial prediction, K = 6: `masking.mask_prob=0.1667`). The targets are whole-word
n-gram spans (span-based prediction); the input is never corrupted. The order is expressed as
`perm_mask` (which tokens each query may not see) and `target_mapping` (which positions the query
stream predicts), built per sample in the loader (data_pipeline/masking.py, strategy `plm`), and
transformers' XLNet runs the content and query streams. Loss: the mean cross-entropy over the
batch's targets (`plm_loss`, reported against the unigram entropy as the MLM losses are).

Left out: Transformer-XL's segment recurrence (memory) and XLNet's bidirectional data pipeline
(`bi_data`); each sequence is one segment, and its two-segment NSP-free input format is not used.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from transformers import PretrainedConfig, PreTrainedModel

from core.errors import ConfigError
from model import flops
from model.backbones import backbone_for
from model.objectives.base import Batch, Objective
from model.objectives.mlm import sparse_mlm
from model.vocabulary_loss import Head

if TYPE_CHECKING:  # the config sections are read here, never built: no import cycle with model.encoder
    from data_pipeline.masking import MaskingConfig
    from model.encoder import EncoderConfig


def plm_loss(hidden: torch.Tensor, labels: torch.Tensor, head: Head,
             chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over real targets of the query stream [B, P, d] through the LM head (labels [B, P], -100
    pads; `chunk`: the head fused with the loss, as sparse_mlm's); and accuracy."""
    return sparse_mlm(hidden, labels, head, torch.arange(labels.numel(), device=labels.device), chunk)


@dataclass
class XLNetOptions:
    """XLNet PLM has no options of its own: K is `masking.mask_prob` (1/K), the spans `masking.max_span`."""


class XLNetPLM(Objective):
    """XLNetLMHeadModel trained on permutation LM."""

    export_holds = "`{root}` (XLNet trained with permutation LM, no Transformer-XL memory)"
    export_loader = "AutoModelForCausalLM"
    options_class = XLNetOptions
    masking = {"strategy": "plm", "mask_prob": 0.1667}  # K = 6: one token in six is a target
    needs = frozenset({"permutation_lm"})

    def __init__(self, config: PretrainedConfig, options: XLNetOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.model = self.backbone.masked_lm(config, init_from)

    @classmethod
    def check_config(cls, options: XLNetOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """The permutation comes from the `plm` masking strategy."""
        if masking.strategy != "plm":
            raise ConfigError(f"objective.name=xlnet needs masking.strategy=plm (got {masking.strategy}): "
                              "it builds the factorization order (perm_mask, target_mapping)")

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The permutation LM loss at the targets, through the query stream."""
        if "perm_mask" not in batch:
            raise ConfigError("objective.name=xlnet needs batches from masking.strategy=plm")
        dtype = self.model.transformer.word_embedding.weight.dtype
        # Under DeepSpeed's bf16/fp16 weights, XLNet builds its relative position embeddings in fp32 and mixes them
        # into einsums with the weights: autocast gives those one dtype. With fp32 weights the engine's own autocast
        # (bf16 mixed precision), if any, stays in charge.
        half = dtype != torch.float32
        with torch.autocast(batch["input_ids"].device.type, dtype=dtype) if half else contextlib.nullcontext():
            query = self.backbone.base(self.model)(input_ids=batch["input_ids"],
                                                   attention_mask=self.encoder_mask(batch),
                                                   perm_mask=batch["perm_mask"].to(dtype),
                                                   target_mapping=batch["target_mapping"].to(dtype)).last_hidden_state
            loss, accuracy = plm_loss(query, batch["target_labels"], self.backbone.mlm_head(self.model),
                                      self.vocab_loss_chunk)
        return {"plm_loss": loss}, {"plm_accuracy": accuracy}

    def flops_per_token(self, seq_len: int) -> float:
        """Content stream at every token; query stream and the vocabulary projection at the targets (mask_prob)."""
        mask_prob = self.mask_prob
        c = self.model.config
        query = self.backbone.query_stream_flops(c, seq_len) + 2 * c.d_model * c.vocab_size
        return flops.TRAIN * (flops.encoder_forward(c, seq_len) + mask_prob * query)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """XLNetLMHeadModel (AutoModelForCausalLM; AutoModel loads its XLNetModel)."""
        return {"": self.model}
