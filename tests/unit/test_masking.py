"""BERT 80/10/10 masking: rates, specials never picked, determinism from the generator."""
import pytest
import torch

from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, TokenMasking

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 1000


def _batch(rows=256, width=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, width), generator=g)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    for r, n in enumerate(lengths.tolist()):
        ids[r, 0], ids[r, n - 1] = CLS, SEP
        ids[r, n:] = PAD
        ids[r, n // 2] = UNK
    return {"input_ids": ids, "attention_mask": (ids != PAD).long()}


def _masker():
    return TokenMasking(MaskingConfig(), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])


def test_specials_and_padding_never_picked():
    batch = _batch()
    out = _masker()(batch, torch.Generator().manual_seed(1))
    special = torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    assert (out["labels"][special] == IGNORE_INDEX).all()
    assert torch.equal(out["input_ids"][special], batch["input_ids"][special])
    assert torch.equal(out["original_input_ids"], batch["input_ids"])


def test_rates():
    batch = _batch()
    out = _masker()(batch, torch.Generator().manual_seed(2))
    orig, new, labels = batch["input_ids"], out["input_ids"], out["labels"]
    pickable = ~torch.isin(orig, torch.tensor([PAD, UNK, CLS, SEP]))
    picked = labels != IGNORE_INDEX
    n = int(picked.sum())
    assert abs(n / int(pickable.sum()) - 0.15) < 0.005
    assert torch.equal(labels[picked], orig[picked])
    as_mask = (new[picked] == MASK).float().mean().item()
    as_random = ((new[picked] != MASK) & (new[picked] != orig[picked])).float().mean().item()
    kept = (new[picked] == orig[picked]).float().mean().item()
    # A random replacement equals the original with probability 1/995: it then counts as kept.
    assert abs(as_mask - 0.8) < 0.01
    assert abs(as_random - 0.1 * (1 - 1 / 995)) < 0.01
    assert abs(kept - (0.1 + 0.1 / 995)) < 0.01
    replaced = new[picked][(new[picked] != MASK) & (new[picked] != orig[picked])]
    assert (replaced >= 5).all() and (replaced < VOCAB).all()  # never a special token
    assert torch.equal(new[~picked], orig[~picked])


@pytest.mark.parametrize("mask_frac,random_frac", [(0.85, 0.0), (0.5, 0.3)])
def test_other_replacement_fractions(mask_frac, random_frac):
    """masking.mask_token_fraction / random_token_fraction other than 80/10 (ELECTRA's 85/0/15): the picked tokens
    become [MASK], a random token or stay, at those rates; the picks themselves do not change."""
    batch = _batch()
    cfg = MaskingConfig(mask_token_fraction=mask_frac, random_token_fraction=random_frac)
    cfg.validate()
    out = TokenMasking(cfg, VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])(batch, torch.Generator().manual_seed(2))
    default = _masker()(batch, torch.Generator().manual_seed(2))
    orig, new, picked = batch["input_ids"], out["input_ids"], out["labels"] != IGNORE_INDEX
    assert torch.equal(out["labels"], default["labels"])
    as_mask = (new[picked] == MASK).float().mean().item()
    as_random = ((new[picked] != MASK) & (new[picked] != orig[picked])).float().mean().item()
    assert abs(as_mask - mask_frac) < 0.01 and abs(as_random - random_frac * (1 - 1 / 995)) < 0.01
    assert torch.equal(new[~picked], orig[~picked])


@pytest.mark.parametrize("mask_frac,random_frac", [(0.9, 0.2), (-0.1, 0.5), (0.5, -0.1)])
def test_replacement_fractions_outside_a_distribution_are_refused(mask_frac, random_frac):
    from core.errors import ConfigError

    cfg = MaskingConfig(mask_token_fraction=mask_frac, random_token_fraction=random_frac)
    with pytest.raises(ConfigError, match="'masking.mask_token_fraction' \\+ 'masking.random_token_fraction'"):
        cfg.validate()


def test_same_generator_same_masks():
    batch = _batch(rows=8, width=64)
    m = _masker()
    a = m(batch, torch.Generator().manual_seed(7))
    b = m(batch, torch.Generator().manual_seed(7))
    c = m(batch, torch.Generator().manual_seed(8))
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["labels"], c["labels"])


# ---- whole-word, span, coco, crop ---------------------------------------------------------
from data_pipeline.masking import (  # noqa: E402
    build_masking,
    crop_view,
    sample_span_lengths,
)


def _word_starts(seed=3):
    """A vocabulary where ~60% of tokens start words (like `▁the`) and the rest continue them."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(VOCAB, generator=g) < 0.6
    starts[:5] = True
    return starts


def _words(ids_row, starts):
    """Independent grouping of positions into words: a word = a start token + following continuations."""
    words, current = [], None
    for pos, tok in enumerate(ids_row.tolist()):
        if tok in (PAD, UNK, CLS, SEP):
            current = None
            continue
        if starts[tok] or current is None:
            current = [pos]
            words.append(current)
        else:
            current.append(pos)
    return words


def _whole_word_counts(picked, input_ids, starts):
    """Assert every word is picked all-or-nothing; return (words, picked words, tokens in words)."""
    n_words = n_picked_words = n_tokens = 0
    for row in range(picked.shape[0]):
        for word in _words(input_ids[row], starts):
            flags = picked[row, word]
            assert flags.all() or not flags.any()  # all or nothing
            n_words += 1
            n_picked_words += bool(flags[0])
            n_tokens += len(word)
    return n_words, n_picked_words, n_tokens


def _masked(strategy: str, rows: int, seed: int, starts=None):
    """(batch, masked output, picked positions) of the named strategy on a random batch."""
    m = build_masking(MaskingConfig(strategy=strategy), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK], word_starts=starts)
    batch = _batch(rows=rows)
    out = m(batch, torch.Generator().manual_seed(seed))
    return batch, out, out["labels"] != IGNORE_INDEX


def test_whole_word_picks_whole_words_at_the_right_rate():
    starts = _word_starts()
    batch, out, picked = _masked("whole_word", 128, 4, starts)
    n_words, n_picked_words, n_tokens = _whole_word_counts(picked, batch["input_ids"], starts)
    assert abs(n_picked_words / n_words - 0.15) < 0.01
    assert abs(int(picked.sum()) / n_tokens - 0.15) < 0.015
    special = torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    assert not picked[special].any()


def test_span_length_distribution_matches_truncated_geometric():
    g = torch.Generator().manual_seed(5)
    lengths = sample_span_lengths(50_000, 0.2, 10, g)
    pmf = [0.2 * 0.8 ** (k - 1) for k in range(1, 11)]
    pmf = [p / sum(pmf) for p in pmf]
    for k in range(1, 11):
        assert abs(float((lengths == k).float().mean()) - pmf[k - 1]) < 0.006
    assert lengths.min() >= 1 and lengths.max() <= 10
    assert abs(float(lengths.float().mean()) - sum(k * p for k, p in zip(range(1, 11), pmf))) < 0.03


def test_span_masking_rate_and_word_alignment():
    starts = _word_starts()
    batch, out, picked = _masked("span", 64, 6, starts)
    pickable = ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    assert not picked[~pickable].any()
    assert abs(int(picked.sum()) / int(pickable.sum()) - 0.15) < 0.01
    for row in range(picked.shape[0]):  # never over the 15% budget (a span stops before the word that would pass it)
        assert int(picked[row].sum()) <= max(1, round(0.15 * int(pickable[row].sum())))
    _whole_word_counts(picked, batch["input_ids"], starts)  # spans cover whole words
    runs = 0
    for row in range(picked.shape[0]):
        padded = torch.cat([torch.tensor([False]), picked[row], torch.tensor([False])]).int()
        runs += int((padded[1:] - padded[:-1] == 1).sum())
    # Contiguous spans: far fewer runs than picked tokens (single-token masking would give ~1 run per token).
    assert runs < 0.5 * int(picked.sum())
    as_mask = (out["input_ids"][picked] == MASK).float().mean().item()
    assert abs(as_mask - 0.8) < 0.06


def test_span_boundaries_describe_each_span():
    """Every picked token knows its span: the tokens before and after it, and its 1-based place in it."""
    starts = _word_starts()
    batch, out, picked = _masked("span", 64, 9, starts)
    left, right, offset = out["span_left"], out["span_right"], out["span_offset"]
    assert not offset[~picked].any() and (offset[picked] >= 1).all()
    spans = 0
    for row in range(picked.shape[0]):
        for pos in (offset[row] == 1).nonzero().squeeze(1).tolist():
            spans += 1
            lo, hi = pos, int(right[row, pos])
            assert int(left[row, pos]) == lo - 1
            assert picked[row, lo:hi].all() and (left[row, lo:hi] == lo - 1).all() and (right[row, lo:hi] == hi).all()
            assert offset[row, lo:hi].tolist() == list(range(1, hi - lo + 1))
            # Both boundaries are context, never picked: touching spans are merged into one, as SpanBERT merges them.
            assert hi < picked.shape[1] and not picked[row, lo - 1] and not picked[row, hi]
    assert spans and sum(int((offset[r] >= 1).sum()) for r in range(picked.shape[0])) == int(picked.sum())


def test_span_p_and_max_span_reach_the_spans_masked():
    """masking.span_p and masking.max_span shape the spans a batch gets (every token a word here: lengths in
    tokens are lengths in words), not only the sampler: Geometric(0.2) truncated at 10 has mean 3.79, (0.7) 1.43.
    As SpanBERT's sampler, a span is cut at the budget rather than dropped (dropping long spans shortened them to a
    mean of 3.16 on these rows), and touching spans merge, so a span kept may be longer than max_span."""
    every_token_a_word = torch.ones(VOCAB, dtype=torch.bool)

    def span_lengths(**options) -> list[int]:
        m = build_masking(MaskingConfig(strategy="span", **options), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK],
                          word_starts=every_token_a_word)
        out = m(_batch(rows=128), torch.Generator().manual_seed(13))
        starts = (out["span_offset"] == 1).nonzero().tolist()
        return [int(out["span_right"][r, c]) - c for r, c in starts]

    long, short, capped = span_lengths(), span_lengths(span_p=0.7), span_lengths(max_span=2)
    mean = {name: sum(lengths) / len(lengths) for name, lengths in (("long", long), ("short", short), ("capped", capped))}
    assert 3.5 < mean["long"] < 4.2 and mean["short"] < 1.7 and mean["capped"] < 1.8, mean
    assert max(long) > 10 and min(capped) == 1  # merged spans run past max_span; single words stay


def test_ngram_lengths_follow_albert():
    """ALBERT's n-gram masking: P(n) ∝ 1/n for n = 1..3, whole words, the same budget."""
    from data_pipeline.masking import ngram_length_pmf

    g = torch.Generator().manual_seed(11)
    lengths = sample_span_lengths(60_000, 0.2, 3, g, ngram_length_pmf(3))
    want = [1 / n / (1 + 1 / 2 + 1 / 3) for n in (1, 2, 3)]
    for n in (1, 2, 3):
        assert abs(float((lengths == n).float().mean()) - want[n - 1]) < 0.006
    starts = _word_starts()
    m = build_masking(MaskingConfig(strategy="ngram", max_span=3), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK],
                      word_starts=starts)
    batch = _batch(rows=64)
    out = m(batch, torch.Generator().manual_seed(2))
    picked = out["labels"] != IGNORE_INDEX
    _whole_word_counts(picked, batch["input_ids"], starts)
    pickable = ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    assert abs(int(picked.sum()) / int(pickable.sum()) - 0.15) < 0.01


def test_coco_mode_masks_every_pick():
    batch, out, picked = _masked("coco", 256, 7)
    assert (out["input_ids"][picked] == MASK).all()
    assert torch.equal(out["input_ids"][~picked], batch["input_ids"][~picked])
    pickable = ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    assert abs(int(picked.sum()) / int(pickable.sum()) - 0.15) < 0.005


def test_crop_view_is_a_contiguous_crop_of_the_clean_sequence():
    batch = _batch(rows=32, width=80)
    crop, crop_mask = crop_view(batch["input_ids"], PAD, CLS, SEP, 0.9, torch.Generator().manual_seed(8))
    for row in range(32):
        ids = batch["input_ids"][row]
        body = ids[1:int((ids != PAD).sum()) - 1].tolist()
        c = crop[row][crop_mask[row].bool()].tolist()
        assert c[0] == CLS and c[-1] == SEP
        inner = c[1:-1]
        assert len(inner) == max(1, round(0.9 * len(body)))
        assert any(body[i:i + len(inner)] == inner for i in range(len(body) - len(inner) + 1))
    m = build_masking(MaskingConfig(strategy="coco", crop_ratio=0.9), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK],
                      pad_id=PAD, cls_id=CLS, sep_id=SEP)
    out = m(batch, torch.Generator().manual_seed(9))
    assert {"crop_input_ids", "crop_attention_mask", "labels"} <= set(out)


@pytest.mark.parametrize("strategy", ["bert", "whole_word", "span", "ngram", "coco"])
def test_every_strategy_is_deterministic_given_the_generator(strategy):
    m = build_masking(MaskingConfig(strategy=strategy, crop_ratio=0.9), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK],
                      _word_starts(), PAD, CLS, SEP)
    batch = _batch(rows=8, width=64)
    a, b = m(batch, torch.Generator().manual_seed(1)), m(batch, torch.Generator().manual_seed(1))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_exact_count_picks_round_p_n_per_sequence_uniformly():
    """ELECTRA / COCO-LM: round(p · n) of each sequence's n pickable tokens, every position equally likely."""
    from data_pipeline.masking import evaluation_masking

    batch = _batch()
    cfg = MaskingConfig(count="exact", mask_prob=0.15)
    out = TokenMasking(cfg, VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])(batch, torch.Generator().manual_seed(3))
    pickable = ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    picked = out["labels"] != IGNORE_INDEX
    assert not (picked & ~pickable).any()
    want = [round(0.15 * int(n)) for n in pickable.sum(1)]
    assert picked.sum(1).tolist() == want
    # Position frequencies over many draws: no position (first pickable, middle, last) is favoured.
    ids = torch.randint(5, VOCAB, (4000, 16), generator=torch.Generator().manual_seed(5))
    ids[:, 0], ids[:, -1] = CLS, SEP  # 14 pickable tokens per row (positions 1..14), 2 picked each
    rows = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    hits = (TokenMasking(cfg, VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])(rows, torch.Generator().manual_seed(4))["labels"]
            != IGNORE_INDEX).float()
    freq = hits[:, 1:15].mean(0)
    assert hits.sum(1).eq(2).all() and (freq - 2 / 14).abs().max() < 0.025
    # Validation shows every picked token as [MASK], with the same picks.
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    train = TokenMasking(MaskingConfig(), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])(batch, g1)
    val = TokenMasking(evaluation_masking(MaskingConfig()), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK])(batch, g2)
    assert torch.equal(train["labels"], val["labels"])
    assert (val["input_ids"][val["labels"] != IGNORE_INDEX] == MASK).all()


# ---- a fixed count of predicted positions per row ------------------------------------------
def test_prediction_slots_from_the_formula():
    from data_pipeline.masking import prediction_slots

    # Independent draws: mean + 5 standard deviations of Binomial(L, p), rounded up: 19.2 + 5 * 4.0398 at 128 x 0.15.
    assert prediction_slots(MaskingConfig(), 128) == 40
    assert prediction_slots(MaskingConfig(strategy="whole_word", mask_prob=0.3), 512) == 206  # 153.6 + 5 * 10.369
    # Exact counts and span budgets never pass round(p * L).
    assert prediction_slots(MaskingConfig(count="exact"), 128) == 19
    assert prediction_slots(MaskingConfig(strategy="span"), 512) == 77
    assert prediction_slots(MaskingConfig(mask_prob=0.9), 8) == 8  # never more than the row


@pytest.mark.parametrize("strategy", ["bert", "whole_word", "span", "ngram", "coco"])
def test_masked_positions_list_the_picks_in_order_then_zeros(strategy):
    from data_pipeline.masking import prediction_slots

    cfg = MaskingConfig(strategy=strategy)
    m = build_masking(cfg, VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK], _word_starts(), PAD, CLS, SEP)
    out = m(_batch(rows=64, width=96), torch.Generator().manual_seed(2))
    positions = out["masked_positions"]
    assert positions.shape == (64, prediction_slots(cfg, 96))
    for row in range(64):
        picked = (out["labels"][row] != IGNORE_INDEX).nonzero().squeeze(1).tolist()
        assert positions[row].tolist() == picked + [0] * (positions.shape[1] - len(picked))
    assert (out["labels"][:, 0] == IGNORE_INDEX).all()  # the padding slots point at [CLS], whose label is ignored


def test_picks_past_the_slots_stay_unpicked():
    """A row that draws more picks than it has slots keeps its first ones; the rest stay clean and unlabelled."""
    from data_pipeline.masking import prediction_slots

    m = _masker()
    batch = _batch(rows=4, width=64)
    everything = ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP]))
    m.pick = lambda ids, generator: (everything, None, {})
    out = m(batch, torch.Generator().manual_seed(0))
    assert torch.equal(everything, ~torch.isin(batch["input_ids"], torch.tensor([PAD, UNK, CLS, SEP])))  # untouched
    slots = prediction_slots(MaskingConfig(), 64)  # 9.6 + 5 * 2.856 -> 24
    assert slots == 24
    picked = out["labels"] != IGNORE_INDEX
    for row in range(4):
        candidates = everything[row].nonzero().squeeze(1)
        assert picked[row].nonzero().squeeze(1).tolist() == candidates[:slots].tolist()
        rest = candidates[slots:]
        assert len(rest) > 0 and (out["labels"][row, rest] == IGNORE_INDEX).all()
        assert torch.equal(out["input_ids"][row, rest], batch["input_ids"][row, rest])
    assert out["masked_positions"].tolist() == [row[:slots].tolist() for row in
                                                (everything[r].nonzero().squeeze(1) for r in range(4))]


def test_a_short_row_of_long_words_still_gets_a_span():
    """[CLS] a ##x b ##y c ##z [SEP], padded to 64 (the end of a packed document): a budget of one token, every word
    two. Dropping each span that passed the budget left such a row with nothing to predict; its first word is masked
    whole instead, within the row's prediction slots (64 wide: 10), and its targets are the span's tokens. In a batch
    of its own width (8: one slot) the word does not fit, and nothing is picked rather than half a word."""
    starts = _word_starts()
    head = [t for t in range(5, VOCAB) if starts[t]][:3]
    tail = [t for t in range(5, VOCAB) if not starts[t]][0]
    row = [CLS, head[0], tail, head[1], tail, head[2], tail, SEP]
    m = build_masking(MaskingConfig(strategy="span"), VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK], word_starts=starts)
    for width, picks in ((64, 2), (8, 0)):
        ids = torch.tensor([row + [PAD] * (width - len(row))])
        for seed in range(20):
            out = m({"input_ids": ids, "attention_mask": (ids != PAD).long()}, torch.Generator().manual_seed(seed))
            picked = out["span_offset"][0] > 0
            assert int(picked.sum()) == picks and torch.equal(picked, out["labels"][0] != -100), (width, seed)
            assert picked[1:7].view(3, 2).all(1).sum() == picks // 2  # one whole word, or none
