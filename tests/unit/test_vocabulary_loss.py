"""train.vocab_loss_chunk: the MLM heads' projection fused with the cross-entropy, a chunk of rows at a time. The loss and
the gradients of the projection's input, weight and bias match a float64 reference written from the formula; the
accuracy counts what the plain path counts; every objective on every backbone gives the plain path's losses,
metrics and gradients; the fused step traces as one graph; ZeRO-3 and a head that is not a VocabularyHead are
refused."""
import copy

import numpy as np
import pytest
import torch
from test_backbones import MATRIX, _batch, _build, _config, _logits

from core.errors import ConfigError
from data_pipeline.shards import read_manifest
from model.backbones import backbone_for
from model.objectives.mlm import sparse_mlm
from model.vocabulary_loss import VocabularyHead, linear_cross_entropy
from pretrain.config import TrainConfig

IGNORE = -100


def _reference(h: np.ndarray, w: np.ndarray, b, t: np.ndarray):
    """Σ over labelled rows of log Σ_v exp(z_v) - z_target, z = h·wᵀ + b, and its gradients, in float64 from the
    formula: d/dz = softmax(z) - onehot(target)."""
    z = h @ w.T + (b if b is not None else 0.0)
    loss, grad_z = 0.0, np.zeros_like(z)
    for i, target in enumerate(t):
        if target == IGNORE:
            continue
        top = z[i].max()
        log_total = top + np.log(np.exp(z[i] - top).sum())
        loss += log_total - z[i, target]
        grad_z[i] = np.exp(z[i] - log_total)
        grad_z[i, target] -= 1.0
    return loss, grad_z @ w, grad_z.T @ h, grad_z.sum(0)


def _inputs(n=37, width=16, vocab=101, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, width, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, width, generator=g, dtype=torch.float64) * 0.5
    b = torch.randn(vocab, generator=g, dtype=torch.float64) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g)
    t[[3, 10, n - 1]] = IGNORE
    return h, w, b, t


@pytest.mark.parametrize("chunk", [1, 8, 37, 500])
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_match_the_formula_in_float64(chunk, bias):
    h, w, b, t = _inputs(bias=bias)
    want_loss, want_h, want_w, want_b = _reference(h.numpy(), w.numpy(), b.numpy() if bias else None, t.numpy())
    leaves = [x.clone().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    loss, _ = linear_cross_entropy(leaves[0], leaves[1], leaves[2] if bias else None, t, chunk)
    (3.0 * loss).backward()  # backward scales what forward computed by the incoming gradient
    assert abs(loss.item() - want_loss) <= 1e-6 * abs(want_loss)
    for leaf, want in zip(leaves, (want_h, want_w, want_b)):
        np.testing.assert_allclose(leaf.grad.numpy(), 3.0 * want, rtol=1e-6, atol=1e-12)


def test_a_literal_case():
    # Two tokens with logits 0 and log 3: softmax (1/4, 3/4); target 0 → loss log 4, target 1 → loss log(4/3).
    h = torch.tensor([[1.0], [1.0], [1.0]], requires_grad=True)
    w = torch.tensor([[0.0], [float(np.log(3.0))]])
    loss, hits = linear_cross_entropy(h, w, None, torch.tensor([0, 1, IGNORE]), 2)
    assert abs(loss.item() - float(np.log(4.0) + np.log(4.0 / 3.0))) < 1e-6
    assert hits.tolist() == [False, True, False]


def test_hits_are_unique_tops_of_labelled_rows():
    h, w, b, t = (x.float() if x.is_floating_point() else x for x in _inputs(n=40, vocab=13, bias=True))
    h[5] = 0.0
    w[t[5]] = w[(t[5] + 1) % 13]  # row 5 ties its target with another token
    b[t[5]] = b[(t[5] + 1) % 13]
    z = (h @ w.T + b).double().numpy()
    labels = t.numpy()
    want = [bool(labels[i] != IGNORE and all(z[i, labels[i]] > z[i, v] for v in range(13) if v != labels[i]))
            for i in range(40)]
    _, hits = linear_cross_entropy(h, w, b, t, 7)
    assert hits.tolist() == want
    assert not hits[5] and 0 < int(hits.sum()) < 37


def test_an_unlabelled_row_is_never_a_hit_even_at_its_slots_top():
    # Logits of token 0 are the largest in every row; IGNORE_INDEX reads as token 0 where the label is clamped.
    h = torch.ones(3, 1)
    w = torch.tensor([[5.0], [1.0], [0.0]])
    _, hits = linear_cross_entropy(h, w, None, torch.tensor([0, IGNORE, 1]), 2)
    assert hits.tolist() == [True, False, False]


def test_nothing_predicted_is_a_zero_that_keeps_the_graph():
    """A batch without a labelled position (found from the labels: zero rows) gives 0 and a backward, as the plain
    path does, so every rank still runs its backward."""
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    projection = torch.nn.Linear(8, 10)
    head = VocabularyHead(lambda rows: rows, projection)
    labels = torch.full((2, 5), IGNORE)
    for chunk in (0, 4):
        loss, accuracy = sparse_mlm(hidden, labels, head, chunk=chunk)
        loss.backward()
        assert loss.item() == 0.0 and float(accuracy) == 0.0 and float(projection.weight.grad.abs().sum()) == 0.0


def test_the_head_hashes_before_its_fields_exist():
    """A compiled step builds the head inside the trace, where torch 2.11's dynamo hashes the object before its
    fields are set (every compiled trainer step failed on the first GPU run of 2026-11-28); a hash over the fields
    raises there, the object's own identity hash does not."""
    bare = object.__new__(VocabularyHead)
    assert hash(bare) == object.__hash__(bare)
    head = VocabularyHead(lambda rows: rows, torch.nn.Linear(2, 3))
    assert head != VocabularyHead(head.transform, head.projection) and head == head


def test_bf16_weights_without_autocast_accumulate_in_float32():
    """DeepSpeed's bf16 weights: every tensor bf16, no autocast. The weight's gradient sums one product per chunk; in
    float32 it stays near the float64 formula however many chunks there are."""
    h, w, b, t = _inputs(n=256, width=8, vocab=50)
    want_loss, _, want_w, _ = _reference(h.numpy(), w.numpy(), b.numpy(), t.numpy())
    leaves = [x.to(torch.bfloat16).requires_grad_() for x in (h, w, b)]
    loss, _ = linear_cross_entropy(*leaves, t, 1)
    loss.backward()
    assert leaves[1].grad.dtype == torch.bfloat16
    assert abs(loss.item() - want_loss) < 1e-2 * abs(want_loss)
    error = np.linalg.norm(leaves[1].grad.double().numpy() - want_w) / np.linalg.norm(want_w)
    assert error < 1e-2, error


def test_without_gradients_nothing_is_kept_and_the_loss_is_the_same():
    h, w, b, t = _inputs()
    with_grad, _ = linear_cross_entropy(h.clone().requires_grad_(), w, b, t, 8)
    with torch.no_grad():
        plain, _ = linear_cross_entropy(h.clone().requires_grad_(), w, b, t, 8)
    assert plain.grad_fn is None and with_grad.grad_fn is not None
    assert plain.item() == with_grad.item()


def test_bf16_autocast_follows_the_plain_path():
    h, w, b, t = (x.float() if x.is_floating_point() else x for x in _inputs(n=64, width=32, vocab=300))
    grads = []
    for fused in (False, True):
        leaves = [x.clone().requires_grad_() for x in (h, w, b)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                loss = linear_cross_entropy(*leaves, t, 16)[0] / int((t != IGNORE).sum())
            else:
                loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(*leaves).float(), t)
        loss.backward()
        grads.append((loss.item(), [x.grad for x in leaves]))
    (plain, plain_grads), (fused, fused_grads) = grads
    assert abs(fused - plain) < 1e-3 * abs(plain)
    assert all(g.dtype == torch.float32 for g in fused_grads)
    for got, want in zip(fused_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=0.05, atol=2e-3)  # bf16 products on both sides


def test_chunk_below_one_is_refused():
    h, w, b, t = _inputs()
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(h, w, b, t, 0)


ARCHITECTURES = ["bert", "modernbert", "albert", "xlnet"]


@pytest.mark.parametrize("backbone", ARCHITECTURES + ["electra-generator"])
def test_a_backbones_vocabulary_head_is_transformers_own_head(backbone, prepared):
    """mlm_head's transform then projection give the logits transformers' masked LM gives."""
    tok = read_manifest(prepared)["tokenizer"]
    bb = backbone_for("bert" if backbone == "electra-generator" else backbone)
    config = _config("bert" if backbone == "electra-generator" else backbone, tok)
    torch.manual_seed(0)
    model = bb.generator(config, 0.5, 1, bb.discriminator(config)) if backbone == "electra-generator" \
        else bb.masked_lm(config)
    model.eval()
    ids = torch.randint(10, tok["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, output_hidden_states=True)
    head = bb.mlm_head(model)
    assert isinstance(head, VocabularyHead) and bb.output_projection(model) is head.projection
    hidden = out.hidden_states[-1]
    if backbone == "modernbert":  # its masked LM's hidden states are before the encoder's final norm
        hidden = model.model.final_norm(hidden)
    torch.testing.assert_close(head(hidden), _logits(out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backbone,name", MATRIX, ids=[f"{o}-{b}" for b, o in MATRIX])
def test_every_objective_gives_the_plain_losses_and_gradients(backbone, name, prepared, tmp_path):
    tok = read_manifest(prepared)["tokenizer"]
    plain = _build(backbone, name, tok, tmp_path).train()
    fused = copy.deepcopy(plain)
    fused.vocab_loss_chunk = 7  # several chunks, the last one short
    batch = _batch(tok, name)
    results = []
    for objective in (plain, fused):
        torch.manual_seed(1)  # the same draws (ELECTRA's and COCO-LM's sampling) on both sides
        loss, metrics = objective(batch)
        loss.backward()
        results.append((loss.detach(), metrics, {n: p.grad for n, p in objective.named_parameters() if p.grad is not None}))
    (want, want_metrics, want_grads), (got, got_metrics, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_metrics.keys() == want_metrics.keys()
    for key in want_metrics:
        torch.testing.assert_close(got_metrics[key], want_metrics[key], rtol=1e-5, atol=1e-6, msg=key)
    assert got_grads.keys() == want_grads.keys()
    for key in want_grads:
        torch.testing.assert_close(got_grads[key], want_grads[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", ["mlm", "coco_lm"])
def test_the_fused_step_traces_as_one_graph(name, prepared, tmp_path):
    from test_one_graph import traced

    tok = read_manifest(prepared)["tokenizer"]
    objective = _build("bert", name, tok, tmp_path).train()
    objective.vocab_loss_chunk = 16
    graphs, breaks, reasons = traced(objective, _batch(tok, name))
    assert (graphs, breaks) == (1, 0), reasons


def test_a_head_that_is_not_a_vocabulary_head_is_refused():
    hidden, labels = torch.randn(2, 5, 8), torch.full((2, 5), IGNORE)
    labels[0, 1] = 3
    with pytest.raises(ConfigError, match="train.vocab_loss_chunk=4 needs a backbone whose mlm_head is a VocabularyHead"):
        sparse_mlm(hidden, labels, torch.nn.Linear(8, 10), chunk=4)


@pytest.mark.parametrize("overrides,message", [
    ({"vocab_loss_chunk": -1}, "'train.vocab_loss_chunk' must be >= 0"),
    ({"vocab_loss_chunk": 1024, "zero_stage": 3}, "train.vocab_loss_chunk=1024 needs ZeRO stage 0-2"),
])
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**overrides).validate()
