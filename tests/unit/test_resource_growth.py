"""benchmarks/resource_growth.py's readings: each figure moves by what the test adds to this process, and the slope and
the step are read as written."""
from __future__ import annotations

import json
import os
import threading

from benchmarks.resource_growth import all_running, last_step, process_figures, slope_per_1000, summarize
from pretrain.run_dir import RunDir


def test_a_process_s_figures_move_by_what_it_opens_starts_and_touches(tmp_path):
    before = process_figures(os.getpid())
    files = [open(tmp_path / f"f{i}", "w") for i in range(10)]
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(3)]
    for t in threads:
        t.start()
    block = bytearray(200 * 2**20)
    block[::4096] = b"\x01" * len(block[::4096])  # every page touched, so resident
    try:
        after = process_figures(os.getpid())
    finally:
        release.set()
        for t in threads:
            t.join()
        for f in files:
            f.close()
    assert after["fds"] - before["fds"] == 10
    assert after["threads"] - before["threads"] == 3
    assert 195 <= after["rss_mb"] - before["rss_mb"] <= 230 and 195 <= after["pss_mb"] - before["pss_mb"] <= 230
    assert process_figures(2**22 + 7) is None  # above the kernel's pid_max: no such process


def test_the_slope_is_per_1000_steps_and_needs_two_steps():
    assert abs(slope_per_1000([(1000, 5.0), (2000, 7.0), (3000, 9.0)]) - 2.0) < 1e-12
    assert abs(slope_per_1000([(0, 1.0), (500, 0.0), (1000, 1.0)])) < 1e-12
    assert slope_per_1000([(100, 1.0), (100, 3.0)]) is None


def test_the_step_is_the_last_train_row_even_with_a_row_half_written(tmp_path):
    metrics = RunDir(tmp_path).metrics
    assert last_step(metrics) == 0
    rows = [{"step": s, "split": "train", "loss": 1.0} for s in range(1, 5000)]
    rows.append({"step": 4999, "split": "validation"})
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5000, "spl')
    assert last_step(metrics) == 4999


def test_the_summary_leaves_the_warm_up_out_and_names_each_rank_s_series():
    def figures(pss: float) -> dict:
        return {"rank_rss_mb": 900.0, "tree_pss_mb": pss, "threads": 17, "fds": 150, "processes": 3}

    samples = [{"step": step, "shm_entries": 10, "shm_mb": 1.0, "run_mb": step / 1000,
                "ranks": [figures(100 + step / 100), figures(200.0)]} for step in (0, 100, 1000, 2000, 3000)]
    summary = summarize(samples, warmup_steps=1000)
    assert summary["rank0.tree_pss_mb"] == {"first": 110.0, "last": 130.0, "max": 130.0, "per_1000_steps": 10.0}
    assert summary["rank1.tree_pss_mb"]["per_1000_steps"] == 0.0
    assert summary["run_mb"]["first"] == 1.0 and abs(summary["run_mb"]["per_1000_steps"] - 1.0) < 1e-12
    assert set(summary) == {"shm_entries", "shm_mb", "run_mb", *(f"rank{r}.{n}" for r in (0, 1) for n in (
        "rank_rss_mb", "tree_pss_mb", "threads", "fds", "processes"))}


def test_samples_count_only_while_every_rank_s_status_says_running(tmp_path):
    assert not all_running(tmp_path, 2)  # no rank has written its status yet
    (tmp_path / "rank0.json").write_text(json.dumps({"status": "running", "pid": 1}))
    assert not all_running(tmp_path, 2)
    (tmp_path / "rank1.json").write_text(json.dumps({"status": "running", "pid": 2}))
    assert all_running(tmp_path, 2)
    (tmp_path / "rank1.json").write_text(json.dumps({"status": "finished", "pid": 2, "step": 100}))
    assert not all_running(tmp_path, 2)  # rank 1 is in its exit: its descriptors close, its workers are gone
    (tmp_path / "rank1.json").write_text('{"status": "runn')  # a file seen half written
    assert not all_running(tmp_path, 2)
