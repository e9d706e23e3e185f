"""XLNet's permutation LM: the factorization order the loader builds, and the model's predictions obeying it
(each target sees the non-targets and the targets before it in the order, never itself or a later one)."""
import torch

from data_pipeline.batches import MaskingCollate
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, build_masking

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 200


def _plm(mask_prob=1 / 6, max_span=5, seed=0):
    starts = torch.rand(VOCAB, generator=torch.Generator().manual_seed(seed)) < 0.6
    starts[:5] = True
    return build_masking(MaskingConfig(strategy="plm", mask_prob=mask_prob, max_span=max_span), VOCAB, MASK,
                         [PAD, UNK, CLS, SEP, MASK], word_starts=starts)


def _sample(n, seed):
    ids = torch.randint(5, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
    ids[0, 0], ids[0, -1] = CLS, SEP
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _order(out):
    """Recover the factorization order from perm_mask alone: a target that can see k other targets is k-th."""
    perm = out["perm_mask"][0].bool()
    targets = (out["labels"][0] != IGNORE_INDEX).nonzero().squeeze(1).tolist()
    seen = {t: sum(not perm[t, u] for u in targets if u != t) for t in targets}
    return targets, seen


def test_perm_mask_is_a_factorization_order_with_targets_last():
    plm = _plm()
    counts = []
    for seed in range(40):
        batch = _sample(60, seed)
        out = plm(batch, torch.Generator().manual_seed(seed))
        assert torch.equal(out["input_ids"], batch["input_ids"])  # XLNet never corrupts its input
        perm = out["perm_mask"][0].bool()
        targets, seen = _order(out)
        counts.append(len(targets))
        target_set = set(targets)
        for i in range(60):
            for j in range(60):
                if j not in target_set:
                    assert not perm[i, j]  # every query sees every non-target
                elif i not in target_set:
                    assert perm[i, j]  # no non-target sees a target
        # Targets: a strict order (a permutation): the k-th sees exactly the k - 1 targets before it, never itself.
        assert sorted(seen.values()) == list(range(len(targets))) and all(perm[t, t] for t in targets)
        for t in targets:
            for u in targets:
                if u != t:
                    assert (not perm[t, u]) == (seen[u] < seen[t])
        mapping = out["target_mapping"][0]
        assert mapping.shape == (len(targets), 60) and torch.equal(mapping.argmax(1), torch.tensor(targets))
        assert torch.equal(out["target_labels"][0], batch["input_ids"][0, targets])
    # Partial prediction: about 1/K = 1/6 of the 58 pickable tokens are targets.
    assert abs(sum(counts) / len(counts) / 58 - 1 / 6) < 0.03


def test_orders_differ_between_samples_and_repeat_for_a_seed():
    plm = _plm()
    a = plm(_sample(60, 1), torch.Generator().manual_seed(5))
    b = plm(_sample(60, 1), torch.Generator().manual_seed(5))
    c = plm(_sample(60, 1), torch.Generator().manual_seed(6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["perm_mask"], c["perm_mask"])


def test_collated_targets_pad_with_ignore_and_zero_rows():
    rows = [{"input_ids": _sample(n, n)["input_ids"][0].numpy(), "sample_id": i} for i, n in enumerate((60, 20))]
    batch = MaskingCollate(_plm(), PAD, seed=3)(rows)
    p = batch["target_mapping"].shape[1]
    assert batch["perm_mask"].shape == (2, 60, 60) and batch["target_labels"].shape == (2, p)
    real = batch["target_labels"] != IGNORE_INDEX
    assert torch.equal(batch["target_mapping"].sum(-1).bool(), real)  # padded targets map nowhere
    assert not batch["perm_mask"][1, :, 20:].any()


def test_each_prediction_depends_only_on_what_the_order_allows():
    """Change a token and see which targets' predictions move: exactly those later in the order (non-targets
    move every target; a target moves only the targets after it; nothing moves its own prediction)."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64, dropout=0.0,
                                         mem_len=None, use_mems_eval=False)).eval()
    out = _plm(mask_prob=0.25)(_sample(30, 7), torch.Generator().manual_seed(7))
    targets, rank = _order(out)
    assert len(targets) >= 3

    def logits(ids):
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=out["attention_mask"], perm_mask=out["perm_mask"],
                         target_mapping=out["target_mapping"]).logits[0]

    base = logits(out["input_ids"])
    context = next(i for i in range(1, 29) if i not in targets)
    for changed in [context, *targets]:
        ids = out["input_ids"].clone()
        ids[0, changed] = 5 + (int(ids[0, changed]) - 4) % (VOCAB - 5)
        moved = (logits(ids) - base).abs().amax(-1) > 0  # masked-out keys weigh exactly 0
        for k, t in enumerate(targets):
            should = changed == context or (changed in rank and rank[changed] < rank[t])
            assert bool(moved[k]) == should, (changed, t)
