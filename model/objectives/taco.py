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

from data_pipeline.masking import IGNORE_INDEX
from model import flops
from model.backbones import backbone_for
from model.diagnostics import retrieval_accuracy
from model.objectives.base import Batch, Objective
from model.objectives.mlm import at_least_fp32, full_precision, sparse_mlm

OFFSETS = torch.tensor([-2, -1, 1, 2])


def sample_taco_indices(valid: torch.Tensor, anchors: torch.Tensor, negatives: int,
                        generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat indices into [B*L]: anchors [N], their positives [N], negatives [N, K] from other sequences.

    Anchors whose sequence has no other valid token, or whose batch has no other sequence, are dropped.
    """
    b, length = valid.shape
    device = valid.device
    counts = valid.sum(1)
    others = valid.sum() - counts  # valid tokens in the other sequences
    keep = anchors & valid & (counts >= 2)[:, None] & (others > 0)[:, None]
    rows, cols = keep.nonzero(as_tuple=True)
    if len(rows) == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty, torch.zeros(0, negatives, dtype=torch.long, device=device)
    offsets = OFFSETS.to(device)[torch.randint(4, (len(rows),), generator=generator).to(device)]
    pos = cols + offsets
    inside = (pos >= 0) & (pos < length)
    ok = inside & valid[rows, pos.clamp(0, length - 1)]
    # Fallback at the edges: another valid position of the same sequence.
    if not bool(ok.all()):
        bad = (~ok).nonzero(as_tuple=True)[0]
        weights = valid[rows[bad]].float()
        weights[torch.arange(len(bad)), cols[bad]] = 0.0
        pos = pos.clone()
        pos[bad] = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    flat_valid = valid.reshape(-1).float()
    neg = torch.empty(len(rows), negatives, dtype=torch.long, device=device)
    for r in rows.unique().tolist():
        sel = (rows == r).nonzero(as_tuple=True)[0]
        weights = flat_valid.clone()
        weights[r * length:(r + 1) * length] = 0.0
        neg[sel] = torch.multinomial(weights, len(sel) * negatives, replacement=True, generator=generator).view(len(sel), negatives)
    return rows * length + cols, rows * length + pos, neg


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
            temperature: float = 0.07) -> torch.Tensor:
    """Mean InfoNCE over the anchors of `tc_logits` (the positive is column 0)."""
    if anchor_idx.numel() == 0:
        return g.sum() * 0.0
    logits = tc_logits(g, anchor_idx, pos_idx, neg_idx, temperature)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


@dataclass
class TACOOptions:
    """TACO: token-alignment contrastive loss on the global semantic g = last hidden - embeddings."""

    temperature: float = 0.07
    negatives: int = 50
    masked_only: bool = False
    weight: float = 1.0


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

    def terms(self, batch: Batch):
        """MLM and TC losses, and how often the positive outscores every negative."""
        attention = batch["attention_mask"]
        bb = self.backbone
        out = bb.encode(bb.base(self.model), batch["input_ids"], attention, batch.get("token_type_ids"), output_hidden_states=True)
        mlm, accuracy = sparse_mlm(out.last_hidden_state, batch["labels"], bb.mlm_head(self.model))
        g = out.last_hidden_state - out.hidden_states[0]
        anchors = (batch["labels"] != IGNORE_INDEX) if self.options.masked_only else attention.bool()
        with torch.no_grad():
            idx = sample_taco_indices(attention.bool(), anchors, self.options.negatives)
        if idx[0].numel() == 0:
            tc, retrieval = g.sum() * 0.0, g.new_zeros((), dtype=torch.float32)
        else:
            logits = tc_logits(g, *idx, temperature=self.options.temperature)
            positive = torch.zeros(len(logits), dtype=torch.long, device=logits.device)  # column 0
            tc = F.cross_entropy(logits, positive)
            retrieval = retrieval_accuracy(logits.detach(), positive)
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
