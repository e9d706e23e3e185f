"""Raw text in, documents out: local text/json/parquet files or hub datasets, read with `datasets` streaming."""
from __future__ import annotations

import codecs
import glob
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlparse

from core.errors import InputDataError, SetupError
from core.input_paths import check_input_file, hub_download_folder
from data_pipeline.config import SourceConfig

if TYPE_CHECKING:  # input_parts imports this module
    from data_pipeline.input_parts import Part

REPLACEMENT_CHAR = "\ufffd"


@dataclass
class ReadStats:
    """Counts gathered while reading, for the manifest."""

    documents: int = 0
    characters: int = 0
    replaced_characters: int = 0


def resolve_files(spec: str) -> list[str]:
    """Expand a file, glob, or comma-separated list of them; a name that matches nothing is an error."""
    files: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if any(ch in part for ch in "*?["):
            matched = sorted(glob.glob(part, recursive=True))
            # A recursive pattern matches folders too; only files are read.
            matched_files = [m for m in matched if Path(m).is_file()]
            if not matched_files:
                folders = f" (only the folder(s) {matched[:3]}; add a file pattern such as '/*.txt')" if matched else ""
                raise InputDataError(f"no file matches the pattern '{part}'{folders}")
            files.extend(matched_files)
        else:
            check_input_file(part, "input file", example="*.txt")
            files.append(part)
    return files


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face endpoint answers a TCP connect (avoids datasets' 20-second retry loop)."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_source_location(source: SourceConfig) -> str:
    """Where a hub source is read from: the folder it was downloaded to, or its hub id when the hub answers."""
    folder = hub_download_folder(source.path, "hub dataset")
    if folder is not None:
        return str(folder)
    if not hub_reachable():
        raise SetupError(
            f"hub dataset '{source.path}' cannot be reached (offline?), and no folder '{source.path}' is here. Download "
            "it where the network is "
            f"(hf download {source.path} --repo-type dataset --local-dir DIR) and set its path to DIR, or pass "
            "local files instead: sources: [{kind: json|parquet|text, path: 'dir/*.parquet'}]"
        )
    return source.path


def _decompression_errors() -> tuple[type[BaseException], ...]:
    """What the standard library's decompressors raise for a truncated or damaged file (gzip's BadGzipFile is an
    OSError; the others are not)."""
    import lzma
    import zlib

    return EOFError, zlib.error, lzma.LZMAError


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a file or hub dataset through `datasets` raises for bad input (not for a bug)."""
    import datasets.exceptions
    import pyarrow

    return (OSError, ValueError, datasets.exceptions.DatasetsError, pyarrow.ArrowException, *_decompression_errors())


def _load(source: SourceConfig, location: str, encoding_errors: str):
    """`location` (a file, or a hub source's folder or id, as `hub_source_location` gave it) as a streamed dataset."""
    import datasets

    if source.kind == "hub":
        try:
            return datasets.load_dataset(location, source.name, split=source.split, streaming=True)
        except _read_errors() as exc:  # datasets raises many types here; all mean the same to the user
            named = f" ({source.name})" if source.name else ""
            raise InputDataError(f"hub dataset '{source.path}'{named} could not be loaded: {exc}") from exc
    kwargs = {}
    if source.kind == "text":
        kwargs = {"sample_by": source.text_documents, "encoding_errors": encoding_errors}
    return datasets.load_dataset(source.kind, data_files=[location], split="train", streaming=True, **kwargs)


def _not_utf8(path: str, kind: str, exc: UnicodeDecodeError | None = None, where: str | None = None) -> InputDataError:
    """The error for bytes that are not UTF-8, naming the file, the offset and the bytes when known."""
    detail = ""
    if exc is not None:
        detail = f" ({where or f'byte {exc.start}'}: {exc.object[exc.start:exc.start + 4]!r})"
    advice = ("fix the file or set encoding_errors=replace" if kind in ("text", "json") else
              f"fix the file (encoding_errors=replace applies to text and JSON-lines sources, not {kind})")
    return InputDataError(f"'{path}' is not valid UTF-8{detail}; {advice}")


# The files of a downloaded folder `datasets` decodes as text (a README, an image or a parquet file it does not).
_TEXT_DATA = {".txt", ".text", ".json", ".jsonl", ".csv", ".tsv"}


def _first_non_utf8(folder: Path) -> tuple[Path, int, UnicodeDecodeError] | None:
    """The first file of a downloaded hub folder (sorted, hidden ones skipped) that is not UTF-8: the file, the
    offset of the first bad byte and the error; None when every text file decodes (the bad bytes were elsewhere)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_DATA
                   and not any(n.startswith(".") for n in p.relative_to(folder).parts))
    for path in files:
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                held = len(decoder.getstate()[0])  # bytes of a character the previous chunk ended inside
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return path, offset - held + exc.start, exc
                offset += len(chunk)
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                return path, offset - len(exc.object) + exc.start, exc
    return None


def _not_utf8_in(part, kind: str, exc: UnicodeDecodeError | None = None) -> InputDataError:
    """`_not_utf8` for a part; for a hub source read from a folder, the file in it that holds the bad bytes."""
    folder = Path(part.path)
    if kind == "hub" and folder.is_dir() and (found := _first_non_utf8(folder)) is not None:
        path, offset, first = found
        return _not_utf8(str(path), kind, first, f"byte {offset}")
    return _not_utf8(part.path, kind, exc)


def _check_text(where: str, row: dict, column: str) -> str:
    if column not in row:
        raise InputDataError(f"'{where}' has no column '{column}' (columns: {sorted(row)}); set sources[].text_column")
    text = row[column]
    if not isinstance(text, str):
        raise InputDataError(f"'{where}': column '{column}' holds {type(text).__name__}, not text")
    return text


def _read_bytes(part) -> bytes:
    if part.codec:
        import bz2
        import gzip
        import lzma

        opener = {"gzip": gzip.open, "bz2": bz2.open, "lzma": lzma.open}[part.codec]
        with opener(part.path, "rb") as fh:
            return fh.read()
    with open(part.path, "rb") as fh:
        fh.seek(part.start)
        return fh.read(part.stop - part.start if part.stop >= 0 else -1)


def _decode(part, data: bytes, source: SourceConfig, encoding_errors: str) -> str:
    try:
        text = data.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as exc:
        where = f"byte {part.start + exc.start}" if not part.codec else f"byte {exc.start} after decompression"
        raise _not_utf8(part.path, source.kind, exc, where) from exc
    if "\r" in text:  # universal newlines, as `datasets` and open() read text
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _raw_documents(source: SourceConfig, part, encoding_errors: str) -> Iterator[str]:
    """A part's documents before stripping: text pieces, JSON-lines rows, parquet rows, or `datasets` rows."""
    if part.reader == "text":
        text = _decode(part, _read_bytes(part), source, encoding_errors)
        if source.text_documents == "document":
            yield text
        else:
            yield from text.split("\n\n" if source.text_documents == "paragraph" else "\n")
    elif part.reader == "jsonl":
        text = _decode(part, _read_bytes(part), source, encoding_errors)
        for number, line in enumerate(text.split("\n")):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputDataError(f"'{part.path}': line {number + 1} of the part at byte {part.start} is not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise InputDataError(f"'{part.path}': line {number + 1} of the part at byte {part.start} is not a JSON object")
            yield _check_text(part.path, row, source.text_column)
    elif part.reader == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(part.path)
        if source.text_column not in pf.schema_arrow.names:
            raise InputDataError(f"'{part.path}' has no column '{source.text_column}' (columns: {sorted(pf.schema_arrow.names)}); "
                                 "set sources[].text_column")
        if part.stop > part.start:
            column = pf.read_row_groups(list(range(part.start, part.stop)), columns=[source.text_column]).column(0)
            for value in column.to_pylist():
                yield _check_text(part.path, {source.text_column: value}, source.text_column)
    else:
        dataset = _load(source, part.path, encoding_errors)
        for row in dataset:
            yield _check_text(part.path, row, source.text_column)


def iter_part(source: SourceConfig, part: Part, encoding_errors: str, stats: ReadStats) -> Iterator[str]:
    """Yield the non-empty, stripped documents of one part, in order."""
    try:
        for text in _raw_documents(source, part, encoding_errors):
            text = text.strip()
            if not text:
                continue
            stats.documents += 1
            stats.characters += len(text)
            stats.replaced_characters += text.count(REPLACEMENT_CHAR)
            yield text
    except UnicodeDecodeError as exc:  # raised inside `datasets`
        raise _not_utf8_in(part, source.kind, exc) from exc
    except InputDataError:
        raise
    except _decompression_errors() as exc:  # read here or inside `datasets`: either way the file is damaged
        raise InputDataError(f"'{part.path}' is truncated or corrupt ({type(exc).__name__}: {exc}); "
                             "replace it with a complete copy") from exc
    except _read_errors() as exc:  # anything else is a bug and keeps its traceback
        if isinstance(exc.__cause__, UnicodeDecodeError) or "codec can't decode" in str(exc):
            raise _not_utf8_in(part, source.kind) from exc
        raise InputDataError(f"could not read '{part.path}' as {source.kind}: {exc}") from exc
