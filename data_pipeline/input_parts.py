"""Cut every source into parts that a worker reads on its own: byte ranges, row groups, or whole files.

Parts depend on the input alone (never on the number of workers or SLURM tasks), so the prepared
dataset is the same however many processes write it. A byte range always ends just after a document
separator (a blank line for paragraphs, a newline for lines and JSON lines), so reading the parts one
by one gives exactly the documents of reading the file whole.

What cannot be cut: compressed text files (.gz/.bz2/.xz: one part each), JSON that is not one object per
line, compressed JSON and other compressions (read whole through `datasets`), and hub datasets (one part, streamed).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from core.errors import InputDataError
from data_pipeline.config import PrepareConfig, SourceConfig
from data_pipeline.raw_text import hub_source_location, resolve_files

MIN_PART_BYTES = 4 << 20
MAX_PART_BYTES = 64 << 20  # a worker holds a part's text in memory (about 4x its bytes)
TARGET_PARTS = 256  # enough for 256 cores to share a corpus evenly, few enough to keep the index small
CODECS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
_SEPARATORS = {"paragraph": re.compile(rb"\n\r?\n"), "line": re.compile(rb"\n"), "jsonl": re.compile(rb"\n")}
_SCAN = 1 << 20


@dataclass(frozen=True)
class Part:
    """One independently readable piece of a source."""

    source: int
    path: str  # a file, or the hub dataset's name
    # text / jsonl: bytes [start, stop) of a file (with `codec`: the whole compressed file);
    # parquet: row groups [start, stop); datasets: the whole file or hub dataset through `datasets`.
    reader: str
    start: int = 0
    stop: int = -1
    codec: str | None = None


def part_size(cfg: PrepareConfig, total_bytes: int) -> int:
    """The configured part size, or one that cuts the corpus into about TARGET_PARTS parts."""
    if cfg.part_bytes:
        return cfg.part_bytes
    return int(min(MAX_PART_BYTES, max(MIN_PART_BYTES, total_bytes // TARGET_PARTS)))


def _next_cut(fh, pos: int, size: int, separator: re.Pattern) -> int:
    """The offset just after the first separator that starts at or after `pos` (the file's end if none)."""
    fh.seek(pos)
    base, buf = pos, b""
    while True:
        chunk = fh.read(_SCAN)
        if not chunk:
            return size
        buf += chunk
        match = separator.search(buf)
        if match:
            return base + match.end()
        base += len(buf) - 2  # a separator split by the chunk end is found in the next round
        buf = buf[-2:]


def _byte_ranges(path: str, size: int, step: int, separator: re.Pattern) -> list[tuple[int, int]]:
    cuts = [0]
    with open(path, "rb") as fh:
        while cuts[-1] + step < size:
            cuts.append(_next_cut(fh, cuts[-1] + step, size, separator))
    if cuts[-1] < size:
        cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def _is_json_lines(path: str) -> bool:
    """True when the file's first line is one JSON object (JSON lines); False for a JSON array or document."""
    with open(path, "rb") as fh:
        first = fh.readline(_SCAN).strip()
    if not first.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def _file_parts(index: int, source: SourceConfig, path: str, step: int) -> list[Part]:
    codec = CODECS.get(os.path.splitext(path)[1])
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
        groups, size, start = [], 0, 0
        for g in range(meta.num_row_groups):
            size += meta.row_group(g).total_byte_size
            if size >= step or g == meta.num_row_groups - 1:
                groups.append(Part(index, path, "parquet", start, g + 1))
                start, size = g + 1, 0
        return groups or [Part(index, path, "parquet", 0, 0)]
    if source.kind == "json":
        if codec or not _is_json_lines(path):  # a compressed file may hold a JSON array: `datasets` reads both
            return [Part(index, path, "datasets")]
        mode = "jsonl"
    else:
        mode = source.text_documents
    if codec or mode == "document":
        return [Part(index, path, "text", codec=codec)]
    if os.path.splitext(path)[1] in (".zst", ".zstd", ".lz4", ".zip"):
        return [Part(index, path, "datasets")]
    ranges = _byte_ranges(path, os.path.getsize(path), step, _SEPARATORS[mode])
    return [Part(index, path, "jsonl" if source.kind == "json" else "text", a, b) for a, b in ranges]


def plan_parts(cfg: PrepareConfig) -> tuple[list[Part], int]:
    """Every source's parts (in source order, then file order, then position in the file) and the part size."""
    files = [[] if s.kind == "hub" else resolve_files(s.path) for s in cfg.sources]
    total = sum(os.path.getsize(f) for group in files for f in group)
    step = part_size(cfg, total)
    parts: list[Part] = []
    for index, (source, group) in enumerate(zip(cfg.sources, files)):
        if source.kind == "hub":  # read whole; a missing folder or an unreachable hub is named before any work
            parts.append(Part(index, hub_source_location(source), "datasets"))
            continue
        for path in group:
            try:
                parts.extend(_file_parts(index, source, path, step))
            except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
                raise InputDataError(f"could not read '{path}': {exc}") from exc
    return parts, step
