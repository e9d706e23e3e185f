"""JSON-lines read back on resume: a last line a kill cut short is left out; anything else malformed still fails."""

import pytest

from core.errors import CheckpointError
from core.jsonl import append_jsonl, complete_lines, read_jsonl, rewind_jsonl


def test_a_last_line_without_its_newline_is_left_out(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert complete_lines(path) == ['{"step": 1}\n', '{"step": 2}\n']


def test_complete_files_and_missing_ones(tmp_path):
    path = tmp_path / "rows.jsonl"
    assert read_jsonl(path) == [] and complete_lines(path) == []
    path.write_text("")
    assert read_jsonl(path) == []
    path.write_text('{"step": 1}\n{"step": 2}\n')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_damaged_line_before_the_last_is_not_hidden(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(CheckpointError, match=r"rows.jsonl is damaged \(its row 2 is not a JSON object\)"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n[2]\n')
    with pytest.raises(CheckpointError, match="its row 2 is not a JSON object"):
        read_jsonl(path)


def test_a_file_that_is_not_utf8_is_named_not_decoded(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": \xff}\n')
    with pytest.raises(CheckpointError, match=r"rows.jsonl is damaged \(not UTF-8 at byte 21\)"):
        rewind_jsonl(path, 1)
    assert path.read_bytes() == b'{"step": 1}\n{"step": \xff}\n'  # left as it was


def test_a_row_appended_after_a_cut_short_line_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "branches.jsonl"
    append_jsonl(path, {"from": "step_00000004"})
    with open(path, "a") as fh:
        fh.write('{"from": "step_0000')  # a kill mid-append
    append_jsonl(path, {"from": "step_00000008"})
    assert path.read_text() == '{"from": "step_00000004"}\n{"from": "step_00000008"}\n'
    assert read_jsonl(path) == [{"from": "step_00000004"}, {"from": "step_00000008"}]


def test_the_run_logger_cuts_a_row_a_kill_cut_short_before_it_appends(tmp_path):
    """A kill mid-row, then a resume that logs a row before its rewind (a damaged checkpoint set aside): the new row
    starts a line of its own, and the rewind reads the file instead of calling it damaged."""
    from pretrain.observe.logger import RunLogger
    from pretrain.run_dir import RunDir

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.metrics.write_text('{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2, "split": "tr')
    log = RunLogger(run, 10, True, report_to=())
    log.scalars(1, {"damaged_checkpoint_step": 2.0}, "resume", before_rewind=True)
    log.rewind(1)
    log.close()
    assert read_jsonl(run.metrics) == [{"step": 1, "split": "train", "loss": 2.0},
                                       {"step": 1, "split": "resume", "damaged_checkpoint_step": 2.0}]
