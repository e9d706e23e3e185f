"""slurm/attempt_outcome.sh, which slurm/pretrain.sbatch sources: what an attempt came to, from srun's code, the ranks'
status files (written here by the trainer's own write_status) and srun's messages. A rank's own failure is never
requeued, even where the survivors' 76 is srun's code or the failing rank's status file could not be written."""
import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from pretrain.lifecycle.exit_status import write_status

SCRIPT = f'set -uo pipefail; source "{REPO}/slurm/attempt_outcome.sh"; attempt_outcome "$1" "$2"; ' \
         'printf "%s|%s|%s|%s|%s" "$rc" "$suspects" "$n_preempted" "$n_failed" "$n_lost"'


def _attempt(folder, monkeypatch, ranks: dict, srun_err: list[str]) -> None:
    """Each rank's last status as the trainer writes it (rank: (host, status, fields)), and srun's messages."""
    monkeypatch.setenv("PRETRAIN_STATUS_DIR", str(folder))
    for rank, (host, status, fields) in ranks.items():
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("SLURMD_NODENAME", host)
        write_status(status, **fields)
    (folder / "srun.err").write_text("".join(f"{line}\n" for line in srun_err))


def _outcome(folder, monkeypatch, srun_rc: int, ranks: dict, srun_err: list[str]) -> tuple[int, str, int, int, int]:
    """The outcome of an attempt whose ranks and srun said so (`_attempt`)."""
    _attempt(folder, monkeypatch, ranks, srun_err)
    proc = subprocess.run(["bash", "-c", SCRIPT, "outcome", str(srun_rc), str(folder)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    rc, suspects, preempted, failed, lost = proc.stdout.split("|")
    return int(rc), suspects, int(preempted), int(failed), int(lost)


KILLED = "srun: error: n2: task 1: Killed"
CASES = {
    "finished": (0, {0: ("n1", "finished", {"step": 9}), 1: ("n2", "finished", {"step": 9})}, [],
                 (0, "", 0, 0, 0)),
    "preempted": (75, {0: ("n1", "preempted", {"step": 5}), 1: ("n2", "preempted", {"step": 5})},
                  ["srun: error: n1: tasks 0-1: Exited with exit code 75"], (75, "", 2, 0, 0)),
    # srun ended the last rank of a preemption: the code is srun's, the ranks had saved.
    "preempted, the last rank ended by srun": (
        143, {0: ("n1", "preempted", {"step": 5}), 1: ("n2", "terminated", {"step": 5, "error": "SIGTERM"})},
        ["srun: error: n2: task 1: Terminated"], (75, "", 1, 0, 0)),
    "a rank killed": (137, {0: ("n1", "peer_lost", {"step": 3}), 1: ("n2", "running", {})},
                      [KILLED, "srun: error: n1: task 0: Exited with exit code 76"], (76, "n2", 0, 0, 1)),
    "a rank hung": (76, {0: ("n1", "peer_lost", {"step": 3}), 1: ("n2", "running", {})},
                    ["srun: error: n1: task 0: Exited with exit code 76"], (76, "n2", 0, 0, 1)),
    # The full disk of one node: its rank exits 2, the other loses its peer and exits 76, srun's code is the higher.
    "a rank's bad input, its peer lost": (
        76, {0: ("n1", "peer_lost", {"step": 3}), 1: ("n2", "failed", {"error": "NoSpaceError", "code": 2})},
        ["srun: error: n2: task 1: Exited with exit code 2", "srun: error: n1: task 0: Exited with exit code 76"],
        (2, "", 0, 1, 1)),
    # The same where STATUS_DIR's disk is the full one: that rank's file still says running.
    "a rank's bad input without its status": (
        76, {0: ("n1", "peer_lost", {"step": 3}), 1: ("n2", "running", {})},
        ["srun: error: n2: task 1: Exited with exit code 2", "srun: error: n1: task 0: Exited with exit code 76"],
        (2, "", 0, 0, 1)),
    "diverged": (4, {0: ("n1", "failed", {"error": "DivergedError", "code": 4}),
                     1: ("n2", "failed", {"error": "DivergedError", "code": 4})},
                 ["srun: error: n1: tasks 0-1: Exited with exit code 4"], (4, "", 0, 2, 0)),
    # A rank's loader worker never started: requeued, and the rank srun killed after it is no suspect.
    "an attempt lost": (137, {0: ("n1", "attempt_lost", {"step": 0}), 1: ("n2", "running", {})},
                        ["srun: error: n2: task 1: Killed", "srun: error: n1: task 0: Exited with exit code 76"],
                        (76, "", 0, 0, 0)),
    # `scancel --signal=HUP` before the first step: a rank dies of the hang-up, srun ends the other. Neither is a lost
    # node: the job ends with srun's code, nothing requeued, no host suspected.
    "a hang-up before the first step": (
        129, {0: ("n1", "terminated", {"step": -1, "error": "SIGTERM"}),
              1: ("n2", "terminated", {"step": -1, "error": "SIGHUP"})},
        ["srun: error: n2: task 1: Hangup", "srun: error: n1: task 0: Terminated"], (129, "", 0, 0, 0)),
    # `scancel --signal=INT` (or srun's Ctrl-C) while training: every rank saves, then dies of the SIGINT. Not
    # requeued, and no host suspected.
    "interrupted": (
        130, {0: ("n1", "interrupted", {"step": 5}), 1: ("n2", "interrupted", {"step": 5})},
        ["srun: error: n1: tasks 0-1: Interrupt"], (130, "", 0, 0, 0)),
    # The same where srun ended the last rank (with a SIGTERM) once the first had died of the SIGINT.
    "interrupted, the last rank ended by srun": (
        143, {0: ("n1", "interrupted", {"step": 5}), 1: ("n2", "terminated", {"step": 5, "error": "SIGTERM"})},
        ["srun: error: n1: task 0: Interrupt", "srun: error: n2: task 1: Terminated"], (130, "", 0, 0, 0)),
    # A SIGINT before the first step: the ranks die of it, nothing saved; the job ends with srun's code, no requeue.
    "an interrupt before the first step": (
        130, {0: ("n1", "terminated", {"step": -1, "error": "SIGINT"}),
              1: ("n2", "terminated", {"step": -1, "error": "SIGINT"})},
        ["srun: error: n1: tasks 0-1: Interrupt"], (130, "", 0, 0, 0)),
    # A second SIGINT ends a rank at once; its peer, still in a collective of the save, loses it first and exits 76.
    # Still an interrupt, not a lost node: not requeued.
    "a second interrupt, the peer lost first": (
        130, {0: ("n1", "terminated", {"error": "SIGINT"}), 1: ("n2", "peer_lost", {"step": 5})},
        ["srun: error: n1: task 0: Interrupt", "srun: error: n2: task 1: Exited with exit code 76"],
        (130, "", 0, 0, 1)),
    # A node lost while the others saved on a SIGINT: the loss decides (requeue), not the interrupt.
    "a rank killed beside an interrupt": (
        137, {0: ("n1", "interrupted", {"step": 5}), 1: ("n2", "running", {})},
        [KILLED, "srun: error: n1: task 0: Interrupt"], (76, "n2", 0, 0, 0)),
    # Preempted: the other ranks exit 75 at once, and srun kills rank 0, which had saved and said so, while it still
    # closes its logs (the trackers, W&B's exit): a preemption, not a lost node on rank 0's host.
    "preempted, the rank still closing killed by srun": (
        137, {0: ("n1", "preempted", {"step": 5}), 1: ("n2", "preempted", {"step": 5})},
        ["srun: error: n2: task 1: Exited with exit code 75", "srun: error: n1: task 0: Killed"], (75, "", 2, 0, 0)),
    # The same at the end of a run (srun's --wait), and for a range of tasks.
    "finished, the ranks still closing killed by srun": (
        137, {0: ("n1", "finished", {"step": 9}), 1: ("n2", "finished", {"step": 9})},
        ["srun: error: n1: tasks 0-1: Killed"], (0, "", 0, 0, 0)),
    # A bug on one rank while the other saved on a signal: the bug stops the job.
    "a bug beside a preemption": (
        75, {0: ("n1", "preempted", {"step": 5}), 1: ("n2", "failed", {"error": "KeyError", "code": 1})},
        ["srun: error: n2: task 1: Exited with exit code 1", "srun: error: n1: task 0: Exited with exit code 75"],
        (1, "", 1, 1, 0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_attempt_outcome(case, tmp_path, monkeypatch):
    srun_rc, ranks, srun_err, expected = CASES[case]
    assert _outcome(tmp_path, monkeypatch, srun_rc, ranks, srun_err) == expected


# Attempts that SLURM itself ended (the batch shell died with them: no `ended` mark), as the next attempt reads them.
ENDED_BY_SLURM = {
    # SLURM's preemption (PreemptMode=REQUEUE) or `scontrol requeue` while training: every rank saved on the SIGTERM.
    "every rank saved": ({0: ("n1", "preempted", {"step": 5}), 1: ("n2", "preempted", {"step": 5})},
                         ["srun: error: n1: tasks 0-1: Exited with exit code 75"], True),
    "saved, the last rank ended by srun": (
        {0: ("n1", "preempted", {"step": 5}), 1: ("n2", "terminated", {"step": 5, "error": "SIGTERM"})},
        ["srun: error: n2: task 1: Terminated"], True),
    # A node failure: its rank never said more than "running"; the survivor lost it or was ended before it could.
    "a node failed": ({0: ("n1", "terminated", {"step": 3, "error": "SIGTERM"}), 1: ("n2", "running", {})},
                      ["srun: error: n1: task 0: Terminated"], False),
    "a node failed, its peer lost it": ({0: ("n1", "peer_lost", {"step": 3}), 1: ("n2", "running", {})}, [], False),
    # Requeued before the first step: nothing saved.
    "before the first step": ({0: ("n1", "terminated", {"step": -1, "error": "SIGTERM"})}, [], False),
    "no rank started": ({}, [], False),
}


@pytest.mark.parametrize("case", list(ENDED_BY_SLURM))
def test_an_attempt_slurm_ended_counts_as_a_preemption_only_where_its_ranks_saved(case, tmp_path, monkeypatch):
    """pretrain.sbatch counts an attempt SLURM ended as a crash (MAX_CRASHES) unless its ranks had saved on SLURM's
    SIGTERM: then it was preempted (SLURM's own preemption requeues the job itself), not lost."""
    ranks, srun_err, saved = ENDED_BY_SLURM[case]
    _attempt(tmp_path, monkeypatch, ranks, srun_err)
    script = f'set -uo pipefail; source "{REPO}/slurm/attempt_outcome.sh"; saved_before_slurm_ended_it "$1"'
    proc = subprocess.run(["bash", "-c", script, "saved", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == (0 if saved else 1), (proc.returncode, proc.stderr)


def _count_crashes(job: Path, attempt: Path, crashed: bool) -> tuple[int, int, str]:
    """pretrain.sbatch's counts after an attempt (its status folder `attempt`): the crashes in a row, over the job's
    life, and the cap they reached at MAX_CRASHES=2, MAX_TOTAL_CRASHES=4 (empty while the job may requeue)."""
    script = (f'set -uo pipefail; source "{REPO}/slurm/attempt_outcome.sh"; count_crashes "$1" "$2" "$3"; '
              'echo "$crashes|$total_crashes|$(crash_cap 2 4)"')
    proc = subprocess.run(["bash", "-c", script, "count", str(job), str(attempt), "1" if crashed else "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    row, total, cap = proc.stdout.rstrip("\n").split("|")
    # What the next attempt reads.
    assert ((job / "crashes").read_text().strip(), (job / "crashes_total").read_text().strip()) == (row, total)
    return int(row), int(total), cap


def test_crashes_count_in_a_row_from_the_last_attempt_that_saved_past_its_start(tmp_path, monkeypatch):
    """MAX_CRASHES bounds a node that fails the job again and again before it saves: a crash after an attempt that
    completed a checkpoint past its start (written there by the trainer's rank 0: record_progress) counts as the first
    in a row. Before, the count was the job's whole life: a month-long job stopped at its second unrelated node
    failure. MAX_TOTAL_CRASHES still bounds a fault that comes back after each save."""
    from pretrain.lifecycle.exit_status import record_progress

    job = tmp_path / "job"
    attempts = [job / f"attempt-{i}" for i in range(9)]
    for folder in attempts:
        folder.mkdir(parents=True)
    monkeypatch.setenv("RANK", "0")
    for i in (2, 3, 4, 6, 7, 8):
        monkeypatch.setenv("PRETRAIN_STATUS_DIR", str(attempts[i]))
        record_progress(250)
    assert json.loads((attempts[2] / "checkpoint.json").read_text())["step"] == 250
    # A crash before any save; another (the cap in a row); one after a save; a preemption that saved; a crash after a
    # save again; one without; then crashes that each come after a save, up to the job's cap of 4.
    crashed = [True, True, True, False, True, True, True, True, True]
    counts = [_count_crashes(job, folder, crash) for folder, crash in zip(attempts, crashed)]
    assert [(row, total) for row, total, _ in counts] == [(1, 1), (2, 2), (1, 3), (0, 3), (1, 4), (2, 5), (1, 6),
                                                          (1, 7), (1, 8)]
    total_cap = "crash {} of the job reached MAX_TOTAL_CRASHES=4 (each after a new checkpoint)"
    assert [cap for _, _, cap in counts] == ["", "crash 2 reached MAX_CRASHES=2", "", "", total_cap.format(4),
                                             "crash 2 reached MAX_CRASHES=2", *(total_cap.format(n) for n in (6, 7, 8))]


def test_rank_0_records_progress_for_each_checkpoint_an_attempt_completes(prepared, tmp_path, monkeypatch):
    """What the count above reads, from real runs: rank 0 records the newest checkpoint each attempt completed (every
    save follows a step of that attempt); a launch that has nothing left to train records nothing."""
    from conftest import TINY_MODEL, run_cli

    def launch(attempt: str, steps: int) -> Path:
        folder = tmp_path / attempt
        monkeypatch.setenv("PRETRAIN_STATUS_DIR", str(folder))  # as pretrain.sbatch sets it for each attempt
        run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                             f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.micro_batch_size=4",
                             "train.global_batch_size=4", f"train.max_steps={steps}", "train.save_every=2",
                             "train.eval_every=0", "train.log_every=2"])
        return folder / "checkpoint.json"

    first, again, longer = launch("attempt-0", 3), launch("attempt-1", 3), launch("attempt-2", 6)
    assert json.loads(first.read_text())["step"] == 3  # step 2's, then the last step's
    assert not again.exists() and (tmp_path / "attempt-1" / "rank0.json").is_file()
    assert json.loads(longer.read_text())["step"] == 6
