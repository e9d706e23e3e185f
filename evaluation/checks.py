"""What the evaluation commands check before their work: that an export's tokenizer fits its model, and that an
output path can be written. Each refusal is one line naming the folder or path (core/errors.py)."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.atomic_files import check_folder_path
from core.errors import CheckpointError, ConfigError, OutputExistsError
from data_pipeline.tokenizer import check_tokenizer_folder
from evaluation.results_files import written_here
from model.backbones.base import check_model_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("pretrain.evaluation")


def export_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of an export whose files `check_model_folder` passed, refused when it has ids its model cannot embed."""
    from transformers import AutoTokenizer

    config = check_model_folder(model_dir, need_weights=True)
    # A folder with no tokenizer file gets, from transformers 5, a tokenizer of a handful of special tokens that maps
    # every word to [UNK]: evaluation would run on that without a word.
    check_tokenizer_folder(model_dir, advice="copy the tokenizer it was trained with into the folder")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab_size = config.get("vocab_size")
    # An id at or past vocab_size has no embedding row: torch stops with an IndexError that names nothing.
    if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
        raise CheckpointError(f"model '{model_dir}': its tokenizer has {len(tokenizer)} tokens but the model's vocab_size "
                              f"is {vocab_size}; the folder's tokenizer is not the one the model was trained with")
    return tokenizer


def usable_length(config: Any, max_length: int) -> int:
    """`max_length` cut to the positions the model has: a longer input has no position embedding to read. A model
    without a limit (XLNet: -1) takes it as it is."""
    positions = getattr(config, "max_position_embeddings", None)
    return min(max_length, positions) if isinstance(positions, int) and positions > 0 else max_length


def check_report_stem(out: str | Path, flag: str = "--out") -> Path:
    """An output path the report's files take their suffixes from (OUT.json, ...): it must end in a file name."""
    if not Path(out).name or str(out).endswith(("/", os.sep)):
        raise ConfigError(f"{flag} '{out}' names a folder; give a path in it without a suffix (e.g. "
                          f"'{Path(out) / 'report'}', which writes report.json beside report.png or report.md)")
    return Path(out)


def check_report(out: str | Path, suffixes: tuple[str, ...], overwrite: bool = False) -> None:
    """`check_output` for each of a report's files (OUT.json and its siblings), judged by OUT.json."""
    stem = check_report_stem(out)
    for suffix in suffixes:
        check_output(stem.with_suffix(suffix), overwrite, results_json=stem.with_suffix(".json"))


def check_output(path: str | Path, overwrite: bool = False, results_json: str | Path | None = None,
                 flag: str = "--out") -> None:
    """Refuse an output file that cannot be written, before the work: a folder in its place, a file where one of its
    parent folders would be, or an existing file, unless `overwrite` and it belongs to results this tool wrote
    (`results_json`, the JSON of the same report; the file itself by default)."""
    path = Path(path)
    if path.is_dir():
        raise OutputExistsError(f"{flag} '{path}' is a folder; give a file path in it (e.g. '{path / 'results.json'}')")
    check_folder_path(path.parent, flag)
    if not path.exists():
        return
    if not overwrite:
        raise OutputExistsError(f"{flag} '{path}' already exists; pass --overwrite to replace it")
    owner = Path(results_json) if results_json is not None else path
    if not written_here(owner):
        raise OutputExistsError(f"--overwrite replaces only results an evaluation command wrote, and '{path}' is not "
                                f"one ({owner} names no such writer): remove it yourself, or write to another path")


def report_cut_words(words: dict[str, dict[str, int]], max_length: int) -> dict[str, dict[str, int]]:
    """Warn of a token task's tagged words that truncation to `max_length` tokens left unread (they are neither trained
    on nor scored); return `words` ({split: {"tagged": n, "cut": n}}) for the result."""
    for split, count in words.items():
        if count["cut"]:
            log.warning("%d of the %d tagged words of the %s split are not read, past the %d tokens read (or of no "
                        "token at all), and are not %s; raise max_length (to the model's positions at most) to read "
                        "those past it", count["cut"], count["tagged"], split, max_length,
                        "trained on" if split == "training" else "scored")
    return words
