"""benchmarks/rotary_tables.py on a CPU at a tiny shape: both sides compile and run in turns, their first losses agree
(the tables hold transformers' values), and the figures land in the JSON it writes. In tests/process: inductor
compiles its kernels in worker processes."""
import json

from benchmarks import rotary_tables


def test_both_sides_run_in_turns_with_the_same_first_loss(tmp_path):
    out = tmp_path / "rt.json"
    assert rotary_tables.main(["--shape", "tiny", "--batch", "2", "--seq", "32", "--steps", "1", "--warmup", "0",
                               "--rounds", "2", "--device", "cpu", "--vocab", "100", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    result = written["result"]
    assert len(result["rounds"]["computed"]) == len(result["rounds"]["tables"]) == 2
    assert result["ms_computed"] > 0 and result["ms_tables"] > 0 and result["ratio_min"] <= result["ratio_max"]
    computed, tables = result["first_loss_computed"], result["first_loss_tables"]
    assert computed != 0 and abs(tables - computed) <= 1e-5 * abs(computed), (computed, tables)
    assert written["args"]["precision"] == "fp32" and written["env"]["torch"]
