"""Raw text in, documents out: local text/json/parquet files or hub datasets, read with `datasets` streaming."""
from __future__ import annotations

import glob
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from core.errors import InputDataError, SetupError
from data_pipeline.config import SourceConfig

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
            if not matched:
                raise InputDataError(f"no file matches the pattern '{part}'")
            files.extend(matched)
        elif not Path(part).is_file():
            raise InputDataError(f"input file not found: '{part}'")
        else:
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


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a file or hub dataset through `datasets` raises for bad input (not for a bug)."""
    import datasets.exceptions
    import pyarrow

    return OSError, ValueError, datasets.exceptions.DatasetsError, pyarrow.ArrowException


def _load(source: SourceConfig, data_files: str | None, encoding_errors: str):
    import datasets

    if source.kind == "hub":
        if not hub_reachable():
            raise SetupError(
                f"hub dataset '{source.path}' cannot be reached (offline?). Download it elsewhere and pass "
                "local files instead: sources: [{kind: json|parquet|text, path: 'dir/*.parquet'}]"
            )
        try:
            return datasets.load_dataset(source.path, source.name, split=source.split, streaming=True)
        except _read_errors() as exc:  # datasets raises many types here; all mean the same to the user
            raise InputDataError(f"hub dataset '{source.path}' ({source.name}) could not be loaded: {exc}") from exc
    kwargs = {}
    if source.kind == "text":
        kwargs = {"sample_by": source.text_documents, "encoding_errors": encoding_errors}
    return datasets.load_dataset(source.kind, data_files=[data_files], split="train", streaming=True, **kwargs)


def _utf8_advice(kind: str) -> str:
    if kind == "text":
        return "fix the file or set encoding_errors=replace"
    return f"fix the file (encoding_errors=replace applies to text sources only, not {kind})"


def iter_source(source: SourceConfig, encoding_errors: str, stats: ReadStats) -> Iterator[str]:
    """Yield the non-empty documents of one source, in order."""
    targets = [None] if source.kind == "hub" else resolve_files(source.path)
    for target in targets:
        where = target or source.path
        try:
            dataset = _load(source, target, encoding_errors)
            for row in dataset:
                if source.text_column not in row:
                    raise InputDataError(
                        f"'{where}' has no column '{source.text_column}' (columns: {sorted(row)}); "
                        "set sources[].text_column"
                    )
                text = row[source.text_column]
                if not isinstance(text, str):
                    raise InputDataError(f"'{where}': column '{source.text_column}' holds {type(text).__name__}, not text")
                text = text.strip()
                if not text:
                    continue
                stats.documents += 1
                stats.characters += len(text)
                stats.replaced_characters += text.count(REPLACEMENT_CHAR)
                yield text
        except UnicodeDecodeError as exc:
            raise InputDataError(
                f"'{where}' is not valid UTF-8 (byte {exc.start}: {exc.object[exc.start:exc.start + 4]!r}); "
                + _utf8_advice(source.kind)
            ) from exc
        except InputDataError:
            raise
        except _read_errors() as exc:  # anything else is a bug and keeps its traceback
            if isinstance(exc.__cause__, UnicodeDecodeError) or "codec can't decode" in str(exc):
                raise InputDataError(f"'{where}' is not valid UTF-8; " + _utf8_advice(source.kind)) from exc
            raise InputDataError(f"could not read '{where}' as {source.kind}: {exc}") from exc
