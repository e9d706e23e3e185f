"""Fine-tuning tasks: GLUE through `datasets`, or local csv/json files; and their metrics as GLUE defines them."""
from __future__ import annotations

import codecs
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.errors import ConfigError, InputDataError, SetupError
from core.input_paths import check_input_file, check_input_folder
from evaluation.config import LocalTaskOptions


@dataclass(frozen=True)
class TaskSpec:
    """Where a task's text and labels are, and how it is scored."""

    name: str
    text: str
    pair: Optional[str] = None
    label: str = "label"
    num_labels: int = 2  # 1 = regression
    metrics: tuple[str, ...] = ("accuracy",)
    eval_split: str = "validation"
    kind: str = "sequence"  # or "token" (text: a list of words, label: a list of tags)
    label_names: tuple[str, ...] = field(default=())
    ignore_tag: Optional[str] = None  # token tasks: words with this tag are neither trained on nor scored
    # Further evaluation splits scored by the same model, (split, name): each metric m of the split is `NAME_m`.
    also_scored: tuple[tuple[str, str], ...] = ()
    # The metric a choice made on the training split (the probe's C) maximises; empty: the first of `metrics`.
    select_by: str = ""

    def selection_metric(self) -> str:
        """The metric the probe's regularisation is chosen by: the task's headline one (CoLA: Matthews)."""
        return self.select_by or self.metrics[0]

    def eval_splits(self) -> tuple[str, ...]:
        """Every split the task is scored on: the evaluation split, then those it is also scored on."""
        return (self.eval_split, *(split for split, _ in self.also_scored))


GLUE: dict[str, TaskSpec] = {
    "cola": TaskSpec("cola", "sentence", metrics=("matthews",)),
    "sst2": TaskSpec("sst2", "sentence"),
    "mrpc": TaskSpec("mrpc", "sentence1", "sentence2", metrics=("accuracy", "f1")),
    "stsb": TaskSpec("stsb", "sentence1", "sentence2", num_labels=1, metrics=("pearson", "spearman")),
    "qqp": TaskSpec("qqp", "question1", "question2", metrics=("accuracy", "f1")),
    # GLUE reports MNLI-m/mm: one model, scored on the matched and on the mismatched validation split.
    "mnli": TaskSpec("mnli", "premise", "hypothesis", num_labels=3, eval_split="validation_matched",
                     also_scored=(("validation_mismatched", "mismatched"),)),
    "qnli": TaskSpec("qnli", "question", "sentence"),
    "rte": TaskSpec("rte", "sentence1", "sentence2"),
}


def glue_name(task: str) -> Optional[str]:
    """'SST-2' / 'sst2' / 'STS-B' -> the GLUE config name, or None when it is not a GLUE task."""
    key = task.lower().replace("-", "").replace("_", "")
    return key if key in GLUE else None


# ---- metrics (GLUE's definitions, from scikit-learn and scipy) -------------------------------------------


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    """Fraction of exact matches."""
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(gold, pred))


def f1_binary(pred: np.ndarray, gold: np.ndarray) -> float:
    """F1 of the positive class (label 1), as GLUE reports for MRPC and QQP."""
    from sklearn.metrics import f1_score

    return float(f1_score(gold, pred, pos_label=1, average="binary", zero_division=0))


def f1_macro(pred: np.ndarray, gold: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes in gold or pred."""
    from sklearn.metrics import f1_score

    return float(f1_score(gold, pred, average="macro", zero_division=0))


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
    """Matthews correlation (multi-class form, Gorodkin 2004; equals the binary MCC for 2 classes)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(gold, pred))


def _correlation(fn, pred: np.ndarray, gold: np.ndarray) -> float:
    # A constant input has no correlation: scipy says nan (with a warning); GLUE's tables read it as 0.
    if np.ptp(pred) == 0 or np.ptp(gold) == 0:
        return 0.0
    return float(fn(pred.astype(np.float64), gold.astype(np.float64))[0])


def pearson(pred: np.ndarray, gold: np.ndarray) -> float:
    """Pearson correlation."""
    from scipy.stats import pearsonr

    return _correlation(pearsonr, pred, gold)


def spearman(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rho: Pearson correlation of the tie-averaged ranks."""
    from scipy.stats import spearmanr

    return _correlation(spearmanr, pred, gold)


METRICS = {"accuracy": accuracy, "f1": f1_binary, "f1_macro": f1_macro, "matthews": matthews, "pearson": pearson,
           "spearman": spearman}


def score(spec: TaskSpec, pred: np.ndarray, gold: np.ndarray, name: str = "") -> dict[str, float]:
    """The task's metrics on flat predictions and gold labels (keyed `NAME_metric` for a split scored as `name`)."""
    return {f"{name}_{m}" if name else m: METRICS[m](pred, gold) for m in spec.metrics}


# ---- loading ------------------------------------------------------------------------------------------


def load_task(task: str, local: LocalTaskOptions, seed: int = 0) -> tuple[TaskSpec, Any, Any]:
    """(spec, train rows, eval rows) for a GLUE name (from the hub, or `NAME:FOLDER`) or `csv:PATH` / `json:PATH`;
    rows are `datasets.Dataset`s."""
    spec, train, evaluation, _ = load_task_splits(task, local, seed)
    return spec, train, evaluation


# Draws the rows a task evaluates on (a local file's held-out split) and the capped subsets: the same rows whatever the
# training seeds and in both commands, so results of separate runs, probes and fine-tunings are on one test set.
SPLIT_SEED = 0


def capped(rows: Any, limit: int) -> Any:
    """A seeded random subset of at most `limit` rows (all of them where `limit` is 0 or reaches their count): drawn
    from every row, not a file's first ones, which a file sorted by label or source would make one class."""
    if not limit or limit >= len(rows):
        return rows
    return rows.shuffle(seed=SPLIT_SEED).select(range(limit))


def capped_splits(train: Any, evaluation: Any, also: dict[str, Any], max_train: int,
                  max_eval: int) -> tuple[Any, Any, dict[str, Any]]:
    """The training split capped at `max_train` rows and each evaluation split at `max_eval` (`capped`: 0, all)."""
    return capped(train, max_train), capped(evaluation, max_eval), {name: capped(rows, max_eval) for name, rows in also.items()}


def load_task_splits(task: str, local: LocalTaskOptions,
                     seed: int = SPLIT_SEED) -> tuple[TaskSpec, Any, Any, dict[str, Any]]:
    """`load_task`'s spec, train and eval rows, and the rows of each split the task is also scored on, by its name
    (`TaskSpec.also_scored`: MNLI's mismatched split); `seed` draws a local file's held-out split."""
    import datasets

    datasets.disable_progress_bars()
    kind, _, path = task.partition(":")
    name = glue_name(kind)
    if name is not None:
        spec, data = _load_glue(task, name) if not path else _load_glue_folder(name, path)
        return spec, data["train"], data[spec.eval_split], {label: data[split] for split, label in spec.also_scored}
    if kind not in ("csv", "json") or not path:
        raise ConfigError(f"unknown task '{task}': use a GLUE name ({', '.join(sorted(GLUE))}), NAME:FOLDER for GLUE "
                          "downloaded to a folder, or csv:PATH / json:PATH")
    for p in filter(None, (path, local.validation_file)):
        check_input_file(p, "task file", example=f"train.{kind}")
    if kind == "csv":
        try:
            codecs.lookup(local.encoding)
        except LookupError:
            raise ConfigError(f"config key 'data.encoding': '{local.encoding}' is not a known text encoding") from None
    files = {"train": path, **({"validation": local.validation_file} if local.validation_file else {})}
    # One load per file: a file datasets cannot read is then named in the message.
    data = {split: _read_task_file(kind, file, split, local.encoding) for split, file in files.items()}
    train = data["train"]
    for split, table in data.items():
        for column in filter(None, (local.text_column, local.pair_column, local.label_column)):
            if column not in table.column_names:
                raise InputDataError(f"task file '{files[split]}' has no column '{column}' (columns: "
                                     f"{table.column_names})")
        _check_rows(files[split], table, local)
    if "validation" in data:
        evaluation = data["validation"]
    else:
        held_out = math.ceil(local.val_fraction * len(train))  # as datasets' train_test_split counts it
        if len(train) - held_out < 1:
            raise InputDataError(f"task file '{path}' has {len(train)} row(s): too few to hold out val_fraction "
                                 f"{local.val_fraction} for evaluation and keep some to train on")
        split = train.train_test_split(test_size=local.val_fraction, seed=seed)
        train, evaluation = split["train"], split["test"]
    if len(train) == 0 or len(evaluation) == 0:
        raise InputDataError(f"task '{task}' has an empty train or evaluation split")
    return _local_spec(task, path, local, train, evaluation), train, evaluation, {}


def _check_rows(file: str, table: Any, local: LocalTaskOptions) -> None:
    """Refuse the first row a task cannot use, by its number (1 = the first row after a csv header): a missing or
    blank text, a missing label, a regression label that is not a number, a list where a sequence task wants one
    value, a token row that is not a list of words with one tag each. Otherwise a missing cell would train on the
    string 'None', a list on its printed form, and a string of words would be split into characters."""
    def refuse(row: int, problem: str) -> None:
        raise InputDataError(f"task file '{file}' row {row + 1}: {problem}")

    # The columns read at once, as Python values (a Dataset's column object decodes row by row; its arrow form holds
    # a column of mixed types as JSON text).
    columns = table.select_columns(list(dict.fromkeys(filter(None, (local.text_column, local.pair_column,
                                                                     local.label_column)))))[:]
    token_hint = "(data.token_task=true for a list per row)"
    for column in filter(None, (local.text_column, local.pair_column)):
        for row, value in enumerate(columns[column]):
            if local.token_task:
                if not isinstance(value, list):
                    refuse(row, f"column '{column}' holds a {type(value).__name__}, not a list of words "
                                "(data.token_task=true)")
                if not value or any(_blank(w) for w in value):
                    refuse(row, f"column '{column}' has no words or an empty word")
            elif isinstance(value, (list, dict)):
                refuse(row, f"column '{column}' holds a {type(value).__name__}; a sequence task reads one text {token_hint}")
            elif _blank(value):
                refuse(row, f"column '{column}' has no text")
    label = local.label_column
    for row, value in enumerate(columns[label]):
        if _blank(value):
            refuse(row, f"column '{label}' has no label")
        if local.token_task:
            words = len(columns[local.text_column][row])
            if not isinstance(value, list) or len(value) != words:
                count = f"{len(value)} tags" if isinstance(value, list) else f"a {type(value).__name__}"
                refuse(row, f"column '{label}' holds {count} for {words} words (a token task needs one tag per word)")
            missing = [i for i, tag in enumerate(value) if _blank(tag)]
            if missing:
                refuse(row, f"column '{label}' has no tag for word {missing[0] + 1}")
        elif isinstance(value, (list, dict)):
            refuse(row, f"column '{label}' holds a {type(value).__name__}; a sequence task needs one label per row "
                        f"{token_hint}")
        elif local.regression and (isinstance(value, bool) or not _is_finite_number(value)):
            refuse(row, f"label {value!r} in column '{label}' is not a finite number (data.regression=true)")


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _is_finite_number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _read_task_file(kind: str, file: str, split: str, encoding: str) -> Any:
    """One csv or json(-lines) task file as a `datasets.Dataset`; an empty, undecodable or malformed file is one line."""
    import datasets
    from datasets.exceptions import DatasetGenerationError
    from datasets.utils import logging as datasets_logging

    if Path(file).stat().st_size == 0:
        raise InputDataError(f"task file '{file}' is empty")
    if kind == "json":
        _check_utf8(file)
    # csv: a cell is its text. pandas' default would read 'NA', 'N/A', 'null' or 'None' as a missing value, and a
    # class named NA (common in relation classification) as no label at all; a blank cell stays blank and is refused.
    kwargs = {"encoding": encoding, "keep_default_na": False} if kind == "csv" else {}
    # datasets logs its own "Failed to read file" line before raising; the one line below replaces it.
    verbosity = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        # A cache of its own, read into memory: datasets' shared one (~/.cache/huggingface) kept a copy of every task
        # file ever read, outside any folder the user named.
        with tempfile.TemporaryDirectory(prefix="task-") as cache:
            return datasets.load_dataset(kind, data_files={split: file}, split=split, cache_dir=cache,
                                         keep_in_memory=True, **kwargs)
    except (DatasetGenerationError, UnicodeDecodeError) as exc:
        problem = _unreadable(exc, kind, encoding)
        if problem is None:
            raise
        raise InputDataError(f"task file '{file}' {problem}") from None
    except ValueError as exc:
        if "corresponds to no data" not in str(exc):  # datasets' words for a split without rows
            raise
        raise InputDataError(f"task file '{file}' has no rows") from None
    finally:
        datasets_logging.set_verbosity(verbosity)


def _check_utf8(file: str) -> None:
    """Refuse a file that is not UTF-8: pyarrow's JSON reader keeps invalid bytes inside strings without a word."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(file, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise InputDataError(f"task file '{file}' is not UTF-8 text ({exc.reason} near byte {offset + max(exc.start, 0)}); "
                                     "json: task files must be UTF-8") from None
            if not chunk:
                return
            offset += len(chunk)


def _unreadable(exc: BaseException, kind: str, encoding: str) -> Optional[str]:
    """Why datasets could not read a task file, from the error it wrapped (its own says only that one occurred); None
    when that error is the machine's (an OSError such as a full disk under datasets' cache), not the file's."""
    causes = []
    while exc is not None and len(causes) < 10:
        causes.append(exc)
        exc = exc.__cause__ or exc.__context__
    for cause in causes:
        if isinstance(cause, UnicodeDecodeError):
            # (no byte offset: the readers decode in chunks, and the one in the error counts from the chunk's start)
            hint = "pass --encoding (e.g. latin-1)" if kind == "csv" else "json: task files must be UTF-8"
            return f"is not {encoding if kind == 'csv' else 'utf-8'} text ({cause.reason}); {hint}"
    if any(isinstance(cause, OSError) for cause in causes):
        return None
    reason = next((c for c in causes[1:] if str(c).strip()), causes[0])
    what = "csv" if kind == "csv" else "JSON lines (or a JSON list of rows)"
    return f"is not valid {what}: {type(reason).__name__}: {str(reason).strip().splitlines()[0]}"


def _load_glue(task: str, name: str) -> tuple[TaskSpec, Any]:
    """A GLUE task from the Hugging Face hub, its splits by name (one clear line when it cannot be reached)."""
    import datasets

    from data_pipeline.raw_text import hub_reachable

    spec = GLUE[name]
    if not hub_reachable():
        raise SetupError(f"GLUE task '{task}' is read from the Hugging Face hub (nyu-mll/glue), which cannot be reached "
                         f"(offline?): download it where the network is (hf download nyu-mll/glue --repo-type dataset "
                         f"--local-dir glue) and name the folder: --task {task}:glue")
    try:
        data = datasets.load_dataset("nyu-mll/glue", name)
    except Exception as exc:  # datasets raises many types; all mean the same here
        raise SetupError(f"GLUE task '{task}' could not be loaded from the hub: {exc}") from exc
    return spec, data


def _load_glue_folder(name: str, folder: str) -> tuple[TaskSpec, Any]:
    """A GLUE task from the folder nyu-mll/glue was downloaded to (`hf download nyu-mll/glue --repo-type dataset
    --local-dir DIR`), read offline: its splits by name."""
    import datasets.exceptions

    spec = GLUE[name]
    where = check_input_folder(folder, "GLUE folder",
                               example="hf download nyu-mll/glue --repo-type dataset --local-dir DIR")
    try:
        # Its own cache, read into memory: datasets keys a folder's cache by the folder's name and the task alone, so
        # a shared cache would hand back the rows of another folder called the same (an older download, a copy).
        with tempfile.TemporaryDirectory(prefix="glue-") as cache:
            data = datasets.load_dataset(str(where), name, cache_dir=cache, keep_in_memory=True)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as exc:  # a missing config is a ValueError
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputDataError(f"GLUE folder '{folder}' has no readable task '{name}': {reason}") from exc
    for split in ("train", *spec.eval_splits()):
        if split not in data:
            raise InputDataError(f"GLUE folder '{folder}': task '{name}' has no '{split}' split (splits: {sorted(data)})")
        columns = data[split].column_names
        missing = [c for c in filter(None, (spec.text, spec.pair, spec.label)) if c not in columns]
        if missing:
            raise InputDataError(f"GLUE folder '{folder}': task '{name}' split '{split}' has no column(s) {missing} "
                                 f"(columns: {columns}); is it a copy of nyu-mll/glue?")
    return spec, data


def _local_spec(task: str, path: str, local: LocalTaskOptions, train: Any, evaluation: Any) -> TaskSpec:
    """A local task's spec: regression, or its label set (at least two labels) read from both splits."""
    token = local.token_task
    if local.regression:
        return TaskSpec(Path(path).stem, local.text_column, local.pair_column, local.label_column, 1, ("pearson", "spearman"))
    values = (v for rows in (train[local.label_column], evaluation[local.label_column]) for v in rows)
    names = sorted({str(t) for v in values for t in (v if token else [v])} - {local.ignore_tag if token else None})
    if len(names) < 2:
        raise InputDataError(f"task '{task}' has {len(names)} label(s) {names}; a classifier needs at least 2")
    metrics = ("accuracy", "f1_macro") if token else ("accuracy", "f1_macro", "matthews")
    # A local task's classes are rarely balanced (a token task's tags never are): accuracy would pick the C that
    # predicts the common class; macro-F1 weighs every class.
    return TaskSpec(Path(path).stem, local.text_column, local.pair_column, local.label_column, len(names), metrics,
                    kind="token" if token else "sequence", label_names=tuple(names),
                    ignore_tag=local.ignore_tag if token else None, select_by="f1_macro")
