"""A Ctrl-C (SIGINT) while training saves a checkpoint at the step boundary, then ends the process by SIGINT, as an
interrupted program does; a second one ends it at once; before the first step it ends it at once. Real torchrun, real
DeepSpeed, real loader workers, real signals to the process group, as a terminal sends them."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROCESS_ENV, REPO, TINY_MODEL, descendants, free_port, run_cli, wait_for_step

from pretrain.run_dir import RunDir


def _from_a_terminal() -> None:
    # A process started in a terminal's foreground gets Python's KeyboardInterrupt handler; the suite itself may run
    # where SIGINT is ignored (a background job), which its children would inherit.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _train_args(data, out, *extra) -> list[str]:
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}",
            *TINY_MODEL, "train.max_steps=100000", "train.save_every=100000", "train.micro_batch_size=4",
            "train.global_batch_size=8", "train.eval_every=0", "train.log_every=1", "train.use_slurm_deadline=false",
            *extra]


def _ignores_sigint(pid: int) -> bool:
    """Whether the process ignores SIGINT (its SigIgn mask, from /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn:")), 16)
                & 1 << (signal.SIGINT - 1))


def _ctrl_c(cmd: list[str], env: dict, out: Path, step: int) -> tuple[int, str, list[int], list[bool]]:
    """Start `cmd` as a terminal's foreground job (a session of its own), press Ctrl-C (SIGINT to its whole process
    group) once the run is past `step`; its exit code, its output, the processes that outlived it, and whether each
    process below it ignored SIGINT then."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_from_a_terminal)
    family: list[int] = []
    try:
        wait_for_step(out, step, [proc])
        family = descendants(proc.pid)
        assert family, "a loader worker at least"
        ignoring = [_ignores_sigint(pid) for pid in family]
        os.killpg(proc.pid, signal.SIGINT)
        log, _ = proc.communicate(timeout=120)
    finally:
        deadline = time.time() + 15  # the workers die with their rank; the resource tracker once its pipe closes
        while (left := [pid for pid in family if _alive(pid)]) and time.time() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.returncode, log, left, ignoring


def test_ctrl_c_under_torchrun_saves_on_every_rank_and_the_run_resumes(prepared, tmp_path):
    """The demo's launch: torchrun gets the terminal's SIGINT and forwards it to each rank's process group, loader
    workers included. Each rank saves at the step boundary, says "interrupted", and nothing prints a rank's traceback;
    the checkpoint is complete and the same command resumes from it (here on one rank)."""
    out, status = tmp_path / "run", tmp_path / "status"
    env = {**os.environ, **PROCESS_ENV, "PRETRAIN_STATUS_DIR": str(status)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "pretrain", *_train_args(prepared, out)]
    code, log, left, _ = _ctrl_c(cmd, env, out, 3)
    assert not left, f"outlived the run: {left}"
    assert code != 0, log[-3000:]  # torchrun itself ends on the signal it got
    statuses = [json.loads((status / f"rank{rank}.json").read_text())["status"] for rank in range(2)]
    assert statuses == ["interrupted", "interrupted"], (statuses, log[-3000:])
    marker = json.loads((out / "PREEMPTED").read_text())
    # Both ranks get the Ctrl-C; rank 1 may read it one step before rank 0 does, and the agreed reason then names it.
    assert marker["reason"] in ("SIGINT", "SIGINT on rank 1") and marker["step"] >= 3, marker
    assert (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file(), log[-3000:]
    assert f"interrupted ({marker['reason']}) at step {marker['step']}: checkpoint saved" in log, log[-3000:]
    assert log.count("Ctrl-C (SIGINT): saving a checkpoint") == 1, log[-3000:]  # rank 0 says it, once
    assert "KeyboardInterrupt" not in log and "[rank0]: Traceback" not in log and "[rank1]: Traceback" not in log
    resumed = run_cli("pretrain", _train_args(prepared, out, f"train.max_steps={marker['step'] + 2}"))
    assert f"from step {marker['step']} to {marker['step'] + 2}" in resumed.stdout, resumed.stdout[-2000:]


def test_ctrl_c_under_the_deepspeed_launcher_saves_on_every_rank(prepared, tmp_path):
    """`deepspeed --num_gpus 2 --module pretrain train ...` in a terminal: the runner, its per-node launch.py and the
    ranks share the terminal's process group, so each rank gets the Ctrl-C itself and saves; launch.py's SIGTERM to
    each rank, which follows, changes nothing for a rank already saving. The runner's own traceback is DeepSpeed's."""
    out, status = tmp_path / "run", tmp_path / "status"
    env = {**os.environ, **PROCESS_ENV, "DS_ACCELERATOR": "cpu", "PRETRAIN_STATUS_DIR": str(status)}
    launcher = str(Path(sys.executable).parent / "deepspeed")
    cmd = [launcher, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "pretrain",
           *_train_args(prepared, out)]
    code, log, left, _ = _ctrl_c(cmd, env, out, 3)
    assert not left, f"outlived the run: {left}"
    assert code != 0, log[-3000:]
    statuses = [json.loads((status / f"rank{rank}.json").read_text())["status"] for rank in range(2)]
    assert statuses == ["interrupted", "interrupted"], (statuses, log[-3000:])
    marker = json.loads((out / "PREEMPTED").read_text())
    # Both ranks get the Ctrl-C; rank 1 may read it one step before rank 0 does, and the agreed reason then names it.
    assert marker["reason"] in ("SIGINT", "SIGINT on rank 1") and marker["step"] >= 3, marker
    assert (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file(), log[-3000:]
    assert log.count("Ctrl-C (SIGINT): saving a checkpoint") == 1, log[-3000:]
    resumed = run_cli("pretrain", _train_args(prepared, out, f"train.max_steps={marker['step'] + 2}"))
    assert f"from step {marker['step']} to {marker['step'] + 2}" in resumed.stdout, resumed.stdout[-2000:]


def test_ctrl_c_of_a_plain_run_saves_then_ends_it_by_sigint(prepared, tmp_path):
    """`python -m pretrain train` in a terminal: the Ctrl-C reaches the rank and its loader worker. The worker leaves
    it to the rank (ignored); the rank saves and dies of SIGINT, which a shell reads as 130 and which stops a shell's
    loop."""
    out, status = tmp_path / "run", tmp_path / "status"
    env = {**os.environ, **PROCESS_ENV, "PRETRAIN_STATUS_DIR": str(status)}
    # Accumulation 8: the rest of the step needs batches the worker makes after the Ctrl-C.
    code, log, left, ignoring = _ctrl_c([sys.executable, "-m", "pretrain", *_train_args(prepared, out),
                                         "train.global_batch_size=32"], env, out, 3)
    assert not left, f"outlived the run: {left}"
    # The loader worker and the resource tracker ignore it: with the rank's handler (a fork's inheritance) a worker
    # forked after the first step would act on a Ctrl-C of its own, as a rank.
    assert ignoring and all(ignoring), ignoring
    assert code == -signal.SIGINT, (code, log[-3000:])
    assert json.loads((status / "rank0.json").read_text())["status"] == "interrupted"
    marker = json.loads((out / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGINT" and (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    # An export of it stopped the same way, while it still imports: one line, death by SIGINT, no folder.
    export = tmp_path / "export"
    proc = subprocess.Popen([sys.executable, "-m", "pretrain", "export", "--checkpoint", str(out), "--out", str(export)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_from_a_terminal)
    time.sleep(1.0)  # importing torch alone takes longer
    proc.send_signal(signal.SIGINT)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, log[-3000:])
    assert log.splitlines() == ["interrupted (Ctrl-C): stopped; what it had not finished writing is removed"], log[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "status"]  # no export, no temporary folder


# A command's imports pelted with SIGTERM every 5 ms (as a stop may land at any point of them), in a bare interpreter:
# no library imported before.
_PELTED_IMPORTS = """import os, signal, threading, time
from core.process_life import exit_on_termination, stops_deferred
exit_on_termination()
done = threading.Event()
def pelt():
    while not done.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.005)
thread = threading.Thread(target=pelt, daemon=True)
imported = False
try:
    with stops_deferred():
        thread.start()
        import numpy, torch, transformers.modeling_utils
        imported = True
        done.set()
        thread.join()
except BaseException as exc:
    done.set()
    thread.join()
    print(type(exc).__name__, exc, "after the imports" if imported else "inside them", flush=True)
import torch
print(float(torch.ones(3).numpy().sum()))
"""
_TWO_CTRL_C = """import os, signal
from core.process_life import exit_on_termination, stops_deferred
exit_on_termination()
with stops_deferred():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    import numpy
print("not ended")
"""


def test_a_stop_during_a_command_s_imports_is_acted_on_once_they_end():
    """Raised inside numpy's or torch's C initialisation, a KeyboardInterrupt (or SystemExit) left the module half
    made: the export stopped with a traceback of the next import (or aborted) instead of its clean-up. Deferred to the
    imports' end, the stop comes once, after them, and the libraries work. A second Ctrl-C still ends it at once."""
    proc = subprocess.run([sys.executable, "-c", _PELTED_IMPORTS], cwd=REPO, env={**os.environ, **PROCESS_ENV},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["SystemExit 143 after the imports", "3.0"], (
        proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    twice = subprocess.run([sys.executable, "-c", _TWO_CTRL_C], cwd=REPO, env={**os.environ, **PROCESS_ENV},
                           capture_output=True, text=True, timeout=300, preexec_fn=_from_a_terminal)
    assert twice.returncode == -signal.SIGINT and twice.stdout == "", (twice.returncode, twice.stdout, twice.stderr)


# The process-level rules, in a bare interpreter: the trainer's signals module set up as `python -m pretrain train`
# sets it (`command_line`: SIGINT taken too, and the wake-up thread that ends the process), then SIGINTs sent
# to itself.
_IMPORTS = "import os, signal, time\nfrom pretrain.lifecycle import signals\n"
_COMMAND_LINE = _IMPORTS + "signals.catch(command_line=True)\nsignals.catch()\n"


def _run(code: str, tmp_path: Path, rank: int = 0, ignored: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """`python -c code` as rank `rank` of 2 started from a terminal (or with SIGINT ignored), its status file in
    tmp_path/status; the process and its seconds."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "PRETRAIN_STATUS_DIR": str(tmp_path / "status")}
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
                          preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else _from_a_terminal)
    return proc, time.time() - started


def _status(tmp_path: Path, rank: int) -> tuple[str, str]:
    recorded = json.loads((tmp_path / "status" / f"rank{rank}.json").read_text())
    return recorded["status"], recorded.get("error", "")


@pytest.mark.parametrize("setup", ["command line", "background job", "library"])
def test_one_sigint_is_recorded_by_the_command_line_alone(setup, tmp_path):
    """`python -m pretrain train` records a Ctrl-C for the next step boundary and goes on; a script's background job,
    started with SIGINT ignored, keeps ignoring it (the shell's choice); a library caller (a notebook) that uses the
    trainer keeps its KeyboardInterrupt."""
    code = ((_IMPORTS + "signals.catch()\n") if setup == "library" else _COMMAND_LINE) + (
        "signals.training_started()\ntry:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n"
        "except KeyboardInterrupt:\n    print('KeyboardInterrupt', end=' ')\n"
        "print('alive', signals.first_received())\n")
    proc, _ = _run(code, tmp_path, ignored=setup == "background job")
    expected = {"command line": ["alive", "SIGINT"], "background job": ["alive", "None"],
                "library": ["KeyboardInterrupt", "alive", "None"]}[setup]
    assert (proc.returncode, proc.stdout.split()) == (0, expected), proc.stderr
    assert ("Ctrl-C (SIGINT): saving a checkpoint" in proc.stderr) == (setup == "command line"), proc.stderr


@pytest.mark.parametrize("main_thread", ["in Python", "in C++"])
def test_a_second_sigint_ends_the_process_at_once_without_saving(main_thread, tmp_path):
    """The first Ctrl-C asks for a save at the step boundary; a second, before the process is done, is a person who
    will not wait: it ends now, by SIGINT, with one line and the status "terminated". Also where the main thread sits
    in C++ (a collective of the save, a long write), which runs no Python handler until it returns: as a main thread
    that blocks SIGINT, so that only the other threads see it, the wake-up thread among them."""
    blocked = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n" if main_thread == "in C++" else ""
    # The second SIGINT once the first has been taken (its handler ran, so its wake-up byte is written): two sent
    # together could merge into one in the kernel. Then the main thread sleeps, running no handler until it wakes.
    code = _COMMAND_LINE + "signals.training_started()\n" + blocked + (
        "os.kill(os.getpid(), signal.SIGINT)\nwhile signals.first_received() is None:\n    time.sleep(0.01)\n"
        "print('first', flush=True)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(20)\nprint('still running')\n")
    proc, seconds = _run(code, tmp_path, rank=1)
    assert (proc.returncode, proc.stdout) == (-signal.SIGINT, "first\n"), (proc.returncode, proc.stdout, proc.stderr)
    assert seconds < 15, seconds
    assert proc.stderr.splitlines() == ["interrupted again: rank 1 of 2 ends now by SIGINT; the last complete "
                                        "checkpoint stands"], proc.stderr  # rank 1: no "saving" line
    assert _status(tmp_path, 1) == ("terminated", "SIGINT")


def test_a_second_sigint_ends_the_process_even_where_its_status_write_hangs(tmp_path):
    """A status folder on a hung file system (here: a write that never returns) must not keep alive a process a
    person asked to end now: the death comes `LAST_RESORT_S` after the ending began, by SIGINT."""
    code = _COMMAND_LINE + (
        "from pretrain.lifecycle import exit_status\nexit_status.write_status = lambda *a, **k: time.sleep(60)\n"
        "signals.LAST_RESORT_S = 1.0\nsignals.training_started()\n"
        "os.kill(os.getpid(), signal.SIGINT)\nwhile signals.first_received() is None:\n    time.sleep(0.01)\n"
        "print('first', flush=True)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nprint('still running')\n")
    proc, seconds = _run(code, tmp_path, rank=1)
    assert (proc.returncode, proc.stdout) == (-signal.SIGINT, "first\n"), (proc.returncode, proc.stdout, proc.stderr)
    assert seconds < 15, seconds


def test_a_sigint_before_the_first_step_ends_the_rank_at_once(tmp_path):
    """Before training there is nothing to save: the SIGINT ends the process at once (from the wake-up thread, wherever
    the main thread is), by SIGINT, with one line."""
    code = _COMMAND_LINE + ("print('caught', flush=True)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(20)\n"
                            "print('still running')\n")
    proc, seconds = _run(code, tmp_path)
    assert (proc.returncode, proc.stdout) == (-signal.SIGINT, "caught\n"), (proc.returncode, proc.stdout, proc.stderr)
    assert seconds < 15, seconds
    assert proc.stderr.splitlines() == ["interrupted: rank 0 of 2 before its first step by SIGINT (Ctrl-C); no step "
                                        "was run, nothing to save"], proc.stderr
    assert _status(tmp_path, 0) == ("terminated", "SIGINT")
