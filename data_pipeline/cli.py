"""Command line for the data pipeline."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from core.config_flags import CommandLineParser, parse_with_overrides
from core.config_io import load_config
from core.errors import ConfigError, UserError, one_line, user_error
from core.process_life import stops_deferred
from data_pipeline.config import PrepareConfig


def _verify(dataset: str) -> int:
    with stops_deferred():
        from data_pipeline.shard_record import record_split
        from data_pipeline.shards import read_manifest, verify_split

    try:
        manifest = read_manifest(dataset)
        for split, counts in manifest["splits"].items():
            shards = verify_split(Path(dataset) / split)
            record_split(Path(dataset) / split)  # launches trust these files until they change
            print(f"{split}: {shards} shard(s), {counts['sequences']} sequences: hashes match")
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m data_pipeline` and its subcommands."""
    parser = CommandLineParser(prog="python -m data_pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="raw text -> tokenizer -> packed MDS shards")
    prep.add_argument("--config", required=True, help="YAML file (see data_pipeline/configs/)")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    prep.add_argument("--task", type=int, default=None,
                      help="this process's task in a job array (0-based); task 0 plans, the last to finish publishes")
    prep.add_argument("--tasks", type=int, default=None, help="the number of tasks in the job array")
    prep.add_argument("--array-id", default=None,
                      help="names the array's shared staging folder (SLURM_ARRAY_JOB_ID): a rerun with the same id resumes")
    prep.add_argument("overrides", nargs="*", help="key=value overrides, e.g. seq_len=256 tokenizer.vocab_size=16000")
    ver = sub.add_parser("verify", help="check a prepared dataset's shards against their recorded hashes")
    ver.add_argument("dataset", help="a folder written by prepare")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run a subcommand; a user's mistake exits 2 with a one-line message, a bug 1 with its traceback."""
    args = parse_with_overrides(build_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    for noisy in ("datasets", "streaming", "fsspec", "urllib3", "huggingface_hub", "botocore", "boto3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "verify":
        return _verify(args.dataset)
    try:
        overrides = list(args.overrides) + (["overwrite=true"] if args.overwrite else [])
        cfg = load_config(PrepareConfig, args.config, overrides, search=(Path(__file__).resolve().parents[1],))
        with stops_deferred():
            from data_pipeline.prepare import prepare, prepare_task

        command = " ".join(["python -m data_pipeline", *(argv if argv is not None else sys.argv[1:])])
        array = (args.task, args.tasks, args.array_id)
        if any(a is not None for a in array) and any(a is None for a in array):
            raise ConfigError("--task, --tasks and --array-id go together")
        out = prepare(cfg, command=command) if args.tasks is None else prepare_task(cfg, args.task, args.tasks, args.array_id, command)
    except Exception as exc:
        shown = user_error(exc)
        if shown is None:  # a bug: its traceback
            raise
        print(f"error: {one_line(shown)}", file=sys.stderr)
        return 2
    print(f"dataset: {out}" if out else "this task is done; the array's last task to end publishes the dataset (the "
          "log above says where, if it already has)")
    return 0
