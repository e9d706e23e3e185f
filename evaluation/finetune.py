"""Fine-tune an exported encoder on a classification, regression or token task, over several seeds.

Hyper-parameter recipes and their sources are tabled in docs/finetuning.md; every value can be
overridden on the command line. The result is a JSON with every seed's metrics, mean ± std, and the
majority-class baseline of each evaluation split (MNLI: matched and mismatched).
"""
from __future__ import annotations

import logging
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
import torch

from core.errors import ConfigError, InputDataError
from evaluation.checks import check_output, export_tokenizer, report_cut_words, usable_length
from evaluation.tasks import LocalTaskOptions, TaskSpec, capped_splits, load_task_splits, score
from model.backbones.base import LOAD_DTYPE, last_hidden_state_of, load_pretrained, weight_decays

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("pretrain.finetune")


@dataclass(frozen=True)
class Hyper:
    """One fine-tuning recipe: a YAML of evaluation/configs/finetune/recipe/ (docs/finetuning.md)."""

    lr: float
    batch_size: int
    epochs: float
    max_length: int = 128
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    grad_clip: float = 1.0
    # The lr for models narrower than BERT-base (hidden < 768), where a paper gives one (TACO, COCO-LM).
    small_model_lr: Optional[float] = None


RECIPES = Path(__file__).resolve().parent / "configs" / "finetune" / "recipe"


def recipe_names() -> list[str]:
    """The recipes shipped as YAML files."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def recipe(name: str, hidden_size: int) -> Hyper:
    """The named recipe for a model of this width (a paper's small-model lr below hidden 768)."""
    from core.config_io import load_config

    if name not in recipe_names():
        raise ConfigError(f"config key 'recipe': unknown recipe '{name}'; options: {', '.join(recipe_names())}")
    hp = load_config(Hyper, RECIPES / f"{name}.yaml")
    return replace(hp, lr=hp.small_model_lr) if hp.small_model_lr is not None and hidden_size < 768 else hp


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _label_ids(spec: TaskSpec, values: list) -> list:
    if spec.num_labels == 1:
        return [float(v) for v in values]
    if not spec.label_names:  # GLUE: already integers
        return [int(v) for v in values]
    index = {name: i for i, name in enumerate(spec.label_names)}
    if spec.kind == "token":
        return [[-100 if str(t) == spec.ignore_tag else index[str(t)] for t in tags] for tags in values]
    return [index[str(v)] for v in values]


def encode(spec: TaskSpec, rows: Any, tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, Any]:
    """Tokenized inputs and labels (token tasks: the first sub-token of each word carries its tag)."""
    labels = _label_ids(spec, list(rows[spec.label]))
    if spec.kind == "token":
        words = [[str(w) for w in row] for row in rows[spec.text]]  # datasets may hand back a lazy column
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
        aligned = []
        for i, tags in enumerate(labels):
            previous, row = None, []
            for word in enc.word_ids(i):
                row.append(-100 if word is None or word == previous else tags[word])
                previous = word
            aligned.append(row)
        return {**enc, "labels": aligned}
    texts = [str(t) for t in rows[spec.text]]
    pairs = [str(t) for t in rows[spec.pair]] if spec.pair else None
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    return {**enc, "labels": labels}


def check_tagged(spec: TaskSpec, enc: dict[str, Any], split: str) -> None:
    """A token task's split must keep a tagged word (one not data.ignore_tag, not truncated away) to learn or score."""
    if spec.kind == "token" and not any(t != -100 for row in enc["labels"] for t in row):
        why = (f"every tag is the ignored tag {spec.ignore_tag!r}, or the words were truncated away"
               if spec.ignore_tag is not None else "the words were truncated away, or it has none")
        raise InputDataError(f"the token task's {split} split has no tagged word to "
                             f"{'learn' if split == 'training' else 'score'} ({why})")


def cut_words(spec: TaskSpec, rows: Any, enc: dict[str, Any]) -> dict[str, int]:
    """A token task split's tagged words, and how many of them truncation cut away (their first sub-token is gone)."""
    tagged = sum(str(t) != spec.ignore_tag for tags in rows[spec.label] for t in tags)
    kept = sum(t != -100 for row in enc["labels"] for t in row)
    return {"tagged": tagged, "cut": tagged - kept}


def _encode_splits(spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int, train_rows: Any,
                   scored: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, int]]]:
    """The training split and each scored split (by the name it is scored as) encoded and checked to hold a tagged
    word; and, for a token task, each split's tagged and cut-away words."""
    train_enc = encode(spec, train_rows, tokenizer, max_length)
    eval_encs = {name: encode(spec, rows, tokenizer, max_length) for name, rows in scored.items()}
    check_tagged(spec, train_enc, "training")
    check_tagged(spec, eval_encs[""], "evaluation")
    if spec.kind != "token":
        return train_enc, eval_encs, {}
    words = {"training": cut_words(spec, train_rows, train_enc),
             **{name or "evaluation": cut_words(spec, rows, eval_encs[name]) for name, rows in scored.items()}}
    return train_enc, eval_encs, report_cut_words(words, max_length)


def _batches(enc: dict[str, Any], order: list[int], batch_size: int, pad_id: int):
    for first in range(0, len(order), batch_size):
        idx = order[first:first + batch_size]
        width = max(len(enc["input_ids"][i]) for i in idx)
        out = {}
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if key in enc:
                fill = pad_id if key == "input_ids" else 0
                out[key] = torch.tensor([enc[key][i] + [fill] * (width - len(enc[key][i])) for i in idx])
        labels = [enc["labels"][i] for i in idx]
        if isinstance(labels[0], list):
            out["labels"] = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
        else:
            out["labels"] = torch.tensor(labels)
        yield out


def _build_model(model_dir: str, spec: TaskSpec):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = AutoModelForTokenClassification if spec.kind == "token" else AutoModelForSequenceClassification
    folder_config = AutoConfig.from_pretrained(model_dir)
    # A task head of its own size (load_pretrained makes a head of another size fresh).
    kwargs: dict[str, Any] = {"num_labels": spec.num_labels}
    if spec.num_labels == 1:
        kwargs["problem_type"] = "regression"
    if _cls_first_xlnet(model_dir, folder_config):
        kwargs["summary_type"] = "first"  # batches pad on the right: the last token of a shorter row is padding
    model = load_pretrained(cls, model_dir, dtype=LOAD_DTYPE, **kwargs)
    if spec.kind == "sequence" and any(a.endswith("ForTokenClassification") for a in folder_config.architectures or ()):
        # A ModernBERT ELECTRA export's root is a 1-label token classifier (the RTD head): its `classifier` has the
        # names and, for a regression, the shape of the task's, and would be loaded as the task head, the same for
        # every seed. The task head is new, drawn from this seed (transformers' init skips what it loaded).
        for param in model.classifier.parameters():
            param._is_hf_initialized = False
        model._init_weights(model.classifier)
    return model


def _cls_first_xlnet(model_dir: str, folder_config: PretrainedConfig) -> bool:
    """Whether this is an XLNet folder whose tokenizer puts [CLS] first (this project's exports, those written before
    their config said so included), where XLNet's sequence summary would read the last token, as for its own
    tokenizer's <cls>."""
    if folder_config.model_type != "xlnet":
        return False
    tokenizer = export_tokenizer(model_dir)
    return tokenizer("x")["input_ids"][0] == tokenizer.cls_token_id


@torch.no_grad()
def evaluate(model: PreTrainedModel, spec: TaskSpec, enc: dict[str, Any], batch_size: int, pad_id: int, device: str,
             name: str = "") -> dict[str, float]:
    """The task's metrics on an encoded evaluation split (keyed `NAME_metric` for a split scored as `name`)."""
    model.eval()
    preds, golds = [], []
    for batch in _batches(enc, list(range(len(enc["labels"]))), batch_size, pad_id):
        labels = batch.pop("labels")
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        if spec.num_labels == 1:
            preds.append(logits.squeeze(-1).numpy())
            golds.append(labels.numpy())
        elif spec.kind == "token":
            keep = labels != -100
            preds.append(logits.argmax(-1)[keep].numpy())
            golds.append(labels[keep].numpy())
        else:
            preds.append(logits.argmax(-1).numpy())
            golds.append(labels.numpy())
    model.train()
    return score(spec, np.concatenate(preds), np.concatenate(golds), name)


def majority_baseline(spec: TaskSpec, train_enc: dict[str, Any], eval_encs: dict[str, dict[str, Any]]
                      ) -> Optional[dict[str, float]]:
    """Metrics of always predicting the training split's most frequent label on each encoded evaluation split, by
    the name it is scored as ("" for the evaluation split); None for regression."""
    if spec.num_labels == 1:
        return None
    flat = lambda labels: np.array([t for row in labels for t in (row if isinstance(row, list) else [row]) if t != -100])  # noqa: E731
    majority = np.bincount(flat(train_enc["labels"])).argmax()
    metrics = {}
    for name, enc in eval_encs.items():
        gold = flat(enc["labels"])
        metrics.update(score(spec, np.full_like(gold, majority), gold, name))
    return metrics


def _optimizer(model: torch.nn.Module, hp: Hyper, total: int):
    """AdamW without decay on biases and norms (`weight_decays`), and linear warmup then linear decay over `total` steps."""
    decay = [p for n, p in model.named_parameters() if weight_decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not weight_decays(n, p)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=hp.lr, betas=hp.betas, eps=hp.eps)
    warmup = int(total * hp.warmup_ratio)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    return optimizer, schedule


def task_loss_and_states(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A task model's loss and its encoder's `last_hidden_state` (the tensor its head reads, and TaCL's anchors)."""
    with last_hidden_state_of(model) as seen:
        loss = model(**batch).loss
    return loss, seen["last"]


def _train_one(model_dir: str, spec: TaskSpec, hp: Hyper, seed: int, train_enc, eval_encs, pad_id: int, device: str,
               loss: str, tacl_weight: float, tacl_temperature: float) -> dict[str, float]:
    _seed_everything(seed)
    model = _build_model(model_dir, spec).to(device)
    teacher = None
    if loss == "supervised-tacl":
        from transformers import AutoModel

        from model.objectives.tacl import supervised_tacl_loss

        teacher = load_pretrained(AutoModel, model_dir, dtype=LOAD_DTYPE).to(device).eval().requires_grad_(False)
    n = len(train_enc["labels"])
    total = max(1, math.ceil(math.ceil(n / hp.batch_size) * hp.epochs))
    optimizer, schedule = _optimizer(model, hp, total)
    generator = random.Random(seed)
    step, start = 0, time.time()
    model.train()
    while step < total:
        order = list(range(n))
        generator.shuffle(order)
        for batch in _batches(train_enc, order, hp.batch_size, pad_id):
            batch = {k: v.to(device) for k, v in batch.items()}
            objective, student = task_loss_and_states(model, batch)
            if teacher is not None:
                with torch.no_grad():
                    reference = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
                anchors = batch["labels"] != -100
                objective = objective + tacl_weight * supervised_tacl_loss(
                    student, reference, batch["labels"], anchors, batch["attention_mask"], tacl_temperature)
            objective.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % 50 == 0 or step == total:
                rate = step / (time.time() - start)
                log.info("seed %d step %d/%d | loss %.4f | %.1f steps/s | ETA %.0fs", seed, step, total, float(objective.detach()), rate,
                         (total - step) / rate)
            if step >= total:
                break
    metrics = {k: v for name, enc in eval_encs.items()
               for k, v in evaluate(model, spec, enc, hp.batch_size * 2, pad_id, device, name).items()}
    log.info("seed %d: %s", seed, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def finetune(model_dir: str, task: str, seeds: list[int], recipe_name: str = "taco", overrides: Optional[dict] = None,
             local: Optional[LocalTaskOptions] = None, loss: Literal["ce", "supervised-tacl"] = "ce", tacl_weight: float = 1.0,
             tacl_temperature: float = 0.01, max_train_samples: int = 0, max_eval_samples: int = 0,
             out: Optional[str] = None, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune once per seed and return (and write to `out`, replacing an earlier result there if `overwrite`)
    every seed's metrics with mean and std."""
    from transformers import AutoConfig

    if out:
        check_output(out, overwrite)
    tokenizer = export_tokenizer(model_dir)
    # The held-out split and the capped subsets do not move with the training seeds (nor differ from the probe's).
    spec, train_rows, eval_rows, also_rows = load_task_splits(task, local or LocalTaskOptions())
    if loss == "supervised-tacl" and spec.kind != "token":
        raise ConfigError("--loss supervised-tacl is for token classification (a json: task with --token-task)")
    train_rows, eval_rows, also_rows = capped_splits(train_rows, eval_rows, also_rows, max_train_samples, max_eval_samples)
    if spec.kind == "sequence" and spec.num_labels > 1 and len(set(train_rows[spec.label])) < 2:
        raise InputDataError(f"the {len(train_rows)} training example(s) hold one class: a classifier needs two; give "
                             "it more or other examples (--max-train-samples, the training file)")
    model_config = AutoConfig.from_pretrained(model_dir)
    hp = replace(recipe(recipe_name, model_config.hidden_size), **(overrides or {}))
    if usable_length(model_config, hp.max_length) < hp.max_length:
        log.info("max_length %d > the model's %d positions: using %d", hp.max_length, model_config.max_position_embeddings,
                 model_config.max_position_embeddings)
        hp = replace(hp, max_length=usable_length(model_config, hp.max_length))
    train_enc, eval_encs, words = _encode_splits(spec, tokenizer, hp.max_length, train_rows, {"": eval_rows, **also_rows})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    also = "".join(f" + {len(rows)} {name}" for name, rows in also_rows.items())
    log.info("fine-tuning %s on %s: %d train / %d eval%s examples, %d seed(s), %s", model_dir, task, len(train_rows),
             len(eval_rows), also, len(seeds), hp)
    runs = [{"seed": s, "metrics": _train_one(model_dir, spec, hp, s, train_enc, eval_encs, tokenizer.pad_token_id, device,
                                                loss, tacl_weight, tacl_temperature)} for s in seeds]
    names = list(runs[0]["metrics"])
    summary = {m: {"mean": statistics.fmean(r["metrics"][m] for r in runs),
                   "std": statistics.stdev([r["metrics"][m] for r in runs]) if len(runs) > 1 else 0.0} for m in names}
    result = {"model": str(model_dir), "task": task, "kind": spec.kind, "num_labels": spec.num_labels,
              "label_names": list(spec.label_names), "train_examples": len(train_rows), "eval_examples": len(eval_rows),
              **({"also_scored_examples": {name: len(rows) for name, rows in also_rows.items()}} if also_rows else {}),
              "recipe": recipe_name, "hyperparameters": asdict(hp), "loss": loss, "seeds": runs, "summary": summary,
              "majority_baseline": majority_baseline(spec, train_enc, eval_encs), **({"words": words} if words else {})}
    if out:
        from evaluation.results_files import write_results_json

        write_results_json(out, result)
    log.info("%s on %s: %s", model_dir, task, ", ".join(f"{m} {v['mean']:.4f} ± {v['std']:.4f}" for m, v in summary.items()))
    return result
