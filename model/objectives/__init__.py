"""Objective registry: the config names an objective, this builds it; the trainer never imports one."""
from __future__ import annotations

import importlib
from typing import Optional

from transformers import BertConfig

from model.objectives.base import Objective, ObjectiveConfig

# name -> "module:class"; imported lazily so one objective's dependencies never load another's.
REGISTRY = {
    "mlm": "model.objectives.mlm:MaskedLM",
    "electra": "model.objectives.electra:Electra",
    "coco_lm": "model.objectives.coco_lm:CocoLM",
    "tacl": "model.objectives.tacl:TaCL",
    "taco": "model.objectives.taco:TACO",
}


def build_objective(cfg: ObjectiveConfig, config: BertConfig, init_from: Optional[str] = None) -> Objective:
    """Instantiate the objective named in the config around a BERT of this shape (weights from init_from if set)."""
    if cfg.name not in REGISTRY:
        raise ValueError(f"unknown objective {cfg.name!r}; known: {sorted(REGISTRY)}")
    module_name, cls_name = REGISTRY[cfg.name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(config, getattr(cfg, cfg.name), init_from)


__all__ = ["Objective", "ObjectiveConfig", "build_objective", "REGISTRY"]
