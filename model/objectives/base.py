"""The one interface every objective implements; the trainer sees nothing else."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

Batch = dict[str, torch.Tensor]
# The loss to back-propagate, and named detached scalars (loss terms and metrics) to log.
ObjectiveResult = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass
class MLMOptions:
    """BERT MLM, optionally with a sentence-pair head (needs `packing: pairs` data)."""

    pair_head: Literal["none", "nsp", "sop"] = "none"


@dataclass
class ElectraOptions:
    """ELECTRA: generator size as fractions of the discriminator, and the RTD weight λ."""

    generator_width: float = 0.25
    generator_depth: float = 1.0
    rtd_weight: float = 50.0
    # mlm: replacements sampled from the generator; uniform: drawn uniformly (a plumbing check).
    generator: Literal["mlm", "uniform"] = "mlm"


@dataclass
class CocoLMOptions:
    """COCO-LM: generator size, loss weights, CLM form and SCL temperature."""

    generator_layers: int = 4
    # The paper's generator has the main model's width and fewer layers (1.0); a narrower one is a
    # weaker corrupter, as ELECTRA's 1/4-1/2 width generators are.
    generator_width: float = 1.0
    copy_weight: float = 50.0
    # weighted: CE weighted by stop-grad p_copy(0) (the authors' posted skeleton);
    # paper: -log(1[x = orig] sg(p1) + sg(p0) softmax(x_orig)).
    clm_form: Literal["weighted", "paper"] = "weighted"
    scl_temperature: float = 1.0
    scl_weight: float = 1.0
    # mlm: replacements sampled from the generator; uniform: drawn uniformly (a plumbing check).
    generator: Literal["mlm", "uniform"] = "mlm"


@dataclass
class TaCLOptions:
    """TaCL: token-level contrastive loss against a frozen teacher."""

    temperature: float = 0.01
    # The original code's softmax runs over all positions, padding included; the paper's does not.
    include_padding: bool = False
    # Variant (a): teacher tokens of the other sequences in the batch join the denominator.
    cross_sequence_negatives: bool = False
    pair_head: Literal["none", "nsp"] = "none"
    weight: float = 1.0


@dataclass
class TACOOptions:
    """TACO: token-alignment contrastive loss on the global semantic g = last hidden - embeddings."""

    temperature: float = 0.07
    negatives: int = 50
    masked_only: bool = False
    weight: float = 1.0


@dataclass
class ObjectiveConfig:
    """Which objective to train, and each objective's options."""

    name: Literal["mlm", "electra", "coco_lm", "tacl", "taco"] = "mlm"
    mlm: MLMOptions = field(default_factory=MLMOptions)
    electra: ElectraOptions = field(default_factory=ElectraOptions)
    coco_lm: CocoLMOptions = field(default_factory=CocoLMOptions)
    tacl: TaCLOptions = field(default_factory=TaCLOptions)
    taco: TACOOptions = field(default_factory=TACOOptions)


class Objective(nn.Module):
    """A module whose forward takes a batch and returns (loss, metrics).

    Subclasses implement `terms` (named, undetached loss terms plus detached metrics) and
    `weights`; forward sums the weighted terms. `hf_models` says what to export.
    """

    weights: dict[str, float] = {}

    @classmethod
    def check_config(cls, options, model, masking) -> None:
        """Raise ConfigError when these options cannot work with the model (EncoderConfig) and masking configs."""

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # pragma: no cover
        """(loss terms with graph, extra detached metrics) for one micro-batch."""
        raise NotImplementedError

    def forward(self, batch: Batch) -> ObjectiveResult:
        """Weighted sum of the terms, and every term and metric detached for logging."""
        terms, metrics = self.terms(batch)
        total = sum(self.weights.get(name, 1.0) * value for name, value in terms.items())
        return total, {**{name: value.detach() for name, value in terms.items()}, **metrics}

    def flops_per_token(self, seq_len: int, mask_prob: float = 0.15) -> float:  # pragma: no cover - interface
        """Training FLOPs per input token, every pass of every network counted (see model/flops.py)."""
        raise NotImplementedError

    def hf_models(self) -> dict[str, PreTrainedModel]:  # pragma: no cover - interface
        """The Hugging Face models to export, keyed by sub-folder ("" for the export's root)."""
        raise NotImplementedError
