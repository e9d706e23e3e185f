"""Checkpoints record every file's size and hash; a damaged newest one is named and skipped for the newest intact one."""
import json
from pathlib import Path

import torch
from conftest import TINY_MODEL, run_cli
from pretrain.run_dir import RunDir

MODEL_FILE = "mp_rank_00_model_states.pt"


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=9", "train.save_every=3",
            "train.keep_last=5", "train.eval_every=0", "train.log_every=3", *extra]


def _weights(run: Path, tag: str) -> dict[str, torch.Tensor]:
    return torch.load(RunDir(run).checkpoints / tag / MODEL_FILE, map_location="cpu", weights_only=False)["module"]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # what a full disk or a cut copy leaves, under a COMPLETE marker


def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_ends_as_if_resumed_from_the_intact_one(prepared, tmp_path):
    run, reference = tmp_path / "run", tmp_path / "reference"
    for out in (run, reference):
        run_cli("pretrain", _args(prepared, out, "train.stop_after=6"))  # checkpoints at steps 3 and 6
    tag = RunDir(run).checkpoints / "step_00000006"
    files = json.loads((tag / "COMPLETE").read_text())["files"]  # the marker records every file's size and hash
    on_disk = {str(p.relative_to(tag)) for p in tag.rglob("*") if p.is_file() and p.name != "COMPLETE"}
    assert set(files) == on_disk and MODEL_FILE in files
    assert all(size == (tag / name).stat().st_size for name, (size, _) in files.items())
    _truncate(tag / MODEL_FILE)

    resumed = run_cli("pretrain", _args(prepared, run))
    assert f"step_00000006 is damaged ({MODEL_FILE} has" in resumed.stdout, resumed.stdout[-3000:]
    assert "resumed from" in resumed.stdout and "at step 3" in resumed.stdout
    assert (RunDir(run).checkpoints / "step_00000006.damaged" / MODEL_FILE).is_file()  # set aside, not deleted
    rows = RunDir(run).metric_rows()
    assert {"step": 3, "split": "resume", "damaged_checkpoint_step": 6.0} in rows
    # The reference resumes from step 3 by hand (train.resume_from) although its step 6 is intact.
    by_hand = run_cli("pretrain", _args(prepared, reference, "train.resume_from=3"))
    assert "at step 3" in by_hand.stdout
    a, b = _weights(run, "step_00000009"), _weights(reference, "step_00000009")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_no_intact_checkpoint_is_a_one_line_error(prepared, tmp_path):
    run = tmp_path / "run"
    run_cli("pretrain", _args(prepared, run, "train.stop_after=3"))
    _truncate(RunDir(run).checkpoints / "step_00000003" / MODEL_FILE)
    proc = run_cli("pretrain", _args(prepared, run), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "every checkpoint" in errors[0] and "step_00000003" in errors[0] and MODEL_FILE in errors[0]
    assert "Traceback" not in proc.stderr
    missing = run_cli("pretrain", _args(prepared, tmp_path / "other", "train.resume_from=step_00000042"), check=False)
    assert missing.returncode == 2 and "train.resume_from=step_00000042" in missing.stderr


def test_a_save_the_disk_has_no_room_for_stops_in_one_line_and_the_next_launch_goes_on(prepared, tmp_path):
    """A full disk, a quota or a file size limit (emulated by RLIMIT_FSIZE: torch's writer then reports only an
    "iostream error") stops the run with exit 2 and one line naming the checkpoint, which does not count; the
    FAILED marker says why; once there is room, the same command trains again."""
    from conftest import run_python

    from pretrain.checkpointing.checkpoint_dir import COMPLETE

    out = tmp_path / "run"
    wider = ["model.hidden_size=64", "model.intermediate_size=128"]  # an optimizer file of about 1 MB
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={out}",
            *TINY_MODEL, *wider, "train.micro_batch_size=4", "train.global_batch_size=8", "train.eval_every=0",
            "train.save_every=2", "train.max_steps=4"]
    limited = run_python(["tests/helpers/file_size_limit.py", "600000", "pretrain", *args])
    assert limited.returncode == 2 and "Traceback" not in limited.stderr, limited.stderr[-3000:]
    (line,) = [line for line in limited.stderr.splitlines() if line.startswith("error:")]
    assert f"checkpoint step_00000002 could not be written in {RunDir(out).checkpoints}: File too large" in line
    assert "the newest complete checkpoint is none" in line
    assert not (RunDir(out).checkpoints / "step_00000002" / COMPLETE).exists()
    assert json.loads((out / "FAILED").read_text())["error"] == "NoSpaceError"
    # Any other write refused so (here the tokenizer's copy into the run folder) is one line too.
    other = run_python(["tests/helpers/file_size_limit.py", "250000", "pretrain",
                        *[a.replace(str(out), str(tmp_path / "other")) for a in args]])
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert "error: a write was refused: File too large (" in other.stderr and "tokenizer.json" in other.stderr
    again = run_cli("pretrain", args)
    assert "finished at step 4" in again.stdout
    assert sorted(p.name for p in RunDir(out).checkpoints.glob("step_*")) == ["step_00000002", "step_00000004"]
    assert all((RunDir(out).checkpoints / tag / COMPLETE).is_file() for tag in ("step_00000002", "step_00000004"))
