"""Our MDS writer against streaming's own MDSWriter: the same files, byte for byte, for every packer's columns."""
import json

import numpy as np
import pytest

from core.errors import ConfigError
from data_pipeline.mds import MDSShardWriter, check_compression, merge_indexes
from data_pipeline.packing import DocumentPacker, FullPacker, PairPacker
from data_pipeline.dataset_dir import DatasetDir


def _samples(columns: dict[str, str], n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.choice([1, 7, 255, 256, 300]))  # shapes on both sides of the uint8 shape limit
        sample = {}
        for name, enc in columns.items():
            if enc.startswith("ndarray:"):
                sample[name] = rng.integers(0, 250, size=length).astype(enc.split(":")[1])
            else:
                sample[name] = int(rng.integers(-2**31, 2**31))
        out.append(sample)
    return out


def _columns(packer) -> dict[str, str]:
    return {k: ("ndarray:uint16" if k == "input_ids" else ("ndarray:uint8" if v == "ndarray" else v)) for k, v in packer.columns.items()}


@pytest.mark.parametrize("packer", [FullPacker, DocumentPacker, PairPacker], ids=lambda p: p.__name__)
@pytest.mark.parametrize("compression", [None, "zstd", "zstd:7"])
def test_same_bytes_as_streaming(tmp_path, packer, compression):
    from streaming import MDSWriter

    columns = _columns(packer)
    samples = _samples(columns, 300, seed=len(columns))
    size_limit = 20_000  # several shards, the last one partial
    with MDSWriter(out=str(tmp_path / "theirs"), columns=columns, compression=compression, hashes=["sha1", "xxh64"],
                   size_limit=size_limit) as theirs:
        for s in samples:
            theirs.write(s)
    ours = MDSShardWriter(tmp_path / "ours", columns, compression, size_limit)
    for s in samples:
        ours.write(s)
    ours.finish()
    names = sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert len(names) > 3 and names == sorted(p.name for p in (tmp_path / "ours").iterdir())
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name


def test_merged_index_reads_back_in_part_order(tmp_path):
    from streaming import StreamingDataset

    from data_pipeline.loader import shared_memory_registration

    columns = {"input_ids": "ndarray:uint16"}
    expected = []
    for part in range(3):
        w = MDSShardWriter(tmp_path / "train" / f"part-{part:05d}", columns, "zstd", 500)
        for i in range(40):
            ids = np.full(5 + i % 9, part * 1000 + i, dtype=np.uint16)
            w.write({"input_ids": ids})
            expected.append(ids.tolist())
        w.finish()
    assert merge_indexes(tmp_path / "train", [f"part-{p:05d}" for p in range(3)]) > 3
    with shared_memory_registration():
        ds = StreamingDataset(local=str(tmp_path / "train"), shuffle=False, batch_size=1)
    assert [ds[i]["input_ids"].tolist() for i in range(ds.num_samples)] == expected
    index = json.loads((DatasetDir(tmp_path).index("train")).read_text())
    assert index["shards"][0]["zip_data"]["basename"].startswith("part-00000/shard.00000.mds")


@pytest.mark.parametrize("bad", ["gz", "zstd:0", "zstd:fast", "brotli"])
def test_unsupported_compression_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="compression"):
        check_compression(bad)
