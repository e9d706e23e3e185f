"""A user's mistake is one line and exit 2; a bug keeps its traceback and exit 1 (and a run marks itself FAILED)."""
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO, TINY_MODEL, run_cli, run_python

from core import errors
from pretrain.run_dir import RunDir


def _python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter: for what the preloaded server's imports would hide."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _script(path, code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python path` with `code` written there, forked from the preloaded server."""
    path.write_text(code)
    return run_python([str(path)], timeout=timeout)


@pytest.mark.parametrize("cls, builtin", [(errors.ConfigError, ValueError), (errors.InputDataError, ValueError),
                                          (errors.MissingFileError, FileNotFoundError), (errors.CheckpointError, RuntimeError),
                                          (errors.OutputExistsError, FileExistsError), (errors.SetupError, RuntimeError)])
def test_every_kind_is_a_user_error_and_what_callers_expect(cls, builtin):
    assert issubclass(cls, errors.UserError) and issubclass(cls, builtin)
    assert str(cls("'x.yaml': bad")) == "'x.yaml': bad"


def test_an_internal_fault_during_training_shows_its_traceback_and_marks_the_run(prepared, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=6", "train.eval_every=0"]
    # The fault: a bug in the loop at step 3 (an exception no user input explains).
    code = ("import pretrain.trainer as t\n"
            "step = t.Trainer.train_step\n"
            "def faulty(self):\n"
            "    if self.step == 2:\n"
            "        raise ZeroDivisionError('injected fault')\n"
            "    step(self)\n"
            "t.Trainer.train_step = faulty\n"
            "from pretrain.cli import main\n"
            f"raise SystemExit(main({args!r}))\n")
    proc = _script(tmp_path / "faulty_train.py", code)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last)" in proc.stderr and "ZeroDivisionError: injected fault" in proc.stderr
    assert "error: injected fault" not in proc.stderr  # not dressed up as the user's mistake
    failed = json.loads((out / "FAILED").read_text())
    assert failed["error"] == "ZeroDivisionError" and failed["message"] == "injected fault" and failed["step"] == 2
    assert "failed at step 2: ZeroDivisionError" in (out / "train.log").read_text()


def test_a_diverged_run_stops_in_one_line_with_exit_4_saves_nothing_of_it_and_resumes_as_it_says(prepared, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=4",
            "train.eval_every=0", "train.log_every=1", "train.save_every=1"]
    run_cli("pretrain", [*args, "optimizer.lr=1e-3", "train.stop_after=2"])
    # Then a peak lr of 1e30: step 3's update is finite and saved, the weights it leaves overflow step 4.
    proc = run_cli("pretrain", [*args, "optimizer.lr=1e30"], check=False)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["error: training diverged at step 4: loss nan, grad_norm inf; nothing of step 4 is saved, but the "
                      "newest checkpoint may hold the weights that diverged: resume from an earlier one "
                      "(train.resume_from=TAG) with a lower optimizer.lr or a longer schedule.warmup_steps"]
    assert sorted(p.name for p in RunDir(out).checkpoints.glob("step_*")) == [f"step_0000000{i}" for i in (1, 2, 3)]
    failed = json.loads((out / "FAILED").read_text())
    assert failed["error"] == "DivergedError" and failed["step"] == 4
    rows = RunDir(out).metric_rows("train")
    assert [row["step"] for row in rows] == [1, 2, 3, 4] and math.isnan(rows[-1]["loss"])  # the diverged step, on record
    # What the line says to do: from the checkpoint before the newest, with a lower lr, the run trains on.
    run_cli("pretrain", [*args, "optimizer.lr=1e-3", "train.resume_from=step_00000002"])
    train = RunDir(out).metric_rows("train")
    assert [row["step"] for row in train] == [1, 2, 3, 4] and all(row["loss"] < 10 for row in train)


def test_an_internal_fault_in_prepare_shows_its_traceback(tmp_path, corpus_file):
    code = ("import data_pipeline.prepare as p\n"
            "def faulty(cfg, command=''):\n"
            "    raise KeyError('injected fault')\n"
            "p.prepare = faulty\n"
            "from data_pipeline.cli import main\n"
            f"raise SystemExit(main(['prepare', '--config', 'data_pipeline/configs/demo.yaml', "
            f"'output_dir={tmp_path / 'out'}', \"sources=[{{kind: text, path: '{corpus_file}'}}]\"]))\n")
    proc = _script(tmp_path / "faulty_prepare.py", code, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback (most recent call last)" in proc.stderr and "KeyError: 'injected fault'" in proc.stderr


def test_bad_input_with_prepare_workers_is_still_one_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good text here\n\n" * 50 + b"caf\xe9 au lait\n")
    proc = run_cli("data_pipeline", ["prepare", "--config", "data_pipeline/configs/demo.yaml", f"output_dir={tmp_path / 'out'}",
                                     f"sources=[{{kind: text, path: '{bad}'}}]", "num_workers=2",
                                     "tokenizer.vocab_size=100"], timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "UTF-8" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_streaming_is_one_line_that_says_how_to_install_it(prepared, tmp_path):
    """mosaicml-streaming is installed apart (--no-deps); where it is absent or cannot be imported, a run says how."""
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={tmp_path / 'run'}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=2", "train.eval_every=0"]
    # None in sys.modules is what Python's import system reads as "this package cannot be imported".
    proc = _python(f"import sys\nsys.modules['streaming'] = None\nfrom pretrain.cli import main\nraise SystemExit(main({args!r}))\n")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("error: mosaicml-streaming cannot be imported"), lines
    assert 'pip install --no-deps "mosaicml-streaming==0.13.0"' in lines[-1]
