"""Seconds from one rank's death or hang to the survivor's exit, with the settings a user runs (no test overrides).

Two bare ranks of `python -m pretrain train`, started as srun starts them (RANK, WORLD_SIZE, MASTER_* set, no
launcher), gloo on CPU, a loader worker per rank. At step `--at-step` rank 1's main process gets, from outside:

- `sigkill`: SIGKILL, as the OOM killer sends it (the survivor should notice the closed connections at once);
- `sigstop`: SIGSTOP, its sockets open and silent as when its host is lost (only `train.step_timeout_s`,
  default 120 s, ends the wait).

Reported per case: rank 0's exit code (76: peer lost), the seconds from the signal to its exit, its `peer lost:`
line, and the processes still alive 5 s after rank 0 ended: of both ranks after a SIGKILL, of rank 0 after a SIGSTOP
(the stopped rank and its workers are alive until they are killed at the end).

    python -m benchmarks.peer_loss_time --data runs/demo/data --cases sigkill sigstop
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.distributed import pid_gone
from benchmarks.arguments import REPO, add_shared, repo_pythonpath, results_file
from pretrain.engine.hardware import cpu_name
from pretrain.run_dir import RunDir

SIGNALS = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running(pids: set[int]) -> set[int]:
    """The pids neither ended nor waiting to be reaped."""
    return {pid for pid in pids if not pid_gone(pid)}


def one_case(case: str, data: Path, work: Path, at_step: int, batch: int, limit_s: float,
             extra: tuple[str, ...] = ()) -> dict:
    """Launch two ranks (the demo config, then the run-config overrides `extra`), signal rank 1 at `at_step`, time
    rank 0's exit."""
    run, logs = work / f"run_{case}", work / f"logs_{case}"
    for folder in (run, logs):
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    logs.mkdir(parents=True)
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={run}",
            f"train.micro_batch_size={batch}", f"train.global_batch_size={2 * batch}", "train.max_steps=100000",
            "train.save_every=100000", "train.eval_every=0", "train.log_every=1", "data.num_workers=1", *extra]
    port, procs = _free_port(), []
    for rank in range(2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": repo_pythonpath(), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with open(logs / f"rank{rank}.log", "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, stdout=out,
                                          stderr=subprocess.STDOUT))
    try:
        metrics = RunDir(run).metrics
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= at_step):
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a rank ended before step {at_step}: see {logs}")
            time.sleep(0.05)
        # A stopped rank 1 is alive, and so are its workers (SLURM's step teardown ends them): count rank 0's only.
        family = descendants(procs[0].pid) | {procs[0].pid}
        if case != "sigstop":
            family |= descendants(procs[1].pid) | {procs[1].pid}
        os.kill(procs[1].pid, SIGNALS[case])
        signalled = time.time()
        try:
            code = procs[0].wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.time() - signalled
        time.sleep(5)
        left = running(family)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    log = (logs / "rank0.log").read_text()
    line = next((row for row in reversed(log.splitlines()) if "peer lost:" in row), "")
    return {"case": case, "exit_code": code, "seconds": round(seconds, 1), "line": line, "left_after_5s": len(left)}


def main() -> None:
    """Run each case once and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, data="runs/demo/data", work="runs/peer_loss_time", out=results_file("peer_loss_time"),
               batch=32)
    parser.add_argument("--cases", nargs="+", choices=list(SIGNALS), default=list(SIGNALS))
    parser.add_argument("--at-step", type=int, default=10, help="the step after which rank 1 is signalled")
    parser.add_argument("--limit-s", type=float, default=300, help="how long to wait for rank 0 at most")
    args = parser.parse_args()
    results = []
    for case in args.cases:
        result = one_case(case, Path(args.data).resolve(), Path(args.work).resolve(), args.at_step, args.batch,
                          args.limit_s)
        results.append(result)
        print(f"{case}: rank 0 exited {result['exit_code']} {result['seconds']:.1f} s after the signal; "
              f"{result['left_after_5s']} process(es) left; {result['line'][:160]}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": cpu_name(),
                                          "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
