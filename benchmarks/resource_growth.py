"""What a long training run holds as it goes: memory, threads, open files, shared memory and disk, sampled from outside.

A run meant for weeks must hold the same at step 100,000 as at step 1,000: a few kilobytes a step more is a node out
of memory days later. This starts bare ranks of `python -m pretrain train` (as srun starts them: RANK, WORLD_SIZE,
MASTER_* set, no launcher) and, every `--every-s` seconds, reads from /proc for each rank's process tree (the rank,
its loader workers, multiprocessing's resource tracker): the rank's resident memory, the tree's proportional set
size (a page n processes share counts 1/n in each), threads, open descriptors and processes; and, machine-wide,
/dev/shm's entries and bytes and the run folder's bytes. The step is the run's last metrics row. A sample counts
while every rank's status file still says it is running: a rank in its exit (its workers gone, its descriptors
closing) is not the run's steady state. Reported per series: its value once the warm-up is over, at the end, its
highest, and the least-squares slope per 1,000 steps after the warm-up.

    python -m benchmarks.resource_growth --data runs/demo/data --ranks 2 --steps 30000 \
        --set train.save_every=2000 train.eval_every=250
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from benchmarks.arguments import REPO, add_shared, repo_pythonpath, results_file
from benchmarks.machine import machine
from benchmarks.peer_loss_time import descendants
from core.shared_memory import SHM_DIR
from pretrain.run_dir import RunDir

PER_RANK = ("rank_rss_mb", "tree_pss_mb", "threads", "fds", "processes")
MACHINE = ("shm_entries", "shm_mb", "run_mb")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_figures(pid: int) -> Optional[dict[str, float]]:
    """One process's resident and proportional memory (MiB), threads and open descriptors; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    field = lambda text, name: int(re.search(rf"^{name}:\s+(\d+)", text, re.M).group(1))  # noqa: E731
    return {"rss_mb": field(status, "VmRSS") / 1024, "pss_mb": field(rollup, "Pss") / 1024,
            "threads": field(status, "Threads"), "fds": fds}


def tree_figures(pid: int) -> Optional[dict[str, float]]:
    """A rank's figures: its own resident memory, and its whole process tree's PSS, threads, descriptors, count."""
    own = process_figures(pid)
    if own is None:
        return None
    tree = [own] + [f for f in (process_figures(child) for child in sorted(descendants(pid))) if f is not None]
    return {"rank_rss_mb": round(own["rss_mb"], 1), "tree_pss_mb": round(sum(f["pss_mb"] for f in tree), 1),
            "threads": sum(f["threads"] for f in tree), "fds": sum(f["fds"] for f in tree), "processes": len(tree)}


def folder_mb(folder: Path) -> float:
    """The bytes of every file under `folder`, in MiB (0 when it is not there)."""
    total = 0
    for path in folder.rglob("*") if folder.is_dir() else ():
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:  # a checkpoint pruned, a temporary file renamed, while the walk went on
            continue
    return round(total / 2**20, 2)


def last_step(metrics: Path) -> int:
    """The step of the last train row of the run's metrics file (0 before the first)."""
    try:
        with open(metrics, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
            tail = fh.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(tail):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the first, cut line of the tail, or a row being written
            continue
        if row.get("split") == "train":
            return int(row["step"])
    return 0


def sample(procs: list[subprocess.Popen], run: Path) -> dict:
    """One sample of every rank's figures and the machine's."""
    entries = list(SHM_DIR.iterdir()) if SHM_DIR.is_dir() else []
    shm_bytes = 0
    for entry in entries:
        try:
            shm_bytes += entry.stat().st_size
        except FileNotFoundError:
            continue
    return {"step": last_step(RunDir(run).metrics), "shm_entries": len(entries), "shm_mb": round(shm_bytes / 2**20, 2),
            "run_mb": folder_mb(run), "ranks": [tree_figures(p.pid) for p in procs]}


def all_running(status: Path, ranks: int) -> bool:
    """Whether every rank's status file says it is running (written at its start; 'finished' once it has trained)."""
    try:
        return all(json.loads((status / f"rank{rank}.json").read_text())["status"] == "running"
                   for rank in range(ranks))
    except (OSError, ValueError):  # not written yet: the ranks write it first thing, before the samples count
        return False


def slope_per_1000(points: list[tuple[float, float]]) -> Optional[float]:
    """The least-squares slope of (step, value) per 1,000 steps; None with fewer than two distinct steps."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / sxx


def summarize(samples: list[dict], warmup_steps: int) -> dict[str, dict[str, Optional[float]]]:
    """Each series after the warm-up: its first value, last value, highest value and slope per 1,000 steps."""
    after = [s for s in samples if s["step"] >= warmup_steps]
    series: dict[str, list[tuple[float, float]]] = {name: [(s["step"], s[name]) for s in after] for name in MACHINE}
    for s in after:
        for rank, figures in enumerate(s["ranks"]):
            for name in PER_RANK if figures is not None else ():
                series.setdefault(f"rank{rank}.{name}", []).append((s["step"], figures[name]))
    return {name: {"first": points[0][1], "last": points[-1][1], "max": max(y for _, y in points),
                   "per_1000_steps": slope_per_1000(points)} if points else
            {"first": None, "last": None, "max": None, "per_1000_steps": None}
            for name, points in series.items()}


def run_and_sample(data: Path, work: Path, ranks: int, steps: int, every_s: float, overrides: list[str]) -> dict:
    """Train `steps` steps on `ranks` bare ranks, sampling every `every_s` seconds; the samples and the exit codes."""
    run, logs, status = work / "run", work / "logs", work / "status"
    shutil.rmtree(work, ignore_errors=True)
    logs.mkdir(parents=True)
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={run}",
            f"train.max_steps={steps}", *overrides]
    port, procs = _free_port(), []
    for rank in range(ranks):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": repo_pythonpath(), "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PRETRAIN_STATUS_DIR": str(status)}
        with open(logs / f"rank{rank}.log", "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, stdout=out,
                                          stderr=subprocess.STDOUT))
    samples, t0 = [], time.time()
    try:
        while any(p.poll() is None for p in procs):
            taken = {"t": round(time.time() - t0, 1), **sample(procs, run)}
            if all_running(status, ranks):  # read after the sample: every rank was running while it was taken
                samples.append(taken)
            time.sleep(every_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return {"exit_codes": [p.returncode for p in procs], "seconds": round(time.time() - t0, 1),
            "logs": str(logs), "samples": [s for s in samples if all(r is not None for r in s["ranks"])]}


def main(argv: Optional[list[str]] = None) -> None:
    """Run once, print each series' figures, write the samples and the summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, data="runs/demo/data", work="runs/resource_growth", out=results_file("resource_growth"),
               steps=3000, set=[])
    parser.add_argument("--ranks", type=int, default=2, choices=[1, 2, 4], help="bare ranks on this machine")
    parser.add_argument("--every-s", type=float, default=2.0, help="seconds between two samples")
    parser.add_argument("--warmup-fraction", type=float, default=0.1,
                        help="the first fraction of the steps, left out of the figures (start-up, first epoch)")
    args = parser.parse_args(argv)
    result = run_and_sample(Path(args.data).resolve(), Path(args.work).resolve(), args.ranks, args.steps,
                            args.every_s, args.set)
    if result["exit_codes"] != [0] * args.ranks:
        raise SystemExit(f"the run ended with {result['exit_codes']}: see {result['logs']}")
    summary = summarize(result["samples"], int(args.warmup_fraction * args.steps))
    print(f"{args.steps} steps on {args.ranks} rank(s) in {result['seconds']:.0f} s, {len(result['samples'])} samples")
    print(f"{'series':<22} {'after warm-up':>14} {'end':>10} {'highest':>10} {'per 1,000 steps':>16}")
    for name, fig in summary.items():
        slope = "-" if fig["per_1000_steps"] is None else f"{fig['per_1000_steps']:+.3f}"
        print(f"{name:<22} {fig['first']!s:>14} {fig['last']!s:>10} {fig['max']!s:>10} {slope:>16}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine(), "args": vars(args), "summary": summary, **result},
                                         indent=1) + "\n")


if __name__ == "__main__":
    main()
