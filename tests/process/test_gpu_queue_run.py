"""benchmarks/gpu_queue.py runs its entries as the GPU machine would, here on a CPU with a real benchmark at a tiny
shape (the vocabulary loss, eager: what is tested is the queue, and a compiling benchmark would spend a minute of the
suite compiling): in order, each with its log and results file, a failing entry recorded with its exit status and its cause
and the rest still run until a failure repeats, an entry that no longer fits the budget skipped, one past its time
ended with its process group, and queue.json (and the archive of the whole folder) saying all of it."""
import json
import math
import subprocess
import tarfile

from benchmarks.gpu_queue import Entry, main, run_queue

TINY = ("--rows", "8", "--hidden", "16", "--chunks", "0", "4", "--steps", "1", "--warmup", "0", "--device", "cpu",
        "--vocab", "100")


def test_entries_run_in_order_and_the_record_says_what_each_did(tmp_path, capsys, monkeypatch):
    import benchmarks.gpu_queue as queue

    cuda = (*TINY[:-4], "--device", "cuda", "--vocab", "100")  # parses, then fails: this machine has no CUDA
    monkeypatch.setattr(queue, "QUEUE", (
        # Estimates that leave a slow machine room (limits of 3 and 5 minutes).
        Entry("bad", "CUDA, which this machine lacks", "vocabulary_loss", cuda, 1.0),
        Entry("tiny", "the vocabulary loss at a tiny shape", "vocabulary_loss", TINY, 2.0),
        Entry("long", "more than the budget", "vocabulary_loss", TINY, 60.0),
        Entry("bad-again", "CUDA again: the failure of 'bad' repeated", "vocabulary_loss", cuda, 1.0),
        Entry("after", "what a repeated failure leaves unrun", "vocabulary_loss", TINY, 1.0)))
    archive = tmp_path / "queue.tar.gz"
    assert main(["--budget-s", "600", "--out", str(tmp_path / "out"), "--archive", str(archive)]) == 1
    rows = json.loads((tmp_path / "out" / "queue.json").read_text())["entries"]
    assert [(r["id"], r["status"]) for r in rows] == [
        ("bad", "exit 1"), ("tiny", "ran"), ("long", "skipped"), ("bad-again", "exit 1"), ("after", "not run")]
    assert "NVIDIA" in (tmp_path / "out" / "bad.log").read_text()
    # Each failure is recorded with the exception its log names first, and the same one twice stops the queue.
    assert "NVIDIA" in rows[0]["error"] and rows[3]["error"] == rows[0]["error"] and "error" not in rows[1]
    assert rows[4]["why"] == "stopped after bad-again failed as bad did"
    assert not (tmp_path / "out" / "after.log").exists()
    settings = json.loads((tmp_path / "out" / "tiny.json").read_text())["settings"]
    assert [s["chunk"] for s in settings] == [0, 4] and math.isclose(settings[0]["loss"], settings[1]["loss"], rel_tol=1e-6)
    assert '"chunk": 4' in (tmp_path / "out" / "tiny.log").read_text()  # the benchmark's own rows, in its log
    assert "60 min" in rows[2]["why"] and not (tmp_path / "out" / "long.log").exists()
    # The output names each failure's cause, the stop, and last what to run again: the entries that did not run.
    said = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("bad: exit 1 in ") and "NVIDIA" in line for line in said)
    assert "stopped after bad-again failed as bad did: the entries after it are not run" in said
    assert said[-1].endswith("next time: python -m benchmarks.gpu_queue --only bad long bad-again after")
    # The archive holds the folder as it ended: one file for a device call to bring back.
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        record = json.load(tar.extractfile("out/queue.json"))
    assert {"out/queue.json", "out/bad.log", "out/tiny.log", "out/tiny.json", "out/bad-again.log"} <= names
    assert record["entries"] == rows
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_entry_past_its_time_is_ended_with_its_whole_group_and_recorded(tmp_path):
    # Endless steps: the benchmark never ends by itself, so only the queue's limit stops it.
    endless = ("--rows", "8", "--hidden", "16", "--chunks", "0", "--steps", "100000000", "--device", "cpu")
    rows = run_queue((Entry("endless", "never ends", "vocabulary_loss", endless, 0.01),), tmp_path / "out", budget_s=8,
                     grace_s=5)
    assert rows[0]["status"] == "timed out" and 8 <= rows[0]["seconds"] < 8 + 5 + 15
    assert json.loads((tmp_path / "out" / "queue.json").read_text())["entries"][0]["status"] == "timed out"
    running = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "out" / "endless.json") not in running


def test_a_queue_with_data_missing_stops_before_running(tmp_path, capsys, monkeypatch):
    import benchmarks.gpu_queue as queue

    monkeypatch.setattr(queue, "WORK", tmp_path / "work")  # nothing prepared there
    assert main(["--only", "auto-modernbert", "--out", str(tmp_path / "out")]) == 2
    assert "data128 is not prepared" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
