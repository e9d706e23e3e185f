"""When a rank dies or hangs, the survivor says so in one line and exits 76 within seconds, with two bare ranks
started as srun starts them (RANK, WORLD_SIZE, MASTER_* set; no torchrun), gloo on CPU."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from benchmarks.peer_loss_time import descendants, running
from conftest import TINY_MODEL, launch_ranks, wait_for_step

from pretrain.lifecycle.exit_status import EXIT_PEER_LOST
from pretrain.run_dir import RunDir



def _launch(data: Path, tmp: Path, fault: str, *extra: str) -> tuple[list[subprocess.Popen], Path]:
    status = tmp / "status"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={tmp / 'run'}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=40",
            "train.save_every=2", "train.eval_every=0", *extra]
    fault_env = {"FAULT": fault, "FAULT_TIME_FILE": str(tmp / "fault_time"), "PRETRAIN_STATUS_DIR": str(status)}
    return launch_ranks(args, 2, tmp, "tests/helpers/faulty_rank.py", env=fault_env), status


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


def _cmdline(pid: int) -> bytes:
    """What a left-over process runs, for the failure message (it may have ended since)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:120]
    except OSError as exc:
        return repr(exc).encode()
