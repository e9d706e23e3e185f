"""benchmarks/resource_growth.py end to end: two bare ranks train while it samples them, and its results file holds
each rank's process tree (the rank, its loader worker, the resource tracker) and the run's growth."""
from __future__ import annotations

import json

from conftest import TINY_MODEL


def test_two_ranks_are_sampled_as_they_train_and_the_figures_are_written(prepared, tmp_path, capsys):
    from benchmarks.resource_growth import main

    out = tmp_path / "resource_growth.json"
    main(["--data", str(prepared), "--work", str(tmp_path / "work"), "--out", str(out), "--steps", "100",
          "--every-s", "0.3", "--ranks", "2", "--set", *TINY_MODEL, "train.micro_batch_size=4",
          "train.global_batch_size=8", "train.save_every=30", "train.eval_every=30", "data.num_workers=1"])
    result = json.loads(out.read_text())
    # Each rank wrote its status where the samples read it: those taken once a rank had finished are left out.
    statuses = [json.loads((tmp_path / "work" / "status" / f"rank{r}.json").read_text())["status"] for r in (0, 1)]
    assert statuses == ["finished", "finished"]
    assert result["exit_codes"] == [0, 0] and result["machine"]["cpu"]
    steps = [s["step"] for s in result["samples"]]
    assert steps == sorted(steps) and steps[-1] >= 50, steps
    trained = [s for s in result["samples"] if s["step"] > 0]
    for rank in (0, 1):
        trees = [s["ranks"][rank] for s in trained]
        assert max(t["processes"] for t in trees) >= 3, trees[-3:]  # the rank, its loader worker, the resource tracker
        assert all(t["rank_rss_mb"] > 100 and t["tree_pss_mb"] > 50 and t["fds"] > 3 for t in trees)
        assert result["summary"][f"rank{rank}.tree_pss_mb"]["last"] == trees[-1]["tree_pss_mb"]
    # Three checkpoints (keep_last 3) and a metrics row a step: the run folder grows.
    assert trained[-1]["run_mb"] > trained[0]["run_mb"] and result["summary"]["run_mb"]["per_1000_steps"] > 0
    printed = capsys.readouterr().out
    assert "100 steps on 2 rank(s)" in printed and "rank1.tree_pss_mb" in printed
