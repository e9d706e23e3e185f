"""Which local shard files were checked against their index's hashes, keyed by each file's size and modification time.

A launch (every requeue included) hashes only the files that changed since they were checked, so its cost does not
grow with the corpus: a 300 GB dataset on a shared file system costs a stat per file, not 300 GB of reads per node.
`prepare` writes the record for the shards it wrote (their hashes were computed from the bytes written); a dataset
without one (copied without it, prepared before it existed) is hashed whole once, on its first launch, and recorded.
The record lives in the split's folder, or, where that folder is read-only, in the user's cache.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from core.atomic_files import write_text_atomic
from data_pipeline.dataset_dir import SPLITS, DatasetDir
from data_pipeline.shards import check_shard, shard_files

RECORD = "verified.json"


def _cache_record(split_dir: Path) -> Path:
    """Where a read-only split's record goes: the user's cache, one file per split folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "contrastive-pretrain" / "verified"
    return cache / f"{hashlib.sha256(str(split_dir.resolve()).encode()).hexdigest()[:20]}.json"


def _read(path: Path) -> dict[str, list]:
    try:
        return json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _stamp(path: Path, expected: Optional[str]) -> list:
    """What the record keeps of a file: size, modification time (ns) and the hash it was checked against."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, expected]


def record_split(split_dir: Path, checked: Optional[dict[str, list]] = None) -> Path:
    """Write the record of a split (`checked`: name -> stamp; default every file as it is now, for `prepare`,
    which computed the hashes from the bytes it wrote); returns where it went."""
    split_dir = Path(split_dir)
    if checked is None:
        _, files = shard_files(split_dir)
        checked = {str(path.relative_to(split_dir)): _stamp(path, expected) for path, expected in files}
    text = json.dumps({"version": 1, "files": checked}, sort_keys=True) + "\n"
    target = split_dir / RECORD
    try:
        write_text_atomic(target, text)
    except OSError:  # a read-only dataset (a shared, protected copy)
        target = _cache_record(split_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, text)
    return target


def record_dataset(root: Path) -> None:
    """`record_split` for every split of a prepared dataset folder."""
    folder = DatasetDir(root)
    for split in SPLITS:
        if folder.index(split).is_file():
            record_split(folder.split(split))


def verify_split_once(split_dir: Path) -> tuple[int, int]:
    """Check the split's shard files that the record does not hold as they are now (all of them the first time)
    against the index's hashes, and record them; returns (files, files hashed now). A mismatch is refused
    (CorruptShardError) and not recorded."""
    split_dir = Path(split_dir)
    _, files = shard_files(split_dir)
    known = {**_read(_cache_record(split_dir)), **_read(split_dir / RECORD)}
    checked, hashed = {}, 0
    for path, expected in files:
        name, stamp = str(path.relative_to(split_dir)), _stamp(path, expected)
        if known.get(name) != stamp:
            check_shard(path, expected)
            hashed += 1
        checked[name] = stamp
    if hashed or set(checked) != set(known):
        record_split(split_dir, checked)
    return len(files), hashed
