"""`train.zero_stage: auto` and the bf16 mode a resumed run keeps: pure decisions, checked against hand-counted bytes."""
import json
from pathlib import Path

import pytest

from core.config_io import load_config
from core.errors import ConfigError
from pretrain.config import RunConfig
from pretrain.engine.ds_config import bf16_weights_for, build_ds_config
from pretrain.engine.zero_stage import choose_stage, model_state_bytes

GIB = 2**30
REPO = Path(__file__).resolve().parents[2]


def test_model_state_bytes_shard_what_each_stage_shards():
    # 1000 trainable + 200 frozen parameters, 4 ranks: weights 4 B, gradients 4 B, Adam 8 B per trainable parameter.
    assert model_state_bytes(1000, 200, 0, 4) == 4 * 1200 + 4 * 1000 + 8 * 1000
    assert model_state_bytes(1000, 200, 1, 4) == 4 * 1200 + 4 * 1000 + 8 * 1000 / 4
    assert model_state_bytes(1000, 200, 2, 4) == 4 * 1200 + 4 * 1000 / 4 + 8 * 1000 / 4
    assert model_state_bytes(1000, 200, 3, 4) == 4 * 1200 / 4 + 4 * 1000 / 4 + 8 * 1000 / 4


def test_auto_picks_zero_alone_the_lowest_stage_that_fits_else_and_the_checkpoints_stage_on_resume():
    bert_base = 110_000_000  # 16 B each unsharded: 1.64 GiB
    stage, why = choose_stage(bert_base, 0, 1, 80 * GIB, "GPU memory")
    assert stage == 0 and why.startswith("one rank") and "1.64 GiB" in why
    assert choose_stage(bert_base, 0, 1, 1 * GIB)[0] == 0  # alone no stage helps, even when it does not fit
    # Several ranks whose gradients can go in buckets during backward: nothing sharded, where it fits.
    stage, why = choose_stage(bert_base, 0, 8, 80 * GIB, "GPU memory", buckets=True)
    # 16 B a parameter of states and 4 B of the buckets' flat copy of the gradients: 2.05 GiB.
    assert stage == 0 and why.startswith("8 ranks: nothing sharded") and "2.05 GiB per rank" in why and "buckets" in why
    assert choose_stage(bert_base, 0, 8, 80 * GIB)[0] == 1  # without the buckets: optimizer states sharded
    # 7B parameters on 8 ranks with 80 GiB each: stage 0 needs 16 B/param = 104.3 GiB > 40, stage 1 4+4+1 = 9 B/param
    # = 58.7 GiB > 40; stage 2 needs 4 + 0.5 + 1 = 5.5 B/param = 35.9 GiB <= 40.
    seven_b = 7_000_000_000
    assert choose_stage(seven_b, 0, 8, 80 * GIB)[0] == 2
    assert choose_stage(seven_b, 0, 8, 80 * GIB, buckets=True)[0] == 2
    # 1B parameters in 36 GB (18 GB for states): 16 B/param of states fit, 20 B with the buckets' copy do not; stage 1's
    # 9 B/param on 8 ranks do.
    assert choose_stage(1_000_000_000, 0, 8, 36e9, buckets=True)[0] == 1
    # On 2 ranks of 40 GiB nothing but stage 3 comes close, and it is named as not fitting.
    stage, why = choose_stage(seven_b, 0, 2, 40 * GIB)
    assert stage == 3 and "do not fit" in why
    # A run that resumes keeps its checkpoints' stage, whatever fits now.
    assert choose_stage(bert_base, 0, 1, 80 * GIB, resumed_stage=2) == (2, "the run's checkpoints were saved at stage 2")


def test_stage_0_over_several_ranks_needs_its_gradient_buckets(tmp_path):
    """`auto` takes stage 0 over several ranks only where the buckets would run: train.overlap_grad_reduce allows them
    and the stage-0 DeepSpeed config holds nothing they do not reproduce (DeepSpeed's bf16 weights), or can be built
    at all (a JSON of one's own that fixes another stage)."""
    from torch import nn

    from pretrain.engine.setup import stage0_buckets, zero_stage_for

    run_yaml = REPO / "pretrain" / "configs" / "demo_mlm.yaml"
    cfg = lambda *extra: load_config(RunConfig, run_yaml, ["train.zero_stage=auto", *extra])  # noqa: E731
    assert stage0_buckets(cfg(), 2, {}) and not stage0_buckets(cfg(), 1, {})
    assert not stage0_buckets(cfg("train.overlap_grad_reduce=false"), 2, {})
    bf16_weights, fixed = tmp_path / "bf16_weights.json", tmp_path / "stage2.json"
    bf16_weights.write_text(json.dumps({"bf16": {"enabled": True}}))
    fixed.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert not stage0_buckets(cfg("train.precision=bf16", f"train.deepspeed_config={bf16_weights}"), 2, {})
    assert not stage0_buckets(cfg(f"train.deepspeed_config={fixed}"), 2, {})
    assert not stage0_buckets(cfg("train.offload_optimizer=true"), 2, {})  # optimizer offload needs ZeRO 1-3
    model = nn.Linear(10, 10)
    stage, note = zero_stage_for(cfg(), model, 2, {})
    assert stage == 0 and note.startswith("ZeRO stage 0 (train.zero_stage=auto: 2 ranks: nothing sharded"), note
    assert zero_stage_for(cfg("train.offload_optimizer=true"), model, 2, {})[0] == 1
    # A stage the JSON fixes is the one auto takes (before, auto chose another and the config then refused it).
    assert zero_stage_for(cfg(f"train.deepspeed_config={fixed}"), model, 2, {}) == \
        (2, f"ZeRO stage 2 (train.zero_stage=auto: {fixed} sets it)")
    build_ds_config(cfg(f"train.deepspeed_config={fixed}"), 2, 2)  # and its config builds
    # LAMB runs at stage 0 only: auto takes it even where the buckets are off.
    lamb = cfg("optimizer.name=lamb", "train.overlap_grad_reduce=false")
    assert zero_stage_for(lamb, model, 2, {})[0] == 0 and build_ds_config(lamb, 2, 0)["zero_optimization"]["stage"] == 0
    assert zero_stage_for(cfg(), model, 2, {"zero_stage": 2})[0] == 2  # a resumed run keeps its checkpoints' stage


def test_a_resumed_bf16_run_keeps_the_mode_its_checkpoints_were_saved_in(tmp_path):
    run_yaml = "pretrain/configs/demo_mlm.yaml"
    cfg = load_config(RunConfig, run_yaml, ["train.precision=bf16"])
    assert bf16_weights_for(cfg, {}) is None  # a new run: the JSON decides (autocast by default)
    assert bf16_weights_for(cfg, {"precision": "bf16", "bf16_weights": False}) is False
    assert bf16_weights_for(cfg, {"precision": "bf16", "bf16_weights": True}) is True
    assert bf16_weights_for(cfg, {"precision": "bf16"}) is True  # saved before autocast was the default
    ds = build_ds_config(cfg, 1, 2, bf16_weights_for(cfg, {"precision": "bf16"}))
    assert ds["bf16"]["enabled"] is True and ds["torch_autocast"]["enabled"] is False
    # A JSON that names the other mode explicitly is refused by name; "auto" follows the checkpoint.
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"bf16": {"enabled": True}}))
    mine = load_config(RunConfig, run_yaml, ["train.precision=bf16", f"train.deepspeed_config={own}"])
    with pytest.raises(ConfigError, match="saved with bf16 autocast .* cannot change it on resume"):
        bf16_weights_for(mine, {"precision": "bf16", "bf16_weights": False})
    own.write_text(json.dumps({"bf16": {"enabled": "auto"}}))
    assert bf16_weights_for(mine, {"precision": "bf16", "bf16_weights": False}) is False


def test_zero_stage_accepts_auto_or_a_stage_and_names_anything_else():
    assert load_config(RunConfig, None, []).train.zero_stage == "auto"
    assert load_config(RunConfig, None, ["train.zero_stage=3"]).train.zero_stage == 3
    with pytest.raises(ConfigError, match="train.zero_stage"):
        load_config(RunConfig, None, ["train.zero_stage=4"])
    with pytest.raises(ValueError, match="must be resolved"):
        build_ds_config(load_config(RunConfig, None, []), 1)


def test_compile_is_refused_at_zero_3_by_name():
    with pytest.raises(ConfigError, match="train.compile=true needs ZeRO stage 0-2"):
        load_config(RunConfig, None, ["train.compile=true", "train.zero_stage=3"])
    with pytest.raises(ConfigError, match="train.compile=layers needs ZeRO stage 0-2"):
        load_config(RunConfig, None, ["train.compile=layers", "train.zero_stage=3"])
    assert load_config(RunConfig, None, ["train.compile=true"]).train.compile is True
    assert load_config(RunConfig, None, ["train.compile=layers"]).train.compile == "layers"
    with pytest.raises(ConfigError, match="train.compile=auto needs ZeRO stage 0-2"):
        load_config(RunConfig, None, ["train.compile=auto", "train.zero_stage=3"])
    with pytest.raises(ConfigError, match="train.compile"):
        load_config(RunConfig, None, ["train.compile=fast"])


@pytest.mark.parametrize("family, tables, mode", [
    ("bert", False, "layers"), ("albert", False, "layers"), ("xlnet", False, "layers"), ("modernbert", True, "step"),
    # ModernBERT's whole step computing cos and sin in the graph measured slower than its layers.
    ("modernbert", False, "layers")])
def test_compile_auto_takes_the_mode_the_backbone_measured_fastest_in(family, tables, mode):
    from pretrain.engine.setup import compile_mode_for

    cfg = load_config(RunConfig, None, ["train.compile=auto", f"model.architecture={family}"])
    assert compile_mode_for(cfg, tables) == (mode, f"train.compile=auto: {mode} (what {family} measured fastest in on a GPU)")
    for given in (True, "layers", "step", False):  # any other value is applied as it is, without a note
        cfg.train.compile = given
        assert compile_mode_for(cfg, tables) == (given, "")


def test_an_unresolved_compile_mode_is_a_bug_not_a_silent_eager_run():
    from torch import nn

    from pretrain.engine.deepspeed_engine import compile_objective

    with pytest.raises(ValueError, match="compile mode 'auto'"):
        compile_objective(nn.Linear(2, 2), "auto")
    assert compile_objective(nn.Linear(2, 2), False) == ""


def test_repeated_layers_are_the_encoder_layers_of_every_backbone():
    """What train.compile compiles: the layers in innermost ModuleLists, checked against each family's own layer class."""
    from transformers import AlbertConfig, AlbertModel, BertConfig, BertModel, ModernBertConfig, ModernBertModel

    from pretrain.engine.deepspeed_engine import repeated_layers

    small = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=100, pad_token_id=0)
    models = {"BertLayer": (BertModel(BertConfig(num_hidden_layers=3, **small)), 3),
              "ModernBertEncoderLayer": (ModernBertModel(ModernBertConfig(num_hidden_layers=3, **small)), 3),
              "AlbertLayer": (AlbertModel(AlbertConfig(num_hidden_layers=3, embedding_size=16, **small)), 1)}
    for name, (model, count) in models.items():
        layers = repeated_layers(model)
        assert [type(layer).__name__ for layer in layers] == [name] * count, name
