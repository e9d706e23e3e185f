"""Write packed sequences as MDS shards, check them against their hashes, and keep the manifest."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.atomic_files import write_text_atomic
from core.errors import InputDataError, MissingFileError
from data_pipeline.dataset_dir import INDEX, MANIFEST



def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every token id (halves shard size for vocabularies < 65536)."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


class SplitWriter:
    """Writes one split's samples to MDS shards (zstd, sha1 + xxh64 hashes)."""

    def __init__(self, out_dir: Path, columns: dict[str, str], dtype: np.dtype, compression: str | None, size_limit: int) -> None:
        from data_pipeline.mds import MDSShardWriter

        self.dtype = dtype
        self.sequences = 0
        self.tokens = 0
        # Token arrays get the vocabulary's dtype; the other columns keep theirs.
        self.columns = {k: (f"ndarray:{dtype.name}" if k == "input_ids" else ("ndarray:uint8" if v == "ndarray" else v))
                        for k, v in columns.items()}
        self._writer = MDSShardWriter(out_dir, self.columns, compression, size_limit)

    def write(self, sample: dict[str, Any]) -> None:
        """Append one sample."""
        ids = np.asarray(sample["input_ids"]).astype(self.dtype)
        self._writer.write({**sample, "input_ids": ids})
        self.sequences += 1
        self.tokens += len(ids)

    def write_rows(self, rows: np.ndarray) -> None:
        """Append each row of a 2-D token array as one sample (a writer whose only column is input_ids)."""
        self._writer.write_rows(rows.astype(self.dtype, copy=False))
        self.sequences += len(rows)
        self.tokens += rows.size

    def close(self) -> dict[str, int]:
        """Finish the shards and index; return the split's counts."""
        self._writer.finish()
        return {"sequences": self.sequences, "tokens": self.tokens}


class CorruptShardError(InputDataError):
    """A shard's bytes do not match the hash recorded when it was written."""


def shard_files(split_dir: Path) -> tuple[int, list[tuple[Path, Optional[str]]]]:
    """A split's shard count and every shard file its index names that must be there, with its xxh64 (None when the
    index records none); a missing index or file is refused."""
    index_path = split_dir / INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptShardError(f"shard index '{index_path}' is missing or corrupt: {exc}") from exc
    files = []
    for shard in index["shards"]:
        for part in ("zip_data", "raw_data"):
            info = shard.get(part)
            if not info:
                continue
            path = split_dir / info["basename"]
            if not path.is_file():
                if part == "raw_data" and shard.get("zip_data"):
                    continue  # only the compressed file is kept until streaming unpacks it
                raise CorruptShardError(f"shard '{path}' is missing")
            files.append((path, info.get("hashes", {}).get("xxh64")))
    return len(index["shards"]), files


def check_shard(path: Path, expected: Optional[str]) -> None:
    """Refuse a shard file whose bytes do not match its xxh64."""
    import xxhash

    if expected is not None and xxhash.xxh64(path.read_bytes()).hexdigest() != expected:
        raise CorruptShardError(f"shard '{path}' does not match its recorded hash (corrupt or modified)")


def verify_split(split_dir: Path) -> int:
    """Check every shard file of a split against the xxh64 hashes in its index; return the shard count."""
    count, files = shard_files(split_dir)
    for path, expected in files:
        check_shard(path, expected)
    return count


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json (what was built, from what, and how)."""
    write_text_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def data_fingerprint(manifest: dict[str, Any]) -> str:
    """What identifies a prepared dataset's contents, wherever it lies: tokenizer, shape, counts per split and source
    (not the paths, the date or the command, which differ for the same data moved or prepared again)."""
    sources = [{k: v for k, v in s.items() if k != "path"} for s in manifest.get("sources", [])]
    identity = {key: manifest.get(key) for key in ("seq_len", "packing", "pair_task", "token_dtype", "splits",
                                                   "replaced_characters")}
    identity.update(tokenizer=manifest.get("tokenizer", {}).get("hash"), sources=sources)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Read a prepared dataset's manifest, with a clear error when the folder is not one."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise MissingFileError(
            f"'{data_dir}' is not a prepared dataset (no {MANIFEST}); run `python -m data_pipeline prepare` first"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputDataError(f"'{path}' is corrupt: {exc}; prepare the dataset again") from exc
    # The names are joined into local paths (a remote dataset's cache among them): one that climbs out is refused.
    names = [*manifest.get("tokenizer", {}).get("files", []), *manifest.get("splits", {})]
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise InputDataError(f"'{path}' names a file or split {name!r} that is not a plain file name; "
                                 "prepare the dataset again")
    return manifest

