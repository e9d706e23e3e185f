"""How each rank ended, for the batch script: the one table of exit codes, and one small JSON file per rank.

The exit codes of `python -m pretrain` are EXIT_CODES below (slurm/pretrain.sbatch acts on them; its copies of
75, 76 and 130 name this file).

With srun's --kill-on-bad-exit the first rank to exit non-zero ends the others, so the step's exit code
is not always the ranks' own (a rank killed by srun counts as 143). With PRETRAIN_STATUS_DIR set (the
sbatch sets it per attempt), each rank also writes rankN.json there: "running" with its host once it
starts, then how it ended ("terminated": srun or SLURM ended it while it ran, after another task died).
A rank still "running" after the step ended died without a word (killed, out of memory, aborted, its
node lost): its host is the one to suspect. Rank 0 also writes checkpoint.json there after each checkpoint the
attempt completes (every save follows a step of the attempt): the sbatch then counts its crashes from there (MAX_CRASHES bounds crashes in
a row without a new checkpoint, not over a month-long job's life).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from core.errors import DivergedError, user_error

EXIT_FINISHED = 0
EXIT_BUG = 1  # Python's own code for an exception that escapes: its traceback is printed
EXIT_USER_ERROR = 2  # core.errors.UserError: one line names the problem (data_pipeline's CLI exits 2 alike)
EXIT_DIVERGED = 4  # core.errors.DivergedError: one line names the step and the value
EXIT_PREEMPTED = 75  # EX_TEMPFAIL, "temporary failure, try again"
EXIT_PEER_LOST = 76
EXIT_INTERRUPTED = 130  # what a shell reports for a process that died of SIGINT, as this one then does
EXIT_CODES = {
    EXIT_FINISHED: "finished: max_steps reached, or train.stop_after steps done",
    EXIT_BUG: "a bug: the traceback says where; do not requeue",
    EXIT_USER_ERROR: "bad input (config, data, checkpoint, storage): the one line says what; do not requeue",
    EXIT_DIVERGED: "diverged: a step's loss or gradient norm was inf or NaN, and nothing of it was saved; do not "
                   "requeue (it would diverge again): resume from a checkpoint before the newest (train.resume_from) "
                   "with a lower optimizer.lr or a longer schedule.warmup_steps",
    EXIT_PREEMPTED: "preempted by a signal or the deadline: a complete checkpoint and the PREEMPTED marker are "
                    "written; run the same command again",
    EXIT_PEER_LOST: "another rank died or stopped answering: this attempt saved nothing (the dead rank's ZeRO shards "
                    "are gone); the last complete checkpoint stands",
    EXIT_INTERRUPTED: "interrupted by a Ctrl-C (SIGINT): a complete checkpoint and the PREEMPTED marker are written, "
                      "and the process ends by SIGINT; run the same command again to go on",
}


def exit_code_for(exc: BaseException) -> int:
    """The exit code of a run that ended with `exc`: bad input (a full disk among it), a divergence, or else a bug."""
    if user_error(exc) is not None:
        return EXIT_USER_ERROR
    return EXIT_DIVERGED if isinstance(exc, DivergedError) else EXIT_BUG


def status_file() -> Path | None:
    """This rank's status file, None when no PRETRAIN_STATUS_DIR is set."""
    folder = os.environ.get("PRETRAIN_STATUS_DIR")
    if not folder:
        return None
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return Path(folder) / f"rank{rank}.json"


def failed_peers() -> dict[int, dict]:
    """The other ranks whose status file says they stopped on an error of their own (rank: its record), read by a
    survivor that lost them: such a rank is no lost node, and its error, not a requeue, ends the job."""
    own = status_file()
    found = {}
    for path in sorted(own.parent.glob("rank*.json")) if own is not None and own.parent.is_dir() else []:
        rank = path.stem[len("rank"):]
        if path == own or not rank.isdigit():
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # a peer's file half seen, or its disk the one that failed: nothing to add
            continue
        if record.get("status") == "failed":
            found[int(rank)] = record
    return found


PROGRESS_FILE = "checkpoint.json"  # slurm/attempt_outcome.sh reads it by this name


def record_progress(step: int) -> None:
    """Say, in the attempt's status folder, that it completed a checkpoint at `step` (rank 0, after each save); nothing
    without PRETRAIN_STATUS_DIR."""
    path = status_file()
    if path is None:
        return
    from core.atomic_files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    # Synced: a node lost a moment later must not take back the progress the next attempt counts crashes from.
    write_text_atomic(path.parent / PROGRESS_FILE, json.dumps({"step": step, "time": time.time()}) + "\n", fsync=True)


def write_status(status: str, **fields: Any) -> None:
    """Record this rank's state (running, finished, stopped, preempted, interrupted, peer_lost, attempt_lost,
    terminated, failed) with its host."""
    path = status_file()
    if path is None:
        return
    from core.atomic_files import check_folder_path, write_text_atomic

    check_folder_path(path.parent, "PRETRAIN_STATUS_DIR (the sbatch's STATUS_DIR)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # SLURM's node name (what ExcNodeList takes), else the host's.
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    write_text_atomic(path, json.dumps({"status": status, "host": host, "pid": os.getpid(),
                                        "time": time.time(), **fields}) + "\n")


def write_status_or_warn(status: str, **fields: Any) -> None:
    """`write_status` of an attempt's end (its checkpoint saved, or the run finished), where a status folder that
    cannot take it (a full quota, a stale NFS handle) is said on stderr instead of raised: the attempt keeps the exit
    it earned, which the batch script reads from srun's code."""
    try:
        write_status(status, **fields)
    except OSError as exc:
        print(f"warning: status '{status}' could not be written to PRETRAIN_STATUS_DIR ({exc}); the exit code says it",
              file=sys.stderr, flush=True)
