"""Learning diagnostics that say whether an objective learned more than a prior: AUC, precision/recall, retrieval, self-similarity.

All run under no_grad on one micro-batch and return float32 scalars; the trainer averages them
over micro-batches and ranks (so an AUC in the logs is the mean of per-micro-batch AUCs).
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F

from core import distributed as dist


@torch.no_grad()
def binary_auc(scores: torch.Tensor, positive: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ROC-AUC of `scores` for the positive class over the entries where `mask` holds (all by default): the share of
    (positive, negative) pairs ordered right, ties counted half (Mann-Whitney U); 0.5 when a class is empty."""
    scores, positive = scores.float().reshape(-1), positive.bool().reshape(-1)
    mask = torch.ones_like(positive) if mask is None else mask.bool().reshape(-1)
    positive, negative = positive & mask, ~positive & mask
    # Counts stay tensors and shapes fixed (no host read, no boolean indexing: this runs in the compiled step).
    n_pos, n_neg = positive.sum().double(), negative.sum().double()
    order = scores.argsort()
    sorted_scores = scores[order]
    below = torch.cat([negative.new_zeros(1, dtype=torch.float64), negative[order].double().cumsum(0)])
    smaller = below[torch.searchsorted(sorted_scores, scores, right=False)]  # negatives scored below each entry
    equal = below[torch.searchsorted(sorted_scores, scores, right=True)] - smaller
    u = ((smaller + equal / 2) * positive).sum()
    auc = u / (n_pos * n_neg).clamp(min=1)
    return torch.where((n_pos == 0) | (n_neg == 0), torch.full_like(auc, 0.5), auc).float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x where mask holds (0 when it holds nowhere), as float32, without boolean indexing."""
    mask = mask.bool()
    return (torch.where(mask, x.float(), 0.0).sum() / mask.sum().clamp(min=1)).float()


@torch.no_grad()
def binary_entropy(p: torch.Tensor) -> torch.Tensor:
    """The cross-entropy (nats) of always predicting the base rate p: the loss a head that learned nothing reaches."""
    p = p.double().clamp(1e-12, 1 - 1e-12)
    return (-(p * p.log() + (1 - p) * (1 - p).log())).float()


@torch.no_grad()
def detection_metrics(logits: torch.Tensor, positive: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """AUC, precision and recall of the positive class (logit > 0), its fraction, and the prior loss, over mask."""
    mask = mask.bool()
    target = positive.bool() & mask
    predicted = (logits > 0) & mask
    true_pos = (predicted & target).sum().float()
    return {
        f"{prefix}_auc": binary_auc(logits, target, mask),
        f"{prefix}_precision": true_pos / predicted.sum().clamp(min=1),
        f"{prefix}_recall": true_pos / target.sum().clamp(min=1),
        f"{prefix}_prior_loss": binary_entropy(masked_mean(target, mask)),
    }


@torch.no_grad()
def retrieval_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose highest logit is the target column."""
    if logits.shape[0] == 0:
        return logits.new_zeros((), dtype=torch.float32)
    return (logits.argmax(-1) == targets).float().mean()


@torch.no_grad()
def token_self_similarity(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity between distinct non-pad tokens of the same sequence (TaCL's measure of anisotropy)."""
    with torch.autocast(hidden.device.type, enabled=False):  # a bf16 matmul would round the statistic to 3 digits
        z = F.normalize(hidden.float(), dim=-1)
        sims = z @ z.transpose(1, 2)  # [B, L, L]
    valid = attention_mask.bool()
    pair = valid[:, :, None] & valid[:, None, :]
    pair &= ~torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)
    return (sims * pair).sum() / pair.sum().clamp(min=1)


def validation_unigram_entropy(loader: Iterable[dict[str, torch.Tensor]], batches: int, tokenizer: dict) -> float:
    """Entropy of the ordinary tokens in the first `batches` validation batches (clean, before masking), counted over
    every rank: the MLM loss of a model that learned only word counts, on the batches evaluation reads."""
    vocab = tokenizer["vocab_size"]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _, batch in zip(range(batches), loader):
        ids = batch["original_input_ids"][batch["attention_mask"].bool()].long()
        counts += torch.bincount(ids, minlength=vocab)[:vocab].double()
    counts[[i for i in tokenizer["special_ids"] if i < vocab]] = 0
    return unigram_entropy(dist.all_reduce_sum(counts))


def unigram_entropy(counts: torch.Tensor) -> float:
    """Entropy (nats) of the token distribution with these counts: the MLM loss of predicting frequencies alone.

    Miller-Madow corrected ((K - 1) / 2N for K observed types in N tokens): the plug-in estimate
    from a few thousand validation tokens of a large vocabulary reads too low.
    """
    counts = counts.double()
    n = counts.sum()
    p = counts[counts > 0] / n
    if not p.numel():
        return math.nan
    return float(-(p * p.log()).sum() + (p.numel() - 1) / (2 * n))


def headline(metrics: dict[str, float], unigram: float | None) -> dict[str, float]:
    """Derived numbers that say whether a model learned: each `*mlm_loss` (and XLNet's `plm_loss`) below the
    unigram entropy, each detection loss below its prior (`X_loss` against `X_prior_loss`)."""
    out = {}
    if unigram is not None:
        out["unigram_entropy"] = unigram
        out.update({f"{k}_below_unigram": unigram - v for k, v in metrics.items() if k.endswith(("mlm_loss", "plm_loss"))})
    for key, prior in metrics.items():
        if key.endswith("_prior_loss") and (loss := key[: -len("_prior_loss")] + "_loss") in metrics:
            out[f"{loss}_below_prior"] = prior - metrics[loss]
    return out
