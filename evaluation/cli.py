"""The evaluation commands (`python -m pretrain evaluate ...|finetune`): analyses and fine-tuning of exported models.

They read Hugging Face folders only, never a run folder or a checkpoint: evaluation stands beside pre-training.
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import asdict
from pathlib import Path

from core.config_flags import add_config_flags, flag_overrides
from core.config_io import load_config
from core.process_life import stops_deferred

# Where the installed packages are: `--config evaluation/configs/finetune/X.yaml` is found there when it is not
# under the working directory (an installed wheel run from any folder).
INSTALLED = (Path(__file__).resolve().parents[1],)


def _eval_config(cls, args: argparse.Namespace):
    """YAML (--config), then key=value overrides, then the flags given (each one is `key=value`)."""
    return load_config(cls, args.config, [*args.overrides, *flag_overrides(args, cls)], search=INSTALLED)


def _self_similarity(args: argparse.Namespace) -> int:
    with stops_deferred():
        from evaluation.checks import check_report, export_tokenizer
        from evaluation.config import SelfSimilarityConfig
        from evaluation.self_similarity import check_depths, model_spec, read_sentences, self_similarity, write_report

    cfg = _eval_config(SelfSimilarityConfig, args)
    sentences = read_sentences(cfg.text)
    labels = dict(model_spec(spec)[::-1] for spec in cfg.model)  # path -> label
    check_report(cfg.out, (".json", ".png"), cfg.overwrite)
    for model in labels:
        export_tokenizer(model)  # every folder checked before the first model's work
    check_depths(labels)
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
    with stops_deferred():
        from evaluation.checks import check_output, export_tokenizer
        from evaluation.config import LinearProbeConfig
        from evaluation.linear_probe import check_layer, linear_probe, metric_text

    cfg = _eval_config(LinearProbeConfig, args)
    if cfg.out:
        check_output(cfg.out, cfg.overwrite)
    for model in cfg.model:  # every folder checked before the first model's work
        check_layer(model, cfg.layer)
        export_tokenizer(model)
    results = [linear_probe(model, cfg.task, cfg.data, cfg.layer, cfg.features, cfg.c_grid, cfg.folds, cfg.max_train_samples,
                            cfg.max_eval_samples, cfg.max_length, cfg.batch_size, cfg.seed) for model in cfg.model]
    for result in results:
        metrics = functools.partial(metric_text, names=result["majority_baseline"])  # the majority class has them all
        counts = "".join(f" + {n} {name}" for name, n in result.get("also_scored_examples", {}).items())
        print(f"{result['model']}: " + ", ".join(f"{name} {metrics(r)}" for name, r in result["probes"].items())
              + f" (majority class {metrics(result['majority_baseline'])}; {result['train_examples']} train / "
                f"{result['eval_examples']} eval{counts})")
    if cfg.out:
        from evaluation.results_files import write_results_json

        write_results_json(cfg.out, {"config": asdict(cfg), "results": results})
        print(f"results: {cfg.out}")
    return 0


def _sentence_embeddings(args: argparse.Namespace) -> int:
    with stops_deferred():
        from evaluation.config import SentenceEmbeddingConfig
        from evaluation.sentence_embeddings import evaluate_suite

    cfg = _eval_config(SentenceEmbeddingConfig, args)
    report = evaluate_suite(cfg.model, cfg.suite, cfg.tasks, cfg.features, cfg.out, layer=cfg.layer, folds=cfg.folds,
                            c_grid=tuple(cfg.c_grid), inner_folds=cfg.inner_folds, max_examples=cfg.max_examples,
                            max_length=cfg.max_length, batch_size=cfg.batch_size, seed=cfg.seed,
                            overwrite=cfg.overwrite)
    print(report["table"], end="")
    if cfg.out:
        print(f"results: {Path(cfg.out).with_suffix('.json')} {Path(cfg.out).with_suffix('.md')}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    with stops_deferred():
        from evaluation.config import FinetuneConfig
        from evaluation.finetune import finetune

    cfg = _eval_config(FinetuneConfig, args)
    result = finetune(cfg.model, cfg.task, cfg.seeds, cfg.recipe, cfg.recipe_overrides(), cfg.data, cfg.loss,
                      cfg.tacl_weight, cfg.tacl_temperature, cfg.max_train_samples, cfg.max_eval_samples, cfg.out,
                      cfg.overwrite)
    for metric, value in result["summary"].items():
        base = (result["majority_baseline"] or {}).get(metric)
        print(f"{metric}: {value['mean']:.4f} ± {value['std']:.4f} over {len(cfg.seeds)} seed(s)"
              + (f" (majority class: {base:.4f})" if base is not None else ""))
    if cfg.out:
        print(f"results: {cfg.out}")
    return 0


# Help of the generated flags (every config key is a flag: core/config_flags.py), by key.
FLAG_HELP = {
    "model": "HF model folder(s): exports",
    "max_length": "tokens per text; longer texts are cut",
    "batch_size": "texts per forward pass",
    "task": "GLUE name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte) from the hub, NAME:FOLDER for GLUE "
            "downloaded to FOLDER, or csv:PATH / json:PATH",
    "text": "UTF-8 text, one sentence per line",
    "out": "output: the results JSON (self-similarity, sentence-embeddings: a path without suffix)",
    "overwrite": "replace an earlier result at --out (only one an evaluation command wrote)",
    "special_tokens": "keep [CLS]/[SEP] in the pairs (include, the default, as TaCL's analysis) or drop them",
    "layer": "hidden-state index (default -1, the last layer; 0 the embeddings)",
    "suite": "task suite folder with tasks.json (default runs/senteval)",
    "tasks": "a subset of the suite's tasks",
    "max_examples": "a seeded sample of this many rows per task",
    "seeds": "default 1 2 3",
    "recipe": "hyper-parameter recipe (docs/finetuning.md; default taco)",
    "loss": "supervised-tacl adds TaCL's supervised token contrastive loss (token tasks)",
    "encoding": "of a csv: file (e.g. latin-1)",
    "regression": "the label is a float score",
    "token_task": "rows hold word lists and tag lists",
    "ignore_tag": "token tasks: the tag of words that carry no label (neither a class nor scored)",
}


# Where a command's key means something else than FLAG_HELP says.
COMMAND_FLAG_HELP = {
    "self-similarity": {"model": "HF model folder(s): exports, as PATH or LABEL=PATH (one label over seeds is one line)"},
    "finetune": {"model": "an HF model folder: an export",
                 **{key: "override the recipe" for key in ("lr", "batch_size", "epochs", "max_length", "weight_decay",
                                                           "warmup_ratio")}},
}


def _command(sub: argparse._SubParsersAction, name: str, cls: type, func, help: str, example: str) -> None:
    """A command that reads config `cls`: --config, key=value overrides, and one flag per key."""
    parser = sub.add_parser(name, help=help)
    parser.add_argument("--config", default=None, help=f"YAML file (keys of {cls.__name__})")
    parser.add_argument("overrides", nargs="*", default=[], help=f"key=value overrides, e.g. {example}")
    add_config_flags(parser, cls, {**FLAG_HELP, **COMMAND_FLAG_HELP.get(name, {})})
    parser.set_defaults(func=func)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `evaluate` (self-similarity, linear-probe, sentence-embeddings) and `finetune` to a command line."""
    from evaluation.config import FinetuneConfig, LinearProbeConfig, SelfSimilarityConfig, SentenceEmbeddingConfig

    ev = sub.add_parser("evaluate", help="analyses of exported models").add_subparsers(dest="analysis", required=True)
    _command(ev, "self-similarity", SelfSimilarityConfig, _self_similarity,
             "TaCL's layer-wise token self-similarity (JSON + PNG)", "max_length=256")
    _command(ev, "linear-probe", LinearProbeConfig, _linear_probe,
             "logistic regression on frozen features (mean-pooled, [CLS], word)", "data.label_column=topic")
    _command(ev, "sentence-embeddings", SentenceEmbeddingConfig, _sentence_embeddings,
             "SentEval-style: frozen mean/[CLS] embeddings, k-fold logistic regression, STS correlation", "folds=5")
    _command(sub, "finetune", FinetuneConfig, _finetune,
             "fine-tune an exported model on a GLUE or local task, over seeds (evaluation/configs/finetune/)",
             "lr=3e-5 data.label_column=topic")
