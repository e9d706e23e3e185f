"""Masking in the loader: per-sample seeds, made in the loader's worker processes, new masks each epoch."""
import os

import numpy as np
import pytest
import torch

from data_pipeline.batches import EVAL_STREAM, INLINE_BATCH_BYTES, MaskingCollate, PackedBatch, unpadded_key
from data_pipeline.loader import LoaderConfig, build_loader
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, build_masking

SPECIAL = [0, 1, 2, 3, 4]  # pad, unk, cls, sep, mask
NUM_SAMPLES = 24


def _masking(**overrides):
    return build_masking(MaskingConfig(mask_prob=0.3, **overrides), vocab_size=100, mask_id=4, special_ids=SPECIAL,
                         pad_id=0, cls_id=2, sep_id=3)


class RecordingPid:
    """A masking transform that also records which process ran it (one column per sample)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, batch, generator):
        out = self.inner(batch, generator)
        return {**out, "pid": torch.full((1, 1), os.getpid(), dtype=torch.long)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """24 sequences of 10-40 ordinary tokens wrapped in [CLS] ... [SEP], in MDS shards with a manifest."""
    from conftest import write_token_dataset

    rng = np.random.default_rng(0)
    return write_token_dataset(tmp_path_factory.mktemp("masking") / "data",
                               [np.concatenate([[2], rng.integers(5, 100, size=rng.integers(10, 40)), [3]])
                                for _ in range(NUM_SAMPLES)])


def _samples(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_ids": np.concatenate([[2], rng.integers(5, 100, size=n), [3]]).astype(np.uint16),
             "sample_id": 100 + i, "epoch": 3} for i, n in enumerate(lengths)]


def test_a_samples_mask_is_its_own_whatever_batch_it_is_in():
    collate = MaskingCollate(_masking(crop_ratio=0.9), pad_id=0, seed=5)
    samples = _samples([30, 12, 45, 7])
    together = collate(samples)
    assert together["input_ids"].shape == (4, 47)
    for row, sample in enumerate(samples):
        alone = collate([sample])
        n = len(sample["input_ids"])
        for key in ("input_ids", "labels", "original_input_ids", "attention_mask"):
            assert torch.equal(together[key][row, :n], alone[key][0, :n]), key
        crop = alone["crop_input_ids"].shape[1]  # a crop is as wide as itself, and padded to the batch's widest crop
        assert torch.equal(together["crop_input_ids"][row, :crop], alone["crop_input_ids"][0])
        assert (together["crop_input_ids"][row, crop:] == 0).all()
        # Padding beyond the sample: pad id, ignored labels, no attention.
        assert (together["input_ids"][row, n:] == 0).all() and (together["attention_mask"][row, n:] == 0).all()
        assert (together["labels"][row, n:] == IGNORE_INDEX).all()
        assert torch.equal(together["original_input_ids"][row, :n], torch.as_tensor(sample["input_ids"].astype(np.int64)))
    assert together["sample_id"].tolist() == [100, 101, 102, 103]
    # The mask follows (seed, epoch, sample id): another epoch or seed masks the same sample elsewhere.
    picked = together["labels"] != IGNORE_INDEX
    other_epoch = collate([{**s, "epoch": 4} for s in samples])["labels"] != IGNORE_INDEX
    other_seed = MaskingCollate(_masking(crop_ratio=0.9), pad_id=0, seed=6)(samples)["labels"] != IGNORE_INDEX
    assert not torch.equal(picked, other_epoch) and not torch.equal(picked, other_seed)
    # Validation ignores the epoch: the same masks at every evaluation.
    fixed = MaskingCollate(_masking(), pad_id=0, seed=5, stream=EVAL_STREAM, per_epoch=False)
    assert torch.equal(fixed(samples)["labels"], fixed([{**s, "epoch": 9} for s in samples])["labels"])
    # Without a transform it pads only: the samples' own tokens, attention over them, no labels.
    padded = MaskingCollate(None, pad_id=0)(samples)
    assert set(padded) == {"input_ids", "attention_mask", "sample_id", unpadded_key("attention_mask")}
    assert torch.equal(padded["input_ids"], together["original_input_ids"])
    assert torch.equal(padded["attention_mask"], together["attention_mask"])


def test_each_attention_mask_comes_with_a_flag_that_says_whether_it_was_padded():
    collate = MaskingCollate(_masking(crop_ratio=0.9), pad_id=0, seed=5)
    keys = (unpadded_key("attention_mask"), unpadded_key("crop_attention_mask"))
    mixed, even = collate(_samples([30, 12, 45])), collate(_samples([20, 20, 20]))
    assert [mixed[k] for k in keys] == [False, False] and [even[k] for k in keys] == [True, True]
    assert all(type(batch[k]) is bool for batch in (mixed, even) for k in keys)  # plain bools: no tensor to read
    assert even["attention_mask"].all() and not mixed["attention_mask"].all()
    assert even["crop_attention_mask"].all() and even["crop_input_ids"].shape == (3, 2 + round(0.9 * 20))
    # They cross from a loader worker beside the packed columns: as bytes, as shared memory, and pinned.
    import pickle
    from multiprocessing.reduction import ForkingPickler

    packed = PackedBatch.pack(even)
    assert packed.buffer.numel() < INLINE_BATCH_BYTES
    rebuild, args = packed.__reduce__()
    for back in (packed, pickle.loads(bytes(ForkingPickler.dumps(packed))), rebuild(*args)):
        out = back.unpack()
        assert list(out) == list(even) and all(out[k] is True for k in keys)
        assert all(torch.equal(out[k], v) if isinstance(v, torch.Tensor) else out[k] is v for k, v in even.items())


def _epochs(dataset, workers, epochs, per_epoch=True):
    """{sample id: masked positions} per epoch, and the pids that masked, through the real streaming loader."""
    cfg = LoaderConfig(path=str(dataset), shuffle=True, shuffle_seed=3, num_workers=workers)
    collate = MaskingCollate(RecordingPid(_masking()), pad_id=0, seed=5, per_epoch=per_epoch)
    loader = build_loader(cfg, "train", 4, collate_fn=collate)
    out, pids = [], set()
    for _ in range(epochs):
        masks = {}
        for batch in loader:
            pids.update(batch["pid"][:, 0].tolist())
            for sid, labels in zip(batch["sample_id"].tolist(), batch["labels"]):
                masks[sid] = (labels != IGNORE_INDEX).nonzero().squeeze(1).tolist()
        out.append(masks)
    return out, pids


def test_a_packed_batch_gives_back_every_column_with_its_dtype_and_shape():
    batch = {"input_ids": torch.arange(15, dtype=torch.long).reshape(3, 5),
             "perm_mask": torch.rand(3, 5, 5),  # XLNet's 2-D float columns
             "flags": torch.tensor([True, False, True]),
             "half": torch.randn(3, 2, dtype=torch.bfloat16),
             "sample_id": torch.tensor([7, 8, 9], dtype=torch.int32)}
    packed = PackedBatch.pack(batch)
    assert packed.rows == 3 and packed.buffer.dtype == torch.uint8 and packed.buffer.dim() == 1
    out = packed.unpack()
    assert list(out) == list(batch)
    for key, value in batch.items():
        assert out[key].dtype == value.dtype and out[key].shape == value.shape and torch.equal(out[key], value), key
    # One block: every column is a view of the same buffer.
    assert {v.untyped_storage().data_ptr() for v in out.values()} == {packed.buffer.untyped_storage().data_ptr()}


def test_a_small_batch_crosses_the_pipe_as_bytes_and_a_large_one_as_shared_memory():
    """What a loader worker sends: the batch's bytes below INLINE_BATCH_BYTES, one shared-memory block above it."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    small = PackedBatch.pack({"input_ids": torch.arange(4 * 128).reshape(4, 128), "flags": torch.ones(4, dtype=torch.bool)})
    sent = bytes(ForkingPickler.dumps(small))
    assert len(sent) > small.buffer.numel()  # the data itself travels in the message
    back = pickle.loads(sent)
    assert not back.buffer.is_shared() and back.rows == 4
    assert torch.equal(back.unpack()["input_ids"], torch.arange(4 * 128).reshape(4, 128))
    back.unpack()["input_ids"][0, 0] = -1  # a writable copy, as a shared block is
    large = PackedBatch.pack({"input_ids": torch.zeros(INLINE_BATCH_BYTES // 8 + 1, dtype=torch.long)})
    rebuild, (buffer, _, _, _) = large.__reduce__()
    assert rebuild is PackedBatch and buffer is large.buffer  # the tensor itself: the DataLoader shares its memory


def test_auto_loader_workers_are_one_on_a_cpu_and_up_to_four_beside_a_gpu():
    from core.config_io import load_config
    from core.errors import ConfigError
    from data_pipeline.loader import cpus_per_rank, loader_workers
    from pretrain.config import RunConfig

    assert loader_workers("auto", gpu=False, cpus=64) == 1  # the training process needs the cores
    assert [loader_workers("auto", gpu=True, cpus=c) for c in (1, 2, 3, 5, 8, 96)] == [1, 1, 2, 4, 4, 4]
    assert loader_workers(0, gpu=True, cpus=8) == 0 and loader_workers(6, gpu=False, cpus=2) == 6
    # torchrun: a machine's ranks share one affinity; srun, a task per rank with --cpus-per-task: CPUs of its own.
    torchrun = {"RANK": "3", "WORLD_SIZE": "8"}
    assert cpus_per_rank(cpus=16, local_ranks=2, environ=torchrun) == 8
    assert cpus_per_rank(cpus=96, local_ranks=8, environ=torchrun) == 12
    assert cpus_per_rank(cpus=3, local_ranks=8, environ=torchrun) == 1
    srun = {"RANK": "11", "WORLD_SIZE": "16", "SLURM_PROCID": "11", "SLURM_NTASKS": "16", "SLURM_CPUS_PER_TASK": "8"}
    assert cpus_per_rank(cpus=8, local_ranks=8, environ=srun) == 8
    assert cpus_per_rank(cpus=96, local_ranks=8, environ=srun) == 12  # SLURM did not bind the task to its CPUs
    # torchrun's 8 ranks inside one SLURM task of 8 CPUs share them.
    inside = {"RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "8"}
    assert cpus_per_rank(cpus=8, local_ranks=8, environ=inside) == 1
    for bad, message in (("-1", "must be auto or >= 0, got -1"), ("lots", "expected 'auto' or an int, got 'lots'")):
        with pytest.raises(ConfigError, match=message):
            load_config(RunConfig, None, [f"data.num_workers={bad}"])


def test_a_dataset_s_shared_memory_is_released_on_request(dataset):
    """A rank that leaves without exit handlers (a lost peer) unlinks its datasets' shared memory itself."""
    from core.shared_memory import SHM_DIR
    from data_pipeline.loader import build_dataset, release_shared_memory

    opened = build_dataset(LoaderConfig(path=str(dataset)), "train", batch_size=4)
    names = sorted(p.name for p in SHM_DIR.glob(f"{opened._shm_prefix_int:06}_*"))
    assert len(names) >= 4 and any(n.endswith("_barrier") for n in names), names
    assert set(names) <= set(release_shared_memory())
    assert not list(SHM_DIR.glob(f"{opened._shm_prefix_int:06}_*"))


def test_a_loader_s_start_watch_gives_its_pipe_back_with_the_loader(dataset):
    """Each loader with workers holds a pipe for its StartWatch: a process that builds loaders again and again (runs
    in a notebook, the tests' processes) ran out of descriptors below 1024 before."""
    import gc

    loader = build_loader(LoaderConfig(path=str(dataset), num_workers=1), "train", 4,
                          collate_fn=MaskingCollate(_masking(), pad_id=0, seed=5))
    fds = (loader.start_watch.read_fd, loader.start_watch.started_fd)
    os.fstat(fds[0])
    del loader
    gc.collect()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
