"""Objective registry: the config names an objective, this builds it; the trainer never imports one."""
from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Literal, Optional

from transformers import PretrainedConfig

from core.errors import ConfigError
from data_pipeline.batches import SampleTransform
from data_pipeline.masking import MaskingConfig
from model import backbones
from model.backbones import backbone_for
from model.objectives.base import Objective

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig

# name -> "module:class". Every one is imported when this package builds the `objective` config section (each
# objective owns its options class), so an objective's module imports only what is installed with the project.
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


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
    """An objective resolved once from its config section: its class and options (checked by `resolve_objective`)."""

    name: str
    cls: type[Objective]
    options: Any

    def data_transform(self, transform: SampleTransform, pad_id: int, cls_id: int, sep_id: int) -> SampleTransform:
        """The loader's per-sample transform: the masking itself, or the objective's views built around it."""
        return self.cls.wrap_masking(self.options, transform, pad_id, cls_id, sep_id)

    def check_data(self, manifest: dict[str, Any]) -> None:
        """Raise ConfigError when the prepared dataset (its manifest's packing and pair task) cannot train this
        objective as configured."""
        self.cls.check_data(self.options, manifest.get("packing", "full"), manifest.get("pair_task"))

    def build(self, config: PretrainedConfig, init_from: Optional[str] = None,
              mask_prob: float = MaskingConfig.mask_prob) -> Objective:
        """The objective around an encoder of this HF config (weights from init_from if set), trained on data masked
        at `mask_prob` (`masking.mask_prob`, which its FLOPs depend on)."""
        _check_architecture(self.cls, self.name, config.model_type)
        objective = self.cls(config, self.options, init_from)
        objective.mask_prob = mask_prob
        return objective


def resolve_objective(cfg: ObjectiveConfig, model: EncoderConfig, masking: MaskingConfig) -> ObjectiveSpec:
    """The named objective, its own checks of its options against the model and masking configs passed (ConfigError)."""
    cls, options = objective_class(cfg.name), getattr(cfg, cfg.name)
    if not model.init_from:  # an init_from folder's family is checked when the objective is built
        _check_architecture(cls, cfg.name, model.architecture)
    if masking is not None and masking.strategy == "plm" and cls.masking.get("strategy") != "plm":
        # plm masks nothing: it leaves the input whole for XLNet's permutation, and any other objective would learn
        # to copy its input.
        raise ConfigError(f"masking.strategy=plm is XLNet's (objective.name=xlnet); objective.name={cfg.name} needs "
                          f"masking that hides tokens ({' '.join(masking_overrides(cfg.name)) or 'masking.strategy=bert'})")
    cls.check_config(options, model, masking)
    return ObjectiveSpec(cfg.name, cls, options)


def masking_overrides(name: str) -> list[str]:
    """The `masking.*` overrides the named objective needs (its class's `masking`), as `key=value` strings."""
    return [f"masking.{key}={value}" for key, value in objective_class(name).masking.items()]


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
    on data masked at `mask_prob` (`masking.mask_prob`); its options unchecked against a model section."""
    return ObjectiveSpec(cfg.name, objective_class(cfg.name), getattr(cfg, cfg.name)).build(config, init_from, mask_prob)


__all__ = ["Objective", "ObjectiveConfig", "ObjectiveSpec", "build_objective", "resolve_objective", "objective_class",
           "masking_overrides", "runs_on", "REGISTRY"]
