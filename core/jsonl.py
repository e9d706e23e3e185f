"""JSON-lines files the trainer appends to and reads back on resume (metrics, the sample audit, branches).

A process killed while appending can leave its last line cut short: readers skip a last line without its newline,
which holds a row never completely written (the step it belonged to is redone after the resume).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.atomic_files import write_text_atomic
from core.errors import CheckpointError


def complete_lines(path: Path) -> list[str]:
    """The file's complete lines (each with its newline), blank ones left out; [] when there is no file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is damaged (not UTF-8 at byte {exc.start}): move it aside to go on "
                              "without its rows") from exc
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # cut short by a kill mid-append
    return [line for line in lines if line.strip()]


def cut_partial_line(path: Path) -> None:
    """Cut off a last line a kill cut short (no newline), so that what is appended next starts a line of its own."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() == 0:
                return
            fh.seek(-1, 2)
            if fh.read(1) == b"\n":
                return
    except FileNotFoundError:
        return
    data = path.read_bytes()
    with open(path, "r+b") as fh:
        fh.truncate(data.rfind(b"\n") + 1)


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one row as a line; a last line a kill cut short is cut off first, so the row starts a line of its own."""
    cut_partial_line(path)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def rewind_jsonl(path: Path, step: int) -> list[dict[str, Any]]:
    """Keep the rows up to `step` (their "step" key), the lines as they were, rewritten whole; every complete row
    read, the later ones too. Nothing is written where there is no file."""
    path = Path(path)
    lines = complete_lines(path)
    rows = _rows(path, lines)
    if path.is_file():
        write_text_atomic(path, "".join(line for line, row in zip(lines, rows) if row["step"] <= step))
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, a last line cut short by a kill left out; [] when there is no file."""
    return _rows(path, complete_lines(path))


def _rows(path: Path, lines: list[str]) -> list[dict[str, Any]]:
    """Each complete line parsed; a line that is no JSON object means the file was damaged, not cut short."""
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            row = exc
        if not isinstance(row, dict):
            raise CheckpointError(f"{path} is damaged (its row {number} is not a JSON object): move it aside to go on "
                                  "without its rows")
        rows.append(row)
    return rows
