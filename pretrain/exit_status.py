"""How each rank ended, for the batch script: exit codes, and one small JSON file per rank.

Exit codes of `python -m pretrain train` (slurm/pretrain.sbatch acts on them):
- 0  finished (max_steps, or train.stop_after);
- 75 preempted: a signal or the deadline; a complete checkpoint is saved, run the same command again;
- 76 peer lost: another rank died or stopped answering; nothing was saved by this attempt (the dead rank's
     ZeRO shards are gone), the last complete checkpoint stands;
- 2  a user's error (one line), 1 a bug (a traceback): do not requeue.

With srun's --kill-on-bad-exit the first rank to exit non-zero ends the others, so the step's exit code
is not always the ranks' own (a rank killed by srun counts as 143). With PRETRAIN_STATUS_DIR set (the
sbatch sets it per attempt), each rank also writes rankN.json there: "running" with its host once it
starts, then how it ended ("terminated": srun or SLURM ended it while it ran, after another task died).
A rank still "running" after the step ended died without a word (killed, out of memory, aborted, its
node lost): its host is the one to suspect.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

EXIT_PEER_LOST = 76


def status_file() -> Path | None:
    """This rank's status file, None when no PRETRAIN_STATUS_DIR is set."""
    folder = os.environ.get("PRETRAIN_STATUS_DIR")
    if not folder:
        return None
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return Path(folder) / f"rank{rank}.json"


def write_status(status: str, **fields) -> None:
    """Record this rank's state (running, finished, stopped, preempted, peer_lost, terminated, failed) with its host."""
    path = status_file()
    if path is None:
        return
    from core.atomic_files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    # SLURM's node name (what ExcNodeList takes), else the host's.
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    write_text_atomic(path, json.dumps({"status": status, "host": host, "pid": os.getpid(),
                                        "time": time.time(), **fields}) + "\n")
