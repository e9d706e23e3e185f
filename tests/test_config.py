"""Typed config loading: YAML + overrides, and errors that name the key."""
import pytest

from core.config_io import ConfigError, load_config
from data_pipeline.config import PrepareConfig
from pretrain.config import RunConfig


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 7\noptimizer:\n  lr: 1.0e-3\n")
    cfg = load_config(RunConfig, path, ["train.max_steps=9", "optimizer.betas=[0.8, 0.9]", "masking.mask_prob=0.2"])
    assert cfg.train.max_steps == 9
    assert cfg.optimizer.lr == 1e-3
    assert cfg.optimizer.betas == (0.8, 0.9)
    assert cfg.masking.mask_prob == 0.2
    assert load_config(RunConfig, None, ["optimizer.lr=3e-4"]).optimizer.lr == 3e-4  # YAML 1.1 reads this as a string


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match="train.max_stepz"):
        load_config(RunConfig, None, ["train.max_stepz=3"])
    path = tmp_path / "c.yaml"
    path.write_text("optimiser:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="optimiser"):
        load_config(RunConfig, path)


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_config(RunConfig, None, ["train.max_steps=many"])
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(RunConfig, None, ["train.precision=fp8"])
    with pytest.raises(ConfigError, match="masking.mask_prob"):
        load_config(RunConfig, None, ["masking.mask_prob=1.5"])
    with pytest.raises(ConfigError, match="model.hidden_size"):
        load_config(RunConfig, None, ["model.hidden_size=30", "model.num_heads=4"])


def test_list_of_sections():
    cfg = load_config(PrepareConfig, None, ["sources=[{kind: json, path: a.jsonl, text_column: body}]"])
    assert cfg.sources[0].kind == "json" and cfg.sources[0].text_column == "body"
    with pytest.raises(ConfigError, match=r"sources\[0\].colour"):
        load_config(PrepareConfig, None, ["sources=[{path: a.txt, colour: red}]"])


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config(RunConfig, "/nonexistent/run.yaml")


def test_global_batch_must_divide():
    from pretrain.ds_config import gradient_accumulation

    assert gradient_accumulation(32, 4, 2) == 4
    with pytest.raises(ConfigError, match="global_batch_size=30"):
        gradient_accumulation(30, 4, 2)


def test_every_example_config_loads_and_passes_its_objective_checks():
    """The shipped run configs are valid: typed keys, and each objective's own checks against model and masking."""
    from pathlib import Path

    from model.objectives import check_objective_config

    configs = sorted((Path(__file__).resolve().parents[1] / "pretrain" / "configs").glob("*.yaml"))
    assert len(configs) >= 7
    for path in configs:
        overrides = ["model.init_from=."] if "tacl" in path.name else []  # TaCL's teacher folder is the user's
        cfg = load_config(RunConfig, path, overrides)
        if "tacl" not in path.name:
            check_objective_config(cfg.objective, cfg.model, cfg.masking)
