"""Every config error a user can make is reported with the key or file it concerns (exit code 2, no traceback)."""
import pytest

from conftest import TINY_MODEL, run_cli
from pretrain.cli import main as pretrain_main


@pytest.mark.parametrize("override,expected", [
    ("train.max_stepz=3", "train.max_stepz"),
    ("train.max_steps=lots", "train.max_steps"),
    ("train.precision=fp8", "train.precision"),
    ("train.deepspeed_config=deepspeed_configs/nope.json", "nope.json"),
    ("train.global_batch_size=30", "global_batch_size=30"),
    ("masking.strategy=random", "masking.strategy"),
    ("objective.name=bert", "objective.name"),
    ("objective.coco_lm.copy_weigth=1", "objective.coco_lm.copy_weigth"),
    ("model.hidden_size=30 model.num_heads=4", "model.hidden_size"),
    ("model.vocab_size=123", "model.vocab_size"),
    ("model.init_from=/nonexistent/bert", "model.init_from"),
    ("objective.name=tacl", "model.init_from"),
    ("data.path=/nonexistent/data", "/nonexistent/data"),
    ("optimizer.impl=deepspeed optimizer.name=lamb train.deepspeed_config=deepspeed_configs/zero0.json", "optimizer.impl=torch"),
    ("train.precision=fp16", "train.precision=fp16"),
    ("optimizer.name=lamb", "zero0.json"),
    ("objective.name=coco_lm", "masking.strategy=coco"),
])
def test_config_errors_are_named(prepared, tmp_path, capsys, override, expected):
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={tmp_path / 'run'}",
            *TINY_MODEL, "train.micro_batch_size=4", *override.split()]
    if expected in ("model.vocab_size", "model.init_from", "/nonexistent/data", "optimizer.impl=torch", "global_batch_size=30",
                    "train.precision=fp16", "zero0.json", "masking.strategy=coco") \
            or override.startswith("train.deepspeed_config"):
        proc = run_cli("pretrain", args, nproc=1, check=False)  # needs the process group: a subprocess
        code, err = proc.returncode, proc.stderr
    else:
        code, err = pretrain_main(args), capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert expected in err and "Traceback" not in err


def test_missing_config_file(capsys):
    assert pretrain_main(["train", "--config", "/nonexistent/run.yaml"]) == 2
    assert "/nonexistent/run.yaml" in capsys.readouterr().err
