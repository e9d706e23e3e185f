"""What tests/process/test_transformers_versions.py runs under transformers 4.57, in one process: a start-up of torch,
transformers and DeepSpeed once instead of once per part.

In turn: the compatibility subset through pytest (first, so that its tests see an interpreter no other part has
used); the exports written under 5.x read, and this major's written (tests/helpers/export_roundtrip.py); a run with
relative positions trained and exported through the command's `main`. pytest's output and the run's log go to
stdout as they come; the last line is a JSON report with each part's outcome (a part that raises records its
traceback, and the parts after it still run), so one part's failure fails only the test that reads it.

Usage: python tests/helpers/on_transformers4.py SPEC.json
SPEC: {"subset": [pytest args], "read": DIR, "write": DIR, "prepared": DIR, "train": [argv], "export": [argv]}
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

SUBSET_END = "---- end of the compatibility subset ----"
TRAIN_MARK = "---- training with relative positions ----"


def _part(run) -> dict:
    """`run()`'s result, or the traceback it raised."""
    try:
        return {"result": run()}
    except BaseException:  # a SystemExit or an assertion is this part's outcome, not the process's
        return {"error": traceback.format_exc()}


def _subset(args: list[str]) -> int:
    import pytest

    # The suite's conftest may point TMPDIR (and inductor's cache) at a folder of its own and remove it at the end:
    # the parts after it run in this process's own environment, as their separate processes did.
    environ, tempdir = dict(os.environ), tempfile.tempdir
    try:
        return int(pytest.main(args))
    finally:
        print(SUBSET_END, flush=True)
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = tempdir


def _roundtrip(read: str, write: str, prepared: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import export_roundtrip

    return {"read": export_roundtrip.read(Path(read)), "written": export_roundtrip.write(Path(write), Path(prepared))}


def _train_and_export(train: list[str], export: list[str]) -> dict:
    from pretrain.cli import main

    print(TRAIN_MARK, flush=True)
    return {"train": main(train), "export": main(export)}


def main() -> None:
    """Run the parts in turn; print the report as the last line."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    report = {"subset": _part(lambda: _subset(spec["subset"]))}
    report["roundtrip"] = _part(lambda: _roundtrip(spec["read"], spec["write"], spec["prepared"]))
    report["relative"] = _part(lambda: _train_and_export(spec["train"], spec["export"]))
    sys.stdout.flush()
    print("\n" + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
