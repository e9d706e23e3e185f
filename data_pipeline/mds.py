"""MDS shards written here, byte for byte what `streaming.MDSWriter` writes, without importing streaming.

Why not streaming's own writer: `import streaming` pulls in torch, transformers and scikit-learn, and its
per-sample encoding runs in Python. Every `prepare` worker and SLURM array task would pay both (BENCHMARKS.md,
"Data preparation throughput and scaling"). The format is small and
versioned (index version 2, the "mds" joint shard); `tests/unit/test_mds_writer.py` checks the bytes against
`streaming.MDSWriter` for every column the packers write, and the loader reads the result with
streaming itself.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from core.errors import ConfigError

from data_pipeline.dataset_dir import INDEX
HASHES = ("sha1", "xxh64")
_DTYPES = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}


def check_compression(compression: str | None) -> tuple[str | None, int]:
    """Parse `zstd` / `zstd:<level>` / None; anything else is a config error naming what is supported."""
    if compression is None:
        return None, 0
    name, _, level = compression.partition(":")
    if name != "zstd" or (level and not (level.isdigit() and 1 <= int(level) <= 22)):
        raise ConfigError(f"config key 'compression' must be auto, null, 'zstd' or 'zstd:<1-22>', got '{compression}'")
    return compression, int(level or 3)


def _encoder(encoding: str):
    """A function value -> bytes for one column, and the column's fixed size (None when variable)."""
    if encoding.startswith("ndarray:"):
        dtype = encoding.split(":")[1]
        if dtype not in _DTYPES or encoding.count(":") != 1:
            raise ValueError(f"unsupported MDS column encoding '{encoding}'")
        np_dtype = np.dtype(dtype)

        def encode_array(value: np.ndarray) -> bytes:
            # dtype fixed by the column, shape stored per sample: one byte (ndim << 2 | shape dtype),
            # the shape in the smallest unsigned type that holds it, then the values.
            if value.dtype != np_dtype:
                raise ValueError(f"column expects {np_dtype.name}, got {value.dtype.name}")
            return _shape_header(value.shape) + value.tobytes()

        return encode_array, None
    if encoding in _DTYPES:
        scalar = getattr(np, encoding)
        return (lambda value: scalar(value).tobytes()), np.dtype(encoding).itemsize
    raise ValueError(f"unsupported MDS column encoding '{encoding}'")


def _shape_header(shape: tuple[int, ...]) -> bytes:
    """The bytes before an ndarray's values when its dtype is fixed by the column (streaming's NDArray encoding)."""
    if not shape or min(shape) <= 0:
        raise ValueError(f"an MDS ndarray needs a shape of positive sizes, got {shape}")
    largest = max(shape)
    for code, (limit, shape_dtype) in enumerate(((1 << 8, np.uint8), (1 << 16, np.uint16), (1 << 32, np.uint32))):
        if largest < limit:
            break
    else:
        code, shape_dtype = 3, np.uint64
    return bytes([(len(shape) << 2) | code]) + np.asarray(shape, dtype=shape_dtype).tobytes()


def _hashes(data: bytes) -> dict[str, str]:
    return {"sha1": hashlib.sha1(data).hexdigest(), "xxh64": xxhash.xxh64(data).hexdigest()}


class MDSShardWriter:
    """Samples in, MDS shards and index.json out (compression zstd or none, sha1 + xxh64 hashes)."""

    def __init__(self, out_dir: Path, columns: dict[str, str], compression: str | None, size_limit: int) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.compression, self.level = check_compression(compression)
        self.size_limit = size_limit
        self.names = sorted(columns)
        self.encodings = [columns[n] for n in self.names]
        encoders = [_encoder(e) for e in self.encodings]
        self._encode = [fn for fn, _ in encoders]
        self.sizes = [size for _, size in encoders]
        self._variable = [i for i, size in enumerate(self.sizes) if size is None]
        self.config = {"version": 2, "format": "mds", "compression": self.compression, "hashes": list(HASHES),
                       "size_limit": size_limit, "column_names": self.names, "column_encodings": self.encodings,
                       "column_sizes": self.sizes}
        self._config_bytes = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.shards: list[dict[str, Any]] = []
        self._samples: list[bytes] = []
        self._size = 8 + len(self._config_bytes)

    def write(self, sample: dict[str, Any]) -> None:
        """Append one sample; a shard is flushed first when this sample would pass the size limit."""
        data = [fn(sample[name]) for fn, name in zip(self._encode, self.names)]
        head = np.asarray([len(data[i]) for i in self._variable], dtype=np.uint32).tobytes() if self._variable else b""
        self._append(head + b"".join(data))

    def write_rows(self, rows: np.ndarray) -> None:
        """Append each row of a 2-D array as one sample of the only column (the fast path for packed tokens)."""
        if len(self.names) != 1 or not self.encodings[0].startswith("ndarray:"):
            raise ValueError("write_rows needs a writer with one ndarray column")
        if rows.dtype.name != self.encodings[0].split(":")[1]:
            raise ValueError(f"column expects {self.encodings[0]}, got {rows.dtype.name}")
        if not len(rows):
            return
        header = _shape_header(rows.shape[1:])
        head = np.uint32(len(header) + rows.itemsize * rows.shape[1]).tobytes()
        for row in rows:
            self._append(head + header + row.tobytes())

    def _append(self, blob: bytes) -> None:
        if self.size_limit and self.size_limit < self._size + len(blob) + 4:
            self._flush()
        self._samples.append(blob)
        self._size += len(blob) + 4

    def _flush(self) -> None:
        n = len(self._samples)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self._samples], out=offsets[1:])
        offsets += 4 + 4 * (n + 1) + len(self._config_bytes)
        raw = np.uint32(n).tobytes() + offsets.astype(np.uint32).tobytes() + self._config_bytes + b"".join(self._samples)
        raw_name = f"shard.{len(self.shards):05}.mds"
        entry: dict[str, Any] = {"samples": n, "raw_data": {"basename": raw_name, "bytes": len(raw), "hashes": _hashes(raw)},
                                 "zip_data": None, **self.config}
        data, name = raw, raw_name
        if self.compression:
            import zstd  # streaming's own zstd binding: the same compressed bytes

            data, name = zstd.compress(raw, self.level), raw_name + ".zstd"
            entry["zip_data"] = {"basename": name, "bytes": len(data), "hashes": _hashes(data)}
        (self.out_dir / name).write_bytes(data)
        self.shards.append(entry)
        self._samples = []
        self._size = 8 + len(self._config_bytes)

    def finish(self) -> None:
        """Write the last shard and the index."""
        if self._samples:
            self._flush()
        with open(self.out_dir / INDEX, "w") as fh:
            json.dump({"version": 2, "shards": self.shards}, fh, sort_keys=True)


def merge_indexes(split_dir: Path, parts: list[str]) -> int:
    """Write `split_dir/index.json` listing the shards of each `split_dir/<part>/index.json`, in the given order."""
    shards = []
    for part in parts:
        for shard in json.loads((split_dir / part / INDEX).read_text())["shards"]:
            for key in ("raw_data", "zip_data"):
                if shard.get(key):
                    shard[key]["basename"] = f"{part}/{shard[key]['basename']}"
            shards.append(shard)
    tmp = split_dir / (INDEX + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"version": 2, "shards": shards}, fh, sort_keys=True)
    os.replace(tmp, split_dir / INDEX)
    return len(shards)
