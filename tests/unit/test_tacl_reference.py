"""experiments/tacl_reference.py: its loss, written apart from model/objectives, agrees with the project's and with
a per-anchor loop; its variants remove what they say; its masking is BERT's 80/10/10."""
import math

import torch

from experiments import tacl_reference as ref
from model.objectives.tacl import tacl_loss



def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student, teacher = torch.randn(3, 9, 8, generator=g, dtype=torch.float64), torch.randn(3, 9, 8, generator=g, dtype=torch.float64)
    keys = torch.ones(3, 9, dtype=torch.bool)
    keys[2, 6:] = False  # a padded sequence
    anchors = (torch.rand(3, 9, generator=g) < 0.4) & keys
    anchors[0, 1] = True
    ids = torch.randint(5, 9, (3, 9), generator=g)  # few ids: many repeats within a sequence
    return student, teacher, anchors, keys, ids


def _loop(student, teacher, anchors, keys, tau, ids=None) -> float:
    """The formula anchor by anchor, in float64, with math on Python floats."""
    losses = []
    for b in range(student.shape[0]):
        for i in range(student.shape[1]):
            if not anchors[b, i]:
                continue
            cos = lambda j: float(torch.dot(student[b, i], teacher[b, j]) / (student[b, i].norm() * teacher[b, j].norm()))  # noqa: E731
            allowed = [j for j in range(student.shape[1]) if keys[b, j] and (ids is None or j == i or ids[b, j] != ids[b, i])]
            denominator = sum(math.exp(cos(j) / tau) for j in allowed)
            losses.append(-math.log(math.exp(cos(i) / tau) / denominator))
    return sum(losses) / len(losses)


def test_reference_loss_equals_the_formula_and_the_project_loss():
    student, teacher, anchors, keys, ids = _case()
    tau = 0.5  # a temperature the float exp above does not overflow at
    want = _loop(student, teacher, anchors, keys, tau)
    got = float(ref.tacl_term(student, teacher, anchors, keys, tau))
    assert abs(got - want) <= 1e-6 * abs(want)
    assert abs(float(tacl_loss(student, teacher, anchors, keys.long(), tau)) - want) <= 1e-6 * abs(want)
    # Same-id negatives dropped: the loop without them; and it is a different number.
    want_no_same = _loop(student, teacher, anchors, keys, tau, ids)
    got_no_same = float(ref.tacl_term(student, teacher, anchors, keys, tau, drop_same_id=ids))
    assert abs(got_no_same - want_no_same) <= 1e-6 * abs(want_no_same) and abs(want_no_same - want) > 1e-3


def test_reference_masking_is_bert_80_10_10_on_ordinary_tokens():
    ids = torch.randint(5, 1000, (64, 128))
    ids[:, 0], ids[:, -1], ids[0, 60:] = 2, 3, 0  # [CLS], [SEP], padding
    inputs, picked = ref.mask_batch(ids, 1000, 4, 0.15, torch.Generator().manual_seed(1))
    assert not picked[:, 0].any() and not picked[:, -1].any() and not picked[0, 60:].any()
    assert torch.equal(inputs[~picked], ids[~picked])
    rate = float(picked.sum()) / float((ids > 4).sum())
    shares = [float(((inputs == 4) & picked).sum()), float(((inputs != 4) & (inputs != ids) & picked).sum())]
    assert abs(rate - 0.15) < 0.01 and abs(shares[0] / float(picked.sum()) - 0.8) < 0.02
    assert abs(shares[1] / float(picked.sum()) - 0.1 * (1 - 1 / 995)) < 0.02  # a random draw may equal the original
