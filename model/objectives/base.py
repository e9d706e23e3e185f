"""The one interface every objective implements; the trainer sees nothing else."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

Batch = dict[str, torch.Tensor]
# The loss to back-propagate, and named detached scalars (loss terms and metrics) to log.
ObjectiveResult = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass
class ObjectiveConfig:
    """Which objective to train."""

    name: Literal["mlm"] = "mlm"


class Objective(nn.Module):
    """A module whose forward takes a batch and returns (loss, metrics)."""

    def forward(self, batch: Batch) -> ObjectiveResult:  # pragma: no cover - interface
        """Compute the loss and its metrics for one micro-batch."""
        raise NotImplementedError

    def hf_models(self) -> dict[str, PreTrainedModel]:  # pragma: no cover - interface
        """The Hugging Face models to export, keyed by sub-folder ("" for the export's root)."""
        raise NotImplementedError
