"""Objectives as modules: where gradients flow, TACO's sampling, and overfitting a tiny batch."""
import pytest
import torch
from transformers import BertConfig

from data_pipeline.masking import MaskingConfig, build_masking
from core.errors import ConfigError
from model.encoder import EncoderConfig
from model.objectives import REGISTRY, ObjectiveConfig, build_objective, objective_class, runs_on
from model.objectives.coco_lm import corrective_lm_loss
from model.objectives.taco import sample_taco_indices, tc_loss

VOCAB, PAD, CLS, SEP, MASK = 120, 0, 2, 3, 4


def tiny_config(dropout=0.0):
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=64, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    cfg._attn_implementation = "sdpa"
    return cfg


def objective(name, dropout=0.0):
    oc = ObjectiveConfig(name=name)
    oc.coco_lm.generator_layers = 1
    oc.taco.negatives = 8
    torch.manual_seed(0)
    return build_objective(oc, tiny_config(dropout))


def masked_batch(name, rows=8, width=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, width), generator=g)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[1, 18:], ids[1, 17] = PAD, SEP
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long(), "token_type_ids": torch.zeros_like(ids)}
    masking = MaskingConfig(strategy="coco" if name == "coco_lm" else "bert", crop_ratio=0.9 if name == "coco_lm" else None)
    return build_masking(masking, VOCAB, MASK, [PAD, 1, CLS, SEP, MASK], pad_id=PAD, cls_id=CLS, sep_id=SEP)(batch, g)


def test_teacher_gets_no_gradient_and_stays_in_eval():
    m = objective("tacl", dropout=0.1)
    m.train()
    assert not m.teacher.training and m.student.training
    before = {k: v.clone() for k, v in m.teacher.state_dict().items()}
    loss, _ = m(masked_batch("tacl"))
    loss.backward()
    assert all(p.grad is None for p in m.teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.student.parameters())
    assert all(torch.equal(before[k], v) for k, v in m.teacher.state_dict().items())
    assert all(not p.requires_grad for p in m.teacher.parameters())


def test_taco_keys_get_no_gradient():
    g = torch.randn(3, 6, 8, requires_grad=True)
    anchors = torch.tensor([0, 2, 4])  # all in sequence 0
    pos = torch.tensor([1, 3, 5])
    neg = torch.tensor([[6, 7], [12, 13], [8, 14]])
    tc_loss(g, anchors, pos, neg).backward()
    grad = g.grad.reshape(-1, 8).abs().sum(-1)
    assert (grad[anchors] > 0).all()
    keys_only = torch.tensor([1, 3, 5, 6, 7, 8, 12, 13, 14])
    assert (grad[keys_only] == 0).all()


@pytest.mark.parametrize("form", ["weighted", "paper"])
def test_corrective_lm_sends_no_gradient_into_the_copy_probability(form):
    logits = torch.randn(10, 20, requires_grad=True)
    copy_logits = torch.randn(10, requires_grad=True)
    targets = torch.randint(0, 20, (10,))
    corrupted = torch.where(torch.rand(10) < 0.5, targets, torch.randint(0, 20, (10,)))
    corrective_lm_loss(logits, targets, copy_logits, corrupted, form).backward()
    assert copy_logits.grad is None
    assert logits.grad.abs().sum() > 0


def _generator_only(m, name):
    shared = {id(p) for p in (m.discriminator if name == "electra" else m.main).parameters()}
    return [p for p in m.generator.parameters() if id(p) not in shared]


@pytest.mark.parametrize("name,main_terms", [("electra", ["rtd_loss"]), ("coco_lm", ["copy_loss", "clm_loss", "scl_loss"])])
def test_generator_samples_carry_no_gradient(name, main_terms):
    m = objective(name)
    terms, _ = m.terms(masked_batch(name))
    sum(terms[t] for t in main_terms).backward(retain_graph=True)
    gen_params = _generator_only(m, name)
    assert gen_params and all(p.grad is None for p in gen_params)
    terms["generator_mlm_loss"].backward()  # the generator does learn from its own MLM loss
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in gen_params)


def test_taco_sampling():
    valid = torch.ones(4, 10, dtype=torch.bool)
    valid[1, 7:] = False
    valid[3, 1:] = False  # a one-token sequence has no positive: its anchors are dropped
    anchors_flat, pos, neg, keep = sample_taco_indices(valid, valid, 16, torch.Generator().manual_seed(0))
    assert anchors_flat.shape == pos.shape == keep.shape == (40,) and neg.shape == (40, 16)  # fixed by [B, L]
    assert torch.equal(keep.view(4, 10), valid & (torch.arange(4) != 3)[:, None])
    anchors_flat, pos, neg = anchors_flat[keep], pos[keep], neg[keep]
    rows, cols = anchors_flat // 10, anchors_flat % 10
    prow, pcol = pos // 10, pos % 10
    assert not (rows == 3).any()
    assert torch.equal(rows, prow) and (pcol != cols).all() and valid[prow, pcol].all()
    offsets = pcol - cols
    interior = (cols >= 2) & (cols <= valid[rows].sum(1) - 3)
    assert set(offsets[interior].tolist()) <= {-2, -1, 1, 2}
    counts = torch.bincount(offsets[interior] + 2, minlength=5)  # offsets -2..2 as 0..4; 0 (the anchor itself) is excluded above
    assert counts[:2].sum() > 0 and counts[3:].sum() > 0, counts  # positives are drawn on both sides of an anchor
    nrow, ncol = neg // 10, neg % 10
    assert (nrow != rows[:, None]).all() and valid[nrow, ncol].all()


@pytest.mark.parametrize("name", ["mlm", "electra", "coco_lm", "tacl", "taco"])
def test_overfits_a_tiny_batch(name):
    m = objective(name)
    m.train()
    batch = masked_batch(name)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    torch.manual_seed(1)
    first, fitted = None, 0
    for _ in range(120):
        loss, _ = m(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
        fitted = fitted + 1 if loss.item() < 0.5 * first else 0
        if fitted == 10:  # fitted, and staying so; an objective that cannot learn the batch runs all 120 steps and fails
            break
    assert loss.item() < 0.5 * first, (first, loss.item())


def test_coco_lm_keeps_pretrained_embeddings_and_ties_its_heads(tmp_path):
    from transformers import BertModel

    torch.manual_seed(5)
    start = BertModel(tiny_config(), add_pooling_layer=False)
    start.save_pretrained(str(tmp_path / "bert"))
    oc = ObjectiveConfig(name="coco_lm")
    oc.coco_lm.generator_layers = 1
    m = build_objective(oc, tiny_config(), str(tmp_path / "bert"))
    emb = m.main.embeddings.word_embeddings.weight
    assert torch.equal(emb, start.embeddings.word_embeddings.weight)
    assert m.clm_head.weight is emb and m.generator.cls.predictions.decoder.weight is emb
    assert m.generator.bert.embeddings is m.main.embeddings


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_objective_accepts_the_masking_it_declares_and_refuses_none_of_it(name):
    """An objective's `masking` (what tests, recipes and the sweep read) is a masking its own check accepts, on the
    first backbone it runs on; the three that need more than the defaults are refused without it."""
    cls = objective_class(name)
    # TaCL continues a checkpoint (any folder name passes its check; the folder is read when the model is built).
    model = EncoderConfig(architecture=runs_on(cls)[0], init_from="teacher" if name == "tacl" else None)
    cls.check_config(getattr(ObjectiveConfig(), name), model, MaskingConfig(**cls.masking))
    if name in ("coco_lm", "spanbert", "xlnet"):
        with pytest.raises(ConfigError):
            cls.check_config(getattr(ObjectiveConfig(), name), model, MaskingConfig())


@pytest.mark.parametrize("include_padding,cross", [(False, False), (True, False), (False, True)])
def test_tacl_options_reach_its_loss(include_padding, cross):
    """The objective's contrastive term, from the student's and the teacher's states, against the float64 formula."""
    from test_objective_losses import _tacl_reference

    oc = ObjectiveConfig(name="tacl")
    oc.tacl.include_padding, oc.tacl.cross_sequence_negatives, oc.tacl.temperature = include_padding, cross, 0.5
    torch.manual_seed(0)
    m = build_objective(oc, tiny_config()).eval()
    with torch.no_grad():  # the teacher drifts from the student, as after training steps
        for p in m.student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = masked_batch("tacl")
    with torch.no_grad():
        terms, _ = m.terms(batch)
        args = {"attention_mask": batch["attention_mask"], "token_type_ids": batch["token_type_ids"]}
        student = m.student.bert(batch["input_ids"], **args).last_hidden_state.double().numpy()
        teacher = m.teacher(batch["original_input_ids"], **args).last_hidden_state.double().numpy()
    anchors = (batch["labels"] != -100).numpy()
    want = _tacl_reference(student, teacher, anchors, batch["attention_mask"].bool().numpy(), 0.5, include_padding, cross)
    assert abs(terms["tacl_loss"].item() - want) <= 1e-5 * abs(want), (terms["tacl_loss"].item(), want)


def test_tacls_validation_self_similarity_reads_the_students_clean_text():
    """The self-similarity logged at validation is TaCL's statistic of the student over clean text (as its analysis
    and `evaluate self-similarity` read it), not over the masked input the MLM term reads."""
    from model.diagnostics import token_self_similarity

    torch.manual_seed(0)
    m = build_objective(ObjectiveConfig(name="tacl"), tiny_config()).eval()
    batch = masked_batch("tacl")
    args = {"attention_mask": batch["attention_mask"], "token_type_ids": batch["token_type_ids"]}
    with torch.no_grad():
        _, metrics = m.terms(batch)
        clean = m.student.bert(batch["original_input_ids"], **args).last_hidden_state
        masked = m.student.bert(batch["input_ids"], **args).last_hidden_state
    want = float(token_self_similarity(clean, batch["attention_mask"]))
    assert abs(float(metrics["self_similarity"]) - want) <= 1e-6 * abs(want)
    assert abs(float(token_self_similarity(masked, batch["attention_mask"])) - want) > 1e-4  # the two differ here


def test_tacl_with_the_nsp_head_adds_its_pair_loss():
    oc = ObjectiveConfig(name="tacl")
    oc.tacl.pair_head = "nsp"
    torch.manual_seed(0)
    m = build_objective(oc, tiny_config()).eval()
    batch = {**masked_batch("tacl"), "pair_label": torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])}
    with torch.no_grad():
        terms, _ = m.terms(batch)
        logits = m.student(batch["input_ids"], attention_mask=batch["attention_mask"],
                           token_type_ids=batch["token_type_ids"]).seq_relationship_logits.double()
    want = -sum(torch.log_softmax(row, -1)[label].item() for row, label in zip(logits, batch["pair_label"])) / 8
    assert set(terms) == {"mlm_loss", "tacl_loss", "nsp_loss"} and abs(terms["nsp_loss"].item() - want) <= 1e-5 * want
    del batch["pair_label"]
    with pytest.raises(ConfigError, match="packing=pairs"):
        m.terms(batch)


@pytest.mark.parametrize("form", ["weighted", "paper"])
def test_coco_lm_hands_its_clm_form_to_the_corrective_loss(form, monkeypatch):
    import model.objectives.coco_lm as coco

    seen = []
    loss = coco.corrective_lm_loss
    monkeypatch.setattr(coco, "corrective_lm_loss", lambda *args: seen.append(args[-1]) or loss(*args))
    oc = ObjectiveConfig(name="coco_lm")
    oc.coco_lm.generator_layers, oc.coco_lm.clm_form = 1, form
    torch.manual_seed(0)
    build_objective(oc, tiny_config()).terms(masked_batch("coco_lm"))
    assert seen == [form]


@pytest.mark.parametrize("masked_only", [False, True])
def test_taco_anchors_are_every_token_or_only_the_masked_ones(masked_only, monkeypatch):
    import model.objectives.taco as taco

    seen = []
    sample = taco.sample_taco_indices
    monkeypatch.setattr(taco, "sample_taco_indices", lambda valid, anchors, *rest: seen.append(anchors.clone())
                        or sample(valid, anchors, *rest))
    oc = ObjectiveConfig(name="taco")
    oc.taco.negatives, oc.taco.masked_only = 8, masked_only
    torch.manual_seed(0)
    batch = masked_batch("taco")
    build_objective(oc, tiny_config()).terms(batch)
    want = (batch["labels"] != -100) if masked_only else batch["attention_mask"].bool()
    assert len(seen) == 1 and torch.equal(seen[0], want)
