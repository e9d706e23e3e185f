"""Launchers: SLURM's srun variables become the process-group variables."""
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROCESS_ENV, REPO, TINY_MODEL, descendants, free_port, python_process, running, wait_for_step

from core.distributed import first_host, slurm_env, started_by_srun
from pretrain.run_dir import RunDir


def test_slurm_env_mapping():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)",
           "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_JOB_ID": "4242"}
    out = slurm_env(env)
    assert out["RANK"] == "5" and out["WORLD_SIZE"] == "8" and out["LOCAL_RANK"] == "1" and out["LOCAL_WORLD_SIZE"] == "4"
    assert out["MASTER_PORT"] == "19242"  # 15000 + the job id modulo 20000: each job its own port
    assert out["MASTER_ADDR"] == "gpu003"
    assert slurm_env({**env, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "2999"})["MASTER_ADDR"] == "10.1.2.3"


# What a real SLURM (22.05, slurm/local_cluster.sh) gives a batch script's shell and an srun task in a job of two
# tasks on one node, and, per SLURM's env.c, salloc's interactive step and an `srun --preserve-env -n 2` of a
# four-task allocation (the allocation's SLURM_NTASKS left in place, the step's own counts beside it).
_JOB = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "MASTER_ADDR": "n1"}
BATCH = {**_JOB, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
         "SLURM_TASKS_PER_NODE": "2"}
SRUN_TASK = {**BATCH, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}
INTERACTIVE = {**BATCH, "SLURM_NTASKS": "4", "SLURM_STEP_ID": "4294967290", "SLURM_STEP_NUM_TASKS": "1"}
PRESERVED = {**BATCH, "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "4", "SLURM_STEP_ID": "3",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}


def test_only_an_srun_task_takes_its_rank_from_slurm():
    """A batch script's shell and salloc's interactive step carry SLURM_PROCID=0 and the allocation's task count, but
    a process they start is one process; an srun task counts its own step's tasks, whatever the allocation's."""
    assert not started_by_srun(BATCH) and not started_by_srun(INTERACTIVE)
    assert started_by_srun(SRUN_TASK) and started_by_srun(PRESERVED)
    task = slurm_env(SRUN_TASK)
    assert (task["RANK"], task["WORLD_SIZE"], task["LOCAL_RANK"], task["LOCAL_WORLD_SIZE"]) == ("1", "2", "1", "2")
    preserved = slurm_env(PRESERVED)
    assert (preserved["WORLD_SIZE"], preserved["LOCAL_WORLD_SIZE"]) == ("2", "2")


def test_first_host_without_scontrol(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert first_host("gpu[003-005,7]") == "gpu003"
    assert first_host("node1,node2") == "node1"
    assert first_host("localhost") == "localhost"


def test_two_tasks_started_the_way_srun_starts_them(prepared, tmp_path):
    """Two processes that only have SLURM's variables form one 2-rank training run."""
    port = free_port()
    procs, logs = [], [tmp_path / f"task{rank}.log" for rank in range(2)]
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(PROCESS_ENV, SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                   SLURM_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="127.0.0.1", SLURM_JOB_ID="1", MASTER_PORT=str(port))
        cmd = ["-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
               f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.max_steps=3", "train.micro_batch_size=4",
               "train.global_batch_size=8", "train.eval_every=0", "train.use_slurm_deadline=false"]
        with open(logs[rank], "w") as out:  # forked from the preloaded server: the srun tasks' own start-up is test_slurm's
            procs.append(python_process(cmd, env, stdout=out, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=180) for p in procs]
    out = logs[0].read_text()
    assert codes == [0, 0], out[-2000:] + logs[1].read_text()[-2000:]
    assert "on 2 rank(s), accumulation 1" in out


def test_a_plain_process_in_a_batch_script_of_several_tasks_trains_as_one_rank(prepared, tmp_path):
    """`python -m pretrain train` run by an sbatch script itself, without srun: the batch shell has SLURM_PROCID=0 and
    the allocation's SLURM_NTASKS=2 (as a real SLURM's batch step shows them) but no step id. It trains as one rank and
    says why, instead of waiting for a second rank nothing starts."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("SLURM_")}
    env.update(PROCESS_ENV, SLURM_JOB_ID="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_NPROCS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="127.0.0.1")
    cmd = ["-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
           f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.max_steps=2", "train.micro_batch_size=4",
           "train.global_batch_size=4", "train.eval_every=0", "train.use_slurm_deadline=false", "train.init_timeout_s=30"]
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        code = python_process(cmd, env, stdout=out, stderr=subprocess.STDOUT).wait(timeout=180)
    text = log.read_text()
    assert code == 0 and "on 1 rank(s), accumulation 1" in text, text[-3000:]
    assert "this SLURM allocation has 2 tasks (SLURM_NTASKS), but this process was not started by srun" in text


def test_deepspeed_launcher_starts_the_same_training_and_its_ranks_stop_with_it(prepared, tmp_path):
    """`deepspeed --num_gpus 2 --module pretrain ...` (it adds --local_rank=N, which the CLI accepts). A launcher
    SIGKILLed mid-run (the OOM killer, a closed ssh session) forwards nothing: its ranks must not train on as
    orphans, but save and stop as on a preemption."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PRETRAIN_STATUS_DIR": str(tmp_path / "status")}
    out = tmp_path / "run"
    launcher = str(Path(sys.executable).parent / "deepspeed")
    cmd = [launcher, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "pretrain", "train",
           "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
           *TINY_MODEL, "train.max_steps=100000", "train.save_every=100000", "train.micro_batch_size=4",
           "train.global_batch_size=8", "train.eval_every=0", "train.log_every=1", "train.use_slurm_deadline=false"]
    # A session of its own: whatever fails below, the finally ends the runner, launch.py and the ranks together.
    runner = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    ranks: list[int] = []
    try:
        wait_for_step(out, 3, [runner])
        (launch,) = [pid for pid in descendants(runner.pid)
                     if b"deepspeed.launcher.launch" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        ranks = [int(pid) for pid in Path(f"/proc/{launch}/task/{launch}/children").read_text().split()]
        assert len(ranks) == 2, ranks
        os.kill(launch, signal.SIGKILL)
        log, _ = runner.communicate(timeout=120)  # the ranks hold the runner's stdout until they end
    finally:
        left = [pid for pid in ranks if running(pid)]  # orphans the test would otherwise leave training
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):  # ended by the session's kill meanwhile
                os.kill(pid, signal.SIGKILL)
        runner.wait()
    assert not left, "the ranks outlived their launcher"
    assert "on 2 rank(s), accumulation 1" in log
    statuses = [json.loads((tmp_path / "status" / f"rank{rank}.json").read_text())["status"] for rank in range(2)]
    assert statuses == ["preempted", "preempted"], statuses
    marker = json.loads((out / "PREEMPTED").read_text())
    assert marker["step"] >= 3 and (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file(), log[-3000:]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGHUP"])
def test_a_torchrun_rank_stops_with_its_launcher(prepared, tmp_path, sig):
    """The same for torchrun (one rank: what is tested is the rank's tie to the agent process that started it, which
    the kernel reports per thread): a SIGKILLed torchrun's rank saves, writes PREEMPTED and exits instead of training
    on as an orphan. A hung-up torchrun (its terminal closed) forwards the SIGHUP to each rank's process group, the
    loader workers too: the rank saves and stops the same way."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PRETRAIN_STATUS_DIR": str(tmp_path / "status")}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(free_port()),
           "-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
           f"train.output_dir={out}", *TINY_MODEL, "train.max_steps=100000", "train.save_every=100000",
           "train.micro_batch_size=4", "train.global_batch_size=4", "train.eval_every=0", "train.log_every=1",
           "train.use_slurm_deadline=false"]
    runner = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    ranks: list[int] = []
    try:
        wait_for_step(out, 3, [runner])
        ranks = [pid for pid in descendants(runner.pid) if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1]
                 .split()[1] == str(runner.pid) and b"pretrain" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(ranks) == 1, ranks
        os.kill(runner.pid, getattr(signal, sig))
        log, _ = runner.communicate(timeout=120)  # the rank holds the agent's stdout until it ends
    finally:
        left = [pid for pid in ranks if running(pid)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runner.wait()
    assert not left, "the rank outlived its launcher"
    assert json.loads((tmp_path / "status" / "rank0.json").read_text())["status"] == "preempted", log[-3000:]
    marker = json.loads((out / "PREEMPTED").read_text())
    # The launcher's death reaches the rank as a SIGTERM (its parent-death signal); a hang-up as itself.
    assert marker["reason"] == {"SIGKILL": "SIGTERM", "SIGHUP": "SIGHUP"}[sig] and marker["step"] >= 3, marker
    assert (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file(), log[-3000:]
