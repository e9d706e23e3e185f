"""`train.overlap_grad_reduce`: where the gradient all-reduce overlaps backward (DeepSpeed's overlap_comm at stages 1-3,
the gradient buckets at stage 0), what a DeepSpeed JSON of one's own may say against it, and what the buckets refuse."""
import json

import pytest

from core.config_io import load_config
from core.errors import ConfigError
from pretrain.config import RunConfig
from pretrain.engine import ds_config
from pretrain.engine.ds_config import build_ds_config, overlaps_grad_reduce
from pretrain.engine.setup import bucket_blockers


def test_alone_nothing_overlaps_and_auto_overlaps_at_stage_0_and_on_gpus_at_stages_1_2(monkeypatch):
    for setting in ("auto", True, False):
        assert overlaps_grad_reduce(setting, 1, 0) is False
    assert overlaps_grad_reduce(True, 2, 0) and overlaps_grad_reduce(True, 2, 3)
    assert not overlaps_grad_reduce(False, 8, 1)
    for cuda, stages in ((False, (0,)), (True, (0, 1, 2))):
        monkeypatch.setattr(ds_config, "_cuda", lambda cuda=cuda: cuda)
        assert [s for s in range(4) if overlaps_grad_reduce("auto", 2, s)] == list(stages)


def test_deepspeeds_overlap_comm_follows_the_setting_at_stages_1_to_3(tmp_path):
    def zero(*overrides, world=2, stage=1):
        cfg = load_config(RunConfig, None, ["train.micro_batch_size=4", "train.global_batch_size=16", *overrides])
        return build_ds_config(cfg, world, stage)["zero_optimization"]

    both = ("overlap_comm", "contiguous_gradients")
    assert [zero("train.overlap_grad_reduce=true")[k] for k in both] == [True, True]
    assert [zero()[k] for k in both] == [False, False]  # auto on CPU
    assert [zero("train.overlap_grad_reduce=true", stage=0)[k] for k in both] == [False, False]  # the buckets' stage
    assert [zero("train.overlap_grad_reduce=true", world=1)[k] for k in both] == [False, False]
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"zero_optimization": {"stage": "auto", "overlap_comm": False}}))
    assert zero(f"train.deepspeed_config={own}", "train.zero_stage=1")["overlap_comm"] is False  # auto: the file's
    with pytest.raises(ConfigError, match="'overlap_comm'=False but train.overlap_grad_reduce=true gives True"):
        zero(f"train.deepspeed_config={own}", "train.zero_stage=1", "train.overlap_grad_reduce=true")


def test_the_buckets_name_what_they_do_not_reproduce():
    assert bucket_blockers({"bf16": {"enabled": False}, "fp16": {"enabled": False}}) == ""
    found = bucket_blockers({"bf16": {"enabled": True}, "prescale_gradients": True, "gradient_predivide_factor": 2.0,
                             "gradient_allreduce_op": "sum"})
    for named in ("bf16 weights", "prescale_gradients=True", "gradient_predivide_factor=2.0", "gradient_allreduce_op='sum'"):
        assert named in found
    assert bucket_blockers({"gradient_allreduce_op": "mean", "gradient_predivide_factor": 1.0}) == ""


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="train.overlap_grad_reduce"):
        load_config(RunConfig, None, ["train.overlap_grad_reduce=sometimes"])
    with pytest.raises(ConfigError, match="train.grad_bucket_mb"):
        load_config(RunConfig, None, ["train.grad_bucket_mb=0"])
    assert load_config(RunConfig, None, ["train.overlap_grad_reduce=false"]).train.overlap_grad_reduce is False
