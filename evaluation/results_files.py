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


def written_here(json_path: Path) -> bool:
    """Whether `json_path` is a results JSON an evaluation command wrote."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("written_by") == WRITTEN_BY
