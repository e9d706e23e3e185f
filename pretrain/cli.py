"""Command line: `python -m pretrain train|export|evaluate|finetune`."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from core.config_io import load_config
from core.errors import MissingFileError, UserError
from pretrain.config import RunConfig


def _train(args: argparse.Namespace) -> int:
    import torch

    from pretrain import signals
    from pretrain.preemption import EXIT_FINISHED, EXIT_PREEMPTED
    from pretrain.run import build_trainer

    cfg = load_config(RunConfig, args.config, args.overrides)
    trainer = build_trainer(cfg)
    try:
        status = trainer.fit()
    except Exception as exc:
        trainer.mark_failed(exc)  # then the error goes on: one line if it is the user's, a traceback if a bug
        raise
    # The decision is made and the checkpoint written: a late SIGTERM (SLURM sends more than one)
    # must not turn "preempted, requeue me" into "killed by a signal" during shutdown.
    signals.ignore()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return EXIT_PREEMPTED if status == "preempted" else EXIT_FINISHED


def _export(args: argparse.Namespace) -> int:
    from pretrain.export import export

    out = export(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"export: {out}")
    return 0


def _self_similarity(args: argparse.Namespace) -> int:
    from pretrain.evaluation.self_similarity import read_sentences, self_similarity, write_report

    sentences = read_sentences(args.text)
    for model in args.model:
        if not (Path(model) / "config.json").is_file():
            raise MissingFileError(f"--model '{model}' is not a Hugging Face model folder (no config.json)")
    results = {model: self_similarity(model, sentences, args.special_tokens, args.max_length, args.batch_size)
               for model in args.model}
    json_path, png_path = write_report(results, args.out, {
        "text": str(args.text), "sentences": len(sentences), "special_tokens": args.special_tokens,
        "max_length": args.max_length, "pooling": "sum of pairwise cosines / number of pairs, over all sentences"})
    for model, values in results.items():
        print(f"{model}: " + " ".join(f"L{i + 1} {v:.3f}" for i, v in enumerate(values)))
    print(f"self-similarity: {json_path} {png_path}")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from pretrain.evaluation.finetune import finetune
    from pretrain.evaluation.tasks import LocalTaskOptions

    overrides = {k: v for k, v in {"lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
                                   "max_length": args.max_length, "weight_decay": args.weight_decay,
                                   "warmup_ratio": args.warmup_ratio}.items() if v is not None}
    local = LocalTaskOptions(text_column=args.text_column, pair_column=args.pair_column, label_column=args.label_column,
                             validation_file=args.validation_file, val_fraction=args.val_fraction, encoding=args.encoding,
                             regression=args.regression, token_task=args.token_task)
    result = finetune(args.model, args.task, args.seeds, args.recipe, overrides, local, args.loss, args.tacl_weight,
                      args.tacl_temperature, args.max_train_samples, args.max_eval_samples, args.out)
    for metric, value in result["summary"].items():
        base = (result["majority_baseline"] or {}).get(metric)
        print(f"{metric}: {value['mean']:.4f} ± {value['std']:.4f} over {len(args.seeds)} seed(s)"
              + (f" (majority class: {base:.4f})" if base is not None else ""))
    if args.out:
        print(f"results: {args.out}")
    return 0


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
    sim = ev.add_parser("self-similarity", help="TaCL's layer-wise token self-similarity (JSON + PNG)")
    sim.add_argument("--model", nargs="+", required=True, help="one or more HF model folders")
    sim.add_argument("--text", required=True, help="UTF-8 text, one sentence per line")
    sim.add_argument("--out", required=True, help="output path without suffix: writes OUT.json and OUT.png")
    sim.add_argument("--special-tokens", choices=("include", "exclude"), default="include",
                     help="keep [CLS]/[SEP] in the pairs (include, as TaCL's analysis) or drop them")
    sim.add_argument("--max-length", type=int, default=512)
    sim.add_argument("--batch-size", type=int, default=32)
    sim.set_defaults(func=_self_similarity)
    ft = sub.add_parser("finetune", help="fine-tune an exported model on a GLUE or local task, over seeds")
    ft.add_argument("--model", required=True, help="HF model folder (an export)")
    ft.add_argument("--task", required=True, help="GLUE name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte) or csv:PATH / json:PATH")
    ft.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ft.add_argument("--recipe", default="taco", choices=("hf", "tacl_squad", "taco", "coco_lm"),
                    help="hyper-parameter recipe (docs/finetuning.md)")
    for name, typ in (("--lr", float), ("--batch-size", int), ("--epochs", float), ("--max-length", int),
                      ("--weight-decay", float), ("--warmup-ratio", float)):
        ft.add_argument(name, type=typ, default=None, help="override the recipe")
    ft.add_argument("--loss", choices=("ce", "supervised-tacl"), default="ce",
                    help="supervised-tacl adds TaCL's supervised token contrastive loss (token tasks)")
    ft.add_argument("--tacl-weight", type=float, default=1.0)
    ft.add_argument("--tacl-temperature", type=float, default=0.01)
    ft.add_argument("--text-column", default="text")
    ft.add_argument("--pair-column", default=None)
    ft.add_argument("--label-column", default="label")
    ft.add_argument("--validation-file", default=None)
    ft.add_argument("--val-fraction", type=float, default=0.1)
    ft.add_argument("--encoding", default="utf-8", help="of a csv: file (e.g. latin-1)")
    ft.add_argument("--regression", action="store_true", help="the label is a float score")
    ft.add_argument("--token-task", action="store_true", help="rows hold word lists and tag lists")
    ft.add_argument("--max-train-samples", type=int, default=0)
    ft.add_argument("--max-eval-samples", type=int, default=0)
    ft.add_argument("--out", default=None, help="results JSON")
    ft.set_defaults(func=_finetune)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
