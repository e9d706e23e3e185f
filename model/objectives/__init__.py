"""Objective registry: the config names an objective, this builds it; the trainer never imports one."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Literal, Optional

from transformers import PretrainedConfig

from core.errors import ConfigError
from data_pipeline.masking import MaskingConfig
from model import backbones
from model.backbones import backbone_for
from model.encoder import EncoderConfig, model_config
from model.objectives.base import Objective

# name -> "module:class"; imported lazily so one objective's dependencies never load another's.
REGISTRY = {
    "mlm": "model.objectives.mlm:MaskedLM",
    "electra": "model.objectives.electra:Electra",
    "coco_lm": "model.objectives.coco_lm:CocoLM",
    "tacl": "model.objectives.tacl:TaCL",
    "taco": "model.objectives.taco:TACO",
    "spanbert": "model.objectives.spanbert:SpanBert",
    "declutr": "model.objectives.declutr:Declutr",
    "xlnet": "model.objectives.xlnet_plm:XLNetPLM",
}


def objective_class(name: str) -> type[Objective]:
    """The class registered under this objective name."""
    if name not in REGISTRY:
        raise ConfigError(f"config key 'objective.name': unknown objective {name!r}; known: {sorted(REGISTRY)}")
    module_name, cls_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def _objective_config_class() -> type:
    """The `objective` config section: the objective's name, and one section of options per registered objective.

    Built from the registry, so adding an objective adds its section; every section is typed (an unknown key
    or a wrong value in any of them is a ConfigError), and only the named objective's section is used.
    """
    sections = [(name, objective_class(name).options_class) for name in REGISTRY]
    fields = [("name", Literal[tuple(REGISTRY)], dataclasses.field(default="mlm"))]
    fields += [(name, cls, dataclasses.field(default_factory=cls)) for name, cls in sections]
    cls = dataclasses.make_dataclass("ObjectiveConfig", fields)
    cls.__module__ = __name__
    cls.__doc__ = "Which objective to train, and each registered objective's options."
    return cls


ObjectiveConfig = _objective_config_class()


def check_objective_config(cfg: ObjectiveConfig, model, masking) -> None:
    """The named objective's own checks of its options against the model and masking configs (ConfigError)."""
    cls = objective_class(cfg.name)
    if not model.init_from:  # an init_from folder's family is checked when the objective is built
        _check_architecture(cls, cfg.name, model.architecture)
    cls.check_config(getattr(cfg, cfg.name), model, masking)


def runs_on(cls: type[Objective]) -> list[str]:
    """The registered backbones that provide everything this objective needs."""
    return [name for name in backbones.REGISTRY if cls.needs <= backbone_for(name).provides]


def _check_architecture(cls: type[Objective], name: str, architecture: str) -> None:
    missing = cls.needs - backbone_for(architecture).provides
    if missing:
        raise ConfigError(f"objective.name={name} runs on model.architecture {', '.join(runs_on(cls))}, not "
                          f"{architecture} (it has no {', '.join(sorted(missing))})")


def build_objective(cfg: ObjectiveConfig, config: PretrainedConfig, init_from: Optional[str] = None,
                    mask_prob: float = MaskingConfig.mask_prob) -> Objective:
    """The objective named in the config around an encoder of this config (weights from init_from if set), trained
    on data masked at `mask_prob` (`masking.mask_prob`)."""
    cls = objective_class(cfg.name)
    _check_architecture(cls, cfg.name, config.model_type)
    objective = cls(config, getattr(cfg, cfg.name), init_from)
    objective.mask_prob = mask_prob
    return objective


def build_for_run(cfg: ObjectiveConfig, model: EncoderConfig, masking: MaskingConfig, tokenizer: dict,
                  seq_len: int) -> tuple[Objective, PretrainedConfig]:
    """The named objective for a training run (its options checked already: `check_objective_config`), and the
    transformers config of its encoder, made for the data's tokenizer and length. The masking rate is bound, and
    `data_transform` is the loader's view of the masking (`wrap_masking` with its options)."""
    cls, options = objective_class(cfg.name), getattr(cfg, cfg.name)
    config = model_config(model, tokenizer, seq_len)
    _check_architecture(cls, cfg.name, config.model_type)
    objective = cls(config, options, model.init_from)
    objective.mask_prob = masking.mask_prob
    objective.data_transform = functools.partial(cls.wrap_masking, options)
    return objective, config


__all__ = ["Objective", "ObjectiveConfig", "build_for_run", "build_objective", "check_objective_config", "objective_class", "runs_on", "REGISTRY"]
