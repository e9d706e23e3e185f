"""Command line: `python -m pretrain train|export|evaluate|finetune`."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from core.config_io import load_config
from core.errors import MissingFileError, UserError, one_line

# Where the installed packages are: `--config pretrain/configs/X.yaml` is found there when it is not under the
# working directory (an installed wheel run from any folder).
INSTALLED = (Path(__file__).resolve().parents[1],)


def _train(args: argparse.Namespace) -> int:
    from pretrain.exit_status import write_status

    write_status("running")  # before the slow imports: a rank that dies in them is still named by its host

    import torch

    from core import distributed as dist
    from pretrain import signals
    from pretrain.config import RunConfig
    from pretrain.preemption import EXIT_FINISHED, EXIT_PREEMPTED
    from pretrain.run import build_trainer

    trainer = None
    try:
        cfg = load_config(RunConfig, args.config, args.overrides, search=INSTALLED)
        trainer = build_trainer(cfg)
        try:
            status = trainer.fit()
        except Exception as exc:
            if not dist.is_peer_failure(exc) and signals.first_received() != "SIGTERM":
                trainer.mark_failed(exc)  # then the error goes on: one line if it is the user's, a traceback if a bug
            raise
    except Exception as exc:
        if dist.is_peer_failure(exc):
            _peer_lost(exc, trainer)
        if signals.first_received() == "SIGTERM":
            # srun ends the other tasks when one dies (--kill-on-bad-exit), or SLURM a failed node's job: what
            # breaks then (a loader worker terminated with us) is the termination, not a bug of this rank.
            write_status("terminated", error=type(exc).__name__, step=trainer.step if trainer is not None else -1)
        else:
            write_status("failed", error=type(exc).__name__, code=2 if isinstance(exc, UserError) else 1)
        raise
    # The decision is made and the checkpoint written: a late SIGTERM (SLURM sends more than one)
    # must not turn "preempted, requeue me" into "killed by a signal" during shutdown.
    signals.ignore()
    write_status(status, step=trainer.step)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return EXIT_PREEMPTED if status == "preempted" else EXIT_FINISHED


def _peer_lost(exc: BaseException, trainer) -> None:
    """Another rank died or hung: one line, no checkpoint (its shards are gone), exit 76 without teardown."""
    import os

    import torch

    from core import distributed as dist
    from pretrain.exit_status import EXIT_PEER_LOST, write_status

    step = trainer.step if trainer is not None else -1
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "?"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    line = (f"peer lost: rank {dist.rank()} of {dist.world_size()}, step {step}, backend {backend}: {first[:300]} "
            f"(exit {EXIT_PEER_LOST}; resume from the last complete checkpoint)")
    if trainer is not None and trainer.rank == 0:
        trainer.log.info(line)
    print(line, file=sys.stderr, flush=True)
    write_status("peer_lost", step=step, error=first[:500])
    sys.stdout.flush()
    # Tearing down a group whose peer is gone can hang (and NCCL's can spin): leave now.
    os._exit(EXIT_PEER_LOST)


def _export(args: argparse.Namespace) -> int:
    from pretrain.export import export

    out = export(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"export: {out}")
    return 0


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
    from pretrain.evaluation.config import SelfSimilarityConfig
    from pretrain.evaluation.self_similarity import model_spec, read_sentences, self_similarity, write_report

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
    from pretrain.evaluation.config import LinearProbeConfig
    from pretrain.evaluation.linear_probe import linear_probe

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
    from pretrain.evaluation.config import SentenceEmbeddingConfig
    from pretrain.evaluation.sentence_embeddings import evaluate_suite

    cfg = _eval_config(SentenceEmbeddingConfig, args)
    report = evaluate_suite(cfg.model, cfg.suite, cfg.tasks, cfg.features, cfg.out, layer=cfg.layer, folds=cfg.folds,
                            c_grid=tuple(cfg.c_grid), inner_folds=cfg.inner_folds, max_examples=cfg.max_examples,
                            max_length=cfg.max_length, batch_size=cfg.batch_size, seed=cfg.seed)
    print(report["table"], end="")
    if cfg.out:
        print(f"results: {Path(cfg.out).with_suffix('.json')} {Path(cfg.out).with_suffix('.md')}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from pretrain.evaluation.config import FinetuneConfig
    from pretrain.evaluation.finetune import finetune

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


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run a subcommand; a user's mistake exits 2 with a one-line message, a bug 1 with its traceback."""
    parser = argparse.ArgumentParser(prog="python -m pretrain")
    # torchrun passes nothing extra, but the deepspeed launcher adds --local_rank=N.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="pre-train (resumes from the output folder)")
    train.add_argument("--config", required=True, help="YAML file (see pretrain/configs/)")
    train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=100")
    train.set_defaults(func=_train)
    exp = sub.add_parser("export", help="checkpoint -> Hugging Face folder")
    exp.add_argument("--checkpoint", required=True, help="RUN_DIR (newest complete checkpoint) or RUN_DIR/checkpoints/TAG")
    exp.add_argument("--out", required=True, help="folder to write")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    exp.set_defaults(func=_export)
    ev = sub.add_parser("evaluate", help="analyses of exported models").add_subparsers(dest="analysis", required=True)
    # Evaluation flags default to unset: a flag given overrides the config file and key=value (pretrain/evaluation/config.py).
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
    ft = sub.add_parser("finetune", help="fine-tune an exported model on a GLUE or local task, over seeds",
                        argument_default=unset)
    ft.add_argument("--config", default=None, help="YAML file (keys of FinetuneConfig; see pretrain/configs/finetune/)")
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
