"""benchmarks/compile_check.py, the GPU node's eager-against-compiled check, on its CPU path: both runs, the loss
comparison, the compiled run's export loaded with transformers' own class."""
from __future__ import annotations

import json

from conftest import run_cli



def test_the_compile_check_compares_eager_and_compiled_runs_and_loads_the_export(prepared, tmp_path):
    out = tmp_path / "check.json"
    proc = run_cli("benchmarks.compile_check", [
        "--size", "tiny", "--steps", "3", "--warmup", "1", "--batch", "4", "--precision", "fp32", "--backbones", "bert",
        "--objectives", "mlm", "--data", str(prepared), "--work", str(tmp_path / "work"), "--out", str(out)], timeout=600)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["steps"] == 3 and row["losses_agree"] and row["max_relative_loss_difference"] <= 1e-2, row
    assert row["export_class"] == "BertModel" and row["compiled_tokens_per_s"] > 0
    assert "bert mlm: losses agree" in proc.stdout
    compiled_log = (tmp_path / "work" / "bert_mlm_compiled" / "train.log").read_text()
    assert "compiled 2 encoder layer(s), each on its own, and predict with torch.compile" in compiled_log  # --mode layers
