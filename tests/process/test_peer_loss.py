"""When a rank dies or hangs, the survivor says so in one line and exits 76 within seconds, with two bare ranks
started as srun starts them (RANK, WORLD_SIZE, MASTER_* set; no torchrun), gloo on CPU."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from benchmarks.peer_loss_time import descendants, running
from conftest import PROCESS_ENV, TINY_MODEL, free_port, launch_ranks, python_process, wait_for_step

from pretrain.lifecycle.exit_status import EXIT_PEER_LOST
from pretrain.run_dir import RunDir



def _train_args(data: Path, out: Path, *extra: str) -> list[str]:
    """The tiny run these tests start on two ranks (a checkpoint every 2 steps), then `extra`'s overrides."""
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=40",
            "train.save_every=2", "train.eval_every=0", *extra]


def _launch(data: Path, tmp: Path, fault: str, *extra: str) -> tuple[list[subprocess.Popen], Path]:
    status = tmp / "status"
    fault_env = {"FAULT": fault, "FAULT_TIME_FILE": str(tmp / "fault_time"), "PRETRAIN_STATUS_DIR": str(status)}
    return launch_ranks(_train_args(data, tmp / "run", *extra), 2, tmp, "tests/helpers/faulty_rank.py",
                        env=fault_env), status


def _survivor(procs: list[subprocess.Popen], tmp: Path, limit: float) -> tuple[int, float, str]:
    """Rank 0's exit code, seconds from the fault to its exit, and its log; every process is gone afterwards."""
    try:
        code = procs[0].wait(timeout=limit + 240)
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return code, ended - float((tmp / "fault_time").read_text()), (tmp / "rank0.log").read_text()


@pytest.mark.parametrize("kind", ["sigkill", "exit", "abort"])
def test_a_dead_peer_ends_the_survivor_within_seconds(prepared, tmp_path, kind):
    procs, status = _launch(prepared, tmp_path, f"1:3:{kind}")
    code, seconds, log = _survivor(procs, tmp_path, limit=15)
    print(f"{kind}: rank 0 exited {code} {seconds:.1f}s after rank 1's fault")
    assert code == EXIT_PEER_LOST, log[-3000:]
    lines = [line for line in log.splitlines() if "peer lost:" in line]
    assert lines and "rank 0 of 2, step 3" in lines[-1] and "backend gloo" in lines[-1], log[-3000:]
    assert "lost rank 1 on this machine" in lines[-1], lines[-1]
    assert "Traceback" not in log
    assert seconds < 15, seconds
    assert json.loads((status / "rank0.json").read_text())["status"] == "peer_lost"
    assert json.loads((status / "rank1.json").read_text())["status"] == "running"  # died without a word
    # This attempt saved nothing after the fault: the newest checkpoint is the one before it.
    tags = sorted(p.name for p in (RunDir(tmp_path / "run").checkpoints).glob("step_*") if (p / "COMPLETE").is_file())
    assert tags[-1] == "step_00000002"


def test_a_rank_whose_disk_fills_up_stops_the_job_in_one_line_and_is_not_requeued(prepared, tmp_path):
    """Rank 1's disk fills up after step 3, so its share of checkpoint 4 (its ZeRO-2 optimizer partition) cannot be
    written: it stops with exit 2 and the one line that names the checkpoint, and writes FAILED; rank 0, waiting in
    the save for it, ends within seconds as a lost peer; checkpoint 4 does not count. The sbatch's outcome of these
    status files is the user's error (exit 2: no requeue, no suspect host); once there is room, the same command
    resumes from checkpoint 2. (The limit is per file, so FAILED and the status file still go; on a disk full for
    every file they fail too, and the rank says so on stderr.)"""
    procs, status = _launch(prepared, tmp_path, "1:3:full", "train.max_steps=6", "train.zero_stage=2")
    code, seconds, log = _survivor(procs, tmp_path, limit=30)
    full = (tmp_path / "rank1.log").read_text()
    checkpoints = RunDir(tmp_path / "run").checkpoints
    assert procs[1].returncode == 2 and "Traceback" not in full, full[-3000:]
    (line,) = [line for line in full.splitlines() if line.startswith("error:")]
    assert f"checkpoint step_00000004 could not be written in {checkpoints}: File too large" in line, line
    assert "the newest complete checkpoint is step_00000002" in line, line
    assert code == EXIT_PEER_LOST and "Traceback" not in log, log[-3000:]
    (lost,) = [line for line in log.splitlines() if line.startswith("peer lost:")]
    assert "peer lost: rank 0 of 2, step 4" in lost and "lost rank 1 on this machine" in lost, lost
    # Not "resume from the last complete checkpoint": the peer's own error would stop the resume too.
    assert lost.endswith("(exit 76; rank 1 stopped on its own error (NoSpaceError, exit 2): its log says why)"), lost
    assert seconds < 30, seconds
    assert json.loads((status / "rank1.json").read_text())["error"] == "NoSpaceError"
    assert json.loads((status / "rank0.json").read_text())["status"] == "peer_lost"
    failed = json.loads(RunDir(tmp_path / "run").marker("FAILED").read_text())
    assert (failed["error"], failed["rank"], failed["step"]) == ("NoSpaceError", 1, 4), failed
    assert sorted(p.name for p in checkpoints.glob("step_*") if (p / "COMPLETE").is_file()) == ["step_00000002"]
    # What slurm/pretrain.sbatch makes of this attempt: srun's code is the higher of the two, and it names each task.
    (status / "srun.err").write_text("srun: error: vm: task 1: Exited with exit code 2\n"
                                     "srun: error: vm: task 0: Exited with exit code 76\n")
    outcome = subprocess.run(["bash", "-c", 'source slurm/attempt_outcome.sh; attempt_outcome 76 "$1"; '
                              'printf "%s|%s" "$rc" "$suspects"', "outcome", str(status)],
                             capture_output=True, text=True, timeout=60)
    assert outcome.stdout == "2|", (outcome.stdout, outcome.stderr)
    again = launch_ranks(_train_args(prepared, tmp_path / "run", "train.max_steps=6", "train.zero_stage=2"), 2,
                         tmp_path / "again")
    codes = [p.wait(timeout=300) for p in again]
    log = (tmp_path / "again" / "rank0.log").read_text()
    assert codes == [0, 0], log[-3000:]
    assert "resumed from" in log and "step_00000002 at step 2" in log and "finished at step 6" in log, log[-3000:]
    assert not RunDir(tmp_path / "run").marker("FAILED").exists()


def test_a_hung_peer_ends_the_survivor_within_the_step_timeout(prepared, tmp_path):
    """SIGSTOP: the peer's sockets stay open and silent, as when its host is lost; only the timeout can end the wait."""
    procs, _ = _launch(prepared, tmp_path, "1:3:stop", "train.step_timeout_s=10")
    code, seconds, log = _survivor(procs, tmp_path, limit=15)
    print(f"stop: rank 0 exited {code} {seconds:.1f}s after rank 1 stopped (step_timeout_s=10)")
    assert code == EXIT_PEER_LOST, log[-3000:]
    assert "peer lost: rank 0 of 2, step 3" in log
    assert seconds < 10 + 5, seconds


def test_a_rank_killed_from_outside_takes_its_loader_workers_with_it(prepared, tmp_path):
    """SIGKILL from outside to one rank's main process mid-run, as the OOM killer sends it, with a loader worker per
    rank and batches larger than a pipe holds (64 KiB): the survivor exits 76 within seconds naming rank 1, and no
    process of rank 1 (its loader worker, its resource tracker) or of the survivor is left. Before, the worker held
    rank 1's connections open and blocked on its full pipe forever, and the survivor waited for its step timeout."""
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={tmp_path / 'run'}",
            *TINY_MODEL, "train.micro_batch_size=32", "train.global_batch_size=64", "train.max_steps=1000",
            "train.save_every=1000", "train.eval_every=0", "train.log_every=1", "data.num_workers=1"]
    procs = launch_ranks(args, 2, tmp_path / "logs")
    try:
        wait_for_step(tmp_path / "run", 10, procs)
        family = {rank: descendants(p.pid) for rank, p in enumerate(procs)}
        assert all(family.values()), family  # each rank has its loader worker (and resource tracker)
        procs[1].kill()
        killed = time.time()
        code = procs[0].wait(timeout=120)
        seconds = time.time() - killed
        deadline = time.time() + 5
        while running(family[0] | family[1]) and time.time() < deadline:
            time.sleep(0.1)
        left = running(family[0] | family[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    log = (tmp_path / "logs" / "rank0.log").read_text()
    print(f"outside SIGKILL at step 10: rank 0 exited {code} {seconds:.1f}s later")
    assert code == EXIT_PEER_LOST and seconds <= 20, (code, seconds, log[-3000:])
    assert "peer lost: rank 0 of 2" in log and "lost rank 1 on this machine" in log, log[-3000:]
    assert not left, {pid: _cmdline(pid) for pid in left}


def _listening(port: int) -> bool:
    """Whether a socket of this machine listens on TCP `port` (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def test_a_peer_that_never_joins_ends_the_rank_after_init_timeout_as_a_lost_peer(prepared, tmp_path):
    """Rank 0 of 2 whose peer never starts (its node failed before the task ran): after train.init_timeout_s it exits
    76 with one line, as for a peer lost later, so that the batch script requeues it (a bounded number of times)."""
    status = tmp_path / "status"
    env = {**PROCESS_ENV, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PRETRAIN_STATUS_DIR": str(status)}
    args = ["-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
            f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.max_steps=4", "train.init_timeout_s=1"]
    with open(tmp_path / "rank0.log", "w") as out:
        proc = python_process(args, {**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "rank0.log").read_text()
    assert code == EXIT_PEER_LOST, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("peer lost:")]
    assert len(lines) == 1 and lines[0].startswith("peer lost: rank 0 of 2, step -1, backend ?: lost a rank that did "
                                                   "not join within train.init_timeout_s"), log[-3000:]
    assert "1/2 clients joined" in lines[0] and "Traceback" not in log
    assert json.loads((status / "rank0.json").read_text())["status"] == "peer_lost"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_termination_ends_a_rank_waiting_at_start_up_for_a_dead_peer_at_once(prepared, tmp_path, sig):
    """Rank 0 of 2 whose peer never comes (srun's kill-on-bad-exit case: a task died at start-up) waits at the
    rendezvous inside C++, where Python runs no signal handler: a SIGTERM there still ends it within seconds, of
    the signal (what srun reads as ended by it), with one line and its status. Before, it lived until the SIGKILL
    that SLURM and torchrun send 30 s later. A SIGHUP (a closed terminal, forwarded by torchrun) does the same."""
    port = free_port()
    status = tmp_path / "status"
    env = {**PROCESS_ENV, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PRETRAIN_STATUS_DIR": str(status)}
    args = ["-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
            f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.max_steps=4"]
    with open(tmp_path / "rank0.log", "w") as out:
        proc = python_process(args, {**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not _listening(port) and time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "rank0.log").read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(1)  # well inside the wait for rank 1
        assert proc.poll() is None and _listening(port)
        proc.send_signal(getattr(signal, sig))
        sent = time.time()
        code = proc.wait(timeout=60)
        seconds = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "rank0.log").read_text()
    print(f"{sig} at the rendezvous: rank 0 ended {seconds:.1f}s later")
    assert code == -getattr(signal, sig) and seconds < 5, (code, seconds, log[-3000:])
    lines = [line for line in log.splitlines() if line.startswith("terminated:")]
    assert lines == [f"terminated: rank 0 of 2 before its first step by {sig} (the job was ended; a rank that stopped "
                     "on its own says why in its log); no step was run, nothing to save"], log[-3000:]
    assert "Traceback" not in log
    recorded = json.loads((status / "rank0.json").read_text())
    assert (recorded["status"], recorded["error"]) == ("terminated", sig)
    checkpoints = RunDir(tmp_path / "run").checkpoints
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


def _cmdline(pid: int) -> bytes:
    """What a left-over process runs, for the failure message (it may have ended since)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:120]
    except OSError as exc:
        return repr(exc).encode()
