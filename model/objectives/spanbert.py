"""SpanBERT: span masking, MLM, and the span boundary objective (SBO).

Joshi et al. 2020, "SpanBERT: Improving Pre-training by Representing and Predicting Spans"
(facebookresearch/SpanBERT). Masking is `masking.strategy=span` (geometric span lengths in
whole words, p = 0.2, clipped at 10; 15% of the tokens; 80/10/10 per span), which also gives every
picked token its span's boundary positions. Each picked token is predicted twice: by the MLM head
from its own encoding, and by the SBO head (model/heads.py) from the two boundary tokens' encodings
and its position in the span, through the MLM's output projection. Total = MLM + SBO (each the
mean over picked tokens). No NSP: SpanBERT trains on single contiguous segments (`packing: full`).

The export is the masked LM (BertForPreTraining on BERT, whose pooler and NSP head stay at their
initial values; ModernBertForMaskedLM on ModernBERT), loading natively; the SBO head is written
beside it as `span_boundary_head.safetensors` + `.json` (`model.heads.SpanBoundaryHead.load`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from core.config_io import check_range
from core.errors import ConfigError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig
from model import flops
from model.backbones import backbone_for
from model.heads import SpanBoundaryHead, SpanBoundaryShape
from model.objectives.base import Batch, Objective
from model.objectives.mlm import at_index, at_least_fp32, mlm_loss, prediction_accuracy, prediction_index, sparse_mlm

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig

SBO_HEAD_NAME = "span_boundary_head"


def span_boundary_loss(hidden: torch.Tensor, labels: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                       offset: torch.Tensor, head: Callable, projection: Callable,
                       index: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of predicting each picked span token from its boundaries; returns (loss, accuracy).

    hidden [B, L, H]; labels [B, L] (IGNORE_INDEX where not picked); left/right [B, L] positions of the
    span's boundary tokens; offset [B, L] 1-based place in the span (0 outside spans); index [N] the flat positions
    predicted (the step's `prediction_index`; every position when None).
    """
    if index is None:
        index = torch.arange(labels.numel(), device=labels.device)
    offset = at_index(offset, index)
    targets = torch.where(offset > 0, at_index(labels, index), IGNORE_INDEX)
    row_start = index - index % labels.shape[1]  # a boundary is a position in its row
    at = lambda boundary: at_index(hidden, row_start + at_index(boundary, index))  # noqa: E731
    logits = at_least_fp32(projection(head(at(left), at(right), offset)))
    return mlm_loss(logits, targets), prediction_accuracy(logits, targets)


@dataclass
class SpanBertOptions:
    """The SBO head's relative position table (tokens; longer spans share its last entry) and the SBO weight."""

    max_span_tokens: int = 32
    sbo_weight: float = 1.0

    def validate(self) -> None:
        """A non-negative SBO weight (a negative one maximises its loss)."""
        check_range("objective.spanbert", self, ("sbo_weight",), at_least=0)


class SpanBert(Objective):
    """Masked LM of the config's backbone + a span boundary head sharing its output projection."""

    # Its span boundary head feeds the MLM's output projection with hidden-size vectors.
    needs = frozenset({"masked_lm", "hidden_projection"})
    export_holds = ("`{root}` (encoder + MLM head); the span boundary head beside it as "
                    "`span_boundary_head.safetensors` + `.json` (`model.heads.SpanBoundaryHead.load(PATH)`)")
    export_loader = "AutoModelForMaskedLM"
    options_class = SpanBertOptions
    masking = {"strategy": "span"}

    def __init__(self, config: PretrainedConfig, options: SpanBertOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.model = self.backbone.masked_lm(config, init_from)
        eps = getattr(config, "layer_norm_eps", None) or getattr(config, "norm_eps", 1e-12)
        self.sbo_head = SpanBoundaryHead(SpanBoundaryShape(config.hidden_size, options.max_span_tokens, eps))
        self.weights = {"sbo_loss": options.sbo_weight}

    @classmethod
    def check_config(cls, options: SpanBertOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """SBO needs span boundaries: the span (or n-gram) masking strategy."""
        if masking.strategy not in ("span", "ngram"):
            raise ConfigError(f"objective.name=spanbert needs masking.strategy=span (got {masking.strategy}): "
                              "the span boundary objective predicts masked spans from their boundaries")
        if options.max_span_tokens < 1:
            raise ConfigError("config key 'objective.spanbert.max_span_tokens' must be >= 1")

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """MLM and SBO losses with their accuracies."""
        hidden = self.backbone.encode(self.backbone.base(self.model), batch["input_ids"], self.encoder_mask(batch),
                                      batch.get("token_type_ids")).last_hidden_state
        index = prediction_index(batch)
        mlm, mlm_accuracy = sparse_mlm(hidden, batch["labels"], self.backbone.mlm_head(self.model), index,
                                       self.vocab_loss_chunk)
        sbo, sbo_accuracy = span_boundary_loss(hidden, batch["labels"], batch["span_left"], batch["span_right"],
                                               batch["span_offset"], self.sbo_head,
                                               self.backbone.output_projection(self.model), index)
        return {"mlm_loss": mlm, "sbo_loss": sbo}, {"mlm_accuracy": mlm_accuracy, "sbo_accuracy": sbo_accuracy}

    def flops_per_token(self, seq_len: int) -> float:
        """Encoder + sparse MLM head + SBO head (two H-wide layers, one 3H wide, and the projection) at picked tokens."""
        mask_prob = self.mask_prob
        c = self.model.config
        h = c.hidden_size
        sbo = 2 * (3 * h * h + h * h) + 2 * h * c.vocab_size
        return flops.TRAIN * (flops.mlm_forward(c, seq_len, mask_prob) + mask_prob * sbo)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The masked LM (encoder + MLM head)."""
        return {"": self.model}

    def side_heads(self) -> dict[str, nn.Module]:
        """The SBO head, saved beside the export's root."""
        return {SBO_HEAD_NAME: self.sbo_head}
