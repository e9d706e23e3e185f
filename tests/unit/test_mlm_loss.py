"""mlm_loss against an independent float64 implementation of the cross-entropy formula."""
import math

import numpy as np
import torch

from model.objectives.mlm import mlm_loss


def reference(logits: np.ndarray, labels: np.ndarray) -> float:
    """mean_i [ log sum_v exp(z_iv) - z_i,y_i ] over labelled positions, in float64."""
    terms = []
    for z, y in zip(logits, labels):
        if y == -100:
            continue
        m = max(z)
        log_norm = m + math.log(sum(math.exp(v - m) for v in z))
        terms.append(log_norm - z[y])
    return sum(terms) / len(terms) if terms else 0.0


def test_matches_reference_with_ignored_positions():
    rng = np.random.default_rng(0)
    for n, v, scale in [(37, 11, 1.0), (64, 50, 8.0), (5, 3, 30.0)]:
        logits = rng.normal(size=(n, v)) * scale
        labels = rng.integers(0, v, size=n)
        labels[rng.random(n) < 0.4] = -100
        got = mlm_loss(torch.tensor(logits), torch.tensor(labels)).item()
        want = reference(logits, labels)
        assert abs(got - want) <= 1e-6 * abs(want)


def test_low_precision_logits_are_upcast():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(16, 40)) * 4
    labels = rng.integers(0, 40, size=16)
    got = mlm_loss(torch.tensor(logits).bfloat16(), torch.tensor(labels))
    assert got.dtype == torch.float32
    want = reference(torch.tensor(logits).bfloat16().double().numpy(), labels)
    assert abs(got.item() - want) <= 1e-6 * abs(want)


def test_nothing_picked_gives_zero_and_a_graph():
    logits = torch.randn(4, 9, requires_grad=True)
    loss = mlm_loss(logits, torch.full((4,), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
