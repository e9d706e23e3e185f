"""Masking in the loader's worker processes: the same masks and order for any number of workers, across epochs and
resumes, and a batch that leaves a worker as one block."""
import os

import pytest
import torch
from data_pipeline.batches import MaskingCollate, unpadded_key
from data_pipeline.loader import LoaderConfig, build_loader
from test_loader_masking import NUM_SAMPLES, _epochs, _masking, dataset  # noqa: F401 (dataset: the module's fixture)


def test_masks_are_made_in_the_loader_workers_the_same_for_any_number_of_them(dataset):
    (in_process,), pids0 = _epochs(dataset, workers=0, epochs=1)
    (in_workers,), pids2 = _epochs(dataset, workers=2, epochs=1)
    assert pids0 == {os.getpid()}
    assert len(pids2) == 2 and os.getpid() not in pids2  # the training process masks nothing
    assert in_workers == in_process and len(in_process) == NUM_SAMPLES


def test_each_epoch_masks_anew_and_resumes_the_same(dataset):
    (first, second), _ = _epochs(dataset, workers=1, epochs=2)
    assert first.keys() == second.keys()
    assert sum(first[k] != second[k] for k in first) >= NUM_SAMPLES - 2  # a new mask for (nearly) every sample
    (again_first, again_second), _ = _epochs(dataset, workers=1, epochs=2)
    assert (again_first, again_second) == (first, second)  # and the same again in a new run
    (fixed_first, fixed_second), _ = _epochs(dataset, workers=1, epochs=2, per_epoch=False)
    assert fixed_first == fixed_second


@pytest.mark.parametrize("inline", [True, False])  # through the pipe; as one shared block (batches over the limit)
def test_a_worker_batch_reaches_the_training_process_as_one_block(dataset, monkeypatch, inline):
    """With workers, the loader's batches cross as one buffer and come out as the collate's dict."""
    import data_pipeline.batches

    if not inline:  # the workers are forked after this: they pack with the patched limit
        monkeypatch.setattr(data_pipeline.batches, "INLINE_BATCH_BYTES", 0)
    cfg = LoaderConfig(path=str(dataset), shuffle=False, num_workers=1)
    loader = build_loader(cfg, "train", 4, collate_fn=MaskingCollate(_masking(), pad_id=0, seed=5))
    batches = list(loader)
    assert len(batches) == NUM_SAMPLES // 4 and loader.num_samples_yielded == NUM_SAMPLES  # resume counts samples
    for batch in batches:
        storages = {v.untyped_storage().data_ptr() for v in batch.values() if isinstance(v, torch.Tensor)}
        assert len(storages) == 1 and set(batch) >= {"input_ids", "labels", "attention_mask", "sample_id"}
        assert type(batch[unpadded_key("attention_mask")]) is bool  # the collate's flag crosses beside the block
        assert batch["input_ids"].is_shared() is not inline


def test_the_sample_order_and_a_resume_do_not_depend_on_the_worker_count(dataset):
    """`data.num_workers: auto` may pick another count on another machine: a requeue there reads the same order."""
    def loader(workers):
        return build_loader(LoaderConfig(path=str(dataset), shuffle=True, num_workers=workers), "train", 3,
                            collate_fn=MaskingCollate(_masking(), pad_id=0, seed=5))

    def walk(it, batches):
        return [next(it)["sample_id"].tolist() for _ in range(batches)]

    straight = {w: walk(iter(loader(w)), NUM_SAMPLES // 3) for w in (0, 1, 2)}
    assert straight[0] == straight[1] == straight[2] and sorted(sum(straight[0], [])) == list(range(NUM_SAMPLES))
    first = loader(2)
    head = walk(iter(first), 3)
    resumed = loader(1)
    resumed.load_state_dict(first.state_dict())
    assert head + walk(iter(resumed), NUM_SAMPLES // 3 - 3) == straight[0]
