"""Frozen-encoder linear probes: logistic regression on an exported model's features.

A small model's fine-tuning result moves with the fine-tuning seed; a probe of frozen features does
not, and it asks what the pre-training alone put into the representations. Sequence tasks are
probed on two features of the chosen layer: the mean over the real tokens and the first token
([CLS]). Token tasks (`data.token_task`) are probed on each tagged word's vector, the mean of its
sub-tokens. Features are standardised on the training split; the inverse regularisation strength
C is picked by stratified k-fold cross-validation on the training split (SentEval's protocol), by the task's headline
metric (CoLA: Matthews; local tasks: macro-F1), then
the probe is refit on the whole training split and scored on the evaluation split (MNLI: on both of its
validation splits).
"""
from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import torch

from core.errors import ConfigError, InputDataError
from evaluation.checks import check_output, export_tokenizer, report_cut_words, usable_length
from evaluation.tasks import METRICS, LocalTaskOptions, TaskSpec, capped_splits, load_task_splits, score
from model.backbones.base import LOAD_DTYPE, check_model_folder, forward_input_names, layer_states, load_pretrained

log = logging.getLogger("pretrain.linear_probe")

SEQUENCE_FEATURES = ("mean", "cls")


def _load(model_dir: str):
    """Tokenizer and encoder (no head) of an export, in eval mode."""
    from transformers import AutoModel

    tokenizer = export_tokenizer(model_dir)
    return tokenizer, load_pretrained(AutoModel, model_dir, dtype=LOAD_DTYPE).eval()


def check_layer(model_dir: str, layer: int) -> None:
    """Refuse a hidden-state index the model does not have (0, the embeddings, to its depth, or counted back from -1),
    from its config, before its weights load."""
    from transformers import AutoConfig

    check_model_folder(model_dir)  # a damaged config.json is named as such
    depth = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    if not -(depth + 1) <= layer <= depth:
        raise ConfigError(f"config key 'layer' is {layer}, but '{model_dir}' has {depth} layers: give 0 (the "
                          f"embeddings) to {depth}, or -1 (the last) to {-(depth + 1)}")


def _hidden(model, enc: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
    """Hidden states of `layer` (-1 or L: the last, `last_hidden_state`; 0: embeddings) in float32."""
    accepted = forward_input_names(model)
    out = model(**{k: v for k, v in enc.items() if k in accepted}, output_hidden_states=True)
    return layer_states(out)[layer].float()


@torch.no_grad()
def sequence_features(model_dir: str, texts: Sequence[str], pairs: Optional[Sequence[str]] = None, layer: int = -1,
                      max_length: int = 128, batch_size: int = 64) -> dict[str, np.ndarray]:
    """Mean-pooled (over real tokens) and first-token features of every text (or text pair)."""
    check_layer(model_dir, layer)
    tokenizer, model = _load(model_dir)
    max_length = usable_length(model.config, max_length)
    mean, first = [], []
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start:start + batch_size])
        second = list(pairs[start:start + batch_size]) if pairs is not None else None
        enc = tokenizer(batch, second, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        hidden = _hidden(model, enc, layer)
        keep = enc["attention_mask"].unsqueeze(-1).float()
        mean.append((hidden * keep).sum(1) / keep.sum(1))
        first.append(hidden[:, 0])
    return {"mean": torch.cat(mean).numpy(), "cls": torch.cat(first).numpy()}


@torch.no_grad()
def word_features(model_dir: str, sentences: Sequence[Sequence[str]], layer: int = -1, max_length: int = 128,
                  batch_size: int = 64) -> list[np.ndarray]:
    """Per sentence, a (words, hidden) array: each word's vector is the mean of its sub-tokens (NaN if truncated away)."""
    check_layer(model_dir, layer)
    tokenizer, model = _load(model_dir)
    max_length = usable_length(model.config, max_length)
    out = []
    for start in range(0, len(sentences), batch_size):
        batch = [[str(w) for w in words] for words in sentences[start:start + batch_size]]
        enc = tokenizer(batch, is_split_into_words=True, truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        hidden = _hidden(model, enc, layer)
        for i, words in enumerate(batch):
            vectors = np.full((len(words), hidden.shape[-1]), np.nan, dtype=np.float32)
            ids = np.array([-1 if w is None else w for w in enc.word_ids(i)])
            for word in np.unique(ids[ids >= 0]):
                vectors[word] = hidden[i, torch.from_numpy(ids == word)].mean(0).numpy()
            out.append(vectors)
    return out


def check_two_classes(train_y: np.ndarray) -> None:
    """Refuse training labels of fewer than two classes, which no classifier fits (sklearn's refusal is a traceback)."""
    classes = np.unique(train_y)
    if len(classes) < 2:
        raise InputDataError(f"the probe's {len(train_y)} training example(s) hold {len(classes)} class(es): a "
                             "classifier needs two; give it more or other examples (--max-train-samples, the training file)")


def fit_probe(train_x: np.ndarray, train_y: np.ndarray, eval_x: np.ndarray, c_grid: Sequence[float] = (0.01, 0.1, 1.0, 10.0),
              folds: int = 5, seed: int = 0, metric: str = "accuracy") -> tuple[np.ndarray, dict[str, Any]]:
    """Predictions on `eval_x` of a logistic regression whose C was chosen by k-fold CV on the training split, scored
    by `metric` (a name of evaluation.tasks.METRICS)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import make_scorer
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    def model(c: float):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))

    # A class rarer than the folds is spread as far as it goes (sklearn warns, and that is expected: a
    # token task's long tail); only when no class fills two folds is there no CV, and C is the grid's middle.
    check_two_classes(train_y)
    largest = int(np.unique(train_y, return_counts=True)[1].max())
    k = min(folds, largest) if largest >= 2 else 0
    cv = {}
    # One BLAS thread: these matrices are small, and OpenBLAS's threads measured 20x slower beside a busy core.
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if k >= 2 and len(c_grid) > 1:
            splits = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
            scorer = make_scorer(lambda gold, pred: METRICS[metric](pred, gold))
            cv = {c: float(cross_val_score(model(c), train_x, train_y, cv=splits, scoring=scorer).mean()) for c in c_grid}
            best = max(cv, key=lambda c: (cv[c], -c))  # ties go to the stronger regularisation
        else:
            best = c_grid[len(c_grid) // 2]
        pred = model(best).fit(train_x, train_y).predict(eval_x)
    return pred, {"c": best, "folds": k, "cv_metric": metric, "cv_scores": {str(c): a for c, a in cv.items()}}


def _labels(spec: TaskSpec, values: list) -> np.ndarray:
    if not spec.label_names:  # GLUE: already integers
        return np.array([int(v) for v in values])
    index = {name: i for i, name in enumerate(spec.label_names)}
    return np.array([index[str(v)] for v in values])


def _token_examples(model_dir: str, spec: TaskSpec, rows, layer: int, max_length: int, batch_size: int,
                    words_of_split: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """One (feature, label) per tagged word that survived truncation; `ignore_tag` words are not examples. The split's
    tagged words and those truncation cut away are counted into `words_of_split`."""
    words, tags = list(rows[spec.text]), list(rows[spec.label])
    vectors = word_features(model_dir, words, layer, max_length, batch_size)
    index = {name: i for i, name in enumerate(spec.label_names)}
    xs, ys, cut = [], [], 0
    for vec, row in zip(vectors, tags):
        for v, tag in zip(vec, row):
            if str(tag) == spec.ignore_tag:
                continue
            if np.isnan(v[0]):
                cut += 1
                continue
            xs.append(v)
            ys.append(index[str(tag)])
    words_of_split.update(tagged=len(xs) + cut, cut=cut)
    if not xs:
        raise ConfigError("the token task has no tagged word to probe (every tag is data.ignore_tag, or truncated away)")
    return np.stack(xs), np.array(ys)


def _probe_sets(model_dir: str, spec: TaskSpec, train_rows, scored: dict[str, Any], features: Sequence[str], layer: int,
                max_length: int, batch_size: int, words: dict[str, dict[str, int]]
                ) -> dict[str, tuple[tuple[np.ndarray, np.ndarray], dict]]:
    """feature -> ((train x, train y), {name a split is scored as: (x, y)}), each split's features computed once (a
    token task's tagged and cut-away words per split counted into `words`)."""
    if spec.kind == "token":
        def examples(rows, split: str):
            return _token_examples(model_dir, spec, rows, layer, max_length, batch_size, words.setdefault(split, {}))

        train = examples(train_rows, "training")
        return {"word": (train, {name: examples(rows, name or "evaluation") for name, rows in scored.items()})}
    ytr = _labels(spec, list(train_rows[spec.label]))
    check_two_classes(ytr)  # the labels are known before the features: refused before the model runs
    features_of = lambda rows: sequence_features(  # noqa: E731
        model_dir, list(rows[spec.text]), list(rows[spec.pair]) if spec.pair else None, layer, max_length, batch_size)
    tr = features_of(train_rows)
    evs = {name: (features_of(rows), _labels(spec, list(rows[spec.label]))) for name, rows in scored.items()}
    return {f: ((tr[f], ytr), {name: (x[f], y) for name, (x, y) in evs.items()}) for f in features}


def linear_probe(model_dir: str, task: str, local: Optional[LocalTaskOptions] = None, layer: int = -1,
                 features: Sequence[str] = SEQUENCE_FEATURES, c_grid: Sequence[float] = (0.01, 0.1, 1.0, 10.0), folds: int = 5,
                 max_train_samples: int = 0, max_eval_samples: int = 0, max_length: int = 128, batch_size: int = 64,
                 seed: int = 0, out: Optional[str] = None, overwrite: bool = False) -> dict[str, Any]:
    """Probe one export on one task; return (and write to `out`, replacing an earlier result there if `overwrite`)
    each feature's metrics beside the majority class."""
    local = local or LocalTaskOptions()
    unknown = set(features) - set(SEQUENCE_FEATURES)
    if unknown:
        raise ConfigError(f"unknown probe feature(s) {sorted(unknown)}: choose from {list(SEQUENCE_FEATURES)}")
    if out:
        check_output(out, overwrite)
    spec, train_rows, eval_rows, also_rows = load_task_splits(task, local)  # fine-tuning's split, whatever `seed`
    if spec.num_labels == 1:
        raise ConfigError(f"task '{task}' is a regression; a linear probe here is a classifier")
    train_rows, eval_rows, also_rows = capped_splits(train_rows, eval_rows, also_rows, max_train_samples, max_eval_samples)
    start, words = time.time(), {}
    sets = _probe_sets(model_dir, spec, train_rows, {"": eval_rows, **also_rows}, features, layer, max_length,
                       batch_size, words)
    if words:
        from transformers import AutoConfig

        report_cut_words(words, usable_length(AutoConfig.from_pretrained(model_dir), max_length))
    results = {}
    for feature, ((xtr, ytr), evals) in sets.items():
        # One probe per feature, its C chosen once, predicting every scored split.
        pred, chosen = fit_probe(xtr, ytr, np.concatenate([x for x, _ in evals.values()]), c_grid, folds, seed,
                                 spec.selection_metric())
        ends = np.cumsum([len(y) for _, y in evals.values()])
        metrics = {k: v for (name, (_, y)), end in zip(evals.items(), ends)
                   for k, v in score(spec, pred[end - len(y):end], y, name).items()}
        results[feature] = {**metrics, **chosen}
    (_, ytr), evals = next(iter(sets.values()))
    most = np.bincount(ytr).argmax()
    majority = {k: v for name, (_, y) in evals.items() for k, v in score(spec, np.full_like(y, most), y, name).items()}
    result = {"model": str(model_dir), "task": task, "kind": spec.kind, "layer": layer, "label_names": list(spec.label_names),
              "train_examples": int(len(ytr)), "eval_examples": int(len(evals[""][1])),
              **({"also_scored_examples": {name: int(len(y)) for name, (_, y) in evals.items() if name}} if also_rows else {}),
              "probes": results, "majority_baseline": majority, **({"words": words} if words else {}),
              "seconds": time.time() - start}
    if out:
        from evaluation.results_files import write_results_json

        write_results_json(out, result)
    log.info("%s on %s: %s", model_dir, task, ", ".join(f"{n} {metric_text(r, majority)}" for n, r in results.items()))
    return result


def metric_text(scores: dict[str, float], names: Iterable[str]) -> str:
    """'NAME VALUE ...' for each metric a task is scored with, on each split it is scored on (CoLA: Matthews; MNLI:
    matched and mismatched accuracy)."""
    return " ".join(f"{name} {scores[name]:.4f}" for name in names)

