"""benchmarks/gpu_throughput.py, the GPU benchmark the queue runs most, on its CPU path (`--tiny`): the dataset
prepared from the corpora when missing and reused when there, one trainer point measured beside the eager and the
compiled bare loop, and the row and the table written; TaCL's teacher, the model of each backbone's MLM point."""
import json
import sys
from pathlib import Path

from conftest import ForkedModuleRuns, kjv_chapters, run_cli

from benchmarks import gpu_throughput
from benchmarks.gpu_throughput import build_parser, ensure_data, point_overrides, teacher_folder
from benchmarks.repro_common import REPO
from core.config_io import load_config
from data_pipeline.dataset_dir import DatasetDir
from pretrain.config import RunConfig


def test_a_tiny_point_runs_with_its_data_prepared_once_profiled_and_through_the_waiting_trainer(tmp_path, monkeypatch,
                                                                                               capfd):
    corpora, work = tmp_path / "corpora", tmp_path / "work"
    corpora.mkdir()
    text = "\n\n".join(kjv_chapters(40)) + "\n"
    (corpora / "kjv.txt").write_text(text, encoding="utf-8")
    (corpora / "wordnet_glosses.txt").write_text(text[: len(text) // 4], encoding="utf-8")
    data = ensure_data(128, corpora, work)
    manifest = DatasetDir(data).manifest.stat().st_mtime_ns
    assert ensure_data(128, corpora, work) == data and DatasetDir(data).manifest.stat().st_mtime_ns == manifest
    out = tmp_path / "gpu.json"
    # Its main in this process (it reads sys.argv, and relaunches it for the profile), its bare loops and profile
    # worker forked (each a fresh interpreter's start-up otherwise); the trainer under torchrun stays a new process.
    monkeypatch.setattr(gpu_throughput, "subprocess", ForkedModuleRuns())
    monkeypatch.setattr(sys, "argv", [gpu_throughput.__file__, *[
        "--tiny", "--steps", "12", "--warmup", "2", "--seqs", "128", "--batches-128", "4", "--objectives", "mlm",
        "--backbones", "bert", "--compile", "off", "--precision", "fp32", "--corpora", str(corpora),
        "--work", str(work), "--out", str(out), "--profile", "--profile-steps", "2", "--host-wait-each-step"]])
    capfd.readouterr()
    gpu_throughput.main()
    proc = capfd.readouterr()  # what the command printed, its trainer's output included (stdout, stderr)
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["objective"], row["backbone"], row["seq"], row["batch"], row["compile"]) == ("mlm", "bert", 128, 4, False)
    # The profile: its trace beside the results, and the host's waits for a device read from it (a CPU has none).
    assert Path(row["trace"]).parent == tmp_path and row["kernels"]["by_kind"]
    assert row["host_waits"] == {"per_step": 0.0, "ms_per_step": 0.0, "pageable_copies_per_step": 0.0, "in": []}
    assert "the host waited for the device 0.0 time(s) a step inside an op, 0.00 ms" in proc.out
    # Trained by benchmarks/waiting_trainer.py, the other side of the host-wait pair (its wait a no-op on a CPU).
    assert row["host_wait_each_step"] is True and "(--host-wait-each-step)" in proc.out
    assert "benchmarks.waiting_trainer: every training step ends with the host waiting for the device" in proc.err
    assert row["compiled"] == ""  # what the trainer's log says it compiled: nothing, at --compile off
    assert row["tokens_per_s"] > 0 and row["bare_tokens_per_s"] > 0 and row["bare_compiled_tokens_per_s"] > 0
    assert abs(row["vs_bare"] - row["tokens_per_s"] / row["bare_tokens_per_s"]) < 1e-9
    assert "| mlm | bert | 128 | 4 | off |" in proc.out


def _corpora(tmp_path):
    """Both corpora gpu_throughput prepares from, 20 KJV chapters each."""
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    text = "\n\n".join(kjv_chapters(20)) + "\n"
    for name in ("kjv.txt", "wordnet_glosses.txt"):
        (corpora / name).write_text(text, encoding="utf-8")
    return corpora


def test_tacls_teacher_is_the_mlm_points_model_so_the_student_is_the_backbone_named(tmp_path):
    """The teacher folder decides TaCL's model: before, it was BERT for every backbone (the ModernBERT points trained
    BERT) with transformers' dropout 0.1 where the MLM points have the demo's 0."""
    corpora = _corpora(tmp_path)
    data = ensure_data(128, corpora, tmp_path / "work")
    manifest = json.loads(DatasetDir(data).manifest.read_text())
    args = build_parser().parse_args(["--tiny", "--set", "model.attention_dropout=0.2"])
    args.size = "tiny"
    family = {"bert": ("bert", "intermediate_size", 256, "hidden_dropout_prob", "attention_probs_dropout_prob"),
              "modernbert": ("modernbert", "intermediate_size", 256, "mlp_dropout", "attention_dropout")}
    for backbone, (model_type, ffn, width, dropout, attention_dropout) in family.items():
        teacher = teacher_folder(backbone, 128, args, data, tmp_path / f"teacher_{backbone}")
        saved = json.loads((teacher / "config.json").read_text())
        assert (saved["model_type"], saved["hidden_size"], saved["num_hidden_layers"], saved[ffn]) == \
            (model_type, 64, 2, width), saved
        assert (saved[dropout], saved[attention_dropout]) == (0.0, 0.2), saved  # the demo's 0, and --set reached it
        assert saved["vocab_size"] == manifest["tokenizer"]["vocab_size"] and (teacher / "tokenizer.json").is_file()
        point = {"objective": "tacl", "backbone": backbone, "seq": 128, "batch": 4, "compile": False}
        cfg = load_config(RunConfig, REPO / "pretrain" / "configs" / "demo_mlm.yaml",
                          point_overrides(point, args, data, teacher, tmp_path))
        assert (cfg.model.init_from, cfg.model.architecture) == (str(teacher), model_type)  # the point's own family


def test_a_modernbert_point_under_compile_auto_compiles_its_whole_step_and_says_so(tmp_path, monkeypatch):
    """`train.compile: auto` (the gpu_base group's) through the trainer on ModernBERT, whose rotary tables go in: the
    whole step compiled, the mask kept on unpadded batches, and the row records what was compiled."""
    corpora = _corpora(tmp_path)
    out, work = tmp_path / "gpu.json", tmp_path / "work"
    launched = []

    def forked(cmd: list[str], env: dict | None = None) -> None:
        """The trainer's one-process torchrun command with its rank forked (the test above runs the command itself)."""
        assert cmd[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m"] and not env
        launched.append(cmd)
        run_cli(cmd[7], cmd[8:], timeout=600)

    # Its main in this process, as in the test above; the trainer forked, not a fresh torchrun agent and rank.
    monkeypatch.setattr(gpu_throughput, "subprocess", ForkedModuleRuns())
    monkeypatch.setattr(gpu_throughput, "run", forked)
    monkeypatch.setattr(sys, "argv", [gpu_throughput.__file__, *[
        "--tiny", "--steps", "6", "--warmup", "2", "--seqs", "128", "--batches-128", "4", "--objectives", "mlm",
        "--backbones", "modernbert", "--compile", "on", "--no-bare", "--precision", "fp32", "--corpora", str(corpora),
        "--work", str(work), "--out", str(out), "--set", "train.compile=auto"]])
    gpu_throughput.main()
    assert len(launched) == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert row["compiled"] == "the objective's step (encoders, heads and losses)" and row["tokens_per_s"] > 0
    log = (work / "mlm_modernbert_seq128_b4_on_tiny" / "train.log").read_text()
    assert "rotary cos/sin read from tables in 1 ModernBERT encoder(s)" in log
    assert "train.compile=auto: step (what modernbert measured fastest in on a GPU)" in log
    assert "unpadded batches keep their attention mask (train.unpadded_mask=auto, train.compile=step)" in log
