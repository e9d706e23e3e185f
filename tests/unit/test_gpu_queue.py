"""benchmarks/gpu_queue.py: every queued GPU measurement parses with its benchmark's own parser and its run-config
overrides load, so a typo is found here and not after a GPU machine started; a bad entry, a repeated id and data not
prepared are each named; the queue's own rules (a group runs whole, a launcher's report is no cause, a stop keeps
its record, an archive path that cannot work is refused) without a benchmark process."""
import json

import pytest

import benchmarks.gpu_queue as queue
from benchmarks.gpu_queue import (QUEUE, Entry, check, entry_limit_s, first_error, main, parse_problem, run_queue,
                                  select, write_record)


@pytest.mark.parametrize("entry", QUEUE, ids=[e.id for e in QUEUE])
def test_every_queued_entry_parses_and_its_overrides_load(entry):
    assert parse_problem(entry) == ""
    assert entry.minutes > 0 and entry.why


def test_the_queue_holds_the_open_measurements_once_each():
    ids = [e.id for e in QUEUE]
    assert len(ids) == len(set(ids))
    # What issue 48's targets need: the compile modes on both backbones, the objectives, the GPU check. Measured
    # entries are out (BENCHMARKS.md, "The first run of the GPU queue", "The second run of the GPU queue").
    assert {"auto-modernbert", "step-bert", "3-modernbert", "5-check", "host-overhead"} <= set(ids)
    assert not {"1d", "1d-step", "3", "4-seq512", "1-chunk", "2"} & set(ids)
    # Each comparison is one group, so that one call measures both sides.
    group = {e.id: e.group for e in QUEUE}
    for baseline, compared in (("auto-modernbert", "wait-modernbert"), ("wait-modernbert-2", "auto-modernbert-2"),
                               ("layers-bert", "wait-bert"), ("layers-modernbert", "auto-modernbert-3"),
                               ("layers-bert-2", "step-bert"), ("layers-bert-2", "bernoulli-bert")):
        assert group[baseline] and group[compared] == group[baseline]
    # The trainer with and without the host's wait a step first, on both backbones, ModernBERT's pair alternated,
    # within the first call's nine minutes (the documented --budget-s 540).
    first = [e for e in QUEUE if e.group in (QUEUE[0].group, "host-wait-bert")]
    assert [e.id for e in first] == ["auto-modernbert", "wait-modernbert", "wait-modernbert-2", "auto-modernbert-2",
                                     "layers-bert", "wait-bert"]
    assert QUEUE[:len(first)] == tuple(first)
    assert sum(e.minutes for e in first) * 60 <= 540
    waiting = {e.id for e in QUEUE if "--host-wait-each-step" in e.args}
    assert waiting == {"wait-modernbert", "wait-modernbert-2", "wait-bert"}
    # Each waiting side trains what its pair does, but for the wait.
    args = {e.id: [a for a in e.args if a not in ("--host-wait-each-step", "--profile", "--profile-steps", "5")]
            for e in QUEUE}
    for waits, plain in (("wait-modernbert", "auto-modernbert-2"), ("wait-bert", "layers-bert")):
        assert args[waits] == args[plain], (waits, plain)
    # The default count's side trains what exact counts' side does, but for the count.
    assert args["bernoulli-bert"] == [*args["layers-bert-2"], "masking.count=bernoulli"]


@pytest.mark.parametrize("module, args, said", [
    ("rotary_tables", ("--shapes", "base"), "--shapes"),  # a flag's typo
    ("gpu_throughput", ("--set", "train.rotary_table=false"), "rotary_table"),  # a run-config key's
    ("kernel_levers", ("--levers", "no_such_lever"), "no_such_lever"),  # a value's
    # What a benchmark checks after parsing, the queue checks too.
    ("kernel_levers", ("--steps", "5", "--warmup", "10"), "--warmup must be at least 1 and below --steps"),
    ("compile_check", ("--steps", "0"), "--steps must be at least 1"),
    ("compile_check", ("--tolerance", "0"), "--tolerance must be above 0"),
    ("host_overhead", ("--steps", "20", "--window", "11"), "--window must be at least 1 and fit --steps twice")])
def test_a_bad_flag_and_a_bad_override_are_named(module, args, said):
    assert said in parse_problem(Entry("x", "a mistake", module, args, 1.0))


def test_only_and_from_do_not_go_together(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "1", "--from", "3", "--list"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_check_names_a_repeated_id_and_missing_data(tmp_path):
    twice = (QUEUE[0], QUEUE[0])
    problems = check(twice, tmp_path)
    assert any(f"id {QUEUE[0].id!r} is used 2 times" in p for p in problems)
    assert any(str(tmp_path / "data128") in p and "--prepare" in p for p in problems)
    assert not any("data512" in p for p in problems)  # the first entry reads seq 128 only


def test_select_keeps_the_queue_order():
    assert [e.id for e in select(QUEUE, ["step-bert", "auto-modernbert"], None)] == ["auto-modernbert", "step-bert"]
    ids = [e.id for e in QUEUE]
    assert [e.id for e in select(QUEUE, None, "4-dropout")] == ids[ids.index("4-dropout"):]
    assert select(QUEUE, None, None) == QUEUE
    with pytest.raises(SystemExit, match="no entry 9z"):
        select(QUEUE, ["9z"], None)


def test_an_entry_may_run_twice_its_estimate_and_a_minute_within_the_time_left():
    entry = Entry("e", "why", "rotary_tables", (), 1.5)
    assert entry_limit_s(entry, 1000) == 240 and entry_limit_s(entry, 100) == 100 and entry_limit_s(entry, 0) == 1


# The shape of a failed gpu_throughput entry's log on the H200 (2026-11-28): the trainer's own line, the rank's
# traceback, then torchrun's and the benchmark's reports of the same failure.
TORCHRUN_LOG = """2026-11-28 21:32:01 failed at step 0: InternalTorchDynamoError: AttributeError: 'VocabularyHead' object has no attribute 'transform'
UserWarning: TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/main/pretrain/trainer.py", line 113, in fit
[rank0]: torch._dynamo.exc.InternalTorchDynamoError: AttributeError: 'VocabularyHead' object has no attribute 'transform'
[rank0]: from user code:
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
subprocess.CalledProcessError: Command '['python3', '-m', 'torch.distributed.run']' returned non-zero exit status 1.
"""


def test_the_first_exception_of_a_log_is_its_cause():
    assert first_error(TORCHRUN_LOG) == ("torch._dynamo.exc.InternalTorchDynamoError: AttributeError: "
                                         "'VocabularyHead' object has no attribute 'transform'")
    # Object addresses differ from run to run; the failure does not.
    one = first_error("RuntimeError: bad <Tensor at 0x7fceaa904a90>\n")
    assert one == first_error("RuntimeError: bad <Tensor at 0x7f00deadbeef>\n") == "RuntimeError: bad <Tensor at 0x?>"
    assert first_error("step 30/30 | loss 8.15\nUserWarning: not an error\nfinished\n") == ""


def test_a_launcher_report_names_no_cause_and_a_wrapped_one_is_read_through():
    # A rank killed by a signal: only torchrun's and the benchmark's reports, which two unrelated failures share.
    killed = "\n".join(line for line in TORCHRUN_LOG.splitlines() if "VocabularyHead" not in line)
    assert first_error(killed) == ""
    bare = "RuntimeError: bare loop failed: Traceback (most recent call last):\n  File \"x.py\"\ntorch.OutOfMemoryError: CUDA\n"
    assert first_error(bare) == "torch.OutOfMemoryError: CUDA"


def test_a_group_that_does_not_fit_is_skipped_whole(tmp_path):
    """Two entries compared with each other, 2 minutes together, in 1.5 minutes: neither starts (the first would fit
    alone); an ungrouped entry after them is judged on its own estimate. Nothing runs, so no log is written."""
    entries = (Entry("a", "baseline", "no_such_module", (), 1.0, group="ab"),
               Entry("b", "compared with a", "no_such_module", (), 1.0, group="ab"),
               Entry("c", "alone, too long", "no_such_module", (), 5.0))
    rows = run_queue(entries, tmp_path / "out", budget_s=90)
    assert [(r["id"], r["status"]) for r in rows] == [("a", "skipped"), ("b", "skipped"), ("c", "skipped")]
    assert rows[0]["why"] == rows[1]["why"] == "its group ab expects 2 min, 1.5 min left"
    assert not list((tmp_path / "out").glob("*.log"))


def test_a_queue_stopped_mid_entry_records_the_entry_as_interrupted(tmp_path, monkeypatch):
    def stopped(*_args):
        raise SystemExit(143)  # what main's SIGTERM handler raises

    monkeypatch.setattr(queue, "run_entry", stopped)
    entries = (Entry("a", "stopped while it runs", "rotary_tables", (), 1.0), Entry("b", "after", "rotary_tables", (), 1.0))
    with pytest.raises(SystemExit):
        run_queue(entries, tmp_path / "out", budget_s=600, archive=tmp_path / "q.tar.gz")
    record = json.loads((tmp_path / "out" / "queue.json").read_text())["entries"]
    assert [(r["id"], r["status"]) for r in record] == [("a", "interrupted")]
    assert (tmp_path / "q.tar.gz").is_file()


def test_an_archive_that_cannot_be_written_is_said_and_the_record_kept(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    write_record(tmp_path / "out", 60, [{"id": "a", "status": "ran"}], tmp_path / "gone" / "q.tar.gz")
    assert "the archive" in capsys.readouterr().err and (tmp_path / "out" / "queue.json").is_file()


@pytest.mark.parametrize("where", ["inside", "missing"])
def test_an_archive_inside_out_or_in_no_folder_is_refused_before_any_entry(tmp_path, capsys, where):
    archive = tmp_path / "out" / "q.tar.gz" if where == "inside" else tmp_path / "gone" / "q.tar.gz"
    assert main(["--only", "1c", "--out", str(tmp_path / "out"), "--archive", str(archive)]) == 2
    assert "must be in a folder that exists, outside --out" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_two_entries_profiling_one_point_keep_two_traces(tmp_path):
    from benchmarks.gpu_throughput import trace_path

    point = {"objective": "mlm", "backbone": "modernbert", "seq": 128, "batch": 256}
    first, second = (trace_path(tmp_path / f"{name}.json", point) for name in ("auto-modernbert", "layers-modernbert"))
    assert first != second and first.parent == second.parent == tmp_path
    assert trace_path(tmp_path / "x.json", {**point, "batch": 512}) != trace_path(tmp_path / "x.json", point)
