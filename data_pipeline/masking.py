"""Dynamic masking of one sample with a given generator (the loader seeds it per sample and epoch, so resume repeats it).

Strategies (special tokens and padding are never picked):
- `bert`: each token picked with probability mask_prob; picked → 80% [MASK], 10% random, 10% kept
  (Devlin et al. 2019).
- `whole_word`: words are picked with probability mask_prob and all their tokens are masked, each
  token then 80/10/10 as in google-research/bert's whole-word masking. Word starts come from the
  vocabulary: sentencepiece pieces beginning with `▁`, WordPiece tokens not beginning with `##`.
- `span`: SpanBERT (Joshi et al. 2020): span lengths in words ~ Geometric(p) truncated at max_span
  and renormalised (mean 3.8 for p=0.2), starts uniform over words, until mask_prob of the tokens
  are picked; as SpanBERT's sampler, a span is drawn again only when its first word is picked, runs
  over picked words, stops before the word that would pass the budget, and touching spans merge into
  one (so its boundaries are never picked); each span is 80/10/10 as a whole. Every picked token also
  gets its span's boundary positions (`span_left`: the token before the span, `span_right`: the token
  after it) and its 1-based place in the span (`span_offset`; 0 where nothing is picked), for the span
  boundary objective.
- `ngram`: ALBERT's n-gram masking (Lan et al. 2020): as `span`, with n-gram lengths in words
  P(n) ∝ 1/n for n = 1..max_span (ALBERT: max_span=3).
- `plm`: XLNet's permutation LM (Yang et al. 2019): the input stays clean; whole-word n-gram spans
  (P(n) ∝ 1/n, n ≤ max_span, as XLNet's `_sample_mask`) pick mask_prob = 1/K of the tokens as
  targets, which come last in a sampled factorization order, in a uniformly random order among
  themselves (XLNet's `_local_perm` with the permutation over the whole sequence). Emits `perm_mask`
  [L, L] (1: query i may not see token j: j is a target not before i in the order; non-targets see
  no target) and `target_mapping` [P, L] / `target_labels` [P] for the P targets, in position order.
- `coco`: COCO-LM's corruption input: tokens picked as in `bert`, all of them → [MASK].
`count=exact` picks exactly round(mask_prob · n) tokens per sequence (bert, coco) instead of
independent draws. A row predicts at most `prediction_slots` tokens (as google-research/bert's
max_predictions_per_seq): the row's picks past that many are left unpicked. Every
strategy but `plm` emits `masked_positions` [K]: the picked positions in order, then 0 ([CLS], never
picked) up to K = `prediction_slots`. A batch's collate turns them into `prediction_index`
(`build_prediction_index`): the flat positions of all its picks, padded to a count fixed per batch shape
(`batch_prediction_slots`), so the step's vocabulary heads run over about as many rows as there are picks and
compile once. Validation uses `evaluation_masking`: the same picks, all shown as [MASK].
With `crop_ratio` set, a contiguous crop of the clean sequence (COCO-LM's second view for sequence
contrastive learning) is added as `crop_input_ids` / `crop_attention_mask`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Iterable, Literal, Optional

import numpy as np
import torch

IGNORE_INDEX = -100


@dataclass
class MaskingConfig:
    """Which tokens are picked and what they become."""

    strategy: Literal["bert", "whole_word", "span", "ngram", "plm", "coco"] = "bert"
    mask_prob: float = 0.15
    # bert/coco: bernoulli picks each token with probability mask_prob (BERT); exact picks
    # round(mask_prob · n) of a sequence's n pickable tokens (ELECTRA, COCO-LM).
    count: Literal["bernoulli", "exact"] = "bernoulli"
    # Of the picked tokens: this fraction becomes [MASK], this fraction a random token, the rest stay.
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1
    # span: Geometric(span_p) span lengths in words, truncated at max_span; ngram: P(n) ∝ 1/n up to max_span.
    span_p: float = 0.2
    max_span: int = 10
    # When set (COCO-LM uses 0.9), add a contiguous crop of the clean sequence of this length ratio.
    crop_ratio: Optional[float] = None

    def validate(self) -> None:
        """Probabilities must be probabilities."""
        from core.errors import ConfigError

        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"config key 'masking.mask_prob' must be in (0, 1), got {self.mask_prob}")
        if self.mask_token_fraction < 0 or self.random_token_fraction < 0 or (
            self.mask_token_fraction + self.random_token_fraction > 1.0
        ):
            raise ConfigError("config keys 'masking.mask_token_fraction' + 'masking.random_token_fraction' must be in [0, 1]")
        if not 0.0 < self.span_p <= 1.0 or self.max_span < 1:
            raise ConfigError("config keys 'masking.span_p' must be in (0, 1] and 'masking.max_span' >= 1")
        if self.count == "exact" and self.strategy not in ("bert", "coco"):
            raise ConfigError(f"config key 'masking.count=exact' applies to strategies bert and coco, not {self.strategy}")
        if self.crop_ratio is not None and not 0.0 < self.crop_ratio <= 1.0:
            raise ConfigError(f"config key 'masking.crop_ratio' must be in (0, 1], got {self.crop_ratio}")


def span_length_pmf(p: float, max_span: int) -> torch.Tensor:
    """P(L = k) for k = 1..max_span: Geometric(p) truncated at max_span and renormalised."""
    k = torch.arange(1, max_span + 1, dtype=torch.float64)
    pmf = p * (1 - p) ** (k - 1)
    return pmf / pmf.sum()


def ngram_length_pmf(max_n: int) -> torch.Tensor:
    """P(n) for n = 1..max_n of ALBERT's n-gram masking: proportional to 1/n."""
    weights = 1.0 / torch.arange(1, max_n + 1, dtype=torch.float64)
    return weights / weights.sum()


def sample_span_lengths(n: int, p: float, max_span: int, generator: torch.Generator,
                        pmf: Optional[torch.Tensor] = None) -> torch.Tensor:
    """n span lengths (in words) drawn from `pmf` (default: `span_length_pmf(p, max_span)`)."""
    pmf = span_length_pmf(p, max_span) if pmf is None else pmf
    return torch.multinomial(pmf.float(), n, replacement=True, generator=generator) + 1


def prediction_slots(cfg: MaskingConfig, seq_len: int) -> int:
    """The most tokens a row of `seq_len` predicts: the width of `masked_positions`, fixed per run.

    Exact counts and span budgets never pass round(mask_prob · seq_len) (SpanBERT's first word of a row may pass its
    budget, within these slots). Independent draws (bert, whole_word) get
    five standard deviations of a Binomial(seq_len, mask_prob) above its mean: a row over it is rarer than one in
    a million for token draws (whole words, drawn in units, reach it more often). The vocabulary heads read the
    batch's own budget (`batch_prediction_slots`); a row's spare slots cost only TaCL's per-row contrast.
    """
    expected = cfg.mask_prob * seq_len
    if _fills_its_slots(cfg):
        return max(1, min(seq_len, round(expected)))
    return max(1, min(seq_len, _five_deviations_above(expected, cfg.mask_prob)))


def _fills_its_slots(cfg: MaskingConfig) -> bool:
    """Exact counts and span budgets pick round(mask_prob · n): no room for a draw's spread is needed."""
    return cfg.count == "exact" or cfg.strategy in ("span", "ngram", "plm")


def _five_deviations_above(expected: float, p: float) -> int:
    """A Binomial count with mean `expected` and probability `p`, five standard deviations above its mean, rounded up."""
    return math.ceil(expected + 5 * math.sqrt(expected * (1 - p)))


def batch_prediction_slots(cfg: MaskingConfig, rows: int, seq_len: int) -> int:
    """The predictions a batch of `rows` × `seq_len` makes room for: the width of its `prediction_index`.

    Independent draws (bert, whole_word) get five standard deviations of a Binomial(rows · seq_len, mask_prob) above
    its mean for the whole batch, where each row's own slots (`prediction_slots`) hold five per row: the batch's
    picks vary far less than its rows'. Exact counts and span budgets fill every row's slots.
    """
    every_row = rows * prediction_slots(cfg, seq_len)
    if _fills_its_slots(cfg):
        return every_row
    return max(1, min(every_row, _five_deviations_above(cfg.mask_prob * rows * seq_len, cfg.mask_prob)))


def build_prediction_index(labels: torch.Tensor, slots: int, most: int) -> torch.Tensor:
    """[slots]: the flat positions (into labels.flatten()) of a batch's labelled tokens in order, then an unlabelled
    position (the first) up to `slots`; [most] for a batch with more than `slots` picks.

    `most` is what the batch can hold (rows × their slots): a batch over its budget takes that wider shape (a
    compiled step runs it eagerly) instead of losing picks, so a sample's masking never depends on the batch it is in.
    """
    flags = (labels != IGNORE_INDEX).numpy().reshape(-1)
    where = np.flatnonzero(flags)
    if len(where) > most:
        raise ValueError(f"a batch holds {len(where)} picks, more than its rows' {most} prediction slots")
    width = slots if len(where) <= slots else most
    index = np.full(width, int(np.argmin(flags)) if len(where) < width else 0, dtype=np.int64)
    index[:len(where)] = where
    return torch.from_numpy(index)


def positions_of(picked: torch.Tensor, slots: int) -> torch.Tensor:
    """[B, slots]: each row's picked positions in order, then 0. Rows never hold more than `slots` picks here."""
    return limit_picks(picked, slots)[1]


def limit_picks(picked: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(picked with each row's picks past the first `slots` dropped, [B, slots] positions of the picks then 0).

    In numpy: the loader masks one sample at a time, where each torch call costs more than its work."""
    flags, copied = picked.cpu().numpy(), False  # a view of the caller's tensor until a row is cut
    positions = np.zeros((flags.shape[0], slots), dtype=np.int64)
    for row, row_flags in enumerate(flags):
        where = np.flatnonzero(row_flags)
        if len(where) > slots:
            if not copied:
                flags, copied = flags.copy(), True
            flags[row, where[slots:]] = False
            where = where[:slots]
        positions[row, :len(where)] = where
    return torch.from_numpy(flags).to(picked.device), torch.from_numpy(positions).to(picked.device)


class _Masking:
    """Shared parts: which tokens may be picked, and turning picked tokens into [MASK] / random / kept."""

    def __init__(self, cfg: MaskingConfig, vocab_size: int, mask_id: int, special_ids: list[int],
                 word_starts: Optional[torch.Tensor] = None) -> None:
        self.cfg = cfg
        self.mask_id = mask_id
        self.special_ids = torch.tensor(sorted(special_ids), dtype=torch.long)
        keep = torch.ones(vocab_size, dtype=torch.bool)
        keep[self.special_ids[self.special_ids < vocab_size]] = False
        # Random replacements are drawn from ordinary tokens only.
        self.replacement_ids = keep.nonzero().squeeze(1)
        self.word_starts = word_starts

    def pickable(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Positions that may be masked: not special, not padding."""
        return ~torch.isin(input_ids, self.special_ids)

    def word_start_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """True where a word begins; special tokens count as words of their own."""
        if self.word_starts is None:
            raise ValueError("this masking strategy needs the tokenizer's word-start table")
        return self.word_starts[input_ids] | ~self.pickable(input_ids)

    def pick(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """Picked positions, optionally a per-position action draw shared within a unit (span), and extra columns."""
        raise NotImplementedError

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Return a new batch with masked `input_ids`, `labels` and the clean `original_input_ids`."""
        ids = batch["input_ids"]
        picked, action, extra = self.pick(ids, generator)
        picked, positions = limit_picks(picked, prediction_slots(self.cfg, ids.shape[1]))
        if action is None:
            action = torch.rand(ids.shape, generator=generator)
        mask_frac, random_frac = self.cfg.mask_token_fraction, self.cfg.random_token_fraction
        if self.cfg.strategy == "coco":
            mask_frac, random_frac = 1.0, 0.0
        to_mask = picked & (action < mask_frac)
        to_random = picked & (action >= mask_frac) & (action < mask_frac + random_frac)
        draws = torch.randint(len(self.replacement_ids), ids.shape, generator=generator)
        masked = torch.where(to_mask, torch.full_like(ids, self.mask_id), ids)
        masked = torch.where(to_random, self.replacement_ids[draws], masked)
        labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
        return {**batch, "input_ids": masked, "labels": labels, "original_input_ids": ids,
                "masked_positions": positions, **extra}


class TokenMasking(_Masking):
    """`bert` and `coco`: each pickable token with probability mask_prob, or exactly round(mask_prob · n) of them."""

    def pick(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """Pickable tokens drawn independently (or exactly k per row), with no shared action draw or extra columns."""
        pickable = self.pickable(ids)
        if self.cfg.count == "exact":
            # The k lowest of uniform scores among the pickable tokens: a uniform k-subset per row.
            scores = torch.rand(ids.shape, generator=generator).masked_fill(~pickable, 2.0)
            ranks = scores.argsort(dim=1).argsort(dim=1)
            k = (self.cfg.mask_prob * pickable.sum(1).double()).round().long()
            return (ranks < k[:, None]) & pickable, None, {}
        probs = torch.full(ids.shape, self.cfg.mask_prob)
        return torch.bernoulli(probs, generator=generator).bool() & pickable, None, {}


class WholeWordMasking(_Masking):
    """`whole_word`: pick words with probability mask_prob; every token of a picked word is picked."""

    def pick(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """Every token of the words whose first token was drawn, with no shared action draw or extra columns."""
        starts = self.word_start_mask(ids)
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        # Index of the first token of each token's word.
        word_head = torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), dim=1).values
        head_picked = torch.bernoulli(torch.full(ids.shape, self.cfg.mask_prob), generator=generator).bool() & starts
        return head_picked.gather(1, word_head) & self.pickable(ids), None, {}


class SpanMasking(_Masking):
    """`span` / `ngram`: contiguous word spans; each span shares one 80/10/10 action draw and knows its boundaries."""

    @functools.cached_property
    def length_pmf(self) -> torch.Tensor:
        """P(a span of n words), n = 1..max_span: 1/n for `ngram` / `plm` (ALBERT), else SpanBERT's truncated geometric."""
        if self.cfg.strategy in ("ngram", "plm"):
            return ngram_length_pmf(self.cfg.max_span)
        return span_length_pmf(self.cfg.span_p, self.cfg.max_span)

    def pick(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor], dict]:
        """Picked spans, one action draw per span, and each picked token's span boundaries and offset columns."""
        pickable = self.pickable(ids)
        starts = self.word_start_mask(ids) & pickable
        picked = torch.zeros_like(pickable)
        action = torch.rand(ids.shape, generator=generator)
        left, right, offset = (torch.zeros_like(ids) for _ in range(3))
        slots = prediction_slots(self.cfg, ids.shape[1])
        for row in range(ids.shape[0]):
            for lo, hi in self._pick_row(pickable[row], starts[row], picked[row], action[row], generator, slots):
                # [CLS] and [SEP] are never picked, so both boundary tokens exist inside the row.
                left[row, lo:hi], right[row, lo:hi] = lo - 1, hi
                offset[row, lo:hi] = torch.arange(1, hi - lo + 1)
        return picked, action, {"span_left": left, "span_right": right, "span_offset": offset}

    def _pick_row(self, pickable, starts, picked, action, generator, slots: int) -> list[tuple[int, int]]:
        """Pick spans in one row (in place) and return them as [lo, hi) token ranges."""
        n = int(pickable.sum())
        budget = max(1, round(self.cfg.mask_prob * n)) if n else 0
        heads = starts.nonzero().squeeze(1).tolist()
        spans: list[tuple[int, int]] = []
        if not heads or not budget:
            return spans
        # Word i spans [heads[i], ends[i]); a word stops at the next word head or a special token.
        length = len(pickable)
        ends = []
        for i, h in enumerate(heads):
            e = h + 1
            limit = heads[i + 1] if i + 1 < len(heads) else length
            while e < limit and pickable[e]:
                e += 1
            ends.append(e)
        tries = 4 * len(heads) + 20
        lengths = sample_span_lengths(tries, self.cfg.span_p, self.cfg.max_span, generator, self.length_pmf).tolist()
        first_words = torch.randint(len(heads), (tries,), generator=generator).tolist()
        if self.cfg.strategy == "span":
            return self._spanbert_row(heads, ends, budget, picked, action, zip(lengths, first_words), slots)
        count = 0
        for span_words, w in zip(lengths, first_words):
            if count >= budget:
                break
            last = w
            # Extend over following words only while they are contiguous (no special token between).
            while last + 1 < len(heads) and last - w + 1 < span_words and heads[last + 1] == ends[last]:
                last += 1
            lo, hi = heads[w], ends[last]
            # As ALBERT's and XLNet's samplers do, an n-gram over another or past the budget is skipped.
            if picked[lo:hi].any() or count + (hi - lo) > budget:
                continue
            picked[lo:hi] = True
            action[lo:hi] = action[lo]  # the whole span is masked, replaced or kept together
            count += hi - lo
            spans.append((lo, hi))
        return spans

    @staticmethod
    def _spanbert_row(heads: list[int], ends: list[int], budget: int, picked: torch.Tensor, action: torch.Tensor,
                      draws: Iterable[tuple[int, int]], slots: int) -> list[tuple[int, int]]:
        """SpanBERT's sampler (facebookresearch/SpanBERT, PairWithSpanMaskingScheme): a span is drawn again only when
        its first word is picked already; it runs over picked words, and stops where its next word would pass the
        budget (whole words, as the paper masks; a row's first word even past it, within the row's `slots`, so no
        row is left without a target); overlapping and adjacent spans are merged, so every boundary is unpicked."""
        count, spans = 0, []
        for span_words, w in draws:
            if count >= budget:
                break
            if picked[heads[w]]:
                continue
            lo = hi = heads[w]
            for last in range(w, min(w + span_words, len(heads))):
                if heads[last] != hi:  # a special token between: the span ends before it
                    break
                new = int((~picked[heads[last]:ends[last]]).sum())
                if count + new > (slots if count == 0 else budget):
                    break
                picked[heads[last]:ends[last]] = True
                count, hi = count + new, ends[last]
                if count >= budget:
                    break
            if hi > lo:
                spans.append((lo, hi))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        for lo, hi in merged:
            action[lo:hi] = action[lo]  # the whole span is masked, replaced or kept together
        return merged


class PermutationMasking(SpanMasking):
    """`plm`: XLNet targets (n-gram spans of whole words) and a factorization order that predicts them last."""

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The clean input, its targets as `labels`, and the permutation's `perm_mask` / `target_mapping` (one sample)."""
        ids = batch["input_ids"]
        picked, _, _ = self.pick(ids, generator)
        targets = picked[0].nonzero().squeeze(1)
        rank = torch.full((ids.shape[1],), -1, dtype=torch.long)  # non-targets: before every target
        rank[targets[torch.randperm(len(targets), generator=generator)]] = torch.arange(len(targets))
        own = torch.where(picked[0], rank, rank + 1)  # a target's own place; non-targets sit at 0
        perm_mask = (own[:, None] <= rank[None, :]) & picked[0][None, :]
        target_mapping = torch.zeros(len(targets), ids.shape[1])
        target_mapping[torch.arange(len(targets)), targets] = 1.0
        labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
        return {**batch, "labels": labels, "original_input_ids": ids, "perm_mask": perm_mask.float()[None],
                "target_mapping": target_mapping[None], "target_labels": ids[0, targets][None]}


def crop_view(input_ids: torch.Tensor, pad_id: int, cls_id: int, sep_id: int, ratio: float,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous crop of each sequence's body (ratio of its length), re-wrapped as [CLS] crop [SEP], as wide as the
    widest crop: rows of one length give crops of one length, which need no padding (nor an attention mask)."""
    crops = []
    for ids in input_ids:
        n_real = int((ids != pad_id).sum())
        body = ids[1:n_real - 1]
        keep = max(1, round(ratio * len(body)))
        start = int(torch.randint(len(body) - keep + 1, (1,), generator=generator)) if len(body) > keep else 0
        crops.append(body[start:start + keep])
    out = input_ids.new_full((len(crops), 2 + max(len(c) for c in crops)), pad_id)
    for row, crop in enumerate(crops):
        out[row, 0], out[row, 1:1 + len(crop)], out[row, 1 + len(crop)] = cls_id, crop, sep_id
    return out, (out != pad_id).long()


class WithCropView:
    """Wraps a masking transform and adds a crop of the clean input (drawn before masking)."""

    def __init__(self, inner: _Masking, ratio: float, pad_id: int, cls_id: int, sep_id: int) -> None:
        self.inner, self.ratio, self.pad_id, self.cls_id, self.sep_id = inner, ratio, pad_id, cls_id, sep_id

    def __call__(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The masked batch plus `crop_input_ids` and `crop_attention_mask`."""
        crop, crop_mask = crop_view(batch["input_ids"], self.pad_id, self.cls_id, self.sep_id, self.ratio, generator)
        return {**self.inner(batch, generator), "crop_input_ids": crop, "crop_attention_mask": crop_mask}


STRATEGIES = {"bert": TokenMasking, "coco": TokenMasking, "whole_word": WholeWordMasking, "span": SpanMasking,
              "ngram": SpanMasking, "plm": PermutationMasking}


def needs_word_starts(cfg: MaskingConfig) -> bool:
    """Whether the strategy picks whole words (it then needs the tokenizer's word-start table)."""
    return STRATEGIES[cfg.strategy] is not TokenMasking


def evaluation_masking(cfg: MaskingConfig) -> MaskingConfig:
    """The same picks with every picked token shown as [MASK]: validation MLM loss then measures prediction,
    not the copying of the 10% kept tokens that makes the 80/10/10 mix read lower."""
    return dataclasses.replace(cfg, mask_token_fraction=1.0, random_token_fraction=0.0)


def build_masking(cfg: MaskingConfig, vocab_size: int, mask_id: int, special_ids: list[int],
                  word_starts: Optional[torch.Tensor] = None, pad_id: int = 0, cls_id: int = 2,
                  sep_id: int = 3) -> _Masking | WithCropView:
    """The masking transform named by the config (with the crop view when crop_ratio is set)."""
    transform = STRATEGIES[cfg.strategy](cfg, vocab_size, mask_id, special_ids, word_starts)
    if cfg.crop_ratio is not None:
        return WithCropView(transform, cfg.crop_ratio, pad_id, cls_id, sep_id)
    return transform
