"""A user's JSON file that cannot be read, is not UTF-8 or is not JSON: one line naming it, the advice, the error class."""
import pytest

from core.errors import CheckpointError, InputDataError
from core.json_file import read_json


def test_each_way_a_json_file_fails_is_one_line_naming_it(tmp_path):
    path = tmp_path / "listing.json"
    with pytest.raises(InputDataError, match=f"shard index '{path}' cannot be read \(No such file or directory\); prepare"):
        read_json(path, "shard index", "prepare it again")
    path.write_bytes(b'{"shards": "\xff"}')
    with pytest.raises(CheckpointError, match=f"shard index '{path}' is not UTF-8 \(byte 12\); prepare it again$"):
        read_json(path, "shard index", "prepare it again", CheckpointError)
    path.write_text('{"shards": [')
    with pytest.raises(InputDataError, match=f"shard index '{path}' is not valid JSON \(Expecting value: line 1"):
        read_json(path, "shard index", "prepare it again")
    path.write_text('{"shards": []}')
    assert read_json(path, "shard index", "prepare it again") == {"shards": []}
