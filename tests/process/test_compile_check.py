"""benchmarks/compile_check.py, the GPU node's eager-against-compiled check, on its CPU path: the plain eager run
against the gpu_base group's fast path (each encoder layer compiled, Q/K/V as one matmul) with the vocabulary loss in
chunks added (`--compiled-set`), the losses compared, the compiled run's export loaded with transformers' own class.
TaCL, since it runs the most: a teacher folder of the backbone's model built first, a frozen encoder compiled beside
the student's masked LM (MLM's own regions: test_compile_regions)."""
from __future__ import annotations

import json

from conftest import ForkedModuleRuns

from benchmarks import compile_check
from pretrain.run_dir import RunDir



def test_the_compile_check_compares_eager_and_compiled_runs_and_loads_the_export(prepared, tmp_path, monkeypatch,
                                                                                 capsys):
    out = tmp_path / "check.json"
    # In this process, its three runs forked (each a fresh interpreter's start-up otherwise).
    monkeypatch.setattr(compile_check, "subprocess", ForkedModuleRuns())
    compile_check.main([
        "--size", "tiny", "--steps", "3", "--warmup", "1", "--batch", "4", "--precision", "fp32", "--backbones", "bert",
        "--objectives", "tacl", "--data", str(prepared), "--work", str(tmp_path / "work"), "--out", str(out),
        "--tolerance", "1e-5", "--compiled-set", "train.vocab_loss_chunk=16",
        # lr: one that moves the weights, so steps 2-3 test the backward too; dropout: the check's own 0 must win
        "--set", "optimizer.lr=3e-3", "model.dropout=0.1"])
    stdout = capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    # fp32, dropout 0: the fused, chunked, compiled run gives the plain eager run's losses to 1e-5 at every step.
    assert row["steps"] == 3 and row["losses_agree"] and row["max_relative_loss_difference"] <= 1e-5, row
    assert row["export_class"] == "BertModel" and row["compiled_tokens_per_s"] > 0
    assert "bert tacl: losses agree" in stdout
    teacher = json.loads((tmp_path / "work" / "bert_teacher" / "config.json").read_text())
    assert (teacher["model_type"], teacher["hidden_size"], teacher["hidden_dropout_prob"]) == ("bert", 64, 0.0)
    eager_log = (tmp_path / "work" / "bert_tacl_eager" / "train.log").read_text()
    compiled_log = (tmp_path / "work" / "bert_tacl_compiled" / "train.log").read_text()
    # --mode auto, as the gpu_base group: BERT's layers, the student's 2 and the teacher's 2
    assert "train.compile=auto: layers (what bert measured fastest in on a GPU)" in compiled_log
    assert "compiled 4 encoder layer(s), each on its own, and predict with torch.compile" in compiled_log
    assert "Q, K and V as one matmul in 4 attention layer(s)" in compiled_log  # the gpu_base group's fused_qkv
    assert "vocabulary projection fused with the loss, 16 rows at a time" in compiled_log  # --compiled-set
    assert "keep their attention mask" not in compiled_log  # eager model forward: unpadded batches go without
    assert not any(said in eager_log for said in ("torch.compile", "one matmul", "rows at a time"))  # the plain run
    for run in ("eager", "compiled"):  # --set reached both runs
        assert "  lr: 0.003\n" in RunDir(tmp_path / "work" / f"bert_tacl_{run}").config.read_text()
