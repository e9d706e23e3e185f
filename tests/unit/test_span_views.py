"""DeCLUTR's span sampling: Beta-distributed lengths, positives overlapping, adjacent to or inside the anchor,
seeded per sample; and the collated batch it gives."""
import numpy as np
import pytest
import torch

from data_pipeline.batches import MaskingCollate
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, build_masking
from data_pipeline.span_views import SpanViewOptions, SpanViews, beta_draw, sample_spans

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4


@pytest.mark.parametrize("a,b", [(4, 2), (2, 4)])
def test_beta_draws_follow_the_beta_distribution(a, b):
    from scipy import stats

    g = torch.Generator().manual_seed(a * 10 + b)
    draws = np.array([beta_draw(a, b, g) for _ in range(4000)])
    assert stats.kstest(draws, stats.beta(a, b).cdf).pvalue > 0.01
    assert abs(draws.mean() - a / (a + b)) < 0.01


def test_spans_lie_where_declutr_puts_them():
    options = SpanViewOptions(min_span_tokens=8, max_span_tokens=60, positives=3)
    g = torch.Generator().manual_seed(0)
    anchors, positives, kinds = [], [], set()
    for _ in range(3000):
        n = int(torch.randint(20, 200, (1,), generator=g))
        (sa, la), pos = sample_spans(n, options, g)
        longest = min(60, n)
        assert 8 <= la <= longest and 0 <= sa and sa + la <= n
        anchors.append((la - 8) / (longest - 8))
        for sp, lp in pos:
            assert 8 <= lp <= la and 0 <= sp and sp + lp <= n
            assert sa - lp <= sp <= sa + la  # overlapping, adjacent or inside
            positives.append((lp - 8) / max(la - 8, 1))
            end, anchor_end = sp + lp, sa + la
            kinds.add("inside" if sp >= sa and end <= anchor_end else
                      "adjacent" if end == sa or sp == anchor_end else "overlapping" if sp < anchor_end and end > sa else "apart")
    assert kinds == {"inside", "adjacent", "overlapping"}
    # The lengths' fractions of their range are floor(Beta): Beta(4, 2) has mean 2/3, Beta(2, 4) 1/3.
    assert 0.6 < np.mean(anchors) < 2 / 3 and 0.25 < np.mean(positives) < 1 / 3


def test_short_documents_shrink_the_spans():
    g = torch.Generator().manual_seed(1)
    for n in (1, 3, 8):
        (sa, la), [(sp, lp)] = sample_spans(n, SpanViewOptions(min_span_tokens=8, max_span_tokens=60), g)
        assert 1 <= la <= n and 1 <= lp <= la and sa + la <= n and sp + lp <= n


def _views(positives=2):
    masking = build_masking(MaskingConfig(), 100, MASK, [PAD, UNK, CLS, SEP, MASK])
    return SpanViews(masking, SpanViewOptions(min_span_tokens=4, max_span_tokens=30, positives=positives), PAD, CLS, SEP)


def test_views_are_spans_of_the_sample_and_the_anchor_is_masked():
    body = torch.arange(10, 90)
    ids = torch.cat([torch.tensor([CLS]), body, torch.tensor([SEP])])[None]
    out = _views()({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.Generator().manual_seed(3))
    clean = out["original_input_ids"][0]
    assert clean[0] == CLS and clean[-1] == SEP
    start = int(clean[1]) - 10
    assert torch.equal(clean[1:-1], body[start:start + len(clean) - 2])  # a contiguous span
    picked = out["labels"][0] != IGNORE_INDEX
    assert torch.equal(out["labels"][0][picked], clean[picked])
    for k in range(2):
        view = out[f"positive{k}_input_ids"][0]
        assert view[0] == CLS and view[-1] == SEP and out[f"positive{k}_attention_mask"].sum() == len(view)
        p_start = int(view[1]) - 10
        assert torch.equal(view[1:-1], body[p_start:p_start + len(view) - 2])


def test_collated_views_repeat_for_a_sample_and_pad_per_column():
    rows = [{"input_ids": np.concatenate([[CLS], np.arange(10, 10 + n), [SEP]]), "sample_id": i, "epoch": 0}
            for i, n in enumerate((70, 12, 40))]
    collate = MaskingCollate(_views(), PAD, seed=5)
    a, b = collate(rows), collate(rows)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)
    other = MaskingCollate(_views(), PAD, seed=5)([{**r, "epoch": 1} for r in rows])
    assert not torch.equal(a["input_ids"], other["input_ids"])  # a new pass draws new spans
    for prefix in ("", "positive0_", "positive1_"):
        ids, mask = a[f"{prefix}input_ids"], a[f"{prefix}attention_mask"]
        assert ids.shape == mask.shape and torch.equal(ids != PAD, mask.bool())
        assert int(mask.sum(1).max()) == ids.shape[1]  # padded to its own longest row
        assert a[f"{prefix}attention_mask_unpadded"] is False  # so its encoder is handed the mask


def test_the_beta_shapes_of_the_run_config_reach_the_loader_s_views():
    """objective.declutr.spans.* (YAML lists) through resolve_objective to the loader's transform: Beta(1, 50)
    anchors are near the shortest span, Beta(50, 1) positives near the anchor's length; the defaults lie between."""
    from pathlib import Path

    from core.config_io import load_config
    from model.objectives import resolve_objective
    from pretrain.config import RunConfig

    config = Path(__file__).resolve().parents[2] / "pretrain" / "configs" / "declutr.yaml"
    body = torch.arange(10, 90)
    ids = torch.cat([torch.tensor([CLS]), body, torch.tensor([SEP])])[None]

    def lengths(*overrides: str) -> tuple[float, float]:
        """Mean anchor length and mean positive/anchor length ratio over 200 draws, in tokens."""
        cfg = load_config(RunConfig, config, ["objective.declutr.spans.min_span_tokens=4",
                                              "objective.declutr.spans.max_span_tokens=64", *overrides])
        masking = build_masking(MaskingConfig(), 100, MASK, [PAD, UNK, CLS, SEP, MASK])
        views = resolve_objective(cfg.objective, cfg.model, cfg.masking).data_transform(masking, PAD, CLS, SEP)
        g = torch.Generator().manual_seed(0)
        outs = [views({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, g) for _ in range(200)]
        anchors = [o["input_ids"].shape[1] - 2 for o in outs]
        ratios = [(o["positive0_input_ids"].shape[1] - 2) / (o["input_ids"].shape[1] - 2) for o in outs]
        return float(np.mean(anchors)), float(np.mean(ratios))

    short_anchor, long_positive = lengths("objective.declutr.spans.anchor_beta=[1, 50]",
                                          "objective.declutr.spans.positive_beta=[50, 1]")
    default_anchor, default_positive = lengths()
    assert short_anchor < 6 < 30 < default_anchor, (short_anchor, default_anchor)
    assert default_positive < 0.7 < 0.9 < long_positive, (default_positive, long_positive)
