"""A training run through the project's own SLURM path, requeued until done, against its uninterrupted twin.

    python -m benchmarks.slurm_requeue_run --name demo_mlm --config pretrain/configs/demo_mlm.yaml \\
        --data runs/demo/data [--time 2] [--min-requeues 3] [key=value ...]
    python -m benchmarks.slurm_requeue_run --name NAME --twin RUN_DIR     # a finished run of a report is the twin

What users will do with a month-long run, at a scale that fits here (issue 17, item 4):
1. start the one-machine SLURM (slurm/local_cluster.sh: munge, slurmctld, one slurmd; needs root);
2. `sbatch slurm/pretrain.sbatch` with `--time=T --signal=B:USR1@60`: each allocation is signalled
   60-90 s before its limit, saves, exits 75 and requeues itself; the next allocation resumes;
3. meanwhile, the same config trained without interruption by torchrun (2 ranks, as the job's 2 tasks);
4. compare: final weights bit for bit, the sample audit of every rank, the losses of every step.
With `--twin RUN_DIR`, an uninterrupted run already made (one of a report's runs) is the twin: the
job trains from that run's own resolved config.yaml, so the report's run itself is what the requeued
run must equal (its sample audit is compared only if it recorded one).
Writes benchmarks/results/slurm_requeue_<name>.json: requeue count, steps done per allocation, the
comparison, wall times. The run folders stay under --work for the report's plots.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchmarks.arguments import add_shared
from pretrain.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The module weights of a run's newest complete checkpoint (rank 0's model file)."""
    tags = sorted(p for p in RunDir(run).checkpoints.glob("step_*") if (p / "COMPLETE").is_file())
    files = sorted(tags[-1].glob("*mp_rank_00_model_states.pt"))
    return torch.load(files[0], map_location="cpu", weights_only=False)["module"]


def rows(run: Path) -> dict[int, float]:
    """Training loss per step from metrics.jsonl."""
    out = {}
    for r in RunDir(run).metric_rows("train"):
        out[r["step"]] = r["loss"]
    return out


def main() -> None:
    """Run both, compare, write the record."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--config", help="the run config (not with --twin)")
    parser.add_argument("--data", help="a prepared dataset folder (not with --twin)")
    parser.add_argument("--twin", help="a finished uninterrupted run folder to compare with, instead of training one")
    parser.add_argument("--time", type=int, default=3, help="minutes per allocation")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--min-requeues", type=int, default=3)
    add_shared(parser, work=str(REPO / "runs" / "slurm_requeue"))
    parser.add_argument("--timeout", type=int, default=3600, help="seconds to wait for the job")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    work = Path(args.work).resolve() / args.name
    work.mkdir(parents=True, exist_ok=True)
    run, twin = work / "slurm_run", (Path(args.twin).resolve() if args.twin else work / "twin")
    for old in (run, *(() if args.twin else (twin,))):
        if old.exists():
            raise SystemExit(f"{old} exists: remove it, or pick another --name")
    if args.twin:
        if args.config or args.data:
            raise SystemExit("--twin takes the config and data from the twin's config.yaml: drop --config and --data")
        if not RunDir(twin).config.is_file():
            raise SystemExit(f"--twin {twin} is not a run folder (no config.yaml)")
        args.config = str(work / "twin_config.yaml")
        shutil.copyfile(RunDir(twin).config, args.config)
        common = ["train.record_samples=true", *args.overrides]
    elif not (args.config and args.data):
        raise SystemExit("give --config and --data, or --twin")
    else:
        common = [f"data.path={Path(args.data).resolve()}", "train.record_samples=true", *args.overrides]
    base = Path(f"/tmp/slurm_requeue_{args.name}")
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                  "MASTER_PORT")},
           "SLURM_LOCAL_DIR": str(base), "SLURM_LOCAL_PORT": str(free_port()), "SLURM_CONF": str(base / "slurm.conf"),
           "PATH": os.environ["PATH"] + ":/usr/sbin", "REPO_DIR": str(REPO), "VENV": sys.prefix, "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    cluster = lambda *a: subprocess.run(["bash", str(REPO / "slurm/local_cluster.sh"), *a], env=env,  # noqa: E731
                                        capture_output=True, text=True, timeout=600)
    started = cluster("start", "1")
    if started.returncode:
        raise SystemExit(f"local SLURM did not start: {started.stderr[-2000:]}")
    t0 = time.time()
    try:
        sub = subprocess.run(
            ["sbatch", "--parsable", "--nodes=1", f"--ntasks-per-node={args.ranks}", "--gpus-per-node=0",
             "--cpus-per-task=1", f"--time={args.time}", "--signal=B:USR1@60", str(REPO / "slurm/pretrain.sbatch")],
            cwd=work, env={**env, "CONFIG": args.config, "MAX_RESTARTS": "50",
                           "OVERRIDES": " ".join(shlex.quote(o) for o in [*common, f"train.output_dir={run}"])},
            capture_output=True, text=True, timeout=60)
        if sub.returncode:
            raise SystemExit(f"sbatch failed: {sub.stderr}")
        job = int(sub.stdout.strip().split(";")[0])
        twin_s = None
        if not args.twin:
            print(f"submitted job {job}; training the twin with torchrun meanwhile", flush=True)
            twin_start = time.time()
            twin_proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
                 "-m", "pretrain", "train", "--config", args.config, *common, f"train.output_dir={twin}",
                 "train.use_slurm_deadline=false"],
                cwd=REPO, env={k: v for k, v in env.items() if not k.startswith("SLURM_")}, capture_output=True, text=True)
            twin_s = time.time() - twin_start
            if twin_proc.returncode:
                raise SystemExit(f"twin failed: {twin_proc.stderr[-3000:]}")
        info = {}
        while time.time() - t0 < args.timeout:
            out = subprocess.run(["scontrol", "show", "job", "-o", str(job)], env=env, capture_output=True, text=True).stdout
            info = dict(item.split("=", 1) for item in out.split() if "=" in item)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                break
            time.sleep(5)
        job_s = time.time() - t0
        if info.get("JobState") != "COMPLETED":
            raise SystemExit(f"job {job} ended {info.get('JobState')} (or did not end in {args.timeout}s): see "
                             f"{work / f'pretrain-{job}.out'}")
    finally:
        cluster("stop")
    log = (work / f"pretrain-{job}.out").read_text()
    # Where each allocation stopped: the PREEMPTED lines' steps, and the step each attempt resumed from.
    resumed_at = [int(m) for m in re.findall(r"resumed from \S+ at step (\d+)", log)]
    ours, ref = final_weights(run), final_weights(twin)
    samples_equal = None  # a twin that recorded no sample audit cannot be compared on it
    if (twin / "samples").is_dir():
        samples_equal = all((run / "samples" / f"rank{r}.jsonl").read_text() == (twin / "samples" / f"rank{r}.jsonl").read_text()
                            for r in range(args.ranks))
    record = {
        "name": args.name, "config": args.config, "twin": str(twin), "overrides": common, "time_limit_min": args.time,
        "job_state": info.get("JobState"), "exit_code": info.get("ExitCode"), "requeues": int(info.get("Restarts", -1)),
        "allocations": len(re.findall(rf"job {job} attempt \d+", log)), "resumed_at_steps": resumed_at,
        "final_step": max(rows(run)), "weights_bit_identical": ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref),
        "samples_identical": samples_equal, "losses_identical": rows(run) == rows(twin),
        "wall_s": {"slurm_job": round(job_s), "twin": round(twin_s)},
    }
    record["requeued_enough"] = record["requeues"] >= args.min_requeues
    print(json.dumps(record, indent=2))
    out = REPO / "benchmarks" / "results" / f"slurm_requeue_{args.name}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    if not (record["weights_bit_identical"] and record["samples_identical"] is not False and record["losses_identical"]):
        raise SystemExit("the requeued run does not equal its twin: see the record")
    if not record["requeued_enough"]:
        raise SystemExit(f"only {record['requeues']} requeues (< {args.min_requeues}): lengthen the run or shorten --time")


if __name__ == "__main__":
    main()
