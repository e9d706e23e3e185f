"""The prepare worker pool: results in order, and `ahead` bounds what finished items occupy until they are handled."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from data_pipeline.worker_pool import WorkerPool



def _write(folder: str, i: int) -> int:
    """A part written to disk (a module-level function: it goes to a spawned worker)."""
    (Path(folder) / f"{i}.part").write_bytes(b"x" * 10)
    return i * i


@pytest.mark.parametrize("ahead", [None, 3])
def test_ahead_bounds_the_items_written_and_not_yet_handled(tmp_path, ahead):
    """Two workers write 12 items; `on_result` is slow (an upload) and removes the item's file. With ahead=3, never
    more than 3 files lie on disk; without it the workers run ahead and the disk holds most of them."""
    seen = []

    def handle(i: int, result: int) -> None:
        seen.append(len(list(tmp_path.glob("*.part"))))
        time.sleep(0.1)
        (tmp_path / f"{i}.part").unlink()

    with WorkerPool(2, str(tmp_path)) as pool:
        results = pool.map(_write, range(12), on_result=handle, ahead=ahead)
    assert results == [i * i for i in range(12)]
    if ahead is None:
        assert max(seen) >= 8, seen
    else:
        assert max(seen) <= 3, seen
