"""DeCLUTR's views of a document: an anchor span and positive spans near it, sampled per sample in the loader.

Giorgi et al. 2021, "DeCLUTR: Deep Contrastive Learning for Unsupervised Textual Representations"
(JohnGiorgi/DeCLUTR, declutr/common/contrastive_utils.py): with ℓ_min and ℓ_max the shortest and
longest span,
    anchor length   ℓ_a = ⌊p_a (ℓ_max − ℓ_min) + ℓ_min⌋,  p_a ~ Beta(4, 2)  (long anchors)
    anchor start    s_a ~ U{0 .. n − ℓ_a}
    positive length ℓ_p = ⌊p_p (ℓ_a − ℓ_min) + ℓ_min⌋,    p_p ~ Beta(2, 4)  (shorter positives)
    positive start  s_p ~ U{s_a − ℓ_p .. s_a + ℓ_a}, kept inside the document
so a positive overlaps the anchor, is adjacent to it, or lies inside it. The document is one
sample of `packing: document` data (a document, or a seq_len piece of a long one: it never crosses
into another document). Where a piece is shorter than ℓ_max, ℓ_max (and ℓ_min) shrink to it.
Beta draws with integer shapes are order statistics of uniforms (the a-th smallest of a + b − 1),
so every draw comes from the sample's own seeded generator and a resumed run repeats it.

The anchor becomes the sample's `input_ids` (then masked for MLM by the wrapped masking); the
positives are `positive{k}_input_ids` / `positive{k}_attention_mask`, each `[CLS] span [SEP]`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SpanViewOptions:
    """Span lengths in tokens, the Beta shapes, and how many positives per anchor."""

    min_span_tokens: int = 8
    max_span_tokens: int = 62
    positives: int = 1
    anchor_beta: tuple[int, int] = (4, 2)
    positive_beta: tuple[int, int] = (2, 4)


def beta_draw(a: int, b: int, generator: torch.Generator) -> float:
    """One Beta(a, b) draw for integer shapes: the a-th smallest of a + b − 1 uniforms."""
    return float(torch.rand(a + b - 1, generator=generator, dtype=torch.float64).sort().values[a - 1])


def sample_spans(n: int, options: SpanViewOptions, generator: torch.Generator) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """(anchor start, length) and each positive's (start, length), in a body of n tokens."""
    longest = min(options.max_span_tokens, n)
    shortest = min(options.min_span_tokens, longest)
    anchor_len = int(beta_draw(*options.anchor_beta, generator) * (longest - shortest) + shortest)
    anchor_start = int(torch.randint(n - anchor_len + 1, (1,), generator=generator))
    positives = []
    for _ in range(options.positives):
        length = int(beta_draw(*options.positive_beta, generator) * (anchor_len - shortest) + shortest)
        low, high = max(0, anchor_start - length), min(n - length, anchor_start + anchor_len)
        positives.append((int(torch.randint(low, high + 1, (1,), generator=generator)), length))
    return (anchor_start, anchor_len), positives


class SpanViews:
    """Wraps a masking transform: the sample becomes a masked anchor span plus clean positive spans."""

    def __init__(self, inner, options: SpanViewOptions, pad_id: int, cls_id: int, sep_id: int) -> None:
        self.inner, self.options, self.pad_id, self.cls_id, self.sep_id = inner, options, pad_id, cls_id, sep_id

    def _wrap(self, body: torch.Tensor) -> torch.Tensor:
        return torch.cat([body.new_tensor([self.cls_id]), body, body.new_tensor([self.sep_id])])[None]

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The masked anchor (input_ids, labels, ...) and the positives, for a one-sample batch."""
        ids = batch["input_ids"][0]
        ids = ids[ids != self.pad_id]
        body = ids[1:-1] if len(ids) >= 2 and ids[0] == self.cls_id and ids[-1] == self.sep_id else ids
        if len(body) == 0:
            body = ids[:1]  # a sample of special tokens only: a one-token span keeps the batch well formed
        (start, length), positives = sample_spans(len(body), self.options, generator)
        anchor = self._wrap(body[start:start + length])
        out = self.inner({"input_ids": anchor, "attention_mask": torch.ones_like(anchor)}, generator)
        for k, (p_start, p_len) in enumerate(positives):
            view = self._wrap(body[p_start:p_start + p_len])
            out[f"positive{k}_input_ids"], out[f"positive{k}_attention_mask"] = view, torch.ones_like(view)
        return out
