"""benchmarks/gpu_queue.py: every queued GPU measurement parses with its benchmark's own parser and its run-config
overrides load, so a typo is found here and not after a GPU machine started; a bad entry, a repeated id and data not
prepared are each named."""
import pytest

from benchmarks.gpu_queue import QUEUE, Entry, check, entry_limit_s, main, parse_problem, select


@pytest.mark.parametrize("entry", QUEUE, ids=[e.id for e in QUEUE])
def test_every_queued_entry_parses_and_its_overrides_load(entry):
    assert parse_problem(entry) == ""
    assert entry.minutes > 0 and entry.why


def test_the_queue_holds_the_open_measurements_once_each():
    ids = [e.id for e in QUEUE]
    assert len(ids) == len(set(ids))
    # What issue 48's targets need: the trainer with its levers, the rotary tables, the objectives, seq 512; the
    # BERT-base step first, then ModernBERT's whole and per layer, within the first call's nine minutes.
    assert {"1", "1d", "1d-step", "1d-step-computed", "3", "4-seq512"} <= set(ids)
    first = ids[:ids.index("1d-step-computed") + 1]
    assert first[0] == "1" and {"1b-modernbert", "1d-step"} <= set(first)
    assert sum(e.minutes for e in QUEUE[:len(first)]) <= 9


def test_a_bad_flag_and_a_bad_override_are_named():
    flag = Entry("x", "a typo", "rotary_tables", ("--shapes", "base"), 1.0)
    assert "--shapes" in parse_problem(flag)
    key = Entry("y", "a key typo", "gpu_throughput", ("--set", "train.rotary_table=false"), 1.0)
    assert "rotary_table" in parse_problem(key)
    value = Entry("z", "a bad value", "kernel_levers", ("--levers", "no_such_lever"), 1.0)
    assert "no_such_lever" in parse_problem(value)
    # What a benchmark checks after parsing, the queue checks too.
    warmup = Entry("w", "warm-up past the steps", "kernel_levers", ("--steps", "5", "--warmup", "10"), 1.0)
    assert "--warmup must be at least 1 and below --steps" in parse_problem(warmup)


def test_only_and_from_do_not_go_together(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "1", "--from", "3", "--list"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_check_names_a_repeated_id_and_missing_data(tmp_path):
    twice = (QUEUE[0], QUEUE[0])
    problems = check(twice, tmp_path)
    assert any(f"id {QUEUE[0].id!r} is used 2 times" in p for p in problems)
    assert any(str(tmp_path / "data128") in p and "--prepare" in p for p in problems)
    assert not any("data512" in p for p in problems)  # entry 1 reads seq 128 only


def test_select_keeps_the_queue_order():
    assert [e.id for e in select(QUEUE, ["3", "1d"], None)] == ["1d", "3"]
    ids = [e.id for e in QUEUE]
    assert [e.id for e in select(QUEUE, None, "4-dropout")] == ids[ids.index("4-dropout"):]
    assert select(QUEUE, None, None) == QUEUE
    with pytest.raises(SystemExit, match="no entry 9z"):
        select(QUEUE, ["9z"], None)


def test_an_entry_may_run_twice_its_estimate_and_a_minute_within_the_time_left():
    entry = Entry("e", "why", "rotary_tables", (), 1.5)
    assert entry_limit_s(entry, 1000) == 240 and entry_limit_s(entry, 100) == 100 and entry_limit_s(entry, 0) == 1
