"""benchmarks/vocabulary_loss.py on a CPU at a small shape: each chunk setting gives the whole pass's loss (the same
weights, rows and targets), and the rows land in the JSON it writes."""
import json
import math

from benchmarks import vocabulary_loss


def test_settings_run_and_keep_the_loss(tmp_path):
    out = tmp_path / "vl.json"
    assert vocabulary_loss.main(["--rows", "50", "--hidden", "16", "--vocab", "300", "--chunks", "0", "7", "64",
                                 "--steps", "2", "--warmup", "1", "--device", "cpu", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["settings"]
    assert [r["chunk"] for r in rows] == [0, 7, 64]
    # Random weights at this scale predict about uniformly over 300 tokens: ln 300 = 5.70.
    assert abs(rows[0]["loss"] - math.log(300)) < 0.5
    for r in rows[1:]:
        assert abs(r["loss"] - rows[0]["loss"]) <= 1e-5 * rows[0]["loss"]
        assert r["ms"] > 0 and r["process_peak_rss_mib"] > 0 and r["gpu_peak_mib"] is None
