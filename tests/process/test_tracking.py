"""train.report_to: W&B (offline) and MLflow (SQLite) hold every row of metrics.jsonl, and a resume continues the same runs."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
from conftest import TINY_MODEL, restored_environ, run_cli
from core.errors import SetupError
from pretrain.run_dir import RunDir



def _wandb_records(path: Path) -> list[bytes]:
    """The records of a .wandb file, read independently of wandb: a 7-byte header (":W&B", magic, version),
    then LevelDB's log format (32 KiB blocks; each chunk crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    data, block, pos, out, partial = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of a block
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            out.append(partial + chunk)
    return out


def _wandb_rows(run: Path, run_id: str = "") -> tuple[set[str], dict[tuple[int, str], float]]:
    """Run ids and {(step, key): value} of every history row in the run's offline W&B files (of one W&B run's)."""
    from wandb.proto import wandb_internal_pb2 as pb

    ids, rows = set(), {}
    for path in sorted(run.glob(f"wandb/offline-run-*/run-{run_id or '*'}.wandb")):
        for raw in _wandb_records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                step = items.pop("_step")
                rows.update({(int(step), k): v for k, v in items.items() if not k.startswith("_")})
    return ids, rows


def _wandb_run_records(run: Path, run_id: str, kind: str = "run") -> list:
    """The `kind` records of one W&B run's offline files (`run`: one per launch that opened it; `exit`: one per launch
    that ended it)."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for path in sorted(run.glob(f"wandb/offline-run-*/run-{run_id}.wandb")):
        for raw in _wandb_records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == kind:
                records.append(record)
    return records


def _until(condition, deadline: float) -> None:
    """Poll `condition` until it holds or time.monotonic() reaches `deadline` (the asserts after it say which)."""
    import time

    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)


def _jsonl_rows(run: Path) -> dict[tuple[int, str], float]:
    rows = {}
    for line in RunDir(run).metrics.read_text().splitlines():
        row = json.loads(line)
        step, split = row.pop("step"), row.pop("split")
        rows.update({(step, f"{split}/{k}"): v for k, v in row.items()})
    return rows


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-6, abs_tol=1e-9) for k in a)


def test_wandb_offline_and_mlflow_hold_the_metrics_rows_and_a_resume_continues_them(prepared, tmp_path):
    import mlflow

    run = tmp_path / "run"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={run}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=6",
            "train.save_every=3", "train.log_every=1", "train.eval_every=3", "train.eval_batches=2",
            "train.report_to=[tensorboard,wandb,mlflow]"]
    with restored_environ():
        os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "tests",
                           "MLFLOW_EXPERIMENT_NAME": "tests"})
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        first = run_cli("pretrain", [*args, "train.stop_after=3"])
        ids = json.loads((run / "trackers.json").read_text())
        second = run_cli("pretrain", args)
    assert "stopping after 3 steps" in first.stdout and "resumed from" in second.stdout
    assert json.loads((run / "trackers.json").read_text()) == ids  # the same tracked runs, not new ones

    expected = _jsonl_rows(run)
    assert {step for step, _ in expected} == set(range(1, 7)) and (3, "validation/mlm_loss") in expected

    wandb_ids, wandb_rows = _wandb_rows(run)
    assert wandb_ids == {ids["wandb"]} and len(list(run.glob("wandb/offline-run-*"))) == 2
    assert _close(wandb_rows, expected)

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [ids["mlflow"]]
    mlflow_rows = {(m.step, key): m.value for key in runs[0].data.metrics
                   for m in client.get_metric_history(ids["mlflow"], key)}
    assert _close(mlflow_rows, expected)
    assert len(mlflow_rows) == sum(len(client.get_metric_history(ids["mlflow"], k)) for k in runs[0].data.metrics)
    params = runs[0].data.params
    assert params["train.max_steps"] == "6" and params["objective.name"] == "mlm"
    assert runs[0].info.status == "FINISHED"

    # A branch from step 3 at another learning rate (what the README advises after a divergence) redoes steps 4-6
    # with other values: its rows go to tracked runs of its own, named for the branch, and the first runs keep theirs.
    with restored_environ():
        os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "tests",
                           "MLFLOW_EXPERIMENT_NAME": "tests"})
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        # Stopped after its first step (and saved), then requeued: the requeue goes on in the branch's runs.
        branch = run_cli("pretrain", [*args, "train.resume_from=3", "optimizer.lr=1e-4", "train.stop_after=1"])
        branch_ids = json.loads((run / "trackers.json").read_text())
        requeued = run_cli("pretrain", [*args, "train.resume_from=3", "optimizer.lr=1e-4"])
    assert "branching from step_00000003" in branch.stdout, branch.stdout[-3000:]
    assert "resumed from" in requeued.stdout and "at step 4" in requeued.stdout, requeued.stdout[-3000:]
    assert json.loads((run / "trackers.json").read_text()) == branch_ids
    assert branch_ids["name"] == "run (branch from step_00000003)" and ids["name"] == "run"
    assert all(branch_ids[k] != ids[k] for k in ("wandb", "mlflow")), (branch_ids, ids)
    rewound = _jsonl_rows(run)
    assert rewound[(4, "train/lr")] != expected[(4, "train/lr")]  # the branch's own values
    branched = {key: value for key, value in rewound.items() if key[0] > 3}
    _, wandb_rows = _wandb_rows(run, branch_ids["wandb"])
    assert _close(wandb_rows, branched)
    names = {r.run.display_name for r in _wandb_run_records(run, branch_ids["wandb"])}
    assert names == {"run (branch from step_00000003)"}, names  # the requeue kept the branch's name
    assert _close(_wandb_rows(run, ids["wandb"])[1], expected)  # the first run as it was
    named = {r.info.run_name: r.info.run_id for r in client.search_runs([experiment.experiment_id])}
    assert named == {"run": ids["mlflow"], "run (branch from step_00000003)": branch_ids["mlflow"]}, named
    branch_run = client.get_run(branch_ids["mlflow"])
    assert _close({(m.step, key): m.value for key in branch_run.data.metrics
                   for m in client.get_metric_history(branch_ids["mlflow"], key)}, branched)


def _wandb_exit_codes(run: Path, run_id: str) -> list[int]:
    """The exit codes W&B recorded for one run, one per launch that ended it, from its offline files."""
    return [record.exit.exit_code for record in _wandb_run_records(run, run_id, "exit")]


# Rank 0 of a run whose ranks all diverge: the others have nothing to end and exit at once, and their launcher (srun,
# torchrun) then terminates rank 0 while it ends its tracked runs.
TERMINATED_WHILE_CLOSING = """
import os, signal
from pretrain.observe import trackers
close = trackers.Trackers.close
def terminated_while_closing(self, exit_code=0):
    os.kill(os.getpid(), signal.SIGTERM)
    close(self, exit_code)
trackers.Trackers.close = terminated_while_closing
"""


def _pretrain_after(prelude: str, path: Path) -> str:
    """A script at `path` that runs `prelude`, then `python -m pretrain` with the script's arguments; its path."""
    path.write_text(prelude + '\nimport runpy, sys\nsys.argv = ["pretrain", *sys.argv[1:]]\n'
                    'runpy.run_module("pretrain", run_name="__main__")\n')
    return str(path)


def test_a_run_that_diverges_sends_its_last_rows_and_ends_its_tracked_runs_as_failed(prepared, tmp_path):
    """A run that ends on an error (here a divergence, exit 4) ends its tracked runs as failed, after the rows that
    waited: the diverged step's row is what a user looks for. Before, the process left without closing them: the
    last rows died with the sender thread, MLflow's run stayed RUNNING, and W&B's ended with exit code 0. The rank's
    failure is recorded before that end: a SIGTERM then (its launcher's, once the other ranks exited) does not turn
    it into a terminated rank (exit 143, no error line)."""
    import mlflow

    run, status = tmp_path / "run", tmp_path / "status"
    script = _pretrain_after(TERMINATED_WHILE_CLOSING, tmp_path / "terminated_while_closing.py")
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={run}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=6",
            "train.eval_every=0", "train.log_every=1", "optimizer.lr=1e30", "train.report_to=[wandb,mlflow]"]
    with restored_environ():
        os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "tests",
                           "MLFLOW_EXPERIMENT_NAME": "tests", "PRETRAIN_STATUS_DIR": str(status)})
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        proc = run_cli(script, args, check=False)
    assert proc.returncode == 4 and "error: training diverged at step" in proc.stderr, proc.stderr[-3000:]
    assert "terminated" not in proc.stderr, proc.stderr[-3000:]
    record = json.loads((status / "rank0.json").read_text())
    assert (record["status"], record["error"], record["code"]) == ("failed", "DivergedError", 4), record
    expected = _jsonl_rows(run)
    last = max(step for step, _ in expected)
    assert math.isnan(expected[(last, "train/loss")])
    ids = json.loads((run / "trackers.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    history = client.get_metric_history(ids["mlflow"], "train/loss")
    assert [m.step for m in history] == list(range(1, last + 1)) and math.isnan(history[-1].value), history
    assert client.get_run(ids["mlflow"]).info.status == "FAILED"
    _, wandb_rows = _wandb_rows(run, ids["wandb"])
    assert wandb_rows.keys() == expected.keys() and math.isnan(wandb_rows[(last, "train/loss")])
    assert _wandb_exit_codes(run, ids["wandb"]) == [4]


def test_the_trackers_end_first_and_as_failed_where_the_run_folder_s_disk_is_full(tmp_path, monkeypatch):
    """The run stopped on a full disk: TensorBoard's flush fails there too. The tracked runs, on no disk of the run's,
    are ended first (as failed, every row sent), and the files are closed all the same; before, the flush's error
    skipped the trackers, and a second close met it again."""
    import errno

    import mlflow

    from pretrain.observe.logger import RunLogger

    run = RunDir(tmp_path / "run")
    with restored_environ():
        os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("tensorboard", "mlflow"), config={"seed": 1})
        log.rewind(0)
        for step in (1, 2, 3):
            log.scalars(step, {"loss": float(step)}, "train")

        def full(*_args) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(log._writer, "flush", full)
        with pytest.raises(OSError, match="No space left"):
            log.close(2)
        log.close(2)  # once: the files are closed
    assert log._text.closed and log._jsonl.closed
    run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FAILED"


@pytest.mark.parametrize("redone", [False, True], ids=["before its first row", "in the steps it redoes"])
def test_a_requeue_that_fails_before_sending_a_row_still_ends_its_tracked_run_as_failed(tmp_path, redone):
    """A continued run opens with its first row sent; a launch that fails before one (in its first steps, or in the
    steps it redoes after a lost node, which are not sent again) opens it at the end to say it failed, rather than
    leave the last attempt's status on it (RUNNING, after a lost node)."""
    import mlflow

    from pretrain.observe.logger import RunLogger

    run = RunDir(tmp_path / "run")
    with restored_environ():
        _first_attempt_logs_two_rows(run)
        run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
        client.update_run(run_id, status="RUNNING")  # as a lost attempt leaves it
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(1 if redone else 2)
        if redone:
            log.scalars(2, {"loss": 2.5}, "train")  # sent by the lost attempt: not sent again
        log.close(1)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == [(1, 1.0), (2, 2.0)]
    assert client.get_run(run_id).info.status == "FAILED"
    assert "warning" not in run.text_log.read_text()


def test_steps_a_lost_attempt_sent_are_not_sent_again_by_the_resume(prepared, tmp_path):
    """An attempt sent steps 4 and 5 after its checkpoint of step 3 and was lost before it saved again (its step-5
    checkpoint removed here: a node lost mid-save leaves none). The resume redoes steps 4 and 5: MLflow's run, the same
    one, holds each step's loss once (MLflow keeps every value sent)."""
    import mlflow

    run = tmp_path / "run"
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={run}",
            *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=5",
            "train.save_every=3", "train.log_every=1", "train.eval_every=0", "train.report_to=[mlflow]"]
    with restored_environ():
        os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        run_cli("pretrain", args)
        ids = json.loads((run / "trackers.json").read_text())
        shutil.rmtree(RunDir(run).checkpoints / "step_00000005")
        resumed = run_cli("pretrain", [*args, "train.max_steps=6"])
    assert "resumed from" in resumed.stdout and "at step 3" in resumed.stdout, resumed.stdout[-3000:]
    assert json.loads((run / "trackers.json").read_text()) == ids
    history = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}").get_metric_history(ids["mlflow"],
                                                                                                 "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]
    assert [row["step"] for row in RunDir(run).metric_rows("train")] == [1, 2, 3, 4, 5, 6]  # the log, rewound too


def test_a_row_logged_before_the_rewind_does_not_resend_the_redone_steps(tmp_path):
    """A resume that sets a damaged checkpoint aside logs its row before the rewind says what the earlier attempt
    sent: the continued run still gets each step once (MLflow would keep both values), and that row goes after the
    rewind, at the step after the last the run got (W&B takes only rising steps: at the restored step it was dropped)."""
    import mlflow

    from pretrain.observe.logger import RunLogger
    from pretrain.observe.trackers import Trackers

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    with restored_environ():
        os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        first = Trackers(run, ["mlflow"], {"seed": 1})
        first.open()
        for step in (1, 2, 3, 4):
            first.log(step, {"loss": float(step)}, "train")
        first.close()
        for step in (1, 2, 3, 4):  # metrics.jsonl, as the first attempt's logger wrote it: the rewind reads it
            with run.metrics.open("a") as fh:
                fh.write(json.dumps({"step": step, "split": "train", "loss": float(step)}) + "\n")
        again = RunLogger(run, 10, True, report_to=("mlflow",), config={"seed": 1})
        again.scalars(2, {"damaged_checkpoint_step": 4.0}, "resume", before_rewind=True)  # the restore's row
        again.rewind(2)
        for step in (3, 4, 5):
            again.scalars(step, {"loss": 10.0 + step}, "train")
        again.close()
    run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "resume/damaged_checkpoint_step")] == [(5, 4.0)]
    assert {"step": 2, "split": "resume", "damaged_checkpoint_step": 4.0} in run.metric_rows()  # the log keeps its step
    # trackers.json damaged (by hand, or by the disk): one line naming it, not a JSONDecodeError's traceback.
    from core.errors import InputDataError

    for damaged in ('{"mlflow": "' + run_id[:5], "[]\n"):  # cut short; JSON, but not the object of ids
        run.tracker_ids.write_text(damaged)
        with restored_environ(), pytest.raises(InputDataError, match=r"trackers.json' is damaged .* remove it to start"):
            os.environ.pop("MLFLOW_TRACKING_URI", None)
            Trackers(run, ["mlflow"], {"seed": 1}).open()


def test_a_run_with_no_tracker_keeps_its_plain_logs(prepared, tmp_path):
    """train.report_to=[] into a new folder: no TensorBoard files, and the text log and metrics.jsonl still hold the run
    (the logger makes the folder: the run files are written only when training starts)."""
    run = RunDir(tmp_path / "run")
    run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                         f"train.output_dir={run.root}", *TINY_MODEL, "train.micro_batch_size=4",
                         "train.global_batch_size=8", "train.max_steps=2", "train.log_every=1", "train.eval_every=0",
                         "train.save_every=2", "train.report_to=[]"])
    assert not run.tensorboard.exists()
    assert [row["step"] for row in run.metric_rows("train")] == [1, 2]
    assert "finished at step 2" in run.text_log.read_text()


def test_an_unknown_tracker_is_a_config_error(prepared, tmp_path):
    proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                                f"train.output_dir={tmp_path / 'run'}", "train.report_to=[tensorboard,comet]"], check=False)
    assert proc.returncode == 2 and "train.report_to" in proc.stderr and "comet" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend, env, named", [
    ("wandb", {"WANDB_MODE": "online"}, "No API key configured"),  # a batch job on a node never logged in
    # Refused by MLflow 3, after W&B (offline) opened its run: that run is ended as failed, not left behind.
    ("mlflow", {"MLFLOW_TRACKING_URI": "file:{tmp}/mlruns", "WANDB_MODE": "offline"}, "filesystem tracking backend"),
])
def test_a_tracker_that_cannot_open_its_run_is_one_line(prepared, tmp_path, backend, env, named):
    """The tracker's service or settings refuse the run: one line naming the tracker, its library's reason and what to
    set, exit 2; not a traceback of the library's."""
    with restored_environ():
        for key in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
            os.environ.pop(key, None)
        os.environ.update({"HOME": str(tmp_path), "WANDB_SILENT": "true",  # no ~/.netrc with a key
                           **{k: v.format(tmp=tmp_path) for k, v in env.items()}})
        proc = run_cli("pretrain", ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                                    f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.micro_batch_size=4",
                                    "train.global_batch_size=8", "train.max_steps=2",
                                    f"train.report_to=[tensorboard,{'wandb,' if backend == 'mlflow' else ''}{backend}]"],
                       check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and f"train.report_to has {backend}, but it could not open its run" in errors[0], errors
    assert named in errors[0] and ("WANDB_API_KEY" if backend == "wandb" else "MLFLOW_TRACKING_URI") in errors[0]
    if backend == "mlflow":
        assert _wandb_exit_codes(tmp_path / "run", "*") == [2]
        assert not (tmp_path / "run" / "trackers.json").exists()


def test_a_tracker_whose_library_is_missing_is_refused_on_every_rank_before_the_model_is_built(prepared, tmp_path):
    """MLflow's SQL store not installed where the job runs (`pip install mlflow-skinny` alone): every rank says so in
    one line and exits 2 before it builds the model. Before, only rank 0 learnt it, after the model and DeepSpeed were
    built, and rank 1 waited for it for minutes."""
    script = _pretrain_after("import sys\nsys.modules['sqlalchemy'] = None  # what a missing package looks like",
                             tmp_path / "without_sqlalchemy.py")
    proc = run_cli(script, ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
                                 f"train.output_dir={tmp_path / 'run'}", *TINY_MODEL, "train.micro_batch_size=4",
                                 "train.global_batch_size=8", "train.max_steps=1", "train.report_to=[mlflow]"],
                   nproc=2, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "peer lost" not in proc.stderr, proc.stderr[-3000:]
    assert errors == ["error: train.report_to has mlflow, but its library is not installed (no module named 'sqlalchemy'); "
                      "pip install mlflow-skinny sqlalchemy alembic"] * 2, errors
    assert "ZeRO stage" not in proc.stdout and "parameters" not in proc.stdout, proc.stdout[-3000:]


def test_deepspeed_starts_without_mlflow_and_mlflow_still_imports():
    """DeepSpeed's autotuner imports MLflow when it can (0.8 s of every rank's start-up); the trainer imports DeepSpeed
    without it, and train.report_to=mlflow imports it afterwards as usual (the test above trains with it)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from core.distributed import import_deepspeed\n"
            "import_deepspeed()\n"
            "assert 'deepspeed' in sys.modules and 'mlflow' not in sys.modules, sorted(sys.modules)\n"
            "from deepspeed.autotuning import autotuner\n"
            "assert autotuner.has_mlflow is False\n"
            "import mlflow\n"
            "print('mlflow', mlflow.__version__)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("mlflow "), proc.stderr[-3000:]


def test_a_tracker_whose_store_fails_mid_run_stalls_no_step_and_catches_up(tmp_path, capfd):
    """MLflow's SQLite store locked by another process mid-run (MLflow then waits 20 s and raises): logging a row
    returns at once, the run's log says that sending stopped and that it went on, and once the lock is gone every row
    reaches the run once, in order. Before, the step waited 20 s and MLflow's error ended the run. MLflow's own
    traceback for each failed try is not printed beside the log's one line: it read as a crash."""
    import sqlite3
    import time

    import mlflow

    from pretrain.observe.logger import RunLogger

    run = RunDir(tmp_path / "run")
    with restored_environ():
        os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        log = RunLogger(run, max_steps=6, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(0)
        log.scalars(1, {"loss": 1.0}, "train")
        sender = log.trackers.senders["mlflow"]
        deadline = time.monotonic() + 60
        _until(lambda: not sender.waiting(), deadline)
        lock = sqlite3.connect(run.mlflow_db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        took = []
        for step in (2, 3, 4):
            start = time.monotonic()
            log.scalars(step, {"loss": float(step)}, "train")
            took.append(time.monotonic() - start)
        _until(sender.failing, deadline)
        log.scalars(5, {"loss": 5.0}, "validation")  # a row that waits behind the failed ones
        released = time.time()
        lock.execute("COMMIT")
        lock.close()
        _until(lambda: not sender.waiting(), deadline)
        log.scalars(6, {"loss": 6.0}, "train")
        log.close()
    assert max(took) < 2.0, took  # MLflow's lock wait is 20 s
    printed = "".join(capfd.readouterr())
    assert "SQLAlchemy database error" not in printed and "Traceback" not in printed, printed[-3000:]
    import logging

    for name in ("mlflow.store.db.utils", "urllib3.connectionpool"):  # the same loggers speak for other work too
        assert logging.getLogger(name).filter(logging.makeLogRecord({"threadName": "MainThread"}))
    text = run.text_log.read_text()
    assert "warning: mlflow: could not send step 2 (" in text and "database is locked" in text, text
    # 1 failed try, or more where this process was slow to release the lock within the 1 s backoff.
    assert re.search(r"warning: mlflow: sending again after \d+ failed tr(y|ies) \(3 row\(s\) waiting\)", text), text
    run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == \
        [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (6, 6.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "validation/loss")] == [(5, 5.0)]
    assert client.get_run(run_id).info.status == "FINISHED"
    # Sent once the lock was gone, but stamped when they were logged: the charts' time axis keeps the outage.
    late = [m.timestamp for m in client.get_metric_history(run_id, "train/loss") if m.step in (2, 3, 4)]
    assert len(late) == 3 and max(late) < released * 1000, (late, released)


def test_a_row_sent_again_after_a_lost_answer_is_one_point(tmp_path):
    """A batch MLflow's server stored but whose answer was lost (a timeout, a 504) is sent again: stamped when it was
    logged, not when sent, it is the same point, which MLflow keeps once; before, it became a second point."""
    import mlflow

    from pretrain.observe.trackers import LOGGED_AT, MlflowTracker

    run = RunDir(tmp_path / "run")
    with restored_environ():
        os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        tracker = MlflowTracker(run, {"seed": 1}, None, "run")
        row = {"train/loss": 2.5, LOGGED_AT: 1_700_000_000.25}
        tracker.log(7, row)
        tracker.log(7, row)
        tracker.close()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
    assert [(m.step, m.value, m.timestamp) for m in client.get_metric_history(tracker.run_id, "train/loss")] == \
        [(7, 2.5, 1_700_000_000_250)]
    assert LOGGED_AT not in client.get_run(tracker.run_id).data.metrics


def _first_attempt_logs_two_rows(run: RunDir) -> None:
    """An attempt that opens a tracked MLflow run in the run folder's store, logs steps 1 and 2 and ends (the caller
    restores the environment)."""
    from pretrain.observe.logger import RunLogger

    os.environ["MLFLOW_EXPERIMENT_NAME"] = "tests"
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    first = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
    first.rewind(0)
    for step in (1, 2):
        first.scalars(step, {"loss": float(step)}, "train")
    first.close()


def _assert_the_run_holds_steps_1_to_4_once(run: RunDir, store: Path) -> None:
    """The MLflow run trackers.json names, in the store in `store`, holds train/loss at steps 1-4 once each and ended."""
    import mlflow

    run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == \
        [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_requeue_whose_tracker_store_is_down_trains_on_and_sends_once_the_store_is_back(tmp_path):
    """At a requeue the tracked run's store cannot be reached (here MLflow's SQLite file, its folder gone and a file in
    its place): the launch goes on training instead of ending the job with exit 2 (which the sbatch does not
    requeue), the log says so, and once the store is back the run it continues gets the rows, each once."""
    import time

    from pretrain.observe.logger import RunLogger

    run, store, away = RunDir(tmp_path / "run"), tmp_path / "store", tmp_path / "away"
    with restored_environ():
        _first_attempt_logs_two_rows(run)
        away.mkdir()
        shutil.copy(run.mlflow_db, away / "mlflow.db")  # the store the requeue is pointed at, while it is away
        store.write_text("the store's folder is not there\n")
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(2)
        log.scalars(3, {"loss": 3.0}, "train")
        sender, deadline = log.trackers.senders["mlflow"], time.monotonic() + 60
        _until(sender.failing, deadline)
        store.unlink()
        away.rename(store)
        _until(lambda: not sender.waiting(), deadline)
        log.scalars(4, {"loss": 4.0}, "train")
        log.close()
    text = run.text_log.read_text()
    assert "warning: mlflow: could not send step 3 (its tracked run did not open: " in text, text
    assert "training goes on" in text and "warning: mlflow: sending again after" in text, text
    _assert_the_run_holds_steps_1_to_4_once(run, store)


def test_a_requeue_whose_tracker_store_is_locked_trains_on_and_sends_once_it_is_free(tmp_path):
    """At a requeue MLflow's SQLite store is locked by another process (a store several jobs share): opening it raises
    SQLAlchemy's error, not MLflow's, which ended the job with a traceback (exit 1, not requeued). The launch goes on,
    the log names the lock, and once it is released the run it continues gets the rows, each once."""
    import sqlite3
    import time

    from pretrain.observe.logger import RunLogger
    from pretrain.observe.trackers import PendingTracker

    run, store = RunDir(tmp_path / "run"), tmp_path / "store"
    with restored_environ():
        _first_attempt_logs_two_rows(run)
        store.mkdir()
        shutil.copy(run.mlflow_db, store / "mlflow.db")  # a URI this process has not opened (MLflow caches stores)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
        lock = sqlite3.connect(store / "mlflow.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(2)
        assert [type(t) for t in log.trackers.items] == [PendingTracker]
        log.scalars(3, {"loss": 3.0}, "train")
        sender, deadline = log.trackers.senders["mlflow"], time.monotonic() + 90
        _until(sender.failing, deadline)
        lock.execute("COMMIT")
        lock.close()
        _until(lambda: not sender.waiting(), deadline)
        log.scalars(4, {"loss": 4.0}, "train")
        log.close()
    text = run.text_log.read_text()
    assert "warning: mlflow: could not send step 3 (its tracked run did not open: " in text, text
    assert "database is locked" in text, text
    _assert_the_run_holds_steps_1_to_4_once(run, store)


def test_a_requeue_whose_tracked_run_was_deleted_says_what_to_do_once_and_stops_trying(tmp_path, monkeypatch):
    """The MLflow run the job continues was deleted by a user between two launches: no try will open it, so the log
    says so once, with what to do, and the sender stops. Before, it read as an outage: it tried every minute for the
    whole job and never said why nothing arrived."""
    import time

    import mlflow

    from pretrain.observe import trackers
    from pretrain.observe.logger import RunLogger

    opens = []

    class Counted(trackers.MlflowTracker):
        def __init__(self, *args) -> None:
            opens.append(time.monotonic())
            super().__init__(*args)

    run = RunDir(tmp_path / "run")
    with restored_environ():
        _first_attempt_logs_two_rows(run)
        run_id = json.loads(run.tracker_ids.read_text())["mlflow"]
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run.mlflow_db}")
        client.delete_run(run_id)
        monkeypatch.setitem(trackers.BACKENDS, "mlflow", Counted)
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(2)
        log.scalars(3, {"loss": 3.0}, "train")
        sender, deadline = log.trackers.senders["mlflow"], time.monotonic() + 60
        _until(lambda: not sender.waiting(), deadline)
        log.scalars(4, {"loss": 4.0}, "train")
        log.close()
    lines = [line for line in run.text_log.read_text().splitlines() if "mlflow" in line]
    assert len(lines) == 1 and "will not send step 3 or any later row (its tracked run did not open: " in lines[0], lines
    assert f"The run {run_id} must be in the 'active' state" in lines[0] and "mlflow runs restore" in lines[0], lines
    assert len(opens) == 1, opens
    client.restore_run(run_id)
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2]


def test_a_requeue_opens_its_tracked_run_off_the_training_path(tmp_path, monkeypatch):
    """At a requeue the tracked run is opened from its tracker's thread: the launch does not wait for it. A library
    that retries a server for many minutes (MLflow over HTTP: 7 tries, 120 s each) held rank 0 before its first step,
    past the other ranks' train.init_timeout_s, which ended the attempt as a crash; every requeue did the same."""
    import threading
    import time

    from pretrain.observe import trackers
    from pretrain.observe.logger import RunLogger

    answer = threading.Event()

    class SlowToOpen(trackers.MlflowTracker):
        def __init__(self, *args) -> None:
            answer.wait(30)  # the service's answer, once the test has timed the launch
            super().__init__(*args)

    run = RunDir(tmp_path / "run")
    with restored_environ():
        _first_attempt_logs_two_rows(run)
        monkeypatch.setitem(trackers.BACKENDS, "mlflow", SlowToOpen)
        start = time.monotonic()
        log = RunLogger(run, max_steps=4, enabled=True, report_to=("mlflow",), config={"seed": 1})
        log.rewind(2)
        log.scalars(3, {"loss": 3.0}, "train")
        took = time.monotonic() - start
        answer.set()
        log.scalars(4, {"loss": 4.0}, "train")
        log.close()
    assert took < 10, took  # the open waits 30 s where the launch makes it
    assert "warning" not in run.text_log.read_text()
    _assert_the_run_holds_steps_1_to_4_once(run, run.root)


def test_a_first_launch_whose_tracker_service_does_not_answer_is_refused_in_time(tmp_path, monkeypatch):
    """A first launch whose tracking service does not answer (a host that drops packets: MLflow's client retries it for
    about 20 minutes) is refused in one line once the wait for the run is up, not after the other ranks' timeouts
    ended the attempt as a crash, which each requeue repeated."""
    import threading
    import time

    from pretrain.observe import trackers

    answer = threading.Event()

    class NoAnswer(trackers.MlflowTracker):
        def __init__(self, *args) -> None:
            answer.wait(30)
            raise ConnectionError("no answer")

    monkeypatch.setitem(trackers.BACKENDS, "mlflow", NoAnswer)
    monkeypatch.setattr(trackers, "FIRST_OPEN_S", 0.5)
    start = time.monotonic()
    with pytest.raises(SetupError, match=r"train.report_to has mlflow, but its service did not open the run within "
                                         r"0.5 s \(its library may still be retrying\); check MLFLOW_TRACKING_URI"):
        trackers.Trackers(RunDir(tmp_path / "run"), ["mlflow"], {"seed": 1}).open()
    took = time.monotonic() - start
    answer.set()
    assert took < 10, took
    assert not RunDir(tmp_path / "run").tracker_ids.exists()


def test_a_tracker_refused_beside_one_a_requeue_continues_leaves_that_run_alone(tmp_path, monkeypatch):
    """MLflow added to report_to at a requeue (trackers.json names the W&B run only), with a URI MLflow refuses: one
    line, exit 2, and the continued W&B run is neither opened nor ended by the refused launch (its next launch goes on
    in it). Before, the refusal opened it, on the main thread, to end it as failed."""
    from pretrain.observe import trackers

    opened = []

    class Counted(trackers.WandbTracker):
        def __init__(self, *args) -> None:
            opened.append(args)

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.tracker_ids.write_text(json.dumps({"name": "run", "wandb": "abc12345"}) + "\n")
    monkeypatch.setitem(trackers.BACKENDS, "wandb", Counted)
    with restored_environ():
        os.environ["MLFLOW_TRACKING_URI"] = f"file:{tmp_path}/mlruns"
        with pytest.raises(SetupError, match="train.report_to has mlflow, but it could not open its run"):
            trackers.Trackers(run, ["wandb", "mlflow"], {"seed": 1}).open()
    assert opened == []
    assert json.loads(run.tracker_ids.read_text()) == {"name": "run", "wandb": "abc12345"}


def test_a_first_launch_whose_tracker_store_cannot_be_made_is_one_line(tmp_path):
    """No earlier attempt opened the run, so the settings are suspect: a store path MLflow cannot create (a file where
    its folder would be) is refused in one line naming the tracker, as a refused URI is; it was an OSError traceback."""
    from pretrain.observe.trackers import Trackers

    (tmp_path / "store").write_text("a file\n")
    with restored_environ():
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
        trackers = Trackers(RunDir(tmp_path / "run"), ["mlflow"], {"seed": 1})
        with pytest.raises(SetupError, match=r"train.report_to has mlflow, but it could not open its run \(.*store"):
            trackers.open()
