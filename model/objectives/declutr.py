"""DeCLUTR: contrastive learning of spans from the same document, plus MLM on the anchors.

Giorgi et al. 2021, "DeCLUTR: Deep Contrastive Learning for Unsupervised Textual Representations"
(JohnGiorgi/DeCLUTR). Per document (a sample of `packing: document` data) the loader samples an
anchor span and `positives` spans near it (data_pipeline/span_views.py: Beta-distributed lengths;
overlapping, adjacent or subsumed). One shared encoder reads the masked anchor and the clean
positives; each span is mean-pooled over its tokens; an anchor's positive is the mean of its
positives' embeddings. The contrastive loss is InfoNCE (NT-Xent) with in-batch negatives over the
2N embeddings of a micro-batch: each embedding's positive is its pair, the other 2N − 2 are
negatives, cosine similarity / τ (τ = 0.05). Total = contrastive + MLM on the anchors (the anchor's
embedding comes from the same masked forward, as in DeCLUTR).

Where this differs: DeCLUTR draws several anchors per document from documents of ≥ 2048 tokens
with spans of 32-512 tokens; here one anchor per sample, spans of `min_span_tokens` to
`max_span_tokens` inside a seq_len piece of one document, and negatives come from the rank's own
micro-batch (no gathering across ranks).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
from transformers import PretrainedConfig, PreTrainedModel

from core.config_io import check_range
from core.errors import ConfigError
from data_pipeline.span_views import SpanViewOptions, SpanViews
from model import flops
from model.backbones import backbone_for
from model.diagnostics import retrieval_accuracy
from model.objectives.base import Batch, Objective
from model.objectives.coco_lm import scl_logits
from model.objectives.mlm import prediction_index, sparse_mlm

if TYPE_CHECKING:  # the config sections are read here, never built: no import cycle with model.encoder
    from data_pipeline.batches import SampleTransform
    from data_pipeline.masking import MaskingConfig
    from model.encoder import EncoderConfig


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of each row's hidden states over its real tokens: [B, L, H], [B, L] -> [B, H]."""
    keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


def declutr_logits(anchor: torch.Tensor, anchor_mask: torch.Tensor, positives: list[torch.Tensor],
                   positive_masks: list[torch.Tensor], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NT-Xent logits over the 2N pooled embeddings (self excluded) and each row's positive column."""
    z_anchor = mean_pool(anchor, anchor_mask)
    z_positive = torch.stack([mean_pool(h, m) for h, m in zip(positives, positive_masks)]).mean(0)
    return scl_logits(z_anchor, z_positive, temperature)


def declutr_loss(anchor: torch.Tensor, anchor_mask: torch.Tensor, positives: list[torch.Tensor],
                 positive_masks: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """DeCLUTR's contrastive loss on hidden states: mean over the 2N embeddings of -log softmax at the positive."""
    return torch.nn.functional.cross_entropy(*declutr_logits(anchor, anchor_mask, positives, positive_masks, temperature))


@dataclass
class DeclutrOptions:
    """Temperature, the MLM weight, and how spans are sampled (lengths in tokens; DeCLUTR: 32-512)."""

    temperature: float = 0.05
    mlm_weight: float = 1.0
    spans: SpanViewOptions = field(default_factory=SpanViewOptions)

    def validate(self) -> None:
        """A positive temperature; a non-negative MLM weight (a negative one maximises its loss)."""
        check_range("objective.declutr", self, ("temperature",), above=0)
        check_range("objective.declutr", self, ("mlm_weight",), at_least=0)


class Declutr(Objective):
    """A masked LM of the config's backbone reading anchors (masked, MLM + contrastive) and positives (clean)."""

    export_holds = ("`{root}` (encoder + MLM head); its sentence embedding is the mean of the last hidden states "
                    "over the real tokens")
    options_class = DeclutrOptions

    def __init__(self, config: PretrainedConfig, options: DeclutrOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.model = self.backbone.masked_lm(config, init_from)
        self.options = options
        self.weights = {"mlm_loss": options.mlm_weight}

    @classmethod
    def check_config(cls, options: DeclutrOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """Spans must fit a sequence; Beta shapes are positive integers; the crop view is COCO-LM's, not this."""
        spans = options.spans
        if not 1 <= spans.min_span_tokens <= spans.max_span_tokens:
            raise ConfigError("config keys 'objective.declutr.spans.min_span_tokens' <= 'max_span_tokens' must hold (>= 1)")
        if spans.positives < 1:
            raise ConfigError("config key 'objective.declutr.spans.positives' must be >= 1")
        for key in ("anchor_beta", "positive_beta"):
            shape = getattr(spans, key)
            if len(shape) != 2 or any(int(v) != v or v < 1 for v in shape):
                raise ConfigError(f"config key 'objective.declutr.spans.{key}' must be two positive integers, got {shape}")
        if masking.crop_ratio is not None:
            raise ConfigError("objective.name=declutr samples its own views: leave masking.crop_ratio unset")

    @classmethod
    def check_data(cls, options: DeclutrOptions, packing: str, pair_task: Optional[str]) -> None:
        """An anchor and its positives come from one document: rows packed across documents (full, pairs) would make
        another document's span a positive."""
        if packing != "document":
            raise ConfigError(f"objective.name=declutr needs data prepared with packing=document (data.path has "
                              f"packing={packing}: its rows cross documents, and a positive span would come from "
                              "another one)")

    @classmethod
    def wrap_masking(cls, options: DeclutrOptions, transform: SampleTransform, pad_id: int, cls_id: int,
                     sep_id: int) -> SampleTransform:
        """The loader's transform: sample the anchor and positives, then mask the anchor."""
        return SpanViews(transform, options.spans, pad_id, cls_id, sep_id)

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Contrastive and anchor MLM losses, with in-batch retrieval accuracy of the positives."""
        if "positive0_input_ids" not in batch:
            raise ConfigError("objective.name=declutr needs its span views in the batch (the loader builds them: "
                              "data_pipeline.run_data)")
        base = self.backbone.base(self.model)
        types = batch.get("token_type_ids")
        anchor = self.backbone.encode(base, batch["input_ids"], self.encoder_mask(batch), types).last_hidden_state
        mlm, mlm_accuracy = sparse_mlm(anchor, batch["labels"], self.backbone.mlm_head(self.model),
                                      prediction_index(batch), self.vocab_loss_chunk)
        positives, masks = [], []
        for k in range(self.options.spans.positives):
            ids, mask = batch[f"positive{k}_input_ids"], batch[f"positive{k}_attention_mask"]
            given = self.encoder_mask(batch, f"positive{k}_attention_mask")
            positives.append(self.backbone.encode(base, ids, given).last_hidden_state)
            masks.append(mask)
        logits, targets = declutr_logits(anchor, batch["attention_mask"], positives, masks, self.options.temperature)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        metrics = {"mlm_accuracy": mlm_accuracy,
                   "declutr_retrieval_accuracy": retrieval_accuracy(logits.detach(), targets)}
        return {"declutr_loss": loss, "mlm_loss": mlm}, metrics

    def flops_per_token(self, seq_len: int) -> float:
        """Per anchor token: the anchor's encoder + sparse MLM head, and the positives' encoder passes (each at most
        an anchor's length: counted as one anchor-length pass each, an upper bound), all trained."""
        mask_prob = self.mask_prob
        c = self.model.config
        return flops.TRAIN * (flops.mlm_forward(c, seq_len, mask_prob)
                              + self.options.spans.positives * flops.encoder_forward(c, seq_len))

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The masked LM: AutoModel loads the encoder whose mean-pooled output is the sentence embedding."""
        return {"": self.model}
