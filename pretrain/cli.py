"""Command line: `python -m pretrain train|export`."""
from __future__ import annotations

import argparse
import logging
import sys

from pretrain.config import RunConfig
from data_pipeline.shards import CorruptShardError
from pretrain.config_io import ConfigError, load_config


def _train(args: argparse.Namespace) -> int:
    import torch

    from pretrain.run import build_trainer

    from pretrain import signals
    from pretrain.preemption import EXIT_FINISHED, EXIT_PREEMPTED

    cfg = load_config(RunConfig, args.config, args.overrides)
    trainer = build_trainer(cfg)
    status = trainer.fit()
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


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run a subcommand; bad input exits 2 with a one-line message."""
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        return args.func(args)
    except (ConfigError, CorruptShardError, FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
