"""Every objective's pure loss against an independent float64 implementation of its formula (1e-6 relative)."""
import math

import numpy as np
import pytest
import torch

from model.objectives.coco_lm import copy_loss, corrective_lm_loss, scl_loss
from model.objectives.declutr import declutr_loss
from model.objectives.electra import rtd_loss
from model.objectives.mlm import pair_loss, prediction_accuracy
from model.vocabulary_loss import unique_top_hits
from model.objectives.spanbert import span_boundary_loss
from model.objectives.tacl import supervised_tacl_loss, tacl_loss
from model.objectives.taco import tc_loss
from model.objectives.xlnet_plm import plm_loss

RTOL = 1e-6


def close(got: torch.Tensor, want: float) -> bool:
    return abs(got.detach().item() - want) <= RTOL * max(abs(want), 1e-12)


def log_softmax_at(z, k):
    m = max(z)
    return z[k] - (m + math.log(sum(math.exp(v - m) for v in z)))


def bce(logit, target):
    p = 1 / (1 + math.exp(-logit))
    return -(target * math.log(p) + (1 - target) * math.log(1 - p))


def cos(u, v):
    return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


rng = np.random.default_rng(0)


def test_pair_loss():
    logits, labels = rng.normal(size=(9, 2)) * 3, rng.integers(0, 2, size=9)
    want = np.mean([-log_softmax_at(z, y) for z, y in zip(logits, labels)])
    assert close(pair_loss(t64(logits), torch.tensor(labels)), want)


@pytest.mark.parametrize("fn", [rtd_loss, copy_loss])
def test_masked_bce(fn):
    logits = rng.normal(size=(3, 11)) * 4
    target = rng.random((3, 11)) < 0.3
    mask = rng.random((3, 11)) < 0.8
    mask[2] = False  # a fully padded row
    terms = [bce(logits[i, j], float(target[i, j])) for i in range(3) for j in range(11) if mask[i, j]]
    assert close(fn(t64(logits), torch.tensor(target), torch.tensor(mask)), sum(terms) / len(terms))
    assert float(fn(t64(logits), torch.tensor(target), torch.zeros(3, 11, dtype=torch.bool))) == 0.0


@pytest.mark.parametrize("form", ["weighted", "paper"])
def test_corrective_lm(form):
    n, v = 13, 17
    logits, copy_logits = rng.normal(size=(n, v)) * 2, rng.normal(size=n) * 2
    targets = rng.integers(0, v, size=n)
    corrupted = np.where(rng.random(n) < 0.4, targets, rng.integers(0, v, size=n))
    terms = []
    for z, c, t, x in zip(logits, copy_logits, targets, corrupted):
        p1 = 1 / (1 + math.exp(-c))
        p0 = 1 - p1
        logp = log_softmax_at(z, t)
        if form == "weighted":
            terms.append(p0 * -logp)
        else:
            terms.append(-math.log((1.0 if x == t else 0.0) * p1 + p0 * math.exp(logp)))
    got = corrective_lm_loss(t64(logits), torch.tensor(targets), t64(copy_logits), torch.tensor(corrupted), form)
    assert close(got, float(np.mean(terms)))


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_scl(tau):
    b, d = 5, 7
    z1, z2 = rng.normal(size=(b, d)), rng.normal(size=(b, d))
    pool = list(z1) + list(z2)
    terms = []
    for i in range(2 * b):
        pos = (i + b) % (2 * b)
        sims = {k: cos(pool[i], pool[k]) / tau for k in range(2 * b) if k != i}
        denom = sum(math.exp(s) for s in sims.values())
        terms.append(-(sims[pos] - math.log(denom)))
        assert len(sims) - 1 == 2 * b - 2  # negatives per anchor
    assert close(scl_loss(t64(z1), t64(z2), tau), float(np.mean(terms)))


def _tacl_reference(s, t, anchors, attention, tau, include_padding, cross):
    b, length, _ = s.shape
    terms = []
    for i in range(b):
        for j in range(length):
            if not anchors[i, j]:
                continue
            keys = [(i2, j2) for i2 in (range(b) if cross else [i]) for j2 in range(length) if include_padding or attention[i2, j2]]
            logits = {k: cos(s[i, j], t[k]) / tau for k in keys}
            m = max(logits.values())
            terms.append(-(logits[(i, j)] - m - math.log(sum(math.exp(x - m) for x in logits.values()))))
    return float(np.mean(terms))


@pytest.mark.parametrize("include_padding,cross", [(False, False), (True, False), (False, True)])
def test_tacl(include_padding, cross):
    b, length, h = 3, 9, 6
    s, t = rng.normal(size=(b, length, h)), rng.normal(size=(b, length, h))
    attention = np.ones((b, length), dtype=bool)
    attention[1, 6:] = False
    attention[2, 4:] = False
    anchors = (rng.random((b, length)) < 0.5) & attention
    got = tacl_loss(t64(s), t64(t), torch.tensor(anchors), torch.tensor(attention), 0.05, include_padding, cross)
    assert close(got, _tacl_reference(s, t, anchors, attention, 0.05, include_padding, cross))


def test_supervised_tacl():
    b, length, h = 2, 8, 5
    s, t = rng.normal(size=(b, length, h)), rng.normal(size=(b, length, h))
    labels = rng.integers(0, 3, size=(b, length))
    attention = np.ones((b, length), dtype=bool)
    attention[1, 6:] = False
    anchors = attention.copy()
    terms = []
    for i in range(b):
        for j in range(length):
            if not anchors[i, j]:
                continue
            keys = [j2 for j2 in range(length) if attention[i, j2] and (j2 == j or labels[i, j2] != labels[i, j])]
            logits = {k: cos(s[i, j], t[i, k]) / 0.1 for k in keys}
            terms.append(-(logits[j] - math.log(sum(math.exp(x) for x in logits.values()))))
    got = supervised_tacl_loss(t64(s), t64(t), torch.tensor(labels), torch.tensor(anchors), torch.tensor(attention), 0.1)
    assert close(got, float(np.mean(terms)))


def test_tacl_without_anchors_is_zero():
    s = torch.randn(2, 5, 4, requires_grad=True)
    loss = tacl_loss(s, torch.randn(2, 5, 4), torch.zeros(2, 5, dtype=torch.bool), torch.ones(2, 5))
    assert loss.item() == 0.0
    loss.backward()


def test_tc_loss_on_given_indices():
    b, length, h, k = 3, 6, 5, 4
    g = rng.normal(size=(b, length, h))
    flat = g.reshape(-1, h)
    anchor = np.array([0, 3, 7, 14])
    pos = np.array([1, 1, 8, 12])
    neg = rng.integers(0, b * length, size=(4, k))
    terms = []
    for a, p, ns in zip(anchor, pos, neg):
        logits = [cos(flat[a], flat[p]) / 0.07] + [cos(flat[a], flat[n]) / 0.07 for n in ns]
        terms.append(-log_softmax_at(logits, 0))
    got = tc_loss(t64(g), torch.tensor(anchor), torch.tensor(pos), torch.tensor(neg), 0.07)
    assert close(got, float(np.mean(terms)))


def test_corrective_lm_paper_form_survives_a_saturated_copy_head():
    """|copy logit| = 30: p0 or p1 rounds to 0 in float32; the loss and its gradient must stay finite and right."""
    n, v = 6, 9
    logits = torch.randn(n, v, dtype=torch.float32, requires_grad=True)
    copy_logits = torch.tensor([30.0, -30.0, 30.0, -30.0, 25.0, -25.0])
    targets = torch.randint(0, v, (n,))
    corrupted = torch.where(torch.arange(n) % 2 == 0, (targets + 1) % v, targets)  # replaced, kept, replaced, ...
    loss = corrective_lm_loss(logits, targets, copy_logits, corrupted, "paper")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    terms = []
    for z, c, t, x in zip(logits.detach().double().numpy(), copy_logits.double().numpy(), targets.numpy(), corrupted.numpy()):
        p1 = 1 / (1 + math.exp(-c))
        p0 = 1 / (1 + math.exp(c))
        terms.append(-math.log((1.0 if x == t else 0.0) * p1 + p0 * math.exp(log_softmax_at(z, t))))
    assert abs(loss.item() - float(np.mean(terms))) <= 1e-5 * float(np.mean(terms))


def _layer_norm(x, gain, bias, eps):
    mu = x.mean()
    return gain * (x - mu) / math.sqrt(((x - mu) ** 2).mean() + eps) + bias


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("flat_index", [False, True])
def test_span_boundary_loss(flat_index):
    """SpanBERT eq. 1: y = LN(GeLU(W2 · LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}] + b1)) + b2)), then the MLM projection;
    over every position, or over the step's flat index of the picks padded with an unpicked position."""
    from model.heads import SpanBoundaryHead, SpanBoundaryShape

    b, length, h, v, table = 2, 12, 6, 11, 4
    hidden = rng.normal(size=(b, length, h))
    labels = np.full((b, length), -100)
    left, right, offset = (np.zeros((b, length), dtype=np.int64) for _ in range(3))
    # Row 0: spans [2, 5) and [5, 7) (adjacent: their own boundaries), row 1: a 6-token span longer than the table.
    for row, lo, hi in ((0, 2, 5), (0, 5, 7), (1, 3, 9)):
        labels[row, lo:hi] = rng.integers(0, v, size=hi - lo)
        left[row, lo:hi], right[row, lo:hi], offset[row, lo:hi] = lo - 1, hi, np.arange(1, hi - lo + 1)
    head = SpanBoundaryHead(SpanBoundaryShape(h, table, 1e-5)).double()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.from_numpy(rng.normal(size=tuple(p.shape))))
    projection = torch.nn.Linear(h, v).double()
    w = {k: x.detach().numpy() for k, x in head.state_dict().items()}
    pw, pb = projection.weight.detach().numpy(), projection.bias.detach().numpy()
    terms, right_count = [], 0
    for i in range(b):
        for j in range(length):
            if labels[i, j] == -100:
                continue
            place = min(offset[i, j], table) - 1  # longer spans share the table's last position
            h0 = np.concatenate([hidden[i, left[i, j]], hidden[i, right[i, j]], w["position.weight"][place]])
            h1 = _layer_norm(_gelu(w["layer1.weight"] @ h0 + w["layer1.bias"]), w["norm1.weight"], w["norm1.bias"], 1e-5)
            y = _layer_norm(_gelu(w["layer2.weight"] @ h1 + w["layer2.bias"]), w["norm2.weight"], w["norm2.bias"], 1e-5)
            z = pw @ y + pb
            terms.append(-log_softmax_at(list(z), labels[i, j]))
            right_count += int(np.argmax(z) == labels[i, j])
    index = torch.tensor(list(np.flatnonzero(labels != -100)) + [0, 0, 13]) if flat_index else None
    loss, accuracy = span_boundary_loss(t64(hidden), torch.tensor(labels), torch.tensor(left), torch.tensor(right),
                                        torch.tensor(offset), head, projection, index)
    assert len(terms) == 11 and close(loss, float(np.mean(terms)))
    assert abs(float(accuracy) - right_count / len(terms)) < 1e-6


@pytest.mark.parametrize("positives,tau", [(1, 0.05), (2, 1.0)])
def test_declutr_loss(positives, tau):
    """DeCLUTR: mean-pooled spans, an anchor's positive is the mean of its positives' embeddings, NT-Xent over 2N."""
    n, h = 4, 6
    lengths = rng.integers(3, 9, size=n)
    anchor = rng.normal(size=(n, 9, h))
    anchor_mask = np.arange(9)[None] < lengths[:, None]
    pos = [rng.normal(size=(n, 7, h)) for _ in range(positives)]
    pos_masks = [np.arange(7)[None] < rng.integers(2, 8, size=n)[:, None] for _ in range(positives)]

    def pool(x, m):
        return np.array([x[i][m[i]].mean(0) for i in range(len(x))])

    za = pool(anchor, anchor_mask)
    zp = np.mean([pool(p, m) for p, m in zip(pos, pos_masks)], axis=0)
    z = list(za) + list(zp)
    terms = []
    for i in range(2 * n):
        sims = {k: cos(z[i], z[k]) / tau for k in range(2 * n) if k != i}
        m = max(sims.values())
        terms.append(-(sims[(i + n) % (2 * n)] - m - math.log(sum(math.exp(v - m) for v in sims.values()))))
    got = declutr_loss(t64(anchor), torch.tensor(anchor_mask), [t64(p) for p in pos],
                       [torch.tensor(m) for m in pos_masks], tau)
    assert close(got, float(np.mean(terms)))


def test_plm_loss():
    """XLNet: -1/|targets| Σ log softmax(query-stream logits)[x_target] over the real targets (padded ones are -100)."""
    b, p, v = 3, 5, 13
    logits = rng.normal(size=(b, p, v)) * 2
    labels = rng.integers(0, v, size=(b, p))
    labels[1, 3:] = -100
    labels[2, :] = -100
    terms = [-log_softmax_at(list(logits[i, j]), labels[i, j]) for i in range(b) for j in range(p) if labels[i, j] != -100]
    right = [int(np.argmax(logits[i, j]) == labels[i, j]) for i in range(b) for j in range(p) if labels[i, j] != -100]
    loss, accuracy = plm_loss(t64(logits), torch.tensor(labels), lambda rows: rows)  # the logits through no head
    assert len(terms) == 8 and close(loss, float(np.mean(terms))) and abs(float(accuracy) - np.mean(right)) < 1e-6


def test_prediction_accuracy_counts_the_targets_that_score_highest():
    """Accuracy: the fraction of real targets (not -100) that are their row's maximum; a tie for the top counts as wrong."""
    n, v = 40, 50
    logits = rng.normal(size=(n, v))
    labels = rng.integers(0, v, size=n)
    labels[::2] = np.argmax(logits[::2], axis=1)  # half of the rows right by construction, the rest mostly wrong
    labels[5] = labels[17] = -100
    right = [int(np.argmax(logits[i]) == labels[i]) for i in range(n) if labels[i] != -100]
    assert 0.5 < np.mean(right) < 1.0
    assert abs(float(prediction_accuracy(torch.tensor(logits, dtype=torch.float32), torch.tensor(labels)))
               - np.mean(right)) < 1e-6
    tied = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0], [0.0, 5.0, 1.0]])
    assert abs(float(prediction_accuracy(tied, torch.tensor([2, 0, 1]))) - 1 / 3) < 1e-7  # only the untied row
    assert float(prediction_accuracy(torch.zeros(4, 9), torch.tensor([0, 3, 8, 5]))) == 0.0  # one score for all
    assert float(prediction_accuracy(tied, torch.tensor([-100, -100, -100]))) == 0.0


@pytest.mark.parametrize("by_count", [False, True])  # the CPU's way and an accelerator's way
def test_a_unique_top_agrees_with_the_formula(by_count):
    logits = torch.tensor(rng.normal(size=(30, 7)), dtype=torch.float32)
    targets = torch.tensor(rng.integers(0, 7, size=30))
    for i in range(0, 10, 2):  # the target tied with another entry at the top; the next row: the target alone there
        logits[i, targets[i]] = logits[i, (targets[i] + 1) % 7] = logits[i].max() + 1
        logits[i + 1, targets[i + 1]] = logits[i + 1].max() + 1
    want = [bool(logits[i, targets[i]] == logits[i].max() and int((logits[i] == logits[i].max()).sum()) == 1)
            for i in range(30)]
    assert sum(want[:10]) == 5 and 0 < sum(want[10:]) < 20
    logits[20, targets[20]] = float("nan")  # a NaN target logit is a miss
    logits[21, targets[21]] = logits[21].max() + 1  # a hit, but for the NaN elsewhere in its row: a miss too
    logits[21, (targets[21] + 1) % 7] = float("nan")
    want[20] = want[21] = False
    assert unique_top_hits(logits, targets, by_count).tolist() == want


def test_replacements_are_drawn_from_the_generators_softmax():
    """The inverse-CDF sampler against the softmax it samples (float64, from the formula): frequencies over 200k
    draws within 4 standard errors, and a token of probability zero is never drawn."""
    from model.objectives.electra import sample_replacements

    logits = torch.tensor([[2.0, 0.5, float("-inf"), -1.0, 1.0], [float("-inf"), 0.0, 0.0, float("-inf"), 3.0]])
    expected = torch.softmax(logits.double(), -1)
    draws = 100_000
    torch.manual_seed(0)
    picked = sample_replacements(logits.repeat_interleave(draws, 0), "mlm").view(2, draws)
    for row in range(2):
        freq = torch.bincount(picked[row], minlength=5).double() / draws
        se = (expected[row] * (1 - expected[row]) / draws).sqrt()
        assert ((freq - expected[row]).abs() <= 4 * se + 1e-12).all(), (freq, expected[row])
        assert (freq[expected[row] == 0] == 0).all()
    torch.manual_seed(0)  # seeded like the rest of the step: the same draws again
    assert torch.equal(sample_replacements(logits.repeat_interleave(draws, 0), "mlm").view(2, draws), picked)


def _contrastive_cases():
    """Each contrastive loss as a function of its float inputs, at a width and temperature where bf16 would show."""
    g = torch.Generator().manual_seed(3)
    b, length, h = 3, 16, 64
    x, y = torch.randn(b, length, h, generator=g, dtype=torch.float64), torch.randn(b, length, h, generator=g, dtype=torch.float64)
    y = x + 7 * y  # cos(x, y) about 0.14, negatives about ±0.12: at τ 0.01 the losses are of order 1-10
    anchors = torch.rand(b, length, generator=g) < 0.4
    attention = torch.ones(b, length, dtype=torch.long)
    labels = torch.randint(0, 4, (b, length), generator=g)
    idx = torch.arange(b * length)
    masks = torch.ones(b, length, dtype=torch.bool)
    return {
        "tacl": lambda s, t: tacl_loss(s, t, anchors, attention, 0.01),
        "tacl_cross": lambda s, t: tacl_loss(s, t, anchors, attention, 0.01, cross_sequence=True),
        "supervised_tacl": lambda s, t: supervised_tacl_loss(s, t, labels, anchors, attention, 0.01),
        "scl": lambda s, t: scl_loss(s[:, 0], t[:, 0], 0.01),
        "tc": lambda s, t: tc_loss(s + t, idx[:8], idx[8:16], idx[16:48].view(8, 4), 0.01),
        "declutr": lambda s, t: declutr_loss(s, masks, [t], [masks], 0.01),
    }, x, y


@pytest.mark.parametrize("name", ["tacl", "tacl_cross", "supervised_tacl", "scl", "tc", "declutr"])
def test_contrastive_logits_stay_fp32_under_bf16_autocast(name):
    """The trainer runs bf16 as autocast: the losses' cosine / τ must not be a bf16 matmul (τ 0.01: errors of 0.4 a logit)."""
    cases, x, y = _contrastive_cases()
    want = float(cases[name](x, y))  # float64, checked against the formula above
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = cases[name](x.float(), y.float())
    assert got.dtype == torch.float32, got.dtype
    assert abs(float(got) - want) <= 1e-5 * abs(want), (float(got), want)
