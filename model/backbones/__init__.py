"""Backbone registry: a model config's `model_type` names the encoder family; objectives ask it for models."""
from __future__ import annotations

import importlib

from transformers import PretrainedConfig

from core.errors import ConfigError
from model.backbones.base import Backbone

# model_type -> "module:class", imported lazily.
REGISTRY = {
    "bert": "model.backbones.bert:BertBackbone",
    "modernbert": "model.backbones.modernbert:ModernBertBackbone",
    "albert": "model.backbones.albert:AlbertBackbone",
    "xlnet": "model.backbones.xlnet:XLNetBackbone",
}


def backbone_for(config: PretrainedConfig | str) -> Backbone:
    """The backbone of this transformers config (or model_type name)."""
    name = config if isinstance(config, str) else config.model_type
    if name not in REGISTRY:
        # Reached with a model.init_from folder of another family (e.g. RoBERTa): the user's choice.
        raise ConfigError(f"no backbone for model type {name!r} (model.init_from or model.architecture); "
                          f"known: {sorted(REGISTRY)}")
    module_name, cls_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)()


__all__ = ["Backbone", "REGISTRY", "backbone_for"]
