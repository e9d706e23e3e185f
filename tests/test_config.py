"""Typed config loading: YAML + overrides, and errors that name the key."""
import pytest

from core.config_io import load_config
from core.errors import ConfigError
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


def test_an_objective_is_one_file_plus_a_registry_entry(tmp_path, monkeypatch):
    """A new objective's options become the typed section objective.<name>, with no shared file edited."""
    import dataclasses
    import sys

    import model.objectives as objectives

    (tmp_path / "toy_objective.py").write_text(
        "from dataclasses import dataclass\n"
        "from model.objectives.base import Objective\n\n"
        "@dataclass\nclass ToyOptions:\n    alpha: float = 1.0\n\n"
        "class Toy(Objective):\n    options_class = ToyOptions\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(objectives.REGISTRY, "toy", "toy_objective:Toy")
    monkeypatch.delitem(sys.modules, "toy_objective", raising=False)
    config_class = objectives._objective_config_class()
    run_class = dataclasses.make_dataclass("Run", [("objective", config_class, dataclasses.field(default_factory=config_class))])

    cfg = load_config(run_class, None, ["objective.name=toy", "objective.toy.alpha=2.5"])
    assert cfg.objective.name == "toy" and cfg.objective.toy.alpha == 2.5
    assert cfg.objective.electra.generator_width == 0.25  # the registered objectives keep their sections
    with pytest.raises(ConfigError, match="objective.toy.beta"):
        load_config(run_class, None, ["objective.toy.beta=1"])
    with pytest.raises(ConfigError, match="objective.toy.alpha"):
        load_config(run_class, None, ["objective.toy.alpha=[1, 2]"])
    # The project's own config, built without the entry, refuses the name.
    with pytest.raises(ConfigError, match="'toy' is not one of"):
        load_config(RunConfig, None, ["objective.name=toy"])
