"""Elastic, exact loader resume across rank counts (real streaming, real rank processes with the environment torchrun
or srun gives them)."""
import json

import numpy as np
import pytest
from conftest import run_cli
from data_pipeline.dataset_dir import DatasetDir

NUM_SAMPLES = 96


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """96 sequences in MDS shards with a manifest (sizes divide every batch x rank count used)."""
    from streaming import MDSWriter

    root = tmp_path_factory.mktemp("loader") / "data"
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(root / "train"), columns={"input_ids": "ndarray:uint16"}, size_limit=2000) as w:
        for _ in range(NUM_SAMPLES):
            w.write({"input_ids": rng.integers(5, 100, size=rng.integers(8, 32)).astype(np.uint16)})
    (DatasetDir(root).manifest).write_text(json.dumps({"tokenizer": {"pad_id": 0}}))
    return root


def _walk(dataset, out, nproc, batch, batches, state_in=None, state_out=None):
    args = ["--data", str(dataset), "--batch", str(batch), "--batches", str(batches), "--out", str(out)]
    args += ["--state-in", str(state_in)] if state_in else []
    args += ["--state-out", str(state_out)] if state_out else []
    run_cli("tests/helpers/loader_walk.py", args, nproc=nproc, timeout=180)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def _masks(out, nproc):
    """Each sample's masked positions, over all ranks of a walk."""
    merged = {}
    for r in range(nproc):
        merged.update(json.loads((out / f"masks{r}.json").read_text()))
    return merged


def _global_steps(per_rank):
    """The set of sample ids consumed at each step, over all ranks."""
    return [sorted(i for rank in per_rank for i in rank[step]) for step in range(len(per_rank[0]))]


@pytest.fixture(scope="module")
def straight_walk(dataset, tmp_path_factory):
    """An uninterrupted 2-rank walk over the whole epoch (global batch 8): its steps and its masks."""
    out = tmp_path_factory.mktemp("straight")
    return _global_steps(_walk(dataset, out, 2, batch=4, batches=-1)), _masks(out, 2)


@pytest.fixture(scope="module")
def straight(straight_walk):
    """The uninterrupted walk's global steps."""
    return straight_walk[0]


@pytest.fixture(scope="module")
def first_half(dataset, tmp_path_factory):
    """5 global batches on 2 ranks, then the loader state as a checkpoint holds it."""
    base = tmp_path_factory.mktemp("first")
    state = base / "state.json"
    first = _walk(dataset, base / "walk", 2, batch=4, batches=5, state_out=state)
    return first, state


def test_same_global_batches_and_masks_on_one_and_two_ranks(dataset, straight_walk, tmp_path):
    straight, straight_masks = straight_walk
    one = _global_steps(_walk(dataset, tmp_path / "one", 1, batch=8, batches=-1))
    assert one == straight
    assert sorted(i for step in one for i in step) == list(range(NUM_SAMPLES))
    # Masks are made per sample in the loader: the same for a sample whatever the rank count or batch.
    one_masks = _masks(tmp_path / "one", 1)
    assert one_masks == straight_masks and len(one_masks) == NUM_SAMPLES
    assert sum(bool(v) for v in one_masks.values()) > 0.8 * NUM_SAMPLES  # 30% of 8-31 tokens: few pick none


@pytest.mark.parametrize("resume_ranks", [1, 2])
def test_resume_on_another_rank_count_sees_each_sample_once(dataset, straight_walk, first_half, tmp_path, resume_ranks):
    straight, straight_masks = straight_walk
    first, state = first_half
    assert json.loads(state.read_text())["sample_in_epoch"] == 2 * 4 * 5
    batch = 8 // resume_ranks  # the same global batch
    rest = _walk(dataset, tmp_path / "rest", resume_ranks, batch=batch, batches=-1, state_in=state)
    seen = [i for rank in first + rest for b in rank for i in b]
    assert len(seen) == len(set(seen)) == NUM_SAMPLES  # no duplicate, no gap
    # And the resumed steps are exactly the ones an uninterrupted 2-rank run would take next.
    assert _global_steps(first) + _global_steps(rest) == straight
    # The resumed samples are masked as the uninterrupted walk masked them.
    rest_masks = _masks(tmp_path / "rest", resume_ranks)
    assert rest_masks == {k: straight_masks[k] for k in rest_masks} and len(rest_masks) == NUM_SAMPLES - 40
