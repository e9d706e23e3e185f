"""A masked LM's vocabulary head and its cross-entropy, in one pass or fused and chunked over the predicted rows.

The plain path projects every predicted row onto the vocabulary at once and hands the logits to cross-entropy:
at BERT-base's 4,864 predicted rows a step and 30,522 tokens that is one [rows, vocabulary] tensor in the compute
dtype, its float32 upcast, and the softmax's gradient of the same size, all alive together. The fused path
(`linear_cross_entropy`, `train.vocab_loss_chunk`) takes `chunk` rows at a time through the projection, the
loss, the accuracy and the gradients of the projection's input, weight and bias, so only one chunk's logits ever
exist; backward only scales the gradients it kept (the scheme of Liger-Kernel's fused linear cross-entropy,
written here in PyTorch so it runs and is tested on a CPU and traces under torch.compile). It reads the
projection's parameters directly, which ZeRO-3 gathers only when the module itself runs: the training config
refuses the two together. The gradients are formed before a loss scale multiplies them (fp16): softmax entries
below fp16's smallest subnormal (6e-8) are 0 there, where the plain path would scale them first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from data_pipeline.masking import IGNORE_INDEX

Head = Callable[[torch.Tensor], torch.Tensor]


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Half-precision tensors are upcast for softmax/log maths; float32 and float64 pass unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# eq=False keeps object's identity hash: a compiled step builds the head inside the trace, and torch 2.11's dynamo
# hashes the object before its fields exist (a field hash raised AttributeError there; later releases catch it).
@dataclass(frozen=True, eq=False)
class VocabularyHead:
    """A masked LM's head as transformers builds it: `transform` (hidden → what the projection reads) and the
    vocabulary `projection` tied to the token embeddings. Calling it gives the logits, as the module itself does."""

    transform: Head
    projection: nn.Linear

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] → vocabulary logits [N, V]."""
        return self.projection(self.transform(hidden))


def unique_top_hits(logits: torch.Tensor, targets: torch.Tensor, by_count: bool) -> torch.Tensor:
    """Per row: the target's logit is above every other entry of its row. A tie for the top is a miss, and so is a row
    with a NaN anywhere.

    `by_count` (on an accelerator): every other entry is below the target, one comparison and one count over the
    logits (a top-k took a GPU longer than the loss itself: BENCHMARKS.md, "The trainer's step against the compiled
    bare loop, kernel by kind"). Otherwise (on a CPU, where counting a boolean row is several times slower than a
    copy): the row's maximum with the target masked out, in a copy of the logits.
    """
    index = targets.unsqueeze(-1)
    own = logits.gather(-1, index)
    if by_count:
        return (logits < own).sum(-1) == logits.shape[-1] - 1
    return own.squeeze(-1) > logits.scatter(-1, index, float("-inf")).amax(-1)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         targets: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, per-row unique-top hits) of `hidden @ weight.T + bias` against `targets`, `chunk` rows
    at a time. hidden [N, H]; weight [V, H]; bias [V] or None; targets [N], rows labelled IGNORE_INDEX count in
    neither. With gradients wanted, they are computed here, chunk by chunk, and backward scales them."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 row, got {chunk}")
    if not hidden.shape[0]:  # nothing predicted: a 0 that keeps the graph, so every rank still runs backward
        return at_least_fp32(F.linear(hidden, weight, bias)).sum(), torch.zeros(0, dtype=torch.bool, device=hidden.device)
    wants = [torch.is_grad_enabled() and t is not None and t.requires_grad for t in (hidden, weight, bias)]
    if any(wants):
        return _FusedLinearCrossEntropy.apply(hidden, weight, bias, targets, chunk, *wants)
    loss, hits, _ = _chunked(hidden, weight, bias, targets, chunk, (False, False, False))
    return loss, hits


def _chunked(hidden, weight, bias, targets, chunk: int, wants) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The loss, the hits and the wanted gradients (of hidden, weight, bias; None where not wanted), one chunk's
    logits alive at a time."""
    by_count = hidden.device.type != "cpu"
    # The weight's and bias's gradients sum over the chunks: in float32 at least, whatever the compute dtype.
    sums = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) if want else None
            for p, want in zip((weight, bias), wants[1:])]
    losses, hits, hidden_grads, weight_as_computed = [], [], [], None
    for start in range(0, hidden.shape[0], chunk):
        rows, labels = hidden[start:start + chunk], targets[start:start + chunk]
        product = F.linear(rows, weight, bias)  # in the compute dtype: autocast's, the weights', or float32
        logits = at_least_fp32(product)
        real = labels != IGNORE_INDEX
        safe = labels.clamp(min=0).unsqueeze(-1)
        hits.append(unique_top_hits(logits, safe.squeeze(-1), by_count) & real)
        log_total = logits.logsumexp(-1, keepdim=True)
        losses.append(torch.where(real, (log_total - logits.gather(-1, safe)).squeeze(-1), 0.0).sum())
        if not any(wants):
            continue
        # d loss / d logits = softmax - one-hot of the target, in place (the logits are not read again). An unlabelled
        # row is shifted by +inf and its one-hot is 0, so its gradient is 0 without one more pass over the chunk. The
        # products that carry it back run in the compute dtype, as autograd's would through the projection.
        shift = torch.where(real.unsqueeze(-1), log_total, float("inf"))
        one_hot = real.to(logits.dtype).unsqueeze(-1)
        grad = logits.sub_(shift).exp_().scatter_add_(-1, safe, -one_hot).to(product.dtype)
        if wants[0]:
            weight_as_computed = weight.to(grad.dtype) if weight_as_computed is None else weight_as_computed  # cast once
            hidden_grads.append((grad @ weight_as_computed).to(hidden.dtype))
        if wants[1]:
            sums[0] += grad.t() @ rows.to(grad.dtype)
        if wants[2]:
            sums[1] += grad.sum(0, dtype=sums[1].dtype)
    grads = [torch.cat(hidden_grads) if wants[0] else None]
    grads += [total.to(p.dtype) if total is not None else None for total, p in zip(sums, (weight, bias))]
    return torch.stack(losses).sum(), torch.cat(hits), grads


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and, chunk by chunk, its gradients; backward scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, want_hidden, want_weight, want_bias):
        """The summed loss and the hits; the gradients kept for backward."""
        loss, hits, grads = _chunked(hidden, weight, bias, targets, chunk, (want_hidden, want_weight, want_bias))
        ctx.present = [g is not None for g in grads]
        ctx.save_for_backward(*[g for g in grads if g is not None])
        ctx.mark_non_differentiable(hits)
        return loss, hits

    @staticmethod
    @once_differentiable  # the gradients are values computed in forward: no graph to differentiate again
    def backward(ctx, grad_loss, _grad_hits):
        """Each kept gradient times d(total)/d(loss) (a 0-dim factor: each keeps its dtype); none for the rest."""
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_loss if present else None for present in ctx.present]
        return (*grads, None, None, None, None, None)
