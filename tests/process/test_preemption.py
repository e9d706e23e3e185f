"""Deadlines, repeated signals and time-based saves (single process: real DeepSpeed, real signals)."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import PROCESS_ENV, REPO, TINY_MODEL, descendants, python_process, run_cli, wait_for_step

from pretrain.lifecycle.exit_status import EXIT_PREEMPTED
from pretrain.lifecycle.preemption import parse_duration
from pretrain.run_dir import RunDir



def _args(data, out, *extra):
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=8", "train.eval_every=0", "train.save_every=1000",
            "train.max_steps=100000", "train.use_slurm_deadline=false", *extra]


def test_parse_duration():
    assert parse_duration("90") == 90 and parse_duration("90m") == 5400 and parse_duration("1.5h") == 5400
    assert parse_duration("23:30:00") == 84600 and parse_duration("1-00:00:30") == 86430 and parse_duration("05:00") == 300
    # SLURM's --time day forms, as a user pastes them: after the days, hours come first (not seconds).
    assert [parse_duration(t) for t in ("0-12", "1-12", "0-12:30", "1-12:30")] == [43200, 129600, 45000, 131400]
    for never in ("nan", "inf", "1:inf", "-inf"):  # float() reads them: a deadline that never comes
        with pytest.raises(ValueError):
            parse_duration(never)


def test_a_wall_time_that_is_no_duration_is_refused():
    from core.errors import ConfigError
    from pretrain.config import TrainConfig

    for value in ("nan", "inf", "abc", "1:2:3:4"):
        with pytest.raises(ConfigError, match=f"'train.max_wall_time' must be a duration .*got '{re.escape(value)}'"):
            TrainConfig(max_wall_time=value).validate()


def test_a_wall_time_in_yaml_is_read_as_written_not_as_a_base_60_number(tmp_path):
    """YAML 1.1 reads an unquoted 1:2:3:4 as 223384: the config loader keeps such scalars text, for the check."""
    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig

    config = tmp_path / "run.yaml"
    config.write_text("train:\n  max_wall_time: 23:30:00\n")
    assert load_config(RunConfig, config).train.max_wall_time == "23:30:00"
    assert load_config(RunConfig, None, ["train.max_wall_time=1:30"]).train.max_wall_time == "1:30"
    for bad in ("1:2:3:4", "1:30:00.5:1"):
        config.write_text(f"train:\n  max_wall_time: {bad}\n")
        with pytest.raises(ConfigError, match=f"'train.max_wall_time' must be a duration .*got '{re.escape(bad)}'"):
            load_config(RunConfig, config)
        with pytest.raises(ConfigError, match=f"got '{re.escape(bad)}'"):
            load_config(RunConfig, None, [f"train.max_wall_time={bad}"])


def test_the_job_end_time_from_the_environment_is_used_when_it_is_a_time(monkeypatch):
    from pretrain.lifecycle.preemption import slurm_end_time

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # nothing to ask squeue: a bad value is then unknown
    for value, expected in (("1790000000", 1790000000.0), ("abc", None), ("nan", None), ("", None)):
        monkeypatch.setenv("SLURM_JOB_END_TIME", value)
        assert slurm_end_time() == expected, value


def test_deadline_saves_and_exits_before_the_limit(prepared, tmp_path):
    out = tmp_path / "run"
    start = time.time()
    proc = run_cli("pretrain", _args(prepared, out, "train.max_wall_time=14s", "train.deadline_margin_s=4"), check=False)
    end = time.time()
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr[-2000:]
    marker = json.loads((out / "PREEMPTED").read_text())
    assert marker["reason"] == "deadline" and marker["step"] > 0
    assert (RunDir(out).checkpoints / marker["checkpoint"] / "COMPLETE").is_file()
    # The trainer's clock starts with the process (its imports, seconds on a slow machine, count), somewhere inside
    # the lifetime measured here (to a clock tick); the checkpoint and the marker must be written before its limit. (A run's first
    # save has no measured length to plan with, only the margin: 4 s covers a slow disk's save of this tiny model.)
    assert start + 14 - 0.02 <= marker["deadline"] <= end + 14
    assert marker["time"] < marker["deadline"]


def test_a_hang_up_then_repeated_signals_during_the_save_leave_a_good_checkpoint(prepared, tmp_path):
    """A run started as `python -m pretrain train ... | tee log` in a terminal that closes (an ssh session that
    drops): every write to the terminal (stderr) fails with EIO, `tee` ends, so every write to its pipe (stdout) fails
    with EPIPE, and the shell, or torchrun, sends SIGHUP to the rank and its loader workers. Then, during the save,
    SLURM-style repeated SIGTERMs to every process (torch's worker dies of a SIGTERM not from its rank, and the rank's
    next batch then failed before its save). The rank saves, writes PREEMPTED and exits 75, and the run resumes."""
    import contextlib
    import os
    import select
    import threading

    out, status = tmp_path / "run", tmp_path / "status" / "rank0.json"
    terminal, rank_terminal = os.openpty()
    tee, rank_pipe = os.pipe()
    proc = python_process(["-m", "pretrain", *_args(prepared, out)], {**os.environ, **PROCESS_ENV,
                          "PRETRAIN_STATUS_DIR": str(status.parent)}, stdout=rank_pipe, stderr=rank_terminal)
    os.close(rank_terminal)
    os.close(rank_pipe)
    console, reading = bytearray(), threading.Event()
    reading.set()

    def read_console() -> None:  # a terminal or pipe nobody reads fills up and blocks the rank's prints
        while reading.is_set():
            for end in select.select([terminal, tee], [], [], 0.1)[0]:
                try:
                    console.extend(os.read(end, 65536))
                except OSError:  # EIO: the rank side is closed (the rank ended)
                    return

    reader = threading.Thread(target=read_console, daemon=True)
    reader.start()
    try:
        try:
            wait_for_step(out, 3, [proc])
            workers = descendants(proc.pid)
            assert workers, "data.num_workers=auto starts a loader worker on a CPU"
        finally:
            reading.clear()
            reader.join()
            for end in (terminal, tee):  # what came after the reader's last look
                os.set_blocking(end, False)
                with contextlib.suppress(OSError):  # EAGAIN: nothing more
                    while chunk := os.read(end, 65536):
                        console.extend(chunk)
            os.close(terminal)  # the hang-up: from here the rank's writes to its terminal fail with EIO,
            os.close(tee)  # and, tee gone, those to its pipe with EPIPE
        # The hang-up reaches the whole process group; the workers' share first, and the rank's after many steps'
        # worth of batches (a worker that died of it would fail the rank's next batch). The hang-up starts the save;
        # the SIGTERMs arrive while it runs.
        for pids, sig, pause in [(workers, signal.SIGHUP, 0.5), ([proc.pid], signal.SIGHUP, 0.02),
                                 *[([proc.pid, *workers], signal.SIGTERM, 0.02)] * 6]:
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:  # a worker the rank ended after its save
                    pass
            time.sleep(pause)
        code = proc.wait(timeout=120)
    finally:  # a rank that did not stop must not train on after the test
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = RunDir(out).text_log.read_text()
    assert code == EXIT_PREEMPTED, (code, console.decode(errors="replace")[-2000:], log[-2000:])
    assert json.loads(status.read_text())["status"] == "preempted"
    marker = json.loads((out / "PREEMPTED").read_text())
    assert marker["reason"] == "SIGHUP"
    tag = RunDir(out).checkpoints / marker["checkpoint"]
    assert (tag / "COMPLETE").is_file()
    assert b"| ETA" in console  # the progress lines went to the pipe until the hang-up
    # The lines after the hang-up reach train.log, though the console refuses them.
    assert f"preempted (SIGHUP) at step {marker['step']}: checkpoint saved" in log, log[-2000:]
    resumed = run_cli("pretrain", _args(prepared, out, f"train.max_steps={marker['step'] + 2}"))
    assert f"at step {marker['step']}" in resumed.stdout


def test_time_based_saves(prepared, tmp_path):
    out = tmp_path / "run"
    run_cli("pretrain", _args(prepared, out, "train.max_steps=4", "train.save_every_minutes=0.0001", "train.keep_last=10"))
    assert sorted(p.name for p in (RunDir(out).checkpoints).glob("step_*")) == [f"step_0000000{i}" for i in range(1, 5)]
    state = __import__("torch").load(RunDir(out).checkpoints / "step_00000004" / "mp_rank_00_model_states.pt",
                                     map_location="cpu", weights_only=False)
    assert state["loader_per_rank"] == [state["loader"]]
    assert {"step", "samples_seen", "tokens_seen", "elapsed_s", "config_hash", "rng"} <= set(state)


def test_the_guards_second_catch_leaves_no_window_where_a_signal_is_ignored(tmp_path):
    """The trainer's guard calls signals.catch() again after `python -m pretrain train` did: with the handlers in and
    the resource tracker running, it must not set the signals to ignored for a moment (the kernel throws away a
    SIGUSR1 that lands then, and SLURM sends it once)."""
    script = tmp_path / "twice.py"
    script.write_text(
        "import signal, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from pretrain.lifecycle import signals\n"
        "signals.catch()\n"
        "ignored, real = [], signal.signal\n"
        "signal.signal = lambda sig, handler: (ignored.append(sig) if handler == signal.SIG_IGN else None, "
        "real(sig, handler))[1]\n"
        "signals.catch()\n"
        "print('ignored', len(ignored), 'usr1 handled', signal.getsignal(signal.SIGUSR1) is signals._handle)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ignored 0 usr1 handled True"), proc.stdout


def test_the_wall_time_budget_counts_from_the_process_start():
    """train.max_wall_time counts the start-up too (imports, a checkpoint's download): the start time the trainer is
    given is the process's own, seconds before the trainer is built."""
    code = ("import time; time.sleep(2.5); from core.process_life import process_start_time; "
            "print(round(time.time() - process_start_time(), 1))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 2.5 <= float(proc.stdout.strip().splitlines()[-1]) < 10, proc.stdout
