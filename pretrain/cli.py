"""Command line: `python -m pretrain train|export`, and evaluation's `evaluate|finetune` (evaluation/cli.py)."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from core.config_flags import CommandLineParser, parse_with_overrides
from core.config_io import load_config
from core.errors import DivergedError, one_line, user_error
from core.process_life import flush_stdout, stops_deferred, to_stderr
from evaluation.cli import add_commands as add_evaluation_commands
from pretrain.lifecycle.exit_status import exit_code_for

# Where the installed packages are: `--config pretrain/configs/X.yaml` is found there when it is not under the
# working directory (an installed wheel run from any folder).
INSTALLED = (Path(__file__).resolve().parents[1],)


def _train(args: argparse.Namespace) -> int:
    from pretrain.lifecycle.exit_status import write_status

    write_status("running")  # before the slow imports: a rank that dies in them is still named by its host

    import torch

    from core import distributed as dist
    from core.host_memory import freeze_imports, resume_garbage_collector
    from pretrain.lifecycle import signals
    from pretrain.config import RunConfig
    from pretrain.lifecycle.exit_status import EXIT_FINISHED, EXIT_INTERRUPTED, EXIT_PREEMPTED, write_status_or_warn
    from pretrain.run import build_trainer

    trainer, failed = None, False
    try:
        cfg = load_config(RunConfig, args.config, args.overrides, search=INSTALLED)
        dist.import_deepspeed()  # the build imports it anyway: its objects are frozen with the other imports'
        freeze_imports()
        trainer = build_trainer(cfg)
        resume_garbage_collector()
        try:
            status = trainer.fit()
        except Exception as exc:
            if not _attempt_lost(exc) and not signals.sigterm_received():
                # Decided once, and recorded before the slow part (the trackers' end, up to seconds): the peers that
                # fail with this rank exit at once, and srun or torchrun then terminates it; that SIGTERM is theirs.
                failed = True
                _record_failure(exc)
                trainer.mark_failed(exc)  # then the error goes on: one line if it is the user's, a traceback if a bug
            raise
    except Exception as exc:
        if not failed:
            _ended_by(exc, trainer)
        raise
    # The decision is made and the checkpoint written: a late SIGTERM (SLURM sends more than one)
    # must not turn "preempted, requeue me" into "killed by a signal" during shutdown.
    signals.ignore()
    write_status_or_warn(status, step=trainer.step)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"preempted": EXIT_PREEMPTED, "interrupted": EXIT_INTERRUPTED}.get(status, EXIT_FINISHED)


def _ended_by(exc: BaseException, trainer) -> None:
    """An error not yet taken as this rank's failure: a lost peer ends the attempt at once, a termination ends the
    rank by its signal, anything else is recorded as the rank's failure (and goes on)."""
    from pretrain.lifecycle import signals

    if _attempt_lost(exc):
        _peer_lost(exc, trainer)
    if signals.sigterm_received():
        # srun ends the other tasks when one dies (--kill-on-bad-exit), or SLURM a failed node's job, or torchrun
        # the other ranks when one exits: what breaks then (a loader worker terminated with us) is the
        # termination, not a bug of this rank, and its traceback would bury the line of the rank that stopped.
        signals.terminated(trainer.step if trainer is not None else -1, type(exc).__name__)
    else:
        _record_failure(exc)


def _record_failure(exc: BaseException) -> None:
    """This rank's status: failed, on `exc`, with the exit code it ends with."""
    from pretrain.lifecycle.exit_status import write_status

    try:
        write_status("failed", error=type(exc).__name__, code=exit_code_for(exc))
    except OSError as status_error:  # on the disk that stopped the run: the run's own error goes on
        to_stderr(f"warning: the rank's status could not be recorded ({status_error})")


def _attempt_lost(exc: BaseException) -> bool:
    """Whether `exc` ends this attempt through no fault of the input or the code: a lost peer, a worker that never
    started."""
    from core import distributed as dist
    from data_pipeline.loader_worker import start_failure

    return start_failure(exc) is not None or dist.is_peer_failure(exc)


def _peer_lost(exc: BaseException, trainer) -> None:
    """Another rank died or hung, or this attempt was lost otherwise (AttemptLostError): one line, no checkpoint (a
    lost rank's shards are gone), exit 76 without teardown."""
    import os

    import torch

    from core import distributed as dist
    from data_pipeline.loader_worker import start_failure
    from pretrain.lifecycle.exit_status import EXIT_PEER_LOST, failed_peers, write_status

    step = trainer.step if trainer is not None else -1
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "?"
    lost = start_failure(exc)
    first = next((line.strip() for line in str(lost or exc).splitlines() if line.strip()), type(exc).__name__)
    if lost is not None:
        line = (f"attempt lost: rank {dist.launched_rank()} of {dist.launched_world_size()}, step {step}: "
                f"{first[:400]} (exit {EXIT_PEER_LOST}; resume from the last complete checkpoint)")
    else:
        if torch.distributed.is_initialized():
            who = dist.lost_peers(str(exc)) or "a peer (its own log says which)"
        else:  # the rendezvous: a rank that never started, or started elsewhere
            who = "a rank that did not join within train.init_timeout_s (its own log, or its node, says why)"
        # A peer that stopped on its own error (a full disk, a bug) wrote so before it went: that error ends the job,
        # and its log says why; resuming would meet it again.
        failed = "; ".join(f"rank {rank} stopped on its own error ({record.get('error')}, exit {record.get('code')}): "
                           "its log says why" for rank, record in failed_peers().items())
        line = (f"peer lost: rank {dist.launched_rank()} of {dist.launched_world_size()}, step {step}, "
                f"backend {backend}: lost {who}: {first[:300]} (exit {EXIT_PEER_LOST}; "
                + (f"{failed})" if failed else "resume from the last complete checkpoint)"))
    to_stderr(line)
    try:  # the records go on the run's disks, which may be what failed: the exit below must happen whatever they do
        if trainer is not None and dist.rank() == 0:
            trainer.log.info(line)
        # attempt_lost: no host to suspect (slurm/attempt_outcome.sh)
        write_status("attempt_lost" if lost is not None else "peer_lost", step=step, error=first[:500])
    except OSError as record_error:
        to_stderr(f"warning: the lost peer could not be recorded ({record_error})")
    from data_pipeline.loader import release_shared_memory

    release_shared_memory()  # os._exit skips streaming's exit handler, which would do it
    flush_stdout()
    # Tearing down a group whose peer is gone can hang (and NCCL's can spin): leave now.
    os._exit(EXIT_PEER_LOST)


def _export(args: argparse.Namespace) -> int:
    with stops_deferred():
        from pretrain.exporting.export import export

    out = export(args.checkpoint, args.out, overwrite=args.overwrite, trust_checkpoint=args.trust_checkpoint)
    print(f"export: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m pretrain` and its subcommands."""
    parser = CommandLineParser(prog="python -m pretrain")
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
    exp.add_argument("--trust-checkpoint", action="store_true",
                     help="read the checkpoint's files with pickle even where they hold more than weights and plain data "
                          "(that can run code: only for a checkpoint from a source you trust)")
    exp.set_defaults(func=_export)
    add_evaluation_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run a subcommand; a user's mistake exits 2 with a one-line message, a bug 1 with its traceback."""
    args = parse_with_overrides(build_parser(), argv)
    if args.command != "train":
        from core.host_memory import resume_garbage_collector

        resume_garbage_collector()  # only a training process runs its start-up with the collector paused
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        return args.func(args)
    except Exception as exc:
        shown = exc if isinstance(exc, DivergedError) else user_error(exc)
        if shown is None:  # a bug: its traceback
            raise
        to_stderr(f"error: {one_line(shown)}")
        return exit_code_for(shown)
