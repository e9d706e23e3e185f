"""BERT 80/10/10 masking: rates, specials never picked, determinism from the generator."""
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


def test_same_generator_same_masks():
    batch = _batch(rows=8, width=64)
    m = _masker()
    a = m(batch, torch.Generator().manual_seed(7))
    b = m(batch, torch.Generator().manual_seed(7))
    c = m(batch, torch.Generator().manual_seed(8))
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["labels"], c["labels"])
