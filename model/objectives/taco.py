"""TACO: token-alignment contrastive objective on the global semantic part of token representations.

Fu et al. 2022, "Contextual Representation Learning beyond Masked Language Modeling" (TACO,
FUZHIYI/TACO). The global semantic of each token is g = last hidden state − embedding-layer
output (computed out of place: the original subtracted in place, which only worked under fp16).
Each anchor's positive is a nearby token of the same sequence (offset uniform in {±1, ±2}, or
another position of the sequence at the edges); K = 50 negatives come from the other sequences
of the batch; keys are detached; cosine similarity / τ (0.07); cross-entropy over all non-pad
anchors (or the masked ones only). Total = MLM + TC. Sampling (`sample_taco_indices`) is separate
from the loss (`tc_loss`), so the loss can be checked on given indices.

Where this differs from the paper: TACO trained RoBERTa/BERT with fairseq (Adam β2 = 0.98, the
project's default); positions and backbone are the config's (any backbone, relative positions
allowed). `tc_retrieval_accuracy` logs how often the positive outscores all K negatives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel

from core.config_io import check_range
from data_pipeline.masking import IGNORE_INDEX
from model import flops
from model.backbones import backbone_for
from model.diagnostics import masked_mean
from model.objectives.base import Batch, Objective
from model.objectives.mlm import at_least_fp32, full_precision, prediction_index, sparse_mlm

OFFSETS = torch.tensor([-2, -1, 1, 2])


def sample_taco_indices(valid: torch.Tensor, anchors: torch.Tensor, negatives: int,
                        generator: Optional[torch.Generator] = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat indices into [B*L], one row per position: the position [N], its positive [N], negatives [N, K] from the
    other sequences' valid tokens, and whether it is an anchor [N] (N = B*L).

    An anchor is a position of `anchors` that is valid, in a sequence with another valid token, in a batch with
    another sequence. Every shape follows from [B, L], so the compiled step traces this once; the rows of positions
    that are no anchor hold indices too, and the loss leaves them out.
    """
    b, length = valid.shape
    device = valid.device
    draws = generator.device if generator is not None else device
    counts = valid.sum(1)
    others = valid.sum() - counts  # valid tokens in the other sequences
    keep = anchors & valid & (counts >= 2)[:, None] & (others > 0)[:, None]
    cols = torch.arange(length, device=device).expand(b, length)
    pos = cols + OFFSETS.to(device)[torch.randint(4, (b, length), generator=generator, device=draws).to(device)]
    ok = (pos >= 0) & (pos < length) & valid.gather(1, pos.clamp(0, length - 1))
    # At the edges: another valid position of the same sequence (uniform where there is none: never an anchor).
    others_here = (valid[:, None, :] & ~torch.eye(length, dtype=torch.bool, device=device)).float()
    others_here = torch.where(others_here.sum(-1, keepdim=True) > 0, others_here, 1.0).reshape(b * length, length)
    fallback = torch.multinomial(others_here, 1, generator=generator).view(b, length)
    pos = torch.where(ok, pos, fallback)
    own = torch.arange(b, device=device)[:, None] == torch.arange(b * length, device=device)[None, :] // length
    elsewhere = (valid.reshape(1, -1) & ~own).float()  # [B, B*L]: the valid tokens of the other sequences
    elsewhere = torch.where(elsewhere.sum(-1, keepdim=True) > 0, elsewhere, 1.0)
    neg = torch.multinomial(elsewhere, length * negatives, replacement=True, generator=generator)
    start = (torch.arange(b, device=device) * length)[:, None]
    return (start + cols).flatten(), (start + pos).flatten(), neg.view(b * length, negatives), keep.flatten()


def tc_logits(g: torch.Tensor, anchor_idx: torch.Tensor, pos_idx: torch.Tensor, neg_idx: torch.Tensor,
              temperature: float = 0.07) -> torch.Tensor:
    """[N, 1 + K] logits: cos(g_a, g_p)/τ first, then cos(g_a, g_n)/τ, with detached keys. g [B, L, H] or [B*L, H]."""
    with full_precision(g):
        flat = at_least_fp32(g.reshape(-1, g.shape[-1]))
        a = F.normalize(flat[anchor_idx], dim=-1)
        keys = F.normalize(flat.detach(), dim=-1)
        p = keys[pos_idx]
        n = keys[neg_idx]
        return torch.cat([(a * p).sum(-1, keepdim=True), torch.einsum("nh,nkh->nk", a, n)], dim=1) / temperature


def tc_loss(g: torch.Tensor, anchor_idx: torch.Tensor, pos_idx: torch.Tensor, neg_idx: torch.Tensor,
            temperature: float = 0.07, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean InfoNCE of `tc_logits` (the positive is column 0) over the rows where `keep` holds (all when None)."""
    if anchor_idx.numel() == 0:
        return g.sum() * 0.0
    return infonce_first(tc_logits(g, anchor_idx, pos_idx, neg_idx, temperature), keep)


def infonce_first(logits: torch.Tensor, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean cross-entropy of column 0 (the positive) over the rows of `logits` where `keep` holds (all when None)."""
    losses = F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device), reduction="none")
    keep = torch.ones_like(losses, dtype=torch.bool) if keep is None else keep
    return torch.where(keep, losses, 0.0).sum() / keep.sum().clamp(min=1)


@dataclass
class TACOOptions:
    """TACO: token-alignment contrastive loss on the global semantic g = last hidden - embeddings."""

    temperature: float = 0.07
    negatives: int = 50
    masked_only: bool = False
    weight: float = 1.0

    def validate(self) -> None:
        """A positive temperature, at least one negative, a non-negative weight."""
        check_range("objective.taco", self, ("temperature",), above=0)
        check_range("objective.taco", self, ("negatives",), at_least=1)
        check_range("objective.taco", self, ("weight",), at_least=0)


class TACO(Objective):
    """The backbone's masked LM with the token-alignment contrastive loss on g = last hidden − embeddings."""

    export_loader = "AutoModelForMaskedLM"
    options_class = TACOOptions

    def __init__(self, config: PretrainedConfig, options: TACOOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.options = options
        self.model = self.backbone.masked_lm(config, init_from)
        self.weights = {"tc_loss": options.weight}

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """MLM and TC losses, and how often the positive outscores every negative."""
        attention = batch["attention_mask"]
        bb = self.backbone
        out = bb.encode(bb.base(self.model), batch["input_ids"], self.encoder_mask(batch), batch.get("token_type_ids"),
                        output_hidden_states=True)
        mlm, accuracy = sparse_mlm(out.last_hidden_state, batch["labels"], bb.mlm_head(self.model), prediction_index(batch),
                                   self.vocab_loss_chunk)
        g = out.last_hidden_state - out.hidden_states[0]
        anchors = (batch["labels"] != IGNORE_INDEX) if self.options.masked_only else attention.bool()
        with torch.no_grad():
            *idx, keep = sample_taco_indices(attention.bool(), anchors, self.options.negatives)
        logits = tc_logits(g, *idx, temperature=self.options.temperature)
        tc = infonce_first(logits, keep)
        with torch.no_grad():
            retrieval = masked_mean(logits.argmax(-1) == 0, keep)
        return {"mlm_loss": mlm, "tc_loss": tc}, {"mlm_accuracy": accuracy, "tc_retrieval_accuracy": retrieval}

    def flops_per_token(self, seq_len: int) -> float:
        """Encoder + MLM head trained, plus each anchor against 1 + K keys."""
        mask_prob = self.mask_prob
        c = self.model.config
        contrast = 2 * (1 + self.options.negatives) * c.hidden_size
        return flops.TRAIN * (flops.mlm_forward(c, seq_len, mask_prob) + contrast)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The masked LM."""
        return {"": self.model}
