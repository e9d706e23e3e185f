"""The one interface every objective implements; the trainer sees nothing else."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn
from transformers import PreTrainedModel

from data_pipeline.batches import OVER_BUDGET, SampleTransform, unpadded_key

if TYPE_CHECKING:  # the config sections are read here, never built: no import cycle with model.encoder
    from data_pipeline.masking import MaskingConfig
    from model.encoder import EncoderConfig

Batch = dict[str, Any]  # tensors, and the loader's per-batch flags (Python bools)
# The loss to back-propagate, and named detached scalars (loss terms and metrics) to log.
ObjectiveResult = tuple[torch.Tensor, dict[str, torch.Tensor]]


class Objective(nn.Module):
    """A module whose forward takes a batch and returns (loss, metrics).

    Subclasses implement `terms` (named, undetached loss terms plus detached metrics) and
    `weights`; forward sums the weighted terms. `hf_models` says what to export.
    """

    weights: dict[str, float] = {}
    # The dataclass of this objective's config section (`objective.<registry name>`): an objective owns its options.
    options_class: type = type(None)
    # The export's model card: what the folder holds (`{root}`, `{generator}`: the classes exported there), and
    # the transformers Auto class its usage snippet loads it with.
    export_holds: str = "`{root}`"
    export_loader: str = "AutoModel"
    # The masking's rate, bound when it is built (`build_objective`): the FLOPs of the sparse heads depend on it.
    mask_prob: float = 0.0
    # What it asks a backbone for (model.backbones.base.CAPABILITIES): it runs on every backbone that provides them.
    needs: frozenset[str] = frozenset({"masked_lm"})
    # The `masking.*` values it needs beyond the defaults (its paper's, where the value is free): `check_config` accepts
    # them, and the tests, the sweep and model.objectives.masking_overrides read them from here.
    masking: dict[str, Any] = {}
    # Methods compiled on their own beside the encoder layers under `train.compile: layers`: a head and its loss, which
    # eager runs as several passes over the vocabulary's logits (upcast, softmax, its gradient, the accuracy).
    compile_regions: tuple[str, ...] = ()
    # Rows of an MLM head's vocabulary projection fused with its loss per pass (`train.vocab_loss_chunk`, bound by the
    # engine set-up; 0: the head's logits whole). Every `sparse_mlm` of the objective passes it.
    vocab_loss_chunk: int = 0
    # Hand an encoder no attention mask for a column the loader padded nothing in (`encoder_mask`). Bound by the engine
    # set-up (`train.unpadded_mask`): off where the step is compiled whole, in which the mask measured faster.
    drop_unpadded_mask: bool = True

    @classmethod
    def check_config(cls, options: Any, model: EncoderConfig, masking: MaskingConfig) -> None:
        """Raise ConfigError when these options cannot work with the model (EncoderConfig) and masking configs."""

    @classmethod
    def check_data(cls, options: Any, packing: str, pair_task: Optional[str]) -> None:
        """Raise ConfigError when data prepared with this `packing` (and `pair_task`, for pairs) cannot train with these
        options: the run would learn another task than the one it names."""

    @classmethod
    def wrap_masking(cls, options: Any, transform: SampleTransform, pad_id: int, cls_id: int,
                     sep_id: int) -> SampleTransform:
        """The loader's per-sample transform for this objective: the masking itself, or views built around it."""
        return transform

    def encoder_mask(self, batch: Batch, column: str = "attention_mask") -> Optional[torch.Tensor]:
        """The attention mask an encoder gets for this column of the batch: none when the loader padded none of its
        rows, so transformers need not read the mask back from the device to find it all ones."""
        if self.drop_unpadded_mask and batch.get(unpadded_key(column)) is True:
            return None
        return batch[column]

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # pragma: no cover
        """(loss terms with graph, extra detached metrics) for one micro-batch."""
        raise NotImplementedError

    def forward(self, batch: Batch) -> ObjectiveResult:
        """Weighted sum of the terms, and every term and metric detached for logging."""
        # A batch over its prediction budget (under one in a million) runs eagerly: compiling its wider shape on its
        # rank alone would keep the other ranks waiting in the gradient all-reduce past train.step_timeout_s. (A
        # stance cannot change inside a compiled frame: forward itself stays uncompiled.)
        with torch.compiler.set_stance("force_eager") if batch.get(OVER_BUDGET) else contextlib.nullcontext():
            terms, metrics = self.terms(batch)
        total = sum(self.weights.get(name, 1.0) * value for name, value in terms.items())
        return total, {**{name: value.detach() for name, value in terms.items()}, **metrics}

    def flops_per_token(self, seq_len: int) -> float:  # pragma: no cover - interface
        """Training FLOPs per input token, every pass of every network counted (see model/flops.py), at `mask_prob`."""
        raise NotImplementedError

    def hf_models(self) -> dict[str, PreTrainedModel]:  # pragma: no cover - interface
        """The Hugging Face models to export, keyed by sub-folder ("" for the export's root)."""
        raise NotImplementedError

    def side_heads(self) -> dict[str, nn.Module]:
        """Heads transformers has no class for, saved beside the export's root by their `save(folder, name)`."""
        return {}

    def begin_step(self, step: int) -> None:
        """Called before the micro-batches of optimizer step `step` (1-based): staged objectives switch here."""
