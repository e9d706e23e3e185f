"""A batch's predictions at flat positions, padded to a budget for the whole batch (`prediction_index`): the formula,
the index the loader's collate builds, and every objective reading it as it read each row's own slots."""
import functools

import numpy as np
import pytest
import torch
from test_backbones import MATRIX, _batch, _build

from data_pipeline.batches import MaskingCollate
from data_pipeline.masking import (IGNORE_INDEX, MaskingConfig, batch_prediction_slots, build_masking,
                                   build_prediction_index, prediction_slots)
from data_pipeline.shards import read_manifest
from model.objectives import coco_lm, electra

PAD, UNK, CLS, SEP, MASK, VOCAB = 0, 1, 2, 3, 4, 200


def test_batch_prediction_slots_from_the_formula():
    # Independent draws: mean + 5 standard deviations of Binomial(rows · L, p) for the batch, rounded up:
    # 4915.2 + 5 * 64.637 at 256 x 128 x 0.15, where every row's 40 slots make 10,240.
    assert batch_prediction_slots(MaskingConfig(), 256, 128) == 5239
    assert batch_prediction_slots(MaskingConfig(strategy="whole_word", mask_prob=0.3), 16, 512) == 2665  # + 5 * 41.477
    # Exact counts and span budgets fill every row's slots.
    assert batch_prediction_slots(MaskingConfig(count="exact"), 256, 128) == 256 * 19
    assert batch_prediction_slots(MaskingConfig(strategy="span"), 8, 512) == 8 * 77
    # Never more than the rows' own slots: 14.4 + 5 * 1.2 = 20.4 > 2 * 8.
    assert batch_prediction_slots(MaskingConfig(mask_prob=0.9), 2, 8) == 16


def test_prediction_index_lists_the_picks_then_an_unpicked_position():
    labels = torch.tensor([[IGNORE_INDEX, 5, IGNORE_INDEX, 7], [IGNORE_INDEX, IGNORE_INDEX, 9, IGNORE_INDEX]])
    assert build_prediction_index(labels, 5, 8).tolist() == [1, 3, 6, 0, 0]
    # Position 0 picked: the padding points at the first position that is not.
    labels = torch.tensor([[5, IGNORE_INDEX], [IGNORE_INDEX, 6]])
    assert build_prediction_index(labels, 3, 4).tolist() == [0, 3, 1]
    assert build_prediction_index(labels, 2, 4).tolist() == [0, 3]  # full: no padding


def test_a_batch_over_its_budget_takes_the_rows_slots_and_loses_no_pick():
    labels = torch.tensor([[IGNORE_INDEX, 5, 6], [7, IGNORE_INDEX, IGNORE_INDEX]])
    assert build_prediction_index(labels, 2, 4).tolist() == [1, 2, 3, 0]
    with pytest.raises(ValueError, match="3 picks, more than its rows' 2"):
        build_prediction_index(labels, 2, 2)


def _samples(rows: int, width: int) -> list[dict]:
    g = np.random.default_rng(3)
    out = []
    for i in range(rows):
        n = width - (i % 5) * 7  # rows of several lengths: the collate pads them
        ids = g.integers(5, VOCAB, n)
        ids[0], ids[-1] = CLS, SEP
        out.append({"input_ids": ids, "sample_id": i})
    return out


@pytest.mark.parametrize("strategy,count", [("bert", "bernoulli"), ("coco", "bernoulli"), ("bert", "exact"),
                                            ("whole_word", "bernoulli")])
def test_the_collate_pads_a_batch_of_masked_samples_to_its_budget(strategy, count):
    cfg = MaskingConfig(strategy=strategy, count=count)
    starts = torch.rand(VOCAB, generator=torch.Generator().manual_seed(1)) < 0.6
    masking = build_masking(cfg, VOCAB, MASK, [PAD, UNK, CLS, SEP, MASK], starts, PAD, CLS, SEP)
    samples = _samples(64, 64)
    batch = MaskingCollate(masking, PAD, seed=5, batch_slots=functools.partial(batch_prediction_slots, cfg))(samples)
    index, labels = batch["prediction_index"], batch["labels"]
    rows_slots = 64 * prediction_slots(cfg, 64)
    assert batch["masked_positions"].numel() == rows_slots
    assert index.shape == (batch_prediction_slots(cfg, 64, 64),)
    if count == "bernoulli":
        assert len(index) < 0.5 * rows_slots  # 729 against 1,536 (9.6 + 5 * 2.856 = 24 a row)
    picks = np.flatnonzero((labels != IGNORE_INDEX).numpy())
    assert 0 < len(picks) <= len(index)
    assert index[:len(picks)].tolist() == picks.tolist()
    assert (labels.flatten()[index[len(picks):]] == IGNORE_INDEX).all()
    # Without a budget the batch holds every row's slots.
    wide = MaskingCollate(masking, PAD, seed=5)(samples)["prediction_index"]
    assert wide.shape == (rows_slots,) and torch.equal(wide[:len(picks)], index[:len(picks)])


def _argmax(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """A sampler that draws nothing: the two layouts hand it their slots in different orders and numbers."""
    return logits.argmax(-1)


BERT_CASES = [o for b, o in MATRIX if b == "bert" and o != "xlnet"]  # XLNet predicts through its target mapping


@pytest.mark.parametrize("name", BERT_CASES)
def test_each_objective_reads_the_batch_index_as_it_reads_each_rows_slots(name, prepared, tmp_path, monkeypatch):
    """The terms from the batch's compact index equal those from every row's slots in turn (what a batch built
    without a budget holds), and the vocabulary head runs over the compact index's rows only."""
    monkeypatch.setattr(electra, "sample_replacements", _argmax)
    monkeypatch.setattr(coco_lm, "sample_replacements", _argmax)
    tok = read_manifest(prepared)["tokenizer"]
    objective = _build("bert", name, tok, tmp_path).train()
    batch = _batch(tok, name)
    rows_seen = []
    head = objective.backbone.mlm_head(getattr(objective, "generator", None) or getattr(objective, "student", None)
                                       or objective.model)
    handle = head.transform.register_forward_pre_hook(lambda module, args: rows_seen.append(args[0].shape[0]))
    torch.manual_seed(7)
    compact, _ = objective.terms(batch)
    handle.remove()
    assert rows_seen and set(rows_seen) == {len(batch["prediction_index"])}
    if name != "spanbert":  # span budgets fill every row's slots
        assert len(batch["prediction_index"]) < batch["masked_positions"].numel()
    torch.manual_seed(7)
    per_row, _ = objective.terms({k: v for k, v in batch.items() if k != "prediction_index"})
    assert compact.keys() == per_row.keys()
    for term in compact:
        assert torch.allclose(compact[term], per_row[term], rtol=1e-5, atol=1e-7), term


def test_the_objective_step_benchmark_masks_as_the_loader_does():
    import argparse

    from benchmarks.objective_step_time import make_batch

    batch = make_batch("mlm", argparse.Namespace(batch=16, seq=128), 300, "cpu", torch.Generator().manual_seed(0))
    assert batch["prediction_index"].shape == (batch_prediction_slots(MaskingConfig(), 16, 128),)  # 388, not 640
    assert len(batch["prediction_index"]) < batch["masked_positions"].numel()


def test_the_run_s_loaders_pad_each_batch_to_its_budget(prepared):
    """What the trainer reads: the training and validation loaders open_run_data builds give each batch the budget of
    its own masking (validation shows every pick as [MASK], with the same picks)."""
    from data_pipeline.loader import LoaderConfig
    from data_pipeline.run_data import open_run_data

    masking = MaskingConfig()
    data = open_run_data(LoaderConfig(path=str(prepared), num_workers=0), masking, 8, seed=1, validation=True,
                         wrap=lambda transform, *specials: transform)
    for loader in (data.train, data.validation):
        batch = next(iter(loader))
        rows, length = batch["input_ids"].shape
        assert len(batch["prediction_index"]) == batch_prediction_slots(masking, rows, length) == 118  # 76.8 + 5 * 8.08, at 8 x 64
        assert len(batch["prediction_index"]) < batch["masked_positions"].numel()  # 8 * 24
