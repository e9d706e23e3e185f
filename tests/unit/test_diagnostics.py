"""Learning diagnostics against float64 references written from their definitions, and the RTD plumbing check:
with uniform replacements a tiny discriminator must learn to detect them."""
import itertools
import math

import pytest
import torch

from model.diagnostics import (
    binary_auc,
    binary_entropy,
    detection_metrics,
    headline,
    retrieval_accuracy,
    token_self_similarity,
    unigram_entropy,
)


def test_auc_is_the_probability_a_positive_outscores_a_negative():
    g = torch.Generator().manual_seed(0)
    for n in (5, 37, 200):
        scores = torch.randn(n, generator=g).double()
        scores[: n // 4] = scores[n // 2]  # ties count half
        labels = torch.rand(n, generator=g) < 0.3
        pos, neg = scores[labels].tolist(), scores[~labels].tolist()
        want = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg)) / (len(pos) * len(neg))
        assert abs(float(binary_auc(scores, labels)) - want) <= 1e-6 * want
    assert float(binary_auc(torch.arange(4.0), torch.tensor([0, 0, 1, 1]))) == 1.0
    assert float(binary_auc(torch.arange(4.0), torch.zeros(4))) == 0.5  # one class only


def test_detection_metrics_against_counts():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0], [1.0, 1.5, -0.5, 0.0]])
    positive = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]]).bool()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()
    m = detection_metrics(logits, positive, mask, "rtd")
    # predicted positive (logit > 0) over the 7 masked: 2.0 (pos), 0.5 (neg), 1.0 (pos), 1.5 (pos): 3 of 4 true.
    assert abs(float(m["rtd_precision"]) - 3 / 4) < 1e-7 and abs(float(m["rtd_recall"]) - 3 / 4) < 1e-7
    p = 4 / 7
    assert abs(float(m["rtd_prior_loss"]) - (-(p * math.log(p) + (1 - p) * math.log(1 - p)))) < 1e-6


def test_binary_entropy_and_unigram_entropy_from_the_formula():
    for p in (0.01, 0.15, 0.5):
        want = -(p * math.log(p) + (1 - p) * math.log(1 - p))
        assert abs(float(binary_entropy(torch.tensor(p))) - want) < 1e-6 * want
    counts = torch.tensor([0, 5, 3, 2, 0, 10.0])
    n, probs = 20.0, [c / 20.0 for c in (5, 3, 2, 10)]
    want = -sum(q * math.log(q) for q in probs) + (4 - 1) / (2 * n)  # Miller-Madow
    assert abs(unigram_entropy(counts) - want) < 1e-9 * want


def test_self_similarity_and_retrieval_against_loops():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    total, pairs = 0.0, 0
    for b in range(3):
        n = int(mask[b].sum())
        for i in range(n):
            for j in range(n):
                if i != j:
                    u, v = hidden[b, i], hidden[b, j]
                    total += float(u @ v / (u.norm() * v.norm()))
                    pairs += 1
    want = total / pairs
    assert abs(float(token_self_similarity(hidden, mask)) - want) < 1e-6 * abs(want)
    # Under bf16 autocast (how the trainer validates) the statistic is still computed in fp32, not in bf16 matmuls.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = token_self_similarity(hidden.float(), mask)
    assert got.dtype == torch.float32 and abs(float(got) - want) < 1e-6 * abs(want)
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5]])
    assert abs(float(retrieval_accuracy(logits, torch.tensor([1, 1, 2]))) - 2 / 3) < 1e-7


def test_headline_numbers():
    out = headline({"mlm_loss": 4.0, "generator_mlm_loss": 5.0, "rtd_loss": 0.3, "rtd_prior_loss": 0.4, "copy_loss": 1.0}, 5.5)
    assert out == pytest.approx({"unigram_entropy": 5.5, "mlm_loss_below_unigram": 1.5, "generator_mlm_loss_below_unigram": 0.5,
                                 "rtd_loss_below_prior": 0.1})


@pytest.mark.parametrize("name", ["electra", "coco_lm"])
def test_uniform_replacements_are_detected(name, monkeypatch):
    """Plumbing: with uniform replacements the detection head must separate replaced from original tokens.

    If the corrupted inputs and the replaced labels ever disagree (labels from the masked input, a
    shifted position, the wrong sign), the AUC stays near 0.5 and this fails.
    """
    from data_pipeline.masking import MaskingConfig, build_masking
    from model.encoder import EncoderConfig, model_config
    from model.objectives import ObjectiveConfig, build_objective, coco_lm, electra

    vocab, pad, cls, sep, mask_id = 400, 0, 2, 3, 4
    tok = {"vocab_size": vocab, "pad_id": pad, "cls_id": cls, "sep_id": sep}
    config = model_config(EncoderConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0), tok, 32)
    options = ObjectiveConfig(name=name)
    options.electra.generator = options.coco_lm.generator = "uniform"
    options.coco_lm.generator_layers = 1
    torch.manual_seed(0)
    model = build_objective(options, config)
    masking = MaskingConfig(strategy="coco" if name == "coco_lm" else "bert", crop_ratio=0.9 if name == "coco_lm" else None)
    transform = build_masking(masking, vocab, mask_id, [pad, 1, cls, sep, mask_id], pad_id=pad, cls_id=cls, sep_id=sep)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    # Like real text against uniform draws: the text uses 20 frequent tokens, so 95% of the replacements are
    # tokens it never shows and the head can reach an AUC near 0.975 once inputs and labels line up.
    key = "rtd_auc" if name == "electra" else "copy_auc"
    # Watch what the detecting network reads and the targets its loss gets.
    seen = {}
    network = model.discriminator if name == "electra" else model.main
    def grab_input(mod, args, kwargs):
        seen.setdefault("input_ids", kwargs["input_ids"])  # the first pass (COCO-LM's second one reads the crop)

    network.register_forward_pre_hook(grab_input, with_kwargs=True)
    module, loss_name = (electra, "rtd_loss") if name == "electra" else (coco_lm, "copy_loss")
    real_loss = getattr(module, loss_name)

    def spy_loss(logits, target, valid):
        seen["target"] = target
        return real_loss(logits, target, valid)

    monkeypatch.setattr(module, loss_name, spy_loss)
    aucs, separated = [], 0
    for step in range(300):
        ids = torch.randint(10, 30, (16, 32), generator=g)
        ids[:, 0], ids[:, -1] = cls, sep
        batch = transform({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, g)
        seen.clear()
        loss, metrics = model(batch)
        changed = seen["input_ids"] != batch["original_input_ids"]
        assert torch.equal(seen["target"], changed if name == "electra" else ~changed), step
        assert changed.any() and not changed[batch["labels"] == -100].any()  # only picked tokens are replaced
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        aucs.append(float(metrics[key]))
        separated = separated + 1 if len(aucs) >= 20 and sum(aucs[-20:]) / 20 >= 0.95 else 0
        if separated == 10:  # separated, and staying so (a broken pipeline stays near 0.5 for all 300 steps)
            break
    assert sum(aucs[-20:]) / 20 >= 0.95, aucs[-20:]
