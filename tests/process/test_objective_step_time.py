"""benchmarks/objective_step_time.py times every objective's step at a tiny shape and writes its table as JSON."""
import json
import subprocess
import sys


def test_every_objective_is_timed(tmp_path):
    out = tmp_path / "steps.json"
    subprocess.run([sys.executable, "-m", "benchmarks.objective_step_time", "--vocab", "300", "--hidden", "32",
                    "--layers", "1", "--heads", "2", "--intermediate", "64", "--batch", "4", "--seq", "32",
                    "--warmup", "1", "--steps", "2", "--out", str(out)], check=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [r["objective"] for r in rows] == ["mlm", "electra", "coco_lm", "tacl", "taco"]
    assert all(r["step_s"] > 0 and r["trainable_params"] > 0 for r in rows) and rows[0]["relative_to_mlm"] == 1.0
