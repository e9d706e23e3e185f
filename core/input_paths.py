"""Input paths checked before they are read: a missing file and a folder where a file belongs are different mistakes,
and each gets its own line."""
from __future__ import annotations

from pathlib import Path

from core.errors import InputDataError, MissingFileError


def check_input_file(path: str | Path, what: str, example: str = "") -> Path:
    """`path` as a Path when it names a file; MissingFileError when nothing is there, InputDataError for a folder."""
    path = Path(path)
    if path.is_dir():
        hint = f" (e.g. '{path / example}')" if example else ""
        raise InputDataError(f"{what} '{path}' is a folder; name a file in it{hint}")
    if not path.is_file():
        raise MissingFileError(f"{what} '{path}' does not exist")
    return path
