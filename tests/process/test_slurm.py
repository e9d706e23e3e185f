"""The real sbatch templates on a real one-machine SLURM (slurm/local_cluster.sh: munge, slurmctld and
two emulated slurmd nodes), submitted with sbatch as a user would.

All jobs are submitted at once by one fixture, and each node declares more CPUs than the machine has, so that they
all run at once: their start-ups, SLURM's requeue delays and the kill waits overlap.
- pretrain on 2 nodes x 1 task with --time=2 and --signal=B:USR1@90, which SLURM sends 0-30 s after the start (it
  checks every 30 s and sends early rather than late): in the trainer's start-up or its first steps, at whatever
  speed the machine trains. It needs more than one allocation (once its first is signalled and requeued, the test
  raises its time limit, as an administrator would: every further 2-minute allocation would cost a start-up, six of
  them on a loaded machine), then export with --dependency=afterok on it;
- prepare_data as a job array of 2 tasks, then (afterok on the array) a job with MAX_RESTARTS=1 on
  its output that is sent USR1 twice (requeued once, then not), the second time before srun starts;
- a job with a bad config (a crash: must not be requeued);
- a job with --time=4 and no signal before its end: the trainer reads the job's end time from SLURM and stops
  before it (train.use_slurm_deadline).
Meanwhile an uninterrupted run of the same training config runs outside SLURM as the reference.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_MODEL, free_port, kjv_chapters, launch_ranks
from data_pipeline.dataset_dir import MANIFEST, DatasetDir
from pretrain.run_dir import RunDir


EXPORTED = "step_00000500"  # the export job's CHECKPOINT
LOST_PORT_BASE = 23000  # the lost-rank job's MASTER_PORT_BASE (the default is 15000)
MAX_STEPS = 600  # the signal comes before step ~120 here (8 steps/s beside the other jobs), ~300 on a machine twice as fast
PREPARE_OVERRIDES = ["tokenizer.vocab_size=400", "tokenizer.character_coverage=1.0", "seq_len=64", "val_fraction=0.1",
                     "part_bytes=40000"]  # several parts for each of the array's 2 tasks
TRAIN_OVERRIDES = [
    *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", f"train.max_steps={MAX_STEPS}",
    "train.save_every=250", "train.log_every=50", "train.eval_every=0", "train.record_samples=true",
    # The signal, not the job's end time, is what this test exercises (the deadline has its own test).
    "train.use_slurm_deadline=false",
]


def _cannot_run() -> str | None:
    """Why a real SLURM cannot be started here, or None."""
    have = all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in ("slurmctld", "slurmd", "sbatch", "munged"))
    if have and os.geteuid() == 0:
        return None
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (it runs slurmctld, slurmd and munged as root)"
    if not shutil.which("apt-get"):
        return "SLURM is not installed and there is no apt-get to install it"
    return None


class Cluster:
    """The started cluster: its environment, and sbatch/scontrol wrappers."""

    def __init__(self, base: Path) -> None:
        self.base = base
        inherited = {k: v for k, v in os.environ.items()
                     if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        self.env = {**inherited, "SLURM_LOCAL_DIR": str(base), "SLURM_LOCAL_PORT": str(free_port()),
                    "SLURM_CONF": str(base / "slurm.conf"), "PATH": os.environ["PATH"] + ":/usr/sbin",
                    "REPO_DIR": str(REPO), "VENV": sys.prefix, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                    "SLURM_LOCAL_CPUS": "11"}  # every job of the fixture at once (20 CPUs at most, of 22)

    def script(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "slurm" / "local_cluster.sh"), *args], env=self.env,
                              capture_output=True, text=True, timeout=600)

    def sbatch(self, script: str, *options: str, cwd: Path, args: tuple[str, ...] = (), unset: tuple[str, ...] = (),
               **knobs: str) -> int:
        """Submit slurm/<script> with sbatch options, the script's own arguments and template knobs (passed by
        environment; `unset`: knobs of the cluster's environment left to the script's defaults)."""
        env = {k: v for k, v in {**self.env, **knobs}.items() if k not in unset}
        out = subprocess.run(["sbatch", "--parsable", *options, str(REPO / "slurm" / script), *args], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...); for an array, its last task."""
        return self.tasks(job_id)[-1]

    def tasks(self, job_id: int) -> list[dict[str, str]]:
        """`scontrol show job`: one dict per line (one per task of a job array)."""
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], env=self.env, capture_output=True,
                             text=True, timeout=60).stdout
        return [dict(item.split("=", 1) for item in line.split() if "=" in item) for line in out.splitlines() if line.strip()]

    def all_jobs(self) -> dict[str, list[dict[str, str]]]:
        """Every job SLURM knows, by job id (an array's tasks under the array's id), from one `scontrol` call."""
        out = subprocess.run(["scontrol", "show", "job", "-o"], env=self.env, capture_output=True, text=True,
                             timeout=60).stdout
        jobs: dict[str, list[dict[str, str]]] = {}
        for line in out.splitlines():
            info = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if info:
                jobs.setdefault(info.get("ArrayJobId", info["JobId"]), []).append(info)
        return jobs

    def set_time_limit(self, job_id: int, minutes: int) -> None:
        """`scontrol update` the job's time limit (root may raise it, running or pending)."""
        subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"], env=self.env, check=True,
                       timeout=60)

    def requeue(self, job_id: int) -> None:
        """`scontrol requeue` from outside: SLURM ends the running job and queues it again, as after a node failure."""
        subprocess.run(["scontrol", "requeue", str(job_id)], env=self.env, check=True, timeout=60)

    def signal_steps(self, job_id: int, sig: str) -> None:
        """`scancel --signal=SIG`: every task of the job's steps (not the batch shell) gets it."""
        subprocess.run(["scancel", f"--signal={sig}", str(job_id)], env=self.env, check=True, timeout=60)

    def signal_batch(self, job_id: int, sig: str = "USR1") -> None:
        """What SLURM's --signal=B:USR1 does, on demand: signal the batch shell."""
        subprocess.run(["scancel", "--batch", f"--signal={sig}", str(job_id)], env=self.env, check=True, timeout=60)


# Set to 1 on a machine where a local SLURM cannot run (not root): the module is then skipped, said in pytest's summary.
# Unset (CI, `make test`), a machine that cannot start the cluster fails the module, so it is never skipped unseen.
WITHOUT_SLURM = "CONTRASTIVE_PRETRAIN_TESTS_WITHOUT_SLURM"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _cannot_run()
    if reason and os.environ.get(WITHOUT_SLURM) == "1":
        pytest.skip(f"{reason} ({WITHOUT_SLURM}=1)")
    assert not reason, f"{reason}: run as root, or set {WITHOUT_SLURM}=1 to skip these tests on purpose"
    cl = Cluster(tmp_path_factory.mktemp("slurm"))
    started = cl.script("start", "2")
    assert started.returncode == 0, started.stdout + started.stderr
    yield cl
    cl.script("stop")


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def jobs(cluster, prepared, tmp_path_factory):
    """Submit everything, drive the restart-limit job, watch for the PREEMPTED marker; wait for the end."""
    from core.atomic_files import mark_output
    from pretrain.exporting.export import EXPORT

    work = tmp_path_factory.mktemp("slurm_jobs")
    corpus = work / "corpus.txt"
    corpus.write_text("\n\n".join(kjv_chapters(60)) + "\n", encoding="utf-8")
    data, run, hf = work / "data", work / "run", work / "hf"
    # The requeue job trains on the session's prepared data, so it and the reference start at once;
    # the prepare job's output feeds the restart-limit job (prepare -> pretrain through afterok).
    # WORKERS: two tokenizing processes in each task's one CPU (the output must be what one process writes).
    # PREPARE_ARGS=--overwrite: the array replaces a dataset already there, prepared from the corpus's first chapters.
    old_corpus = work / "old_corpus.txt"
    old_corpus.write_text("\n\n".join(kjv_chapters(10)) + "\n", encoding="utf-8")
    _prepare_once(PREPARE_OVERRIDES + [
        f"output_dir={data}", f"sources=[{{kind: text, path: '{old_corpus}'}}]", "num_workers=1"])
    prepare = cluster.sbatch(
        "prepare_data.sbatch", "--array=0-1", "--cpus-per-task=1", cwd=work, WORKERS="2", PREPARE_ARGS="--overwrite",
        OVERRIDES=" ".join(PREPARE_OVERRIDES + [f"output_dir={data}", f"'sources=[{{kind: text, path: {corpus}}}]'"]))
    train_args = [f"data.path={prepared}", f"train.output_dir={run}", *TRAIN_OVERRIDES]
    pretrain = cluster.sbatch(
        "pretrain.sbatch", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=2",
        "--signal=B:USR1@90", cwd=work, OVERRIDES=" ".join(train_args))
    reference = work / "reference"
    reference_procs = launch_ranks(["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                                    f"train.output_dir={reference}", *TRAIN_OVERRIDES,
                                    # Every 125 steps, all kept: the killed job's end (step 375) is compared too.
                                    "train.save_every=125", "train.keep_last=10"], 2, work / "reference_logs")
    # CHECKPOINT: an earlier checkpoint than the newest (the run keeps its newest three: 500 and 600 among them).
    # EXPORT_ARGS=--overwrite: an export already in OUT (its marker, and a file the new one does not have) is replaced.
    hf.mkdir()
    mark_output(hf, EXPORT)
    (hf / "stale.txt").write_text("from an earlier export")
    export = cluster.sbatch("export.sbatch", f"--dependency=afterok:{pretrain}", "--cpus-per-task=1", cwd=work,
                            RUN_DIR=str(run), OUT=str(hf), CHECKPOINT=str(RunDir(run).checkpoints / EXPORTED),
                            EXPORT_ARGS="--overwrite")
    # Submitted as the README says, from the repository root with none of REPO_DIR, VENV, OMP_NUM_THREADS set (the
    # log and the status files kept out of the repository): the script's defaults find the repository and its .venv.
    # Two CPUs, so that the threads it says are the task's CPUs and not the cluster environment's 1.
    crash = cluster.sbatch("pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0",
                           "--cpus-per-task=2", f"--output={work}/%x-%j.out", cwd=REPO,
                           unset=("REPO_DIR", "OMP_NUM_THREADS") + (("VENV",) if _venv_is_the_repos() else ()),
                           STATUS_DIR=str(work / ".pretrain-status"),
                           OVERRIDES=f"data.path={data} train.output_dir={work / 'crash'} train.no_such_key=1")
    limited_run = work / "limited"
    # ENV_SETUP (run by the batch shell before srun) says when an attempt has begun, and in the second attempt holds
    # the shell for 8 s before srun: the window in which the test sends the second USR1.
    limited = cluster.sbatch(
        "pretrain.sbatch", f"--dependency=afterok:{prepare}", "--nodes=1", "--ntasks-per-node=1",
        "--gpus-per-node=0", "--cpus-per-task=1", cwd=work, MAX_RESTARTS="1",
        ENV_SETUP=f'touch {work}/limited-setup-${{SLURM_RESTART_COUNT:-0}}; '
                  f'if [ "${{SLURM_RESTART_COUNT:-0}}" = 1 ]; then sleep 8; fi',
        OVERRIDES=" ".join([f"data.path={data}", f"train.output_dir={limited_run}", *TRAIN_OVERRIDES,
                            "train.max_steps=100000", "train.log_every=5"]))

    # A rank SIGKILLed after the checkpoint of step 125: the step ends, the job requeues and resumes from it; killed
    # again after the second attempt's checkpoint of step 250, a crash in a row with the first but after a new
    # checkpoint, so it requeues again at MAX_CRASHES=2; stop_after=250 makes the third attempt end at step 500, a step
    # the reference keeps.
    lost_run = work / "lost"
    lost = cluster.sbatch(
        "pretrain.sbatch", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        MASTER_PORT_BASE=str(LOST_PORT_BASE),
        OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={lost_run}", *TRAIN_OVERRIDES,
                            "train.save_every=125", "train.stop_after=250"]))
    # A rank killed in every attempt (2 tasks on one node): requeued once, away from that node, then failed at the cap.
    doomed = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={work / 'doomed'}", *TRAIN_OVERRIDES]))
    # The same with EXCLUDE_FAILED_HOSTS=0: requeued as it is, wherever SLURM puts it.
    kept = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        EXCLUDE_FAILED_HOSTS="0",
        OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={work / 'kept'}", *TRAIN_OVERRIDES]))
    # No signal before the end of a 4-minute allocation (it would come 5-35 s before): the trainer's own deadline, the
    # job's end time from SLURM less two steps, a save and the margin, comes first: with a 200 s margin, 40 s after the
    # job's start, or at the trainer's first step when its start-up took longer (the job keeps a core for no longer
    # than that). Not requeued (MAX_RESTARTS=0).
    # Its CONFIG is a file of its own, by absolute path (the demo config resolved, with keep_last 2), and its margin
    # comes as an argument after the script.
    deadline_run, deadline_config = work / "deadline", work / "deadline_config.yaml"
    _write_resolved_config(deadline_config, "train.keep_last=2")
    deadline_job = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=4",
        "--signal=B:USR1@5", cwd=work, MAX_RESTARTS="0", CONFIG=str(deadline_config), args=("train.deadline_margin_s=200",),
        OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={deadline_run}", *TRAIN_OVERRIDES,
                            "train.max_steps=100000", "train.use_slurm_deadline=true"]))
    # Requeued by SLURM itself as its trainer starts (`scontrol requeue`, what slurmctld does when a node fails): the
    # batch script is ended with it and cannot decide, and the rank, before its first step, saves nothing; the next
    # attempt counts a crash and, at MAX_CRASHES=1, stops there.
    outside = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        MAX_CRASHES="1", OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={work / 'outside'}",
                                             *TRAIN_OVERRIDES, "train.max_steps=100000"]))
    # Requeued by SLURM itself once it trains (SLURM's own preemption, PreemptMode=REQUEUE, ends and requeues a job
    # the same way): the rank saves on SLURM's SIGTERM, so the next attempt resumes it without counting a crash.
    slurm_preempted_run = work / "slurm_preempted"
    slurm_preempted = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        MAX_CRASHES="1", OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={slurm_preempted_run}",
                                             *TRAIN_OVERRIDES, "train.max_steps=150", "train.log_every=5"]))
    # `scancel --signal=INT` (a Ctrl-C, from outside) once it trains: the rank saves and ends by SIGINT, and the job
    # ends with 130, not requeued.
    interrupted_run = work / "interrupted"
    interrupted = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={interrupted_run}", *TRAIN_OVERRIDES,
                            "train.max_steps=100000", "train.log_every=5"]))
    # Requeued by SLURM itself as soon as it runs, with MAX_RESTARTS=0 (SLURM's preemption requeueing it again and
    # again reaches the cap the same way): the next attempt exits 3 before it trains.
    over_cap = cluster.sbatch(
        "pretrain.sbatch", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", cwd=work,
        MAX_RESTARTS="0", OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={work / 'over_cap'}",
                                              *TRAIN_OVERRIDES]))
    # A prepare array whose task 1 fails in its first run (in ENV_SETUP, before prepare starts): task 0 writes its
    # parts and stops short of the merge; `scontrol requeue <array job id>`, as prepare_data.sbatch says, then
    # finishes the dataset with the parts already written kept.
    failed_once, requeued_data = work / "prepare-failed-once", work / "data_requeued"
    requeued_prepare = cluster.sbatch(
        "prepare_data.sbatch", "--array=0-1", "--cpus-per-task=1", cwd=work, WORKERS="1",
        # Task 0's rerun waits (at most 2 minutes) until task 1 has published: the order that failed before.
        ENV_SETUP=f'if [ "$SLURM_ARRAY_TASK_ID" = 1 ] && [ ! -e {failed_once} ]; then touch {failed_once}; exit 1; fi; '
                  f'if [ "$SLURM_ARRAY_TASK_ID" = 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then '
                  f'for _ in $(seq 240); do [ -e {requeued_data}/{MANIFEST} ] && break; sleep 0.5; done; fi',
        OVERRIDES=" ".join(PREPARE_OVERRIDES + [f"output_dir={requeued_data}", f"'sources=[{{kind: text, path: {corpus}}}]'"]))
    # Submitted with --no-requeue (over the script's own #SBATCH --requeue, as a site's wrapper may submit it), then
    # preempted once it trains: the rank saves, SLURM refuses the script's requeue, and the job ends with 75.
    refused_run = work / "refused"
    refused = cluster.sbatch(
        "pretrain.sbatch", "--no-requeue", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1",
        cwd=work, OVERRIDES=" ".join([f"data.path={prepared}", f"train.output_dir={refused_run}", *TRAIN_OVERRIDES,
                                      "train.max_steps=100000", "train.log_every=5"]))
    ids = {"prepare": prepare, "pretrain": pretrain, "export": export, "crash": crash, "limited": limited, "lost": lost,
           "doomed": doomed, "deadline": deadline_job, "outside": outside, "kept": kept, "interrupted": interrupted,
           "slurm_preempted": slurm_preempted, "over_cap": over_cap, "refused": refused}
    kills: dict[str, list[float]] = {"lost": [], "doomed": [], "kept": []}

    def rank_status(job: int, attempt: int, rank: int) -> Path:
        """The status file a rank of an attempt writes once its signal handlers are in (pretrain.sbatch's STATUS_DIR)."""
        return work / ".pretrain-status" / str(job) / f"attempt-{attempt}" / f"rank{rank}.json"

    def kill_rank1(job: int, attempt: int) -> bool:
        """SIGKILL rank 1 of an attempt once it has written its status (its pid); True when done."""
        status = rank_status(job, attempt, 1)
        try:
            os.kill(json.loads(status.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            return False
        return True

    markers: list[dict] = []
    limit_signals = 0
    raised = requeued = interrupt_sent = preempted_by_slurm = over_cap_requeued = refused_preempted = False
    array_requeued = False
    deadline = time.time() + 720
    while time.time() < deadline:
        # One scontrol call per poll: seven jobs polled one by one kept a core busy on this 2-core machine.
        known = cluster.all_jobs()
        states = {j: known.get(str(j), [{}])[-1].get("JobState") for j in ids.values() if j != prepare}
        for attempt, tag in enumerate(("step_00000125", "step_00000250")):
            if len(kills["lost"]) == attempt and (RunDir(lost_run).checkpoints / tag / "COMPLETE").is_file() \
                    and kill_rank1(lost, attempt):
                kills["lost"].append(time.time())
        for name in ("doomed", "kept"):
            if states[ids[name]] == "RUNNING" and len(kills[name]) < 2:
                attempt = int(known[str(ids[name])][-1].get("Restarts", "0"))
                if attempt == len(kills[name]) and kill_rank1(ids[name], attempt):
                    kills[name].append(time.time())
        if not over_cap_requeued and states[over_cap] == "RUNNING":
            cluster.requeue(over_cap)
            over_cap_requeued = True
        if not requeued and states[outside] == "RUNNING" and rank_status(outside, 0, 0).is_file():
            cluster.requeue(outside)  # once its trainer has started
            requeued = True
        states.update({f"prepare {i}": t.get("JobState") for i, t in enumerate(known.get(str(prepare), []))})
        marker = run / "PREEMPTED"
        try:
            record = json.loads(marker.read_text())
        except FileNotFoundError:  # none yet, or the resumed attempt removed it since
            record = None
        if record is not None and record not in [m for m, _ in markers]:
            markers.append((record, (RunDir(run).checkpoints / record["checkpoint"] / "COMPLETE").is_file()))
        if markers and not raised:
            cluster.set_time_limit(pretrain, 15)
            raised = True
        # The limit job: USR1 once it trains in attempt 1, and again in attempt 2 while its batch shell is still in
        # ENV_SETUP, before srun has started the trainer.
        log = work / f"pretrain-{limited}.out"
        if states[limited] == "RUNNING":
            if limit_signals == 0 and log.is_file() and "| ETA" in log.read_text():
                cluster.signal_batch(limited)
                limit_signals = 1
            elif limit_signals == 1 and (work / "limited-setup-1").is_file():
                cluster.signal_batch(limited)
                limit_signals = 2
        log = work / f"pretrain-{slurm_preempted}.out"
        if not preempted_by_slurm and states[slurm_preempted] == "RUNNING" and log.is_file() \
                and "| ETA" in log.read_text():
            cluster.requeue(slurm_preempted)
            preempted_by_slurm = True
        log = work / f"pretrain-{interrupted}.out"
        if not interrupt_sent and states[interrupted] == "RUNNING" and log.is_file() and "| ETA" in log.read_text():
            cluster.signal_steps(interrupted, "INT")
            interrupt_sent = True
        log = work / f"pretrain-{refused}.out"
        if not refused_preempted and states[refused] == "RUNNING" and log.is_file() and "| ETA" in log.read_text():
            cluster.signal_batch(refused)
            refused_preempted = True
        array = [t.get("JobState") for t in known.get(str(requeued_prepare), [])]
        if not array_requeued and len(array) == 2 and all(s in FINAL for s in array) and "FAILED" in array:
            cluster.requeue(requeued_prepare)
            array_requeued = True
            continue  # its states as they are now: queued again
        states.update({f"requeued prepare {i}": state for i, state in enumerate(array)})
        if all(s in FINAL for s in states.values()) and all(p.poll() is not None for p in reference_procs):
            break
        time.sleep(0.5)
    assert all(p.poll() == 0 for p in reference_procs), f"reference run failed; see {work / 'reference_logs'}"
    return {"work": work, "run": run, "hf": hf, "reference": reference, "markers": markers, "limit_signals": limit_signals,
            "ids": ids, "limited_run": limited_run, "interrupted_run": interrupted_run,
            "slurm_preempted_run": slurm_preempted_run, "refused_run": refused_run,
            "deadline_run": deadline_run,
            "prepare_tasks": cluster.tasks(prepare), "corpus": corpus, "array_requeued": array_requeued,
            "requeued_prepare_tasks": cluster.tasks(requeued_prepare), "requeued_data": requeued_data,
            "failed_once": failed_once, "kills": kills, "lost_run": lost_run,
            "info": {name: cluster.job(j) for name, j in ids.items()}}


def _venv_is_the_repos() -> bool:
    """Whether this Python is the repository's .venv (`make test`, CI): the sbatch templates' default VENV."""
    return (REPO / ".venv").resolve() == Path(sys.prefix).resolve()


def _write_resolved_config(path: Path, *overrides: str) -> None:
    """The demo run config with its groups resolved and `overrides` applied, as one YAML file of its own."""
    import yaml

    from core.config_io import config_to_dict, load_config
    from pretrain.config import RunConfig

    cfg = load_config(RunConfig, REPO / "pretrain" / "configs" / "demo_mlm.yaml", list(overrides))
    path.write_text(yaml.safe_dump(config_to_dict(cfg)), encoding="utf-8")


def _prepare_once(overrides: list[str]) -> Path:
    """A dataset prepared in this process (one worker), as `python -m data_pipeline prepare` would."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    return prepare(load_config(PrepareConfig, None, overrides))


def _log(jobs, name: str) -> str:
    if name == "prepare":  # the array's tasks, each with its own job id
        return "".join((jobs["work"] / f"prepare-data-{t['JobId']}.out").read_text() for t in jobs["prepare_tasks"])
    prefix = {"export": "export"}.get(name, "pretrain")
    return (jobs["work"] / f"{prefix}-{jobs['ids'][name]}.out").read_text()


def _samples(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / "samples" / f"rank{rank}.jsonl").read_text().splitlines()]


def _weights(run: Path, step: int = MAX_STEPS) -> dict[str, torch.Tensor]:
    path = RunDir(run).checkpoints / f"step_{step:08d}" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def test_time_limit_signal_requeue_and_exact_resume(jobs):
    info, log = jobs["info"]["pretrain"], _log(jobs, "pretrain")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log[-3000:])
    assert int(info["Restarts"]) >= 1, log[-3000:]
    assert "USR1 received: forwarding it to the training tasks" in log
    assert "requeueing job" in log and "attempt 2 (restart 1" in log and "training finished" in log
    # The marker was seen while the job waited to be rerun, naming a complete checkpoint.
    assert jobs["markers"], "no PREEMPTED marker was written"
    record, complete = jobs["markers"][0]
    # srun delivers USR1 to both tasks; rank 0 names the first rank that had it.
    assert record["reason"] in ("SIGUSR1", "SIGUSR1 on rank 1") and 0 < record["step"] < MAX_STEPS and complete
    assert f"resumed from {RunDir(jobs['run']).checkpoints / record['checkpoint']} at step {record['step']}" in log
    assert not (jobs["run"] / "PREEMPTED").exists()  # the finished attempt cleared it

    # Same weights, bit for bit, as the run that was never interrupted.
    ours, ref = _weights(jobs["run"]), _weights(jobs["reference"])
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    # Same samples in the same order on each rank; every step once, none skipped or repeated.
    for rank in (0, 1):
        got = _samples(jobs["run"], rank)
        assert [r["step"] for r in got] == list(range(1, MAX_STEPS + 1))
        assert got == _samples(jobs["reference"], rank)
    per_step = [sorted(i for rank in (0, 1) for micro in _samples(jobs["run"], rank)[s]["sample_ids"] for i in micro)
                for s in range(MAX_STEPS)]
    epoch = [i for ids in per_step[:100] for i in ids]  # the first 800 samples: all distinct within an epoch
    assert len(epoch) == len(set(epoch)) == 800


def test_chain_prepare_pretrain_export_with_afterok(jobs):
    """prepare (a 2-task array) -> (afterok) pretrain on its data; pretrain -> (afterok) export, held through the requeues."""
    assert [t["JobState"] for t in jobs["prepare_tasks"]] == ["COMPLETED", "COMPLETED"], _log(jobs, "prepare")[-3000:]
    manifest = json.loads((DatasetDir(jobs["work"] / "data").manifest).read_text())
    assert manifest["splits"]["train"]["sequences"] > 0 and manifest["tokenizer"]["vocab_size"] == 400
    # Both tasks wrote parts, one of them merged; the result is what one process writes.
    log = _log(jobs, "prepare")
    assert manifest["tasks"] == 2 and "task 0/2: " in log and "task 1/2: " in log and log.count(" merged ") == 1
    assert manifest["num_workers"] == manifest["config"]["num_workers"] == 2  # WORKERS reached prepare
    assert all(f"task {t}/2: 0 of" not in log for t in (0, 1))
    from data_pipeline.shard_record import RECORD

    # What one process writes from the corpus: the array replaced the dataset of the first chapters (PREPARE_ARGS).
    single = _prepare_once(PREPARE_OVERRIDES + [
        f"output_dir={jobs['work'] / 'data_single'}", f"sources=[{{kind: text, path: '{jobs['corpus']}'}}]", "num_workers=1"])
    # (The verification records hold each copy's own file times. Training read the array's uncompressed shards, a
    # local dataset's default, where they are: nothing was unpacked beside them.)
    files = {d: {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
                 if p.is_file() and p.name not in (MANIFEST, RECORD)}
             for d in (single, jobs["work"] / "data")}
    assert any(name.endswith(".mds") for name in files[single])
    assert files[single] == files[jobs["work"] / "data"]
    assert "| ETA" in _log(jobs, "limited")  # the dependent job trained on what prepare wrote
    export = jobs["info"]["export"]
    assert export["JobState"] == "COMPLETED", _log(jobs, "export")[-3000:]
    # afterok held the export back through the requeue until the training's final success.
    assert json.loads((jobs["hf"] / "config.json").read_text())["hidden_size"] == 32
    assert not (jobs["hf"] / "stale.txt").exists()  # EXPORT_ARGS=--overwrite replaced the earlier export
    from transformers import AutoModelForMaskedLM

    assert f"export {RunDir(jobs['run']).checkpoints / EXPORTED} -> {jobs['hf']}" in _log(jobs, "export")
    model = AutoModelForMaskedLM.from_pretrained(jobs["hf"])
    ours, newest = _weights(jobs["run"], 500), _weights(jobs["run"])
    key = next(k for k in ours if k.endswith("word_embeddings.weight"))
    assert torch.equal(model.get_input_embeddings().weight, ours[key].float())
    assert not torch.equal(ours[key], newest[key])  # CHECKPOINT chose step 500, not the newest


def test_a_prepare_array_requeued_after_a_task_failed_keeps_the_parts_written_and_finishes(jobs):
    """Task 1 failed in its first run; `scontrol requeue <array job id>` (prepare_data.sbatch's advice) reran the
    array: the parts task 0 wrote in the first run are not written again, one task merges, and the dataset is what
    one process writes."""
    tasks = {t["ArrayTaskId"]: t for t in jobs["requeued_prepare_tasks"]}
    logs = {i: (jobs["work"] / f"prepare-data-{t['JobId']}.out").read_text() for i, t in tasks.items()}
    assert jobs["array_requeued"] and jobs["failed_once"].is_file(), logs
    assert [tasks[i]["JobState"] for i in ("0", "1")] == ["COMPLETED", "COMPLETED"], logs
    assert int(tasks["1"]["Restarts"]) >= 1, tasks["1"]
    # Task 0 wrote its parts in the first run; SLURM reran it too, and its rerun, held until task 1 had published,
    # left the dataset as it was (before, it refused it as an older one: FAILED, and the array with it).
    counts = [int(line.split("task 0/2: ", 1)[1].split(" of ")[0]) for line in logs["0"].splitlines()
              if "task 0/2: " in line and " parts to write" in line]
    assert counts and counts[0] > 0 and len(counts) == 1, logs["0"]
    assert int(tasks["0"]["Restarts"]) >= 1 and "task 0/2: the dataset is already published" in logs["0"], logs["0"]
    assert logs["1"].count("] array job ") == 1, logs["1"]  # its first run ended in ENV_SETUP, before a word
    assert (logs["0"] + logs["1"]).count(" merged ") == 1
    from data_pipeline.shard_record import RECORD

    single = _prepare_once(PREPARE_OVERRIDES + [
        f"output_dir={jobs['work'] / 'data_requeued_single'}", f"sources=[{{kind: text, path: '{jobs['corpus']}'}}]",
        "num_workers=1"])
    files = {d: {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
                 if p.is_file() and p.name not in (MANIFEST, RECORD)}
             for d in (single, jobs["requeued_data"])}
    assert any(name.endswith(".mds") for name in files[single]) and files[single] == files[jobs["requeued_data"]]


def test_crash_is_not_requeued(jobs):
    """A bad config key (exit 2) is not requeued. The job was submitted from the repository root with the knobs
    unset: the log's first lines name the repository, the Python of its .venv and the task's CPUs as threads."""
    info, log = jobs["info"]["crash"], _log(jobs, "crash")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0" and info["ExitCode"] == "2:0", info
    assert "no_such_key" in log and "training failed with exit code 2: not requeueing" in log
    python = Path(sys.prefix) / "bin" / "python"
    assert f"repository {REPO}; python {python}\n" in log or not _venv_is_the_repos(), log[:2000]
    assert "rendezvous " in log and log.count(", OMP_NUM_THREADS=2\n") == 1, log[:2000]
    crash = jobs["ids"]["crash"]
    assert not (REPO / ".pretrain-status" / str(crash)).exists() and not (REPO / f"pretrain-{crash}.out").exists()


def test_a_job_slurm_requeued_past_max_restarts_exits_3_before_it_trains(jobs):
    """SLURM requeued the job itself (its preemption, an outside requeue) past MAX_RESTARTS: the script's own requeue
    cap cannot act on that, so the next attempt refuses to start, exit 3, and the job fails."""
    info, log = jobs["info"]["over_cap"], _log(jobs, "over_cap")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1" and info["ExitCode"] == "3:0", (info, log[-3000:])
    assert "restart 1 exceeds MAX_RESTARTS=0 (requeued by SLURM itself?): not starting" in log, log[-3000:]
    assert f"job {jobs['ids']['over_cap']} attempt 2 " not in log, log[-3000:]


def test_an_interrupt_saves_and_ends_the_job_without_requeueing(jobs):
    """A SIGINT to the tasks (`scancel --signal=INT`): the rank saves and dies of it; the sbatch reads its status and
    ends the job with 130, where a task that died of a signal would otherwise count as a lost node and requeue."""
    info, log = jobs["info"]["interrupted"], _log(jobs, "interrupted")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0" and info["ExitCode"] == "130:0", info
    assert "interrupted (SIGINT) after saving a checkpoint: not requeueing" in log, log[-3000:]
    marker = json.loads((jobs["interrupted_run"] / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGINT", marker
    assert (RunDir(jobs["interrupted_run"]).checkpoints / marker["checkpoint"] / "COMPLETE").is_file()


def test_a_job_slurm_requeued_after_its_ranks_saved_resumes_without_counting_a_crash(jobs):
    """SLURM's own preemption (or an outside `scontrol requeue`) once the job trains: the batch shell dies with the job
    and cannot decide, but the rank saved on SLURM's SIGTERM; the next attempt reads its status as a preemption, not a
    lost node, so even at MAX_CRASHES=1 it resumes from that checkpoint and finishes."""
    info, log = jobs["info"]["slurm_preempted"], _log(jobs, "slurm_preempted")
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, log[-3000:])
    assert ("attempt 1 was ended by SLURM after every rank had saved a checkpoint (a preemption by SLURM, or an outside "
            "requeue): not a crash; resuming") in log, log[-3000:]
    assert "crash" not in log.split("not a crash; resuming", 1)[1], log[-3000:]
    first, second = log.split(f"job {jobs['ids']['slurm_preempted']} attempt 2 ")
    assert "preempted (SIGTERM) at step" in first, first[-3000:]
    assert "resumed from" in second and "training finished" in second, second[-3000:]


def test_a_requeue_slurm_refuses_ends_the_job_with_its_checkpoint_and_says_how_to_go_on(jobs):
    """A job submitted with --no-requeue, preempted: the rank saves, `scontrol requeue` is refused, and the job ends
    with 75 (preempted) in one line that says so and how to go on, its checkpoint complete."""
    info, log = jobs["info"]["refused"], _log(jobs, "refused")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0" and info["ExitCode"] == "75:0", (info, log[-3000:])
    marker = json.loads((jobs["refused_run"] / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGUSR1", marker
    checkpoint = RunDir(jobs["refused_run"]).checkpoints / marker["checkpoint"]
    assert (checkpoint / "COMPLETE").is_file()
    assert "preempted with a checkpoint: requeueing job" in log
    said = ("scontrol requeue failed (was the job submitted with --no-requeue?): not requeued; submit the job again "
            "to resume from its last checkpoint")
    assert said in log and f"saved checkpoint {checkpoint} in " in log.split(said)[0], log[-3000:]


def test_restart_limit_is_respected(jobs):
    info, log = jobs["info"]["limited"], _log(jobs, "limited")
    assert jobs["limit_signals"] == 2, log[-3000:]
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1" and info["ExitCode"] == "75:0", info
    assert "requeueing job" in log  # the first preemption was requeued ...
    assert "restart 1 reached MAX_RESTARTS=1: not requeueing" in log  # ... the second was not
    assert log.count(f"job {jobs['ids']['limited']} attempt ") == 2
    # The second USR1 came while the batch shell ran ENV_SETUP: kept, forwarded once the trainer caught signals, and
    # the trainer saved and exited 75 (a task killed by an early USR1 would have been a crash, exit 1).
    second = log.split("requeueing job", 1)[1]
    said = ["USR1 received before srun started", f"job {jobs['ids']['limited']} attempt 2",
            "USR1 received: forwarding it to the training tasks", "preempted (SIGUSR1) at step"]
    where = [second.find(text) for text in said]
    assert -1 not in where and where == sorted(where), (where, second[-3000:])
    marker = json.loads((jobs["limited_run"] / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGUSR1" and (RunDir(jobs["limited_run"]).checkpoints / marker["checkpoint"] / "COMPLETE").is_file()


def test_the_job_end_time_from_slurm_stops_the_run_before_its_limit(jobs):
    """With no signal in time, the trainer's deadline (SLURM's end time for the job, less two steps, a save and
    train.deadline_margin_s) stops it with a complete checkpoint before SLURM would kill it."""
    import datetime

    from pretrain.lifecycle.preemption import parse_duration

    info, log = jobs["info"]["deadline"], _log(jobs, "deadline")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0" and info["Restarts"] == "0", (info, log[-3000:])
    assert "USR1 received" not in log and "preempted (deadline) at step" in log, log[-3000:]
    assert "preempted with a checkpoint, but restart 0 reached MAX_RESTARTS=0" in log
    marker = json.loads((jobs["deadline_run"] / "PREEMPTED").read_text())
    # (EndTime is when the job ended; the limit it ran under is its start plus its 4-minute time limit.) The stop came
    # at the deadline (40 s in) or at the first step after a longer start-up (30-60 s), two minutes before the end.
    limit = datetime.datetime.fromisoformat(info["StartTime"]).timestamp() + parse_duration(info["TimeLimit"])
    assert info["TimeLimit"] == "00:04:00" and marker["reason"] == "deadline", (marker, info)
    assert abs(marker["deadline"] - limit) <= 1 and marker["time"] < limit - 120, (marker, info["StartTime"])
    assert (RunDir(jobs["deadline_run"]).checkpoints / marker["checkpoint"] / "COMPLETE").is_file()
    assert marker["step"] > 0
    # The run read CONFIG's file and the argument after the script.
    import yaml

    saved = yaml.safe_load(RunDir(jobs["deadline_run"]).config.read_text())["train"]
    assert (saved["keep_last"], saved["deadline_margin_s"]) == (2, 200.0), saved
    assert f"config {jobs['work'] / 'deadline_config.yaml'} overrides: " in log


def _said_at(log: str, text: str) -> float:
    """When the sbatch said `text` (its "[pretrain.sbatch YYYY-MM-DD HH:MM:SS]" prefix), as a Unix time."""
    import datetime

    line = next(line for line in log.splitlines() if text in line)
    stamp = line.split("[pretrain.sbatch ", 1)[1][:19]
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()


def test_a_killed_rank_ends_the_step_requeues_and_resumes_exactly(jobs):
    """A rank killed in two attempts in a row, each time after the attempt's own new checkpoint: each is the first
    crash since progress, so MAX_CRASHES=2 requeues both (it counted the job's whole life, and stopped it at the
    second), and the last attempt ends with the uninterrupted run's weights and samples."""
    info, log = jobs["info"]["lost"], _log(jobs, "lost")
    assert len(jobs["kills"]["lost"]) == 2, log[-3000:]
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", (info, log[-3000:])
    lost_line = "a rank or node was lost (crash 1 of at most 2): srun: error: n2: task 1: Killed (host n2)"
    assert log.count(lost_line) == 2 and "MAX_CRASHES" not in log, log[-3000:]
    # MASTER_PORT_BASE gave each attempt's ranks their MASTER_PORT (the sbatch's sum; they met there and trained on).
    port = LOST_PORT_BASE + jobs["ids"]["lost"] % 20000
    assert log.count(", rendezvous ") == 3 and log.count(f":{port}, OMP_NUM_THREADS=1\n") == 3, log[-3000:]
    seconds = _said_at(log, "a rank or node was lost") - jobs["kills"]["lost"][0]
    print(f"SIGKILL of rank 1 -> the step ended and the sbatch decided {seconds:.0f}s later (1 s resolution)")
    assert seconds < 40, seconds
    # Two nodes for a 2-node job: excluding n2 would leave it unschedulable, so the requeue keeps it.
    assert "not excluding n2: the partition would keep 1 usable node(s) for a 2-node job" in log
    assert "requeueing job" in log and "after the lost rank" in log
    second, third = log.split(f"job {jobs['ids']['lost']} attempt ")[2:4]
    assert "resumed from" in second and "at step 125" in second and "stopped at step" not in second
    assert "resumed from" in third and "at step 250" in third and "stopped at step 500" in third
    ours, ref = _weights(jobs["lost_run"], 500), _weights(jobs["reference"], 500)
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    for rank in (0, 1):
        assert _samples(jobs["lost_run"], rank) == _samples(jobs["reference"], rank)[:500]


def test_without_host_exclusion_a_lost_rank_requeues_the_job_as_it_is(jobs):
    """EXCLUDE_FAILED_HOSTS=0: the crash is counted and the job requeued at once, with no held requeue, no helper
    job and no ExcNodeList; at the cap it fails as with exclusion."""
    info, log = jobs["info"]["kept"], _log(jobs, "kept")
    assert len(jobs["kills"]["kept"]) == 2, log[-3000:]
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1" and info["ExitCode"] == "76:0", (info, log[-3000:])
    assert f"requeueing job {jobs['ids']['kept']} after the lost rank (restart 1)" in log, log[-3000:]
    assert "held" not in log and "exclud" not in log and info["ExcNodeList"] == "(null)"
    assert "crash 2 reached MAX_CRASHES=2" in log


def test_an_attempt_ended_by_slurm_itself_counts_as_a_crash(jobs):
    """A job that SLURM ended and requeued (a node failure, an outside requeue) never reached its script's decision:
    the next attempt finds no end mark from the last one, counts a crash, and at MAX_CRASHES stops before srun."""
    info, log = jobs["info"]["outside"], _log(jobs, "outside")
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1" and info["ExitCode"] == "76:0", (info, log[-3000:])
    assert ("attempt 1 was ended by SLURM, not by the training (a node failure or an outside requeue): crash 1 of at "
            "most 1") in log, log[-3000:]
    assert "crash 1 reached MAX_CRASHES=1: not starting" in log
    second = log.split(f"job {jobs['ids']['outside']} attempt 2 ")[1]
    assert "| ETA" not in second and "training failed" not in second  # stopped before srun started a trainer


def test_a_rank_lost_in_every_attempt_stops_at_the_crash_cap_away_from_the_bad_node(jobs):
    info, log = jobs["info"]["doomed"], _log(jobs, "doomed")
    assert len(jobs["kills"]["doomed"]) == 2, log[-3000:]
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1" and info["ExitCode"] == "76:0", (info, log[-3000:])
    first = log.split(" attempt 2 ")[0]
    node = first.split("node(s) [", 1)[1].split("]", 1)[0]
    assert f"srun: error: {node}: task 1: Killed (host {node})" in first, first[-3000:]
    # A running job cannot change its ExcNodeList: it requeued itself held, and a helper job excluded the node.
    helper = first.split(f"requeueing job {jobs['ids']['doomed']} held after the lost rank")[1].split("job ", 1)[1].split()[0]
    helper_log = (jobs["work"] / ".pretrain-status" / str(jobs["ids"]["doomed"]) / f"exclude-{helper}.out").read_text()
    assert f"excluded {node} (scontrol show job confirms ExcNodeList={node}) and released it" in helper_log, helper_log
    assert info["ExcNodeList"] == node
    second = log.split(" attempt 2 ")[1]
    other = second.split("node(s) [", 1)[1].split("]", 1)[0]
    assert other != node  # the requeued attempt ran elsewhere
    assert f"crash 2 reached MAX_CRASHES=2 (last failing host: {other}): not requeueing" in second
    # The rank killed at start-up leaves its peer waiting at the rendezvous; srun's SIGTERM ends that one at once, not
    # SLURM's SIGKILL KillWait (30 s) later.
    for crash, killed in enumerate(jobs["kills"]["doomed"], 1):
        seconds = _said_at(log, f"a rank or node was lost (crash {crash} of") - killed
        print(f"attempt {crash}: SIGKILL of rank 1 at start-up -> the sbatch decided {seconds:.0f}s later")
        assert seconds < 20, seconds
    assert "MAX_RESTARTS" not in second  # the crash cap stopped it, not the preemption cap


def test_a_host_exclusion_that_does_not_take_cancels_the_job_instead_of_releasing_it(cluster, tmp_path):
    """slurm/exclude_and_release.sh, which the sbatch submits after a lost rank for the job it requeued held: where
    SLURM keeps another ExcNodeList than the one asked (here it refuses a node it does not know; a submit plugin may
    rewrite the list), the job is cancelled, not released to run again on the node that failed. (An exclusion that
    takes is test_a_rank_lost_in_every_attempt_stops_at_the_crash_cap_away_from_the_bad_node's.)"""
    job = cluster.sbatch("pretrain.sbatch", "--hold", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0",
                         "--cpus-per-task=1", cwd=tmp_path, OVERRIDES="train.max_steps=1")  # held: it never runs
    try:
        done = subprocess.run(["bash", str(REPO / "slurm" / "exclude_and_release.sh"), str(job), "no-such-node", "1"],
                              env=cluster.env, capture_output=True, text=True, timeout=120)
    finally:  # whatever happened, the job must not run (released) or stay in the queue
        state = cluster.job(job)["JobState"]
        subprocess.run(["scancel", str(job)], env=cluster.env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"the exclusion of no-such-node from job {job} did not take" in done.stdout, done.stdout + done.stderr
    assert "cancelling the job rather than run it on that node again" in done.stdout
    assert state == "CANCELLED"


def test_the_exclusion_helper_waits_its_bound_then_says_how_to_release_and_stops_on_an_ended_job(cluster, tmp_path):
    """A job whose node is gone stays COMPLETING for minutes, never PENDING within a short wait: the helper says the
    job stays held and how to exclude and release it by hand (it used to stop after 300 s with neither); a job that
    ended instead (cancelled) is said at once, without waiting out the bound."""
    job = cluster.sbatch("pretrain.sbatch", "--hold", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=0",
                         "--cpus-per-task=1", cwd=tmp_path, OVERRIDES="train.max_steps=1")
    try:
        # Pending is what it waits for: the bound is seen on a job it cannot find (a bound of 0 s: no look at all).
        timed = subprocess.run(["bash", str(REPO / "slurm" / "exclude_and_release.sh"), "999999", "n9", "1"],
                               env={**cluster.env, "EXCLUDE_WAIT_S": "0"}, capture_output=True, text=True, timeout=60)
        assert timed.returncode == 1 and "did not return to the queue within 0s" in timed.stdout, timed.stdout
        assert "scontrol update JobId=999999 ExcNodeList=n9 && scontrol release 999999" in timed.stdout
        subprocess.run(["scancel", str(job)], env=cluster.env, timeout=60)
        start = time.monotonic()
        ended = subprocess.run(["bash", str(REPO / "slurm" / "exclude_and_release.sh"), str(job), "n9", "1"],
                               env=cluster.env, capture_output=True, text=True, timeout=120)
        assert ended.returncode == 1 and f"job {job} ended (CANCELLED) instead of returning to the queue" in ended.stdout
        assert time.monotonic() - start < 30
    finally:
        subprocess.run(["scancel", str(job)], env=cluster.env, timeout=60)


def test_host_lists_are_read_in_slurm_s_compressed_form(cluster, tmp_path):
    """A job's own --exclude may be "gpu[01,05-06]": the sbatch adds the suspects to it host by host (a split on commas
    cut it inside the brackets, and the update that followed was refused, so the helper cancelled the job), and the
    helper compares what SLURM writes back however it writes it. Where scontrol cannot read a list (here: a
    slurm.conf it refuses), no list is taken for the same as another, not even for itself: the helper then cancels
    rather than release, and the sbatch leaves the job's exclusions as they are."""
    script = (f'source "{REPO}/slurm/host_lists.sh"; merged_hosts "$1" "$2"; '
              'for pair in "$3|$4" "$5|$6"; do same_hosts "${pair%|*}" "${pair#*|}" && echo same || echo differ; done')
    out = subprocess.run(["bash", "-c", script, "lists", "gpu[01,05-06]", "n2,gpu05", "n[1-2]", "n2,n1", "(null)",
                          "no-such-node"], env=cluster.env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["gpu01,gpu05,gpu06,n2", "same", "differ"], out.stdout + out.stderr
    (tmp_path / "slurm.conf").write_text("")  # scontrol refuses it at once (no ClusterName)
    out = subprocess.run(["bash", "-c", script, "lists", "n1", "", "n1", "n1", "(null)", "n1"],
                         env={**cluster.env, "SLURM_CONF": str(tmp_path / "slurm.conf")}, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["differ", "differ"], out.stdout + out.stderr  # and no merged list
