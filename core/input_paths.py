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


def check_input_folder(path: str | Path, what: str, example: str = "") -> Path:
    """`path` as an absolute Path when it names a folder; MissingFileError when nothing is there, InputDataError for
    a file."""
    path = Path(path).expanduser()
    if path.is_file():
        hint = f" (e.g. one made by `{example}`)" if example else ""
        raise InputDataError(f"{what} '{path}' is a file; name a folder{hint}")
    if not path.is_dir():
        raise MissingFileError(f"{what} '{path}' does not exist")
    return path.resolve()


def hub_download_folder(path: str, what: str) -> Path | None:
    """The folder a hub dataset was downloaded to (absolute), when `path` names one; None for a hub id or URL.

    As in `datasets.load_dataset`, an existing folder wins over a hub id of the same name; the absolute path keeps a
    folder called like one of datasets' own loaders (`parquet`, `json`) from being read as that loader. A path that
    can only be a path (absolute, ./, ../, ~) and is not a folder is refused rather than asked of the hub."""
    if "://" in path:  # hf://datasets/..., s3://...: datasets reads these itself
        return None
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if folder.exists():
        raise InputDataError(f"{what} '{path}' is a file; name a hub dataset id or the folder it was downloaded to")
    if folder.is_absolute() or path.startswith((".", "~")):
        raise MissingFileError(f"{what} folder '{path}' does not exist")
    return None
