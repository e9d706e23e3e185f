"""A launch hashes only the shard files that changed since they were checked (data_pipeline/shard_record.py)."""
import json
import os
import shutil

import pytest
from conftest import prepare_corpus

from data_pipeline.dataset_dir import DatasetDir
from data_pipeline.shard_record import RECORD, verify_split_once
from data_pipeline.shards import CorruptShardError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus_file):
    """A dataset of this module's own: reading the shared one (another test of this worker may have) leaves
    decompressed copies of its shards beside them, which count as files of the split."""
    return prepare_corpus(tmp_path_factory.mktemp("own") / "data", corpus_file)


@pytest.fixture
def split(prepared, tmp_path):
    """A copy of the prepared dataset's train split, without its record."""
    out = shutil.copytree(DatasetDir(prepared).split("train"), tmp_path / "train")
    (out / RECORD).unlink(missing_ok=True)
    return out


def _files(split) -> list:
    return [p for p in sorted(split.rglob("*.mds*"))]


def test_prepare_records_its_shards_and_a_launch_trusts_them(prepared):
    record = json.loads((DatasetDir(prepared).split("train") / RECORD).read_text())["files"]
    shards = _files(DatasetDir(prepared).split("train"))
    assert shards and sorted(record) == sorted(str(p.relative_to(DatasetDir(prepared).split("train"))) for p in shards)
    assert verify_split_once(DatasetDir(prepared).split("train")) == (len(shards), 0)


def test_only_what_changed_is_hashed_again_and_damage_is_refused(split):
    files = _files(split)
    assert verify_split_once(split) == (len(files), len(files))  # no record: every file, once
    assert verify_split_once(split) == (len(files), 0)
    os.utime(files[0], ns=(files[0].stat().st_atime_ns, files[0].stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert verify_split_once(split) == (len(files), 1)
    body = bytearray(files[0].read_bytes())
    body[len(body) // 2] ^= 0xFF
    files[0].write_bytes(bytes(body))
    with pytest.raises(CorruptShardError, match="does not match its recorded hash"):
        verify_split_once(split)
    with pytest.raises(CorruptShardError):  # and it is not recorded as checked
        verify_split_once(split)


def test_a_split_whose_record_cannot_be_written_keeps_it_in_the_users_cache(split, tmp_path, monkeypatch):
    """A read-only dataset (a protected shared copy): the record goes to the user's cache. Root writes through a
    folder's mode bits, so the write is made to fail by a folder in the record's place."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = _files(split)
    (split / RECORD).mkdir()
    assert verify_split_once(split) == (len(files), len(files))
    assert verify_split_once(split) == (len(files), 0)
    assert (split / RECORD).is_dir() and len(list((tmp_path / "cache").rglob("*.json"))) == 1
