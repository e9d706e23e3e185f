"""The evaluation commands (`python -m pretrain evaluate ...|finetune`): analyses and fine-tuning of exported models.

They read Hugging Face folders only, never a run folder or a checkpoint: evaluation stands beside pre-training.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from core.config_io import load_config
from core.errors import MissingFileError

# Where the installed packages are: `--config evaluation/configs/finetune/X.yaml` is found there when it is not
# under the working directory (an installed wheel run from any folder).
INSTALLED = (Path(__file__).resolve().parents[1],)


# Flags of the evaluation commands that are keys of their configs' `data` section.
_DATA_FLAGS = ("text_column", "pair_column", "label_column", "validation_file", "val_fraction", "encoding", "regression",
               "token_task", "ignore_tag")
# Parsed arguments that are not config keys.
_NOT_KEYS = ("func", "command", "analysis", "config", "overrides", "local_rank")


def _eval_config(cls, args: argparse.Namespace):
    """YAML (--config), then key=value overrides, then the flags given (each one is `key=value`).

    The evaluation parsers default every flag to unset (argparse.SUPPRESS), so `args` holds only
    the flags on the command line besides the names in _NOT_KEYS.
    """
    given = [f"{'data.' if name in _DATA_FLAGS else ''}{name}={json.dumps(value, ensure_ascii=False)}"
             for name, value in vars(args).items() if name not in _NOT_KEYS]
    return load_config(cls, args.config, [*args.overrides, *given], search=INSTALLED)


def _self_similarity(args: argparse.Namespace) -> int:
    from evaluation.config import SelfSimilarityConfig
    from evaluation.self_similarity import model_spec, read_sentences, self_similarity, write_report

    cfg = _eval_config(SelfSimilarityConfig, args)
    sentences = read_sentences(cfg.text)
    labels = dict(model_spec(spec)[::-1] for spec in cfg.model)  # path -> label
    for model in labels:
        if not (Path(model) / "config.json").is_file():
            raise MissingFileError(f"--model '{model}' is not a Hugging Face model folder (no config.json)")
    results = {model: self_similarity(model, sentences, cfg.special_tokens, cfg.max_length, cfg.batch_size)
               for model in labels}
    json_path, png_path = write_report(results, cfg.out, {
        "text": str(cfg.text), "sentences": len(sentences), "special_tokens": cfg.special_tokens,
        "max_length": cfg.max_length, "pooling": "sum of pairwise cosines / number of pairs, over all sentences"},
        labels=labels)
    for model, values in results.items():
        print(f"{model}: " + " ".join(f"L{i + 1} {v:.3f}" for i, v in enumerate(values)))
    print(f"self-similarity: {json_path} {png_path}")
    return 0


def _linear_probe(args: argparse.Namespace) -> int:
    from evaluation.config import LinearProbeConfig
    from evaluation.linear_probe import linear_probe

    cfg = _eval_config(LinearProbeConfig, args)
    results = [linear_probe(model, cfg.task, cfg.data, cfg.layer, cfg.features, cfg.c_grid, cfg.folds, cfg.max_train_samples,
                            cfg.max_eval_samples, cfg.max_length, cfg.batch_size, cfg.seed) for model in cfg.model]
    for result in results:
        base = result["majority_baseline"]["accuracy"]
        print(f"{result['model']}: " + ", ".join(f"{name} accuracy {r['accuracy']:.4f}" for name, r in result["probes"].items())
              + f" (majority class {base:.4f}; {result['train_examples']} train / {result['eval_examples']} eval)")
    if cfg.out:
        from core.atomic_files import write_text_atomic

        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(cfg.out), json.dumps({"config": asdict(cfg), "results": results}, indent=2) + "\n")
        print(f"results: {cfg.out}")
    return 0


def _sentence_embeddings(args: argparse.Namespace) -> int:
    from evaluation.config import SentenceEmbeddingConfig
    from evaluation.sentence_embeddings import evaluate_suite

    cfg = _eval_config(SentenceEmbeddingConfig, args)
    report = evaluate_suite(cfg.model, cfg.suite, cfg.tasks, cfg.features, cfg.out, layer=cfg.layer, folds=cfg.folds,
                            c_grid=tuple(cfg.c_grid), inner_folds=cfg.inner_folds, max_examples=cfg.max_examples,
                            max_length=cfg.max_length, batch_size=cfg.batch_size, seed=cfg.seed)
    print(report["table"], end="")
    if cfg.out:
        print(f"results: {Path(cfg.out).with_suffix('.json')} {Path(cfg.out).with_suffix('.md')}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from evaluation.config import FinetuneConfig
    from evaluation.finetune import finetune

    cfg = _eval_config(FinetuneConfig, args)
    result = finetune(cfg.model, cfg.task, cfg.seeds, cfg.recipe, cfg.recipe_overrides(), cfg.data, cfg.loss,
                      cfg.tacl_weight, cfg.tacl_temperature, cfg.max_train_samples, cfg.max_eval_samples, cfg.out)
    for metric, value in result["summary"].items():
        base = (result["majority_baseline"] or {}).get(metric)
        print(f"{metric}: {value['mean']:.4f} ± {value['std']:.4f} over {len(cfg.seeds)} seed(s)"
              + (f" (majority class: {base:.4f})" if base is not None else ""))
    if cfg.out:
        print(f"results: {cfg.out}")
    return 0


def _add_task_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say how a csv:/json: task is read (the `data.*` keys), the sample caps and the output."""
    parser.add_argument("--text-column")
    parser.add_argument("--pair-column")
    parser.add_argument("--label-column")
    parser.add_argument("--validation-file")
    parser.add_argument("--val-fraction", type=float)
    parser.add_argument("--encoding", help="of a csv: file (e.g. latin-1)")
    parser.add_argument("--token-task", action="store_true", help="rows hold word lists and tag lists")
    parser.add_argument("--ignore-tag", help="token tasks: the tag of words that carry no label (neither a class nor scored)")
    parser.add_argument("--max-train-samples", type=int)
    parser.add_argument("--max-eval-samples", type=int)
    parser.add_argument("--out", help="results JSON")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `evaluate` (self-similarity, linear-probe, sentence-embeddings) and `finetune` to a command line."""
    _add_evaluate(sub)
    _add_finetune(sub)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("evaluate", help="analyses of exported models").add_subparsers(dest="analysis", required=True)
    # Evaluation flags default to unset: a flag given overrides the config file and key=value (evaluation/config.py).
    unset = argparse.SUPPRESS
    sim = ev.add_parser("self-similarity", help="TaCL's layer-wise token self-similarity (JSON + PNG)", argument_default=unset)
    sim.add_argument("--config", default=None, help="YAML file (keys of SelfSimilarityConfig)")
    sim.add_argument("overrides", nargs="*", default=[], help="key=value overrides")
    sim.add_argument("--model", nargs="+",
                     help="one or more HF model folders, each PATH or LABEL=PATH (one label over several seeds: one line, range shaded)")
    sim.add_argument("--text", help="UTF-8 text, one sentence per line")
    sim.add_argument("--out", help="output path without suffix: writes OUT.json and OUT.png")
    sim.add_argument("--special-tokens", choices=("include", "exclude"),
                     help="keep [CLS]/[SEP] in the pairs (include, the default, as TaCL's analysis) or drop them")
    sim.add_argument("--max-length", type=int, help="default 512")
    sim.add_argument("--batch-size", type=int, help="default 32")
    sim.set_defaults(func=_self_similarity)
    probe = ev.add_parser("linear-probe", help="logistic regression on frozen features (mean-pooled, [CLS], word)",
                          argument_default=unset)
    probe.add_argument("--config", default=None, help="YAML file (keys of LinearProbeConfig)")
    probe.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. data.label_column=topic")
    probe.add_argument("--model", nargs="+", help="one or more HF model folders")
    probe.add_argument("--task", help="GLUE name or csv:PATH / json:PATH")
    probe.add_argument("--layer", type=int, help="hidden-state index (default -1, the last layer)")
    _add_task_flags(probe)
    probe.set_defaults(func=_linear_probe)
    sent = ev.add_parser("sentence-embeddings", argument_default=unset,
                         help="SentEval-style: frozen mean/[CLS] embeddings, k-fold logistic regression, STS correlation")
    sent.add_argument("--config", default=None, help="YAML file (keys of SentenceEmbeddingConfig)")
    sent.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. folds=5")
    sent.add_argument("--model", nargs="+", help="one or more HF model folders")
    sent.add_argument("--suite", help="task suite folder with tasks.json (default runs/senteval)")
    sent.add_argument("--tasks", nargs="+", help="a subset of the suite's tasks")
    sent.add_argument("--max-examples", type=int, help="a seeded sample of this many rows per task")
    sent.add_argument("--out", help="output path without suffix: writes OUT.json and OUT.md")
    sent.set_defaults(func=_sentence_embeddings)


def _add_finetune(sub: argparse._SubParsersAction) -> None:
    unset = argparse.SUPPRESS
    ft = sub.add_parser("finetune", help="fine-tune an exported model on a GLUE or local task, over seeds",
                        argument_default=unset)
    ft.add_argument("--config", default=None, help="YAML file (keys of FinetuneConfig; see evaluation/configs/finetune/)")
    ft.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. lr=3e-5 data.label_column=topic")
    ft.add_argument("--model", help="HF model folder (an export)")
    ft.add_argument("--task", help="GLUE name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte) or csv:PATH / json:PATH")
    ft.add_argument("--seeds", type=int, nargs="+", help="default 1 2 3")
    ft.add_argument("--recipe", choices=("hf", "tacl_squad", "taco", "coco_lm"),
                    help="hyper-parameter recipe (docs/finetuning.md; default taco)")
    for name, typ in (("--lr", float), ("--batch-size", int), ("--epochs", float), ("--max-length", int),
                      ("--weight-decay", float), ("--warmup-ratio", float)):
        ft.add_argument(name, type=typ, help="override the recipe")
    ft.add_argument("--loss", choices=("ce", "supervised-tacl"),
                    help="supervised-tacl adds TaCL's supervised token contrastive loss (token tasks)")
    ft.add_argument("--tacl-weight", type=float)
    ft.add_argument("--tacl-temperature", type=float)
    ft.add_argument("--regression", action="store_true", help="the label is a float score")
    _add_task_flags(ft)
    ft.set_defaults(func=_finetune)
