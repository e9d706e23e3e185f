"""JSON files of a user's folders (a dataset's index and manifest, a tokenizer's and a model's files, a DeepSpeed
config), read with one line naming the file when they cannot be (core/errors.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import InputDataError, UserError


def read_json(path: str | Path, what: str, advice: str, error: type[UserError] = InputDataError) -> Any:
    """The parsed JSON of `path`; one line, "{what} '{path}' ...; {advice}", when it cannot be read, is not UTF-8 or
    is not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:  # a ValueError too: named apart, "not UTF-8" says more than a JSON error
        raise error(f"{what} '{path}' is not UTF-8 (byte {exc.start}); {advice}") from exc
    except OSError as exc:
        raise error(f"{what} '{path}' cannot be read ({exc.strerror or exc}); {advice}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"{what} '{path}' is not valid JSON ({exc}); {advice}") from exc
