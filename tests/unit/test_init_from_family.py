"""`model.init_from` decides the model's family: `model.architecture` unset follows the folder, and set to another
family is refused in one line naming both (before, a ModernBERT run config with a BERT folder trained BERT silently)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config_io import load_config
from core.errors import ConfigError
from model.encoder import EncoderConfig, model_config
from pretrain.config import RunConfig

DEMO = Path(__file__).resolve().parents[2] / "pretrain" / "configs" / "demo_mlm.yaml"  # its model group: modernbert


def folder(tmp_path: Path, name: str, content: str) -> str:
    """A model folder holding only a config.json with `content` (the family is read from it, not the weights)."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(content, encoding="utf-8")
    return str(path)


def test_an_unset_architecture_is_the_folders_family_or_bert(tmp_path):
    modern = folder(tmp_path, "modern", json.dumps({"model_type": "modernbert"}))
    assert EncoderConfig(init_from=modern).architecture == "modernbert"
    albert = folder(tmp_path, "albert", json.dumps({"model_type": "albert"}))
    assert EncoderConfig(init_from=albert).architecture == "albert"
    assert EncoderConfig().architecture == "bert"
    # Nothing to read, or a family no backbone builds: bert, and the folder is refused where it is read (below).
    for path in (str(tmp_path / "absent"), folder(tmp_path, "roberta", json.dumps({"model_type": "roberta"})),
                 folder(tmp_path, "damaged", '{"model_type": "modern'), folder(tmp_path, "list", "[1, 2]")):
        assert EncoderConfig(init_from=path).architecture == "bert", path
    # In a run config: `null` lets the folder decide whatever a model group named.
    cfg = load_config(RunConfig, DEMO, [f"model.init_from={modern}", "model.architecture=null"])
    assert cfg.model.architecture == "modernbert"
    assert load_config(RunConfig, DEMO, []).model.architecture == "modernbert"  # no folder: the group's choice


def test_an_architecture_that_is_not_the_folders_family_is_refused_naming_both(tmp_path):
    bert = folder(tmp_path, "bert", json.dumps({"model_type": "bert"}))
    # The mistake benchmarks/gpu_throughput.py made: a ModernBERT point (the demo's model group here), a BERT teacher.
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, DEMO, [f"model.init_from={bert}"])
    assert str(err.value) == (f"config key 'model.architecture' is modernbert, but model.init_from '{bert}' holds a "
                              "bert model: set model.architecture=bert, or leave it unset (then the folder's family is "
                              "used)")
    named = load_config(RunConfig, DEMO, [f"model.init_from={bert}", "model.architecture=bert"])
    assert named.model.architecture == "bert"
    # Built without the loader's check (a script's own EncoderConfig), the model config refuses it all the same.
    with pytest.raises(ConfigError, match="'model.architecture' is modernbert, but model.init_from .* holds a bert"):
        model_config(EncoderConfig(architecture="modernbert", init_from=bert), {"vocab_size": 100}, 64)


def test_a_folder_of_an_unregistered_family_is_still_named_as_such(tmp_path):
    roberta = folder(tmp_path, "roberta", json.dumps({"model_type": "roberta"}))  # no weights: the family first
    with pytest.raises(ConfigError, match=r"'model.init_from': '.*roberta' is a roberta model; supported: bert"):
        model_config(EncoderConfig(init_from=roberta), {"vocab_size": 100}, 64)


def test_tacls_sentence_pair_head_needs_a_bert_folder(tmp_path):
    """TaCL's NSP head reads the family the folder resolved to (ModernBERT has no pooler or token types)."""
    from model.objectives import resolve_objective

    nsp = ["objective.name=tacl", "objective.tacl.pair_head=nsp", "model.architecture=null"]
    for family, refused in (("modernbert", True), ("bert", False)):
        teacher = folder(tmp_path, family, json.dumps({"model_type": family}))
        cfg = load_config(RunConfig, DEMO, [*nsp, f"model.init_from={teacher}"])
        if refused:
            with pytest.raises(ConfigError, match=r"pair_head=nsp needs a BERT teacher \(modernbert has no NSP head\)"):
                resolve_objective(cfg.objective, cfg.model, cfg.masking)
        else:
            assert resolve_objective(cfg.objective, cfg.model, cfg.masking).name == "tacl"
