"""benchmarks/kernel_levers.py on a CPU (tiny shape, eager): each lever that keeps the math gives the baseline's first
loss, the levers a CPU cannot run say why in their row, and the figures land in the JSON it writes."""
import json
import math

import pytest

from benchmarks import kernel_levers


def test_levers_run_and_keep_the_loss(tmp_path):
    out = tmp_path / "levers.json"
    assert kernel_levers.main(["--shape", "tiny", "--batch", "2", "--steps", "3", "--warmup", "1", "--device", "cpu",
                               "--no-compile", "--attention", "--out", str(out),
                               "--levers", "baseline", "no_mask", "fused_qkv", "vocab_chunk_1024", "cudnn_attention",
                               "no_mask+fused_qkv", "no_mask+cudnn_attention"]) == 0
    result = json.loads(out.read_text())
    rows = {r["lever"]: r for r in result["levers"]}
    assert "error" in rows["cudnn_attention"] and "error" in rows["no_mask+cudnn_attention"]  # no cuDNN on a CPU
    assert rows["no_mask+fused_qkv"]["mask"] is False and rows["no_mask+fused_qkv"]["fused_qkv"] is True
    first = rows["baseline"]["first_loss"]
    # A fresh masked LM predicts about uniformly over BERT's 30,522 tokens: ln(30522) = 10.33.
    assert abs(first - math.log(30522)) < 0.3
    for lever in ("no_mask", "fused_qkv", "vocab_chunk_1024", "no_mask+fused_qkv"):
        assert abs(rows[lever]["first_loss"] - first) <= 1e-5 * first, lever
        assert rows[lever]["tokens_per_s"] > 0 and rows[lever]["vs_baseline"] > 0
    timed = {(r["backend"], r["mask"]) for r in result["attention"] if "ms" in r}
    assert ("math", True) in timed and ("math", False) in timed


def test_an_unknown_lever_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        kernel_levers.main(["--device", "cpu", "--levers", "no_mask+fused_qvk"])
    assert exit_.value.code == 2
    assert "unknown lever 'fused_qvk' in 'no_mask+fused_qvk'; choose from baseline, no_mask" in capsys.readouterr().err
