"""A shard that could not be brought into the cache, as the user reads it: a damaged one (streaming's checksum
failure) is removed from the cache and named by its bucket key, a full disk is the no-room line, a bug stays one."""
import errno

from core.errors import NoSpaceError
from data_pipeline.loader import shard_failure
from data_pipeline.shards import CorruptShardError

SHARD = "part-00000/shard.00000.mds.zstd"


def test_a_damaged_shard_in_a_relative_cache_is_removed_and_named_by_its_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for local in ("cache/train", str(tmp_path / "cache" / "train")):  # data.path relative, and absolute
        damaged = tmp_path / "cache" / "train" / SHARD
        damaged.parent.mkdir(parents=True, exist_ok=True)
        damaged.write_bytes(b"damaged")
        named = f"{local}/{SHARD}"  # streaming joins the stream's local folder and the shard's name
        error = shard_failure(ValueError(f"Checksum failure: {named}"), "s3://corpus/kjv/train", local)
        assert isinstance(error, CorruptShardError) and not damaged.exists(), local
        assert str(error).startswith(f"shard 's3://corpus/kjv/train/{SHARD}' does not match the hash in its index")


def test_a_full_cache_disk_is_the_no_room_line_and_a_bug_is_none(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache" / SHARD))
    error = shard_failure(full, "s3://corpus/kjv/train", str(tmp_path / "cache"))
    assert isinstance(error, NoSpaceError) and "No space left on device" in str(error) and SHARD in str(error)
    wrapped = RuntimeError("decompressing failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded", "x")
    assert isinstance(shard_failure(wrapped, "", "cache"), NoSpaceError)
    assert shard_failure(KeyError("column"), "s3://corpus/kjv/train", "cache") is None
