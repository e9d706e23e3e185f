"""Write packed sequences as MDS shards, and publish a finished dataset folder atomically."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

MANIFEST = "manifest.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every token id (halves shard size for vocabularies < 65536)."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


class SplitWriter:
    """Writes one split's packed sequences to MDS shards, numbering them with a `sample_id`."""

    def __init__(self, out_dir: Path, dtype: np.dtype, compression: str | None, size_limit: int) -> None:
        from streaming import MDSWriter

        self.dtype = dtype
        self.sequences = 0
        self.tokens = 0
        columns = {"input_ids": f"ndarray:{dtype.name}", "sample_id": "int64"}
        self._writer = MDSWriter(
            out=str(out_dir), columns=columns, compression=compression, hashes=["sha1", "xxh64"], size_limit=size_limit
        )

    def write(self, seq: np.ndarray) -> None:
        """Append one sequence."""
        self._writer.write({"input_ids": seq.astype(self.dtype), "sample_id": self.sequences})
        self.sequences += 1
        self.tokens += len(seq)

    def close(self) -> dict[str, int]:
        """Finish the shards and index; return the split's counts."""
        self._writer.finish()
        return {"sequences": self.sequences, "tokens": self.tokens}


def check_overwrite(final_dir: Path, overwrite: bool) -> None:
    """Refuse to clobber an existing output unless asked."""
    if final_dir.exists() and not overwrite:
        raise FileExistsError(f"output folder '{final_dir}' already exists; pass --overwrite to replace it")


def prepare_output(final_dir: Path, overwrite: bool) -> Path:
    """Refuse to clobber an existing output unless asked; return a fresh temporary folder beside it."""
    check_overwrite(final_dir, overwrite)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(f".{final_dir.name}.tmp-{os.getpid()}-{int(time.time())}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def publish(tmp_dir: Path, final_dir: Path) -> None:
    """Swap a finished temporary folder into place; an old dataset is removed only after that."""
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
        final_dir.rename(old)
        tmp_dir.rename(final_dir)
        shutil.rmtree(old)
    else:
        tmp_dir.rename(final_dir)


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json (what was built, from what, and how)."""
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """Read a prepared dataset's manifest, with a clear error when the folder is not one."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"'{data_dir}' is not a prepared dataset (no {MANIFEST}); run `python -m data_pipeline prepare` first"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"'{path}' is corrupt: {exc}") from exc
