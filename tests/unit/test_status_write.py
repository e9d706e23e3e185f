"""A rank's status at the end of an attempt (saved on a preemption, finished): a status folder that cannot take it
is said, not raised, so the attempt keeps the exit code it earned (75, 0, 130) and is requeued as it should be."""
import json

from pretrain.lifecycle.exit_status import write_status_or_warn


def test_a_status_folder_that_cannot_take_the_end_status_is_said_not_raised(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRETRAIN_STATUS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    write_status_or_warn("preempted", step=5)
    assert json.loads((tmp_path / "rank0.json").read_text())["status"] == "preempted"
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "rank1.json").mkdir()  # what the write renames onto cannot take it (as a full quota or a stale handle)
    write_status_or_warn("preempted", step=5)
    err = capsys.readouterr().err
    assert err.startswith("warning: status 'preempted' could not be written to PRETRAIN_STATUS_DIR (")
    assert err.rstrip().endswith("; the exit code says it")
