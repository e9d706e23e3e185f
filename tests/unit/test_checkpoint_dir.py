"""What a save leaves in `checkpoints/`: the newest complete tags, and nothing a killed save, conversion or download
left behind (each of those holds up to a checkpoint's size, on a disk a month-long run fills)."""
from pathlib import Path

from pretrain.checkpointing.checkpoint_dir import COMPLETE, LATEST, CheckpointDir
from pretrain.run_dir import RunDir


def _tag(root, name: str, complete: bool = True) -> None:
    (root / name).mkdir()
    (root / name / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    if complete:
        (root / name / COMPLETE).write_text("{}\n")


def test_a_save_keeps_the_newest_tags_and_removes_what_killed_work_left(tmp_path):
    root = RunDir(tmp_path).checkpoints
    root.mkdir()
    for step in (10, 20, 30, 40):
        _tag(root, f"step_{step:08d}")
    _tag(root, "step_00000035", complete=False)  # a save killed midway
    _tag(root, ".step_00000020_universal.tmp", complete=False)  # a conversion killed midway
    _tag(root, "step_00000030_universal")  # converted, then killed while the engine loaded it
    _tag(root, ".step_00000040.download", complete=False)  # a download from the bucket killed midway
    (root / "latest_universal").write_text(".step_00000020_universal.tmp")  # ds_to_universal's pointer
    (root / LATEST).write_text("step_00000040")
    _tag(root, "aside-after-step_00000010-20261130T120000")  # train.resume_from set these aside: the user's
    _tag(root, "step_00000040.damaged")  # set aside by a resume, for the user to look at
    (root / "notes.txt").write_text("mine")

    CheckpointDir(root).remove_stale("step_00000040", keep_last=2)

    assert sorted(p.name for p in root.iterdir()) == sorted([
        LATEST, "aside-after-step_00000010-20261130T120000", "notes.txt", "step_00000030", "step_00000040",
        "step_00000040.damaged"])
    assert (root / "step_00000040" / COMPLETE).is_file()


def test_a_save_does_not_take_a_newer_unmarked_tag_for_debris(tmp_path):
    """Another writer's tag past the one just saved (a branch's) is not this save's to judge."""
    root = RunDir(tmp_path).checkpoints
    root.mkdir()
    _tag(root, "step_00000010")
    _tag(root, "step_00000050", complete=False)
    CheckpointDir(root).remove_stale("step_00000010", keep_last=3)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000010", "step_00000050"]


def test_a_file_that_cannot_be_read_is_damage_and_the_older_tag_is_taken(tmp_path):
    """A read that fails (EIO: /proc/self/mem at offset 0 is unmapped) makes the tag damaged, as a changed byte does:
    the older intact tag is the one resumed or exported, not a traceback."""
    import json
    import os

    from pretrain.checkpointing.checkpoint_dir import file_manifest

    root = tmp_path / "tags"
    root.mkdir()
    for name in ("step_00000010", "step_00000020"):
        _tag(root, name, complete=False)
        (root / name / COMPLETE).write_text(json.dumps({"files": file_manifest(root / name)}))
    newest = root / "step_00000020" / "mp_rank_00_model_states.pt"
    newest.unlink()
    os.symlink("/proc/self/mem", newest)  # a regular file of 0 bytes whose read fails
    marker = root / "step_00000020" / COMPLETE
    marker.write_text(json.dumps({"files": {"mp_rank_00_model_states.pt": [0, "0" * 16]}}))
    folder = CheckpointDir(root)
    assert folder.damage("step_00000020") == "mp_rank_00_model_states.pt cannot be read (Input/output error)"
    assert folder.damage("step_00000010") is None
    assert folder.newest_intact() == ("step_00000010", [("step_00000020", folder.damage("step_00000020"))])


def test_the_latest_pointer_follows_tags_moved_aside(tmp_path, monkeypatch):
    """DeepSpeed's zero_to_fp32.py reads `latest`: after a branch moves later tags aside, or a damaged newest is set
    aside, it names the newest complete tag left, not one that is gone; with none left there is no pointer."""
    import json

    from pretrain.checkpointing.checkpoint_dir import file_manifest

    root = tmp_path / "tags"
    root.mkdir()
    for name in ("step_00000010", "step_00000020", "step_00000030"):
        _tag(root, name, complete=False)
        (root / name / COMPLETE).write_text(json.dumps({"files": file_manifest(root / name)}))
    (root / LATEST).write_text("step_00000030")
    import pretrain.checkpointing.checkpoint_dir as checkpoint_dir

    synced = []  # each move is synced into its folder (a crash of the machine must not bring a tag back)
    real = checkpoint_dir.fsync_folder
    monkeypatch.setattr(checkpoint_dir, "fsync_folder", lambda path: (synced.append(Path(path)), real(path)))
    folder = CheckpointDir(root)
    moved, _ = folder.set_aside_after("step_00000020")
    assert moved == ["step_00000030"] and (root / LATEST).read_text() == "step_00000020" and synced == [root]
    (root / "step_00000020" / "mp_rank_00_model_states.pt").write_bytes(b"weighTs")  # a changed byte
    assert folder.newest_intact(set_aside=True)[0] == "step_00000010"
    assert (root / LATEST).read_text() == "step_00000010" and synced == [root, root]
    (root / "step_00000010" / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert folder.newest_intact(set_aside=True)[0] is None and not (root / LATEST).exists()
