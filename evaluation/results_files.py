"""The files the evaluation commands write: each results JSON names the command that wrote it, so that `--overwrite`
replaces an earlier result and never a file of another kind (a model's config.json, a task file, a manifest)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.atomic_files import write_text_atomic

WRITTEN_BY = "contrastive-pretrain evaluation"


def write_results_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """`payload` as indented JSON at `path` (written whole or not at all), marked as this tool's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"written_by": WRITTEN_BY, **payload}, indent=2) + "\n")
    return path


# What each command's results JSON held before it said who wrote it (linear-probe, fine-tuning, self-similarity,
# sentence embeddings, a linear probe's per-model file): --overwrite replaces these too.
EARLIER_SHAPES = ({"config", "results"}, {"seeds", "summary", "majority_baseline"}, {"self_similarity", "by_label"},
                  {"results", "table", "tasks"}, {"probes", "majority_baseline"})
# Larger than any results JSON: not read to find out (`--out` may name a model's weights by mistake).
LARGEST_RESULTS_BYTES = 64 << 20


def written_here(json_path: Path) -> bool:
    """Whether `json_path` is a results JSON an evaluation command wrote (now, or before it said so)."""
    try:
        if json_path.stat().st_size > LARGEST_RESULTS_BYTES:
            return False
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    return data.get("written_by") == WRITTEN_BY or any(shape <= data.keys() for shape in EARLIER_SHAPES)
