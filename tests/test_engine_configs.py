"""The DeepSpeed config matrix on 2 CPU ranks (bf16; fp16 needs a GPU), LAMB, and exact resume under ZeRO-3."""
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, run_cli

pytestmark = pytest.mark.slow


def _args(data, out, *extra):
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=16", "train.eval_every=0", "schedule.warmup_steps=2",
            "optimizer.lr=3e-3", *extra]


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.parametrize("ds_config,extra", [
    ("zero1_bf16", ["train.precision=bf16"]),
    ("zero2_bf16", ["train.precision=bf16"]),
    ("zero3_bf16", ["train.precision=bf16"]),
    ("zero2_offload_bf16", ["train.precision=bf16"]),
    ("zero0", ["optimizer.name=lamb", "optimizer.lr=1e-2"]),
])
def test_config_trains_on_two_ranks(prepared, tmp_path, ds_config, extra):
    out = tmp_path / "run"
    run_cli("pretrain", _args(prepared, out, f"train.deepspeed_config=deepspeed_configs/{ds_config}.json",
                              "train.max_steps=8", "train.save_every=8", *extra), nproc=2)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 9)) and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert losses[8] < losses[1]
    meta = json.loads((out / "checkpoints" / "step_00000008" / "meta.json").read_text())
    assert meta["zero_stage"] == int(ds_config[4]) and meta["world_size"] == 2


def test_precision_mismatch_is_named(prepared, tmp_path):
    proc = run_cli("pretrain", _args(prepared, tmp_path / "run", "train.deepspeed_config=deepspeed_configs/zero2_bf16.json"),
                   nproc=1, check=False)
    assert proc.returncode == 2 and "enabled" in proc.stderr and "auto" in proc.stderr


@pytest.mark.parametrize("ds_config,precision", [("zero3", "fp32"), ("zero2_bf16", "bf16")])
def test_zero_resume_is_exact(prepared, tmp_path, ds_config, precision):
    """ZeRO-3 in fp32, and ZeRO-2 in bf16 (DeepSpeed's bf16 optimizer, fp32 master partitions in the checkpoint)."""
    z3 = [f"train.deepspeed_config=deepspeed_configs/{ds_config}.json", f"train.precision={precision}",
          "train.max_steps=12", "train.save_every=4", "model.dropout=0.1", "model.attention_dropout=0.1",
          "train.record_samples=true"]
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run_cli("pretrain", _args(prepared, straight, *z3), nproc=2)
    run_cli("pretrain", _args(prepared, out, *z3, "train.stop_after=6"), nproc=2)
    run_cli("pretrain", _args(prepared, out, *z3), nproc=2)
    assert _losses(out) == _losses(straight)
    samples = lambda run: (run / "samples" / "rank1.jsonl").read_text()  # noqa: E731
    assert samples(out) == samples(straight) and samples(out).count("\n") == 12
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    a = get_fp32_state_dict_from_zero_checkpoint(str(straight / "checkpoints"), tag="step_00000012")
    b = get_fp32_state_dict_from_zero_checkpoint(str(out / "checkpoints"), tag="step_00000012")
    assert all(torch.equal(a[k], b[k]) for k in a)
