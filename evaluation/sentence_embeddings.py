"""SentEval-style evaluation of frozen sentence embeddings: classification, sentence pairs, and STS correlation.

Conneau & Kiela 2018, "SentEval: An Evaluation Toolkit for Universal Sentence Representations". The
encoder is frozen; a sentence's embedding is the mean of the last hidden states over its real tokens
(`mean`) or the first token's ([CLS], `cls`). Per task kind:
- `classification` (MR, CR, SUBJ, TREC, topics, ...): logistic regression, scored by stratified
  k-fold cross-validation (SentEval's 10 folds); inside each outer fold the inverse regularisation C
  is picked by an inner k-fold CV on the training part (`linear_probe.fit_probe`), so no test fold
  ever chooses C. Reported: the mean and std of the outer folds' accuracy, and the majority class.
- `pairs` (MRPC-like paraphrase pairs): the same classifier on [u; v; |u − v|; u ⊙ v] (SentEval's
  pair features).
- `sts` (scored pairs): no training; the cosine of the two embeddings against the gold score,
  Spearman and Pearson correlation (× 100, as SentEval reports).

A task suite is a folder with `tasks.json` ({"tasks": [{"name", "kind", "file", "text", "pair",
"label", "note"}]}) and its CSV files; `evaluation/senteval_data.py` builds one from what installs
offline here. Results: one JSON with every number, and a markdown table (a row per model and feature).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from core.errors import ConfigError, InputDataError, MissingFileError
from core.input_paths import check_input_file
from evaluation.checks import check_report, export_tokenizer
from evaluation.results_files import write_results_json

log = logging.getLogger("pretrain.sentence_embeddings")

KINDS = ("classification", "pairs", "sts")
FEATURES = ("mean", "cls")


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite: its file and columns, and how it is scored."""

    name: str
    kind: str
    file: Path
    text: str = "text"
    pair: Optional[str] = None
    label: str = "label"
    note: str = ""


def read_suite(folder: str | Path, names: Sequence[str] = ()) -> list[SuiteTask]:
    """The tasks of a suite folder (all, or those named), checked: kinds known, files present, pairs where needed."""
    folder = Path(folder)
    index = folder / "tasks.json"
    if not index.is_file():
        raise MissingFileError(f"'{folder}' is not a sentence-embedding task suite (no tasks.json); "
                               "build one with `python -m evaluation.senteval_data --out DIR`")
    try:
        entries = json.loads(index.read_text(encoding="utf-8"))["tasks"]
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise TypeError("'tasks' is not a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        raise InputDataError(f"'{index}' is not a task index ({{\"tasks\": [...]}}): {exc}") from None
    tasks = []
    for entry in entries:
        unknown = set(entry) - {"name", "kind", "file", "text", "pair", "label", "note"}
        if unknown or "name" not in entry or "kind" not in entry or not isinstance(entry.get("file"), str):
            raise InputDataError(f"'{index}': task entry {entry} needs name, kind and file (unknown keys: {sorted(unknown)})")
        task = SuiteTask(**{**entry, "file": folder / entry["file"]})
        if task.kind not in KINDS:
            raise InputDataError(f"'{index}': task '{task.name}' has kind '{task.kind}'; known: {', '.join(KINDS)}")
        if task.kind != "classification" and not task.pair:
            raise InputDataError(f"'{index}': task '{task.name}' ({task.kind}) needs a 'pair' column")
        tasks.append(task)
    known = {t.name for t in tasks}
    missing = [n for n in names if n not in known]
    if missing:
        raise ConfigError(f"task(s) {missing} are not in the suite '{folder}' (it has {sorted(known)})")
    chosen = [t for t in tasks if not names or t.name in names]
    for task in chosen:
        check_input_file(task.file, f"task '{task.name}': file")
    return chosen


def read_rows(task: SuiteTask, max_examples: int = 0, seed: int = 0) -> dict[str, list]:
    """The task's columns as lists (a seeded sample of max_examples rows when set); bad files are one-line errors."""
    import csv

    try:
        with task.file.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    except UnicodeDecodeError as exc:
        raise InputDataError(f"task '{task.name}': '{task.file}' is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    columns = [task.text, task.label] + ([task.pair] if task.pair else [])
    if not rows:
        raise InputDataError(f"task '{task.name}': '{task.file}' has no rows")
    absent = [c for c in columns if c not in rows[0]]
    if absent:
        raise InputDataError(f"task '{task.name}': '{task.file}' has no column(s) {absent} (it has {list(rows[0])})")
    for number, row in enumerate(rows, 1):  # a short row's missing cells are None: a traceback further on
        empty = [c for c in columns if row.get(c) is None]
        if empty:
            raise InputDataError(f"task '{task.name}': '{task.file}' row {number} has no value in column(s) {empty}")
    if max_examples and len(rows) > max_examples:
        keep = np.random.default_rng(seed).choice(len(rows), max_examples, replace=False)
        rows = [rows[i] for i in sorted(keep)]
    return {c: [r[c] for r in rows] for c in columns}


def pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """SentEval's sentence-pair features [u; v; |u − v|; u ⊙ v]."""
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def cosine(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    u64, v64 = u.astype(np.float64), v.astype(np.float64)
    norms = np.linalg.norm(u64, axis=1) * np.linalg.norm(v64, axis=1)
    return (u64 * v64).sum(1) / np.maximum(norms, 1e-12)


def cross_validated(x: np.ndarray, y: np.ndarray, folds: int, c_grid: Sequence[float], inner_folds: int,
                    seed: int) -> dict[str, Any]:
    """Outer stratified k-fold accuracy of a logistic regression whose C each fold picks by inner CV."""
    from sklearn.model_selection import StratifiedKFold

    from evaluation.linear_probe import fit_probe

    smallest = int(np.unique(y, return_counts=True)[1].min())
    k = min(folds, smallest)
    if k < 2:
        raise InputDataError(f"a class has {smallest} example(s): k-fold cross-validation needs at least 2 per class")
    scores, chosen = [], []
    for train, test in StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y):
        pred, info = fit_probe(x[train], y[train], x[test], c_grid, inner_folds, seed)
        scores.append(float((pred == y[test]).mean()))
        chosen.append(info["c"])
    majority = float(np.bincount(y).max() / len(y))
    return {"accuracy": float(np.mean(scores)), "accuracy_std": float(np.std(scores)), "fold_accuracy": scores,
            "folds": k, "c_chosen": chosen, "majority_class": majority, "examples": int(len(y))}


def sts_scores(u: np.ndarray, v: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """Spearman and Pearson (× 100) of the embeddings' cosine against the gold scores."""
    from evaluation.tasks import pearson, spearman

    sims = cosine(u, v)
    return {"spearman": 100 * spearman(sims, gold), "pearson": 100 * pearson(sims, gold), "examples": int(len(gold))}


def evaluate_task(model_dir: str, task: SuiteTask, features: Sequence[str] = FEATURES, layer: int = -1,
                  folds: int = 10, c_grid: Sequence[float] = (0.01, 0.1, 1.0, 10.0), inner_folds: int = 5,
                  max_examples: int = 0, max_length: int = 128, batch_size: int = 64, seed: int = 0) -> dict[str, Any]:
    """One model on one task: {feature: scores}."""
    from evaluation.linear_probe import sequence_features

    rows = read_rows(task, max_examples, seed)
    # Both sides of a pair in one pass: the model is loaded once per task.
    texts = rows[task.text] + (rows[task.pair] if task.pair else [])
    both = sequence_features(model_dir, texts, None, layer, max_length, batch_size)
    n = len(rows[task.text])
    first = {name: value[:n] for name, value in both.items()}
    second = {name: value[n:] for name, value in both.items()} if task.pair else None
    out = {}
    if task.kind == "sts":
        try:
            gold = np.array([float(v) for v in rows[task.label]])
        except ValueError as exc:
            raise InputDataError(f"task '{task.name}': an STS score is not a number ({exc})") from None
        for name in features:
            out[name] = sts_scores(first[name], second[name], gold)
        return out
    labels = sorted(set(rows[task.label]))
    y = np.array([labels.index(v) for v in rows[task.label]])
    for name in features:
        x = first[name] if task.kind == "classification" else pair_features(first[name], second[name])
        out[name] = {**cross_validated(x, y, folds, c_grid, inner_folds, seed), "labels": labels}
    return out


def headline(task: SuiteTask, scores: dict[str, Any]) -> float:
    """The number a table shows: accuracy × 100, or Spearman × 100 for STS."""
    return scores["spearman"] if task.kind == "sts" else 100 * scores["accuracy"]


def table(results: dict[str, dict[str, dict[str, Any]]], tasks: list[SuiteTask], features: Sequence[str]) -> str:
    """Markdown: a row per (model, feature), a column per task (accuracy or STS Spearman, × 100), and their mean."""
    header = "| model | feature | " + " | ".join(
        f"{t.name} ({'ρ' if t.kind == 'sts' else 'acc'})" for t in tasks) + " | mean |"
    lines = [header, "|" + "---|" * (len(tasks) + 3)]
    for model, per_task in results.items():
        for feature in features:
            values = [headline(t, per_task[t.name][feature]) for t in tasks]
            lines.append(f"| {model} | {feature} | " + " | ".join(f"{v:.1f}" for v in values)
                         + f" | {np.mean(values):.1f} |")
    chance = [100 * next(iter(results.values()))[t.name][features[0]]["majority_class"] if t.kind != "sts" else 0.0
              for t in tasks]
    lines.append("| majority class | | " + " | ".join("" if t.kind == "sts" else f"{c:.1f}" for t, c in zip(tasks, chance))
                 + " | |")
    return "\n".join(lines) + "\n"


def evaluate_suite(models: Sequence[str], suite: str | Path, task_names: Sequence[str] = (),
                   features: Sequence[str] = FEATURES, out: Optional[str | Path] = None, overwrite: bool = False,
                   **options: Any) -> dict[str, Any]:
    """Every model on every task of the suite; writes OUT.json and OUT.md when `out` is given (`overwrite`: replacing
    an earlier report there)."""
    unknown = set(features) - set(FEATURES)
    if unknown or not features:
        raise ConfigError(f"sentence-embedding features must be some of {list(FEATURES)}, got {list(features)}")
    if out:
        check_report(out, (".json", ".md"), overwrite)
    for model in models:
        export_tokenizer(model)  # every folder checked before the first task's work
    tasks = read_suite(suite, task_names)
    start = time.time()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for model in models:
        results[model] = {}
        for task in tasks:
            results[model][task.name] = evaluate_task(model, task, features, **options)
            log.info("%s on %s: %s", model, task.name,
                     ", ".join(f"{f} {headline(task, s):.1f}" for f, s in results[model][task.name].items()))
    report = {"suite": str(suite), "tasks": [{"name": t.name, "kind": t.kind, "file": str(t.file), "note": t.note}
                                             for t in tasks],
              "features": list(features), "options": options, "results": results, "seconds": time.time() - start}
    report["table"] = table(results, tasks, features)
    if out:
        from core.atomic_files import write_text_atomic

        write_results_json(Path(out).with_suffix(".json"), report)
        write_text_atomic(Path(out).with_suffix(".md"), report["table"])
    return report
