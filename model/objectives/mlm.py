"""BERT masked language modelling with a sparse prediction head.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (google-research/bert, run_pretraining.py: the loss is computed only at the
masked positions, and the output projection is tied to the input embeddings).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, PreTrainedModel

from data_pipeline.masking import IGNORE_INDEX
from model.objectives.base import Batch, Objective, ObjectiveResult


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not IGNORE_INDEX (0 when there are none).

    logits: [N, V] at the selected positions; labels: [N].
    """
    keep = labels != IGNORE_INDEX
    if not bool(keep.any()):
        return logits.sum() * 0.0  # keeps the graph so every rank still runs backward
    logits = logits[keep]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the softmax of a 30k vocabulary needs more than 8 mantissa bits
    return F.cross_entropy(logits, labels[keep], reduction="mean")


class MaskedLM(Objective):
    """BERT encoder + tied MLM head; the vocabulary projection runs only at the picked positions."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.model = BertForMaskedLM(config)

    def forward(self, batch: Batch) -> ObjectiveResult:
        """MLM loss and accuracy on one masked micro-batch."""
        hidden = self.model.bert(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch.get("token_type_ids"),
        ).last_hidden_state
        picked = batch["labels"] != IGNORE_INDEX
        labels = batch["labels"][picked]
        logits = self.model.cls(hidden[picked])
        loss = mlm_loss(logits, labels)
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == labels).float().mean() if labels.numel() else loss.new_zeros(())
        return loss, {"mlm_loss": loss.detach(), "mlm_accuracy": accuracy}

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """Exported as BertForMaskedLM, so `pipeline("fill-mask")` works."""
        return {"": self.model}
