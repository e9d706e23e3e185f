"""TaCL: token-aware contrastive continual pre-training against a frozen teacher.

Su et al. 2022, "TaCL: Improving BERT Pre-training with Token-aware Contrastive Learning"
(yxuansu/TaCL). The teacher is a frozen copy of the starting checkpoint, kept in eval mode (no
dropout: the original code left it in train mode, its issue #11), with no gradient and no
optimizer state; it reads the clean ids while the student reads the masked ids. For each anchor
(every position picked for MLM, including the 10% random and 10% kept), the positive is the
teacher's token at the same position; cosine similarities / τ (0.01) are soft-maxed over the
teacher's non-pad tokens of the same sequence (the paper; `include_padding` gives the original
code's softmax over all positions). Total = MLM (+ NSP) + TaCL.
Variants: (a) cross-sequence negatives (the other sequences' teacher tokens join the
denominator); (b) supervised TaCL for token classification (`supervised_tacl_loss`: tokens of
the anchor's class are removed from the denominator).

Where this differs from the paper: the teacher is frozen in eval mode (see above); the student can
be a ModernBERT as well as a BERT (no NSP there); the optimizer and schedule follow the run config,
not the original scripts. Validation logs the student's last-layer `self_similarity`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel

from core.config_io import check_range
from core.errors import ConfigError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig
from model import flops
from model.backbones import backbone_for
from model.diagnostics import token_self_similarity
from model.objectives.base import Batch, Objective
from model.objectives.mlm import (at_least_fp32, at_positions, check_pair_data, full_precision, pair_loss, prediction_index,
                                  prediction_positions, sparse_mlm)

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


def _contrast(logits: torch.Tensor, key_mask: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[positive] over allowed keys, per anchor. logits/key_mask [..., K], positive [...]."""
    logits = logits.masked_fill(~key_mask, float("-inf"))
    return -(logits.gather(-1, positive[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1))


def tacl_loss(student: torch.Tensor, teacher: torch.Tensor, anchors: torch.Tensor, attention_mask: torch.Tensor,
              temperature: float = 0.01, include_padding: bool = False, cross_sequence: bool = False,
              index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean token-level InfoNCE over anchors. student/teacher [B, L, H]; anchors/attention_mask [B, L].

    `index` [B, K] lists the positions that may be anchors (every position when None): the training step passes
    its fixed count of predicted positions, so the similarity rows and every shape stay fixed."""
    b, length, _ = student.shape
    if index is None:
        index = torch.arange(length, device=student.device).expand(b, length)
    real = anchors.bool().gather(1, index)  # [B, K]
    keys_valid = torch.ones_like(attention_mask, dtype=torch.bool) if include_padding else attention_mask.bool()
    with full_precision(student):
        s = F.normalize(at_least_fp32(student), dim=-1)
        t = F.normalize(at_least_fp32(teacher), dim=-1)
        anchor_vecs = at_positions(s, index)  # [B, K, H]
        if cross_sequence:
            logits = anchor_vecs.flatten(0, 1) @ t.reshape(b * length, -1).T / temperature  # [B*K, B*L]
            key_mask = keys_valid.reshape(1, b * length)
            positive = (torch.arange(b, device=index.device)[:, None] * length + index).flatten()
            real = real.flatten()
        else:
            logits = torch.einsum("bkh,blh->bkl", anchor_vecs, t) / temperature  # [B, K, L]
            key_mask = keys_valid[:, None, :]
            positive = index
        # A slot that is no anchor may have no finite logit (a padding position): where, not a product, drops it.
        losses = torch.where(real, _contrast(logits, key_mask, positive), 0.0)
        return losses.sum() / real.sum().clamp(min=1)


def supervised_tacl_loss(student: torch.Tensor, teacher: torch.Tensor, token_labels: torch.Tensor, anchors: torch.Tensor,
                         attention_mask: torch.Tensor, temperature: float = 0.01) -> torch.Tensor:
    """Variant (b): like tacl_loss within each sequence, but other tokens of the anchor's class leave the denominator."""
    if not bool(anchors.any()):
        return student.sum() * 0.0
    rows, cols = anchors.nonzero(as_tuple=True)
    same_class = token_labels[rows] == token_labels[rows, cols][:, None]
    key_mask = attention_mask.bool()[rows] & ~same_class
    key_mask[torch.arange(len(rows), device=key_mask.device), cols] = True  # the positive itself stays
    with full_precision(student):
        s = F.normalize(at_least_fp32(student), dim=-1)
        t = F.normalize(at_least_fp32(teacher), dim=-1)
        logits = torch.einsum("nh,nlh->nl", s[rows, cols], t[rows]) / temperature
        return _contrast(logits, key_mask, cols).mean()


@dataclass
class TaCLOptions:
    """TaCL: token-level contrastive loss against a frozen teacher."""

    temperature: float = 0.01
    # The original code's softmax runs over all positions, padding included; the paper's does not.
    include_padding: bool = False
    # Variant (a): teacher tokens of the other sequences in the batch join the denominator.
    cross_sequence_negatives: bool = False
    pair_head: Literal["none", "nsp"] = "none"
    weight: float = 1.0

    def validate(self) -> None:
        """A positive temperature (a negative one pushes the teacher's token away); a non-negative weight."""
        check_range("objective.tacl", self, ("temperature",), above=0)
        check_range("objective.tacl", self, ("weight",), at_least=0)


class TaCL(Objective):
    """Student (the backbone's masked LM, with NSP on BERT) and a frozen copy of its encoder as the teacher."""

    needs = frozenset({"masked_lm", "encoder"})
    export_holds = "the student as `{root}` (the teacher is the starting checkpoint and is not exported)"
    export_loader = "AutoModelForMaskedLM"
    options_class = TaCLOptions
    compile_regions = ("predict",)

    def __init__(self, config: PretrainedConfig, options: TaCLOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.options = options
        self.student = self.backbone.masked_lm(config, init_from, pair_head=options.pair_head == "nsp")
        self.teacher = self.backbone.encoder(config)
        missing, unexpected = self.teacher.load_state_dict(self.backbone.base(self.student).state_dict(), strict=False)
        if missing or any(not k.startswith("pooler.") for k in unexpected):
            raise ConfigError(f"model.init_from: the teacher does not match the student's encoder: missing {missing}, "
                              f"unexpected {unexpected}")
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        self.weights = {"tacl_loss": options.weight}

    @classmethod
    def check_config(cls, options: TaCLOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """TaCL continues a pre-trained checkpoint (the teacher); NSP needs BERT."""
        if not model.init_from:
            raise ConfigError("objective tacl continues pre-training: set model.init_from to the teacher's HF folder")
        if options.pair_head == "nsp" and model.architecture != "bert":  # the init_from folder's family, or refused
            raise ConfigError(f"objective.tacl.pair_head=nsp needs a BERT teacher ({model.architecture} has no NSP "
                              "head)")

    @classmethod
    def check_data(cls, options: TaCLOptions, packing: str, pair_task: Optional[str]) -> None:
        """NSP learns from data prepared for it (pairs of NSP labels)."""
        check_pair_data("objective.tacl.pair_head", options.pair_head, packing, pair_task)

    def train(self, mode: bool = True) -> "TaCL":
        """The teacher stays in eval mode (no dropout) whatever the trainer asks of the rest."""
        super().train(mode)
        self.teacher.eval()
        return self

    def predict(self, hidden: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The student's MLM loss and accuracy at the predicted flat positions `index`."""
        return sparse_mlm(hidden, labels, self.backbone.mlm_head(self.student), index, self.vocab_loss_chunk)

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """MLM (+ NSP) and the token-level contrastive loss; the student's self-similarity when evaluating."""
        attention, types = batch["attention_mask"], batch.get("token_type_ids")
        bb = self.backbone
        out = bb.encode(bb.base(self.student), batch["input_ids"], self.encoder_mask(batch), types)
        mlm, accuracy = self.predict(out.last_hidden_state, batch["labels"], prediction_index(batch))
        with torch.no_grad():
            teacher_hidden = bb.encode(self.teacher, batch["original_input_ids"], self.encoder_mask(batch),
                                       types).last_hidden_state
        anchors = batch["labels"] != IGNORE_INDEX
        tacl = tacl_loss(out.last_hidden_state, teacher_hidden, anchors, attention, self.options.temperature,
                         self.options.include_padding, self.options.cross_sequence_negatives,
                         prediction_positions(batch))
        terms = {"mlm_loss": mlm, "tacl_loss": tacl}
        metrics = {"mlm_accuracy": accuracy}
        if not self.training:  # an L×L product per sequence: a validation diagnostic, not a training cost
            # Of the clean text, as TaCL's analysis and `evaluate self-similarity` measure it: a pass of its own, the
            # masked input's [MASK] tokens would move the statistic with the masking rate.
            with torch.no_grad():
                clean = bb.encode(bb.base(self.student), batch["original_input_ids"], self.encoder_mask(batch),
                                  types).last_hidden_state
            metrics["self_similarity"] = token_self_similarity(clean, attention)
        if self.options.pair_head == "nsp":
            if "pair_label" not in batch:
                raise ConfigError("objective.tacl.pair_head=nsp needs data prepared with packing=pairs")
            terms["nsp_loss"] = pair_loss(bb.pair_logits(self.student, out.pooler_output), batch["pair_label"])
        return terms, metrics

    def flops_per_token(self, seq_len: int) -> float:
        """Student trained + teacher forward (no grad) + the anchors' similarity rows over the sequence."""
        mask_prob = self.mask_prob
        c = self.student.config
        contrast = mask_prob * 2 * seq_len * c.hidden_size
        return flops.TRAIN * (flops.mlm_forward(c, seq_len, mask_prob) + contrast) + flops.encoder_forward(c, seq_len)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The student as a masked LM (fill-mask works); the teacher is the starting checkpoint, not exported."""
        return {"": self.student}
