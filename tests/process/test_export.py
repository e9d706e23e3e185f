"""Export: the HF folder reproduces the training model, loads in AutoModelForMaskedLM and fill-mask, and is written safely."""
import os
import subprocess

import pytest
import torch
from conftest import TINY_MODEL, python_process, run_cli
from pretrain.run_dir import RunDir



@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    run, probe = base / "run", base / "probe.pt"
    run_cli("tests/helpers/train_and_probe.py", [
        "--probe-out", str(probe), "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}",
        f"train.output_dir={run}", *TINY_MODEL, "train.max_steps=6", "train.save_every=3", "train.micro_batch_size=4",
        "train.global_batch_size=8", "schedule.warmup_steps=2", "train.eval_every=0"])
    return base, run, torch.load(probe)


@pytest.fixture(scope="module")
def exported(trained):
    """The run's newest checkpoint exported through the CLI."""
    base, run, _ = trained
    run_cli("pretrain", ["export", "--checkpoint", str(run), "--out", str(base / "hf")])
    return base / "hf"


def test_export_logits_equal_training_model(trained, exported):
    from transformers import AutoModelForMaskedLM

    base, run, probe = trained
    out = exported
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    model = AutoModelForMaskedLM.from_pretrained(str(out), local_files_only=True).eval()
    assert type(model).__name__ == "BertForMaskedLM"
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    assert torch.allclose(logits, probe["logits"][""], atol=1e-5, rtol=0)
    # Every file readable by whom the umask lets read (safetensors' writer makes its file 0o600): a shared file
    # system's other users load the export too.
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_fill_mask_pipeline_runs_offline(exported):
    from transformers import AutoTokenizer, pipeline

    out = exported
    # As the README and the demo call it: the pipeline finds the tokenizer in the folder.
    fill = pipeline("fill-mask", model=str(out))
    assert fill.tokenizer.get_vocab() == AutoTokenizer.from_pretrained(str(out), local_files_only=True).get_vocab()
    preds = fill("And God said, Let there be [MASK].", top_k=4)
    assert len(preds) == 4 and all(0.0 <= p["score"] <= 1.0 for p in preds)
    assert all("[MASK]" not in p["sequence"] for p in preds)


def test_older_tag_and_existing_folder(trained):
    base, run, _ = trained
    out = base / "hf_old"
    run_cli("pretrain", ["export", "--checkpoint", str(RunDir(run).checkpoints / "step_00000003"), "--out", str(out)])
    before = (out / "model.safetensors").read_bytes()
    refused = run_cli("pretrain", ["export", "--checkpoint", str(run), "--out", str(out)], check=False)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert (out / "model.safetensors").read_bytes() == before
    run_cli("pretrain", ["export", "--checkpoint", str(run), "--out", str(out), "--overwrite"])
    assert (out / "model.safetensors").read_bytes() != before  # step 6 weights replaced step 3's
    assert sorted(p.name for p in base.iterdir() if p.name.startswith(".")) == []  # no temporary folders left


def test_killed_export_leaves_no_partial_folder(trained):
    """kill -9 as soon as the export starts writing: no output folder appears; the next export cleans up and succeeds."""
    import signal
    import time

    base, run, _ = trained
    out = base / "hf_killed"
    proc = python_process(["-m", "pretrain", "export", "--checkpoint", str(run), "--out", str(out)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not list(base.glob(".hf_killed.tmp-*")):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(base.glob(".hf_killed.tmp-*")), "the export finished before it could be killed"
    assert not out.exists()
    run_cli("pretrain", ["export", "--checkpoint", str(run), "--out", str(out)])
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    assert not list(base.glob(".hf_killed.tmp-*"))  # the killed writer's debris is gone


def test_a_run_whose_config_names_another_family_than_it_trained_exports_what_it_trained(trained, tmp_path):
    """Runs started before model.architecture had to match model.init_from's folder saved the model group's name (here
    ModernBERT) beside BERT weights: the export builds the family the model config recorded, as training did."""
    import json
    import shutil

    import yaml
    from transformers import AutoModelForMaskedLM

    from pretrain.checkpointing.checkpoint_dir import COMPLETE, CheckpointDir, file_manifest
    from pretrain.run_dir import CONFIG_FILE

    _, run, probe = trained
    old = tmp_path / "run"
    shutil.copytree(run, old)
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "config.json").write_text(json.dumps({"model_type": "bert"}))
    checkpoints = CheckpointDir(RunDir(old).checkpoints)
    for folder in [old, *(checkpoints.tag(tag) for tag in checkpoints.complete_tags())]:
        config = folder / CONFIG_FILE
        data = yaml.safe_load(config.read_text())
        data["model"].update(architecture="modernbert", init_from=str(teacher))
        config.write_text(yaml.safe_dump(data))
        if folder != old:  # the marker's record of the file, as the old run saved it
            marker = json.loads((folder / COMPLETE).read_text())
            marker["files"][CONFIG_FILE] = file_manifest(folder)[CONFIG_FILE]
            (folder / COMPLETE).write_text(json.dumps(marker))
    run_cli("pretrain", ["export", "--checkpoint", str(old), "--out", str(tmp_path / "hf")])
    model = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    assert type(model).__name__ == "BertForMaskedLM"
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    assert torch.allclose(logits, probe["logits"][""], atol=1e-5, rtol=0)
