"""BERT masked language modelling with a sparse prediction head, and optional NSP / SOP.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding" (google-research/bert, run_pretraining.py: the loss is computed only at the
masked positions, and the output projection is tied to the input embeddings). SOP: Lan et al.
2020, "ALBERT" (google-research/albert): the same 2-way head, predicting swapped segment order.

Where this differs from the paper: BERT used Adam β2 = 0.999 and 10% of steps at seq 512 after
seq 128; the project's optimizer default is RoBERTa's β2 = 0.98 (set `optimizer.betas` to match
BERT) and sequence length is the dataset's. On BERT the model is `BertForPreTraining` even without
a pair task (the pooler and NSP head then stay frozen), so the export has Google's layout.
Validation shows every picked token as [MASK] (the 80/10/10 mix reads lower).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel

from core.errors import ConfigError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, positions_of
from model import flops
from model.backbones import REGISTRY, backbone_for
from model.objectives.base import Batch, Objective
from model.vocabulary_loss import Head, VocabularyHead, at_least_fp32, linear_cross_entropy, unique_top_hits

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


def full_precision(x: torch.Tensor) -> torch.autocast:
    """A region where autocast is off: a similarity matmul inside it runs in x's dtype, not in bf16/fp16.

    Contrastive logits are cos / τ with τ as small as 0.01: a bf16 cosine (3 significant digits) moves a
    logit by up to 0.4 and the loss's gradient by several percent."""
    return torch.autocast(x.device.type, enabled=False)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not IGNORE_INDEX (0 when there are none).

    logits: [N, V] at the selected positions; labels: [N].
    """
    # Sum over count rather than a branch on keep.any(): no host sync in the hot loop, and with nothing
    # picked the loss is a 0 that keeps the graph, so every rank still runs backward.
    # The softmax of a 30k vocabulary needs more than bf16's 8 mantissa bits.
    losses = F.cross_entropy(at_least_fp32(logits), labels, ignore_index=IGNORE_INDEX, reduction="none")
    return losses.sum() / (labels != IGNORE_INDEX).sum().clamp(min=1)


def check_pair_data(key: str, pair_head: str, packing: str, pair_task: Optional[str]) -> None:
    """Refuse data whose pair labels are not the task `pair_head` names (ConfigError naming `key` and the data's)."""
    if pair_head == "none" or (packing == "pairs" and pair_task == pair_head):
        return
    has = f"packing={packing}" + (f" pair_task={pair_task}" if packing == "pairs" else "")
    raise ConfigError(f"{key}={pair_head} needs data prepared with packing=pairs pair_task={pair_head} (data.path has "
                      f"{has})")


def pair_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """NSP / SOP: mean 2-way cross-entropy over the batch. logits [B, 2], labels [B] in {0, 1}."""
    return F.cross_entropy(at_least_fp32(logits), labels, reduction="mean")


def prediction_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of the targets (not IGNORE_INDEX) whose logit is their row's unique maximum; 0 when there are none, with
    no host sync.

    A target tied with another entry for the maximum counts as wrong: bf16 logits tie at the top of a large
    vocabulary often enough to matter, and a head that gives every token the same score must score 0, not 1.
    Pass the float32 logits the loss upcast anyway (a bf16 reduction over a vocabulary row is slower on a CPU).
    """
    with torch.no_grad():
        real = targets != IGNORE_INDEX
        hits = unique_top_hits(logits, targets.clamp(min=0), by_count=logits.device.type != "cpu")
        return (hits & real).sum().float() / real.sum().clamp(min=1)


def prediction_positions(batch: Batch) -> torch.Tensor:
    """[B, K]: the positions the step predicts, a fixed count per row (the loader's `masked_positions`; 0 pads), for
    a term that works row by row (TaCL's contrast); the vocabulary heads read `prediction_index`."""
    if "masked_positions" in batch:
        return batch["masked_positions"]
    return positions_from_labels(batch["labels"])


def prediction_index(batch: Batch) -> torch.Tensor:
    """[N]: the flat positions (into the batch's B · L tokens) the vocabulary heads predict, a fixed count per batch
    shape: the loader's `prediction_index` (its picks, then an unpicked position), or every row's slots in turn.

    A row's slots make room for five standard deviations of its picks, a batch's for five of the batch's: under
    `masking.count: bernoulli` at 128 tokens, 0.51 of the rows through a head at 256 rows, 0.74 at 4."""
    if "prediction_index" in batch:
        return batch["prediction_index"]
    return flat_positions(prediction_positions(batch), batch["labels"].shape[1])


def flat_positions(index: torch.Tensor, length: int) -> torch.Tensor:
    """index [B, K] of positions within rows of `length` → [B · K] positions into the flattened batch."""
    return (torch.arange(index.shape[0], device=index.device)[:, None] * length + index).flatten()


def at_index(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, L, ...] at flat positions index [N] (`prediction_index`) → [N, ...]."""
    return x.flatten(0, 1).index_select(0, index)


def put_at_index(x: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A copy of x [B, L] with values [N] at the flat positions index [N] (a padding slot puts back its own value)."""
    return x.flatten().scatter(0, index, values).view_as(x)


def positions_from_labels(labels: torch.Tensor) -> torch.Tensor:
    """[B, K]: the labelled positions of a batch built without the loader's masking, as many per row as its fullest
    row holds (a host read, and a width that changes from batch to batch: not what the compiled step reads)."""
    picked = labels != IGNORE_INDEX
    return positions_of(picked, int(picked.sum(1).max()) if picked.numel() else 0)


def at_positions(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, L, ...] at index [B, K] → [B, K, ...]: a gather of fixed shape, where boolean indexing has none."""
    if x.dim() == 2:
        return x.gather(1, index)
    return x.gather(1, index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:]))


def sparse_mlm(hidden: torch.Tensor, labels: torch.Tensor, head: Head, index: Optional[torch.Tensor] = None,
               chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the MLM head only at the predicted flat positions `index` [N] (`prediction_index(batch)`; found from
    the labels when None); return (loss, accuracy). Slots labelled IGNORE_INDEX (padding) count in neither.
    `chunk` > 0 (`train.vocab_loss_chunk`, the objective's `vocab_loss_chunk`): the head's projection and loss fused,
    that many rows at a time (model/vocabulary_loss.py); the head must be a VocabularyHead."""
    index = flat_positions(positions_from_labels(labels), labels.shape[1]) if index is None else index
    targets = at_index(labels, index)
    rows = at_index(hidden, index)
    if chunk:
        if not isinstance(head, VocabularyHead):
            raise ConfigError(f"train.vocab_loss_chunk={chunk} needs a backbone whose mlm_head is a VocabularyHead "
                              f"(got {type(head).__name__}); set train.vocab_loss_chunk=0")
        projection = head.projection
        total, hits = linear_cross_entropy(head.transform(rows), projection.weight, projection.bias, targets, chunk)
        count = (targets != IGNORE_INDEX).sum().clamp(min=1)
        return total / count, hits.sum().float() / count
    logits = at_least_fp32(head(rows))  # one upcast for the loss and the accuracy
    return mlm_loss(logits, targets), prediction_accuracy(logits, targets)


@dataclass
class MLMOptions:
    """BERT MLM, optionally with a sentence-pair head (needs `packing: pairs` data)."""

    pair_head: Literal["none", "nsp", "sop"] = "none"


class MaskedLM(Objective):
    """Encoder + tied MLM head (+ NSP/SOP head on BERT); the vocabulary projection runs only at picked positions."""

    export_loader = "AutoModelForMaskedLM"
    options_class = MLMOptions
    compile_regions = ("predict",)

    def __init__(self, config: PretrainedConfig, options: MLMOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.pair_head = options.pair_head
        self.model = self.backbone.masked_lm(config, init_from, pair_head=self.pair_head != "none")

    @classmethod
    def check_config(cls, options: MLMOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """Sentence-pair heads need token types and a pooler (BERT, ALBERT)."""
        if options.pair_head != "none" and not backbone_for(model.architecture).has_pair_head:
            having = [name for name in REGISTRY if backbone_for(name).has_pair_head]
            raise ConfigError(f"objective.mlm.pair_head={options.pair_head} needs model.architecture="
                              f"{' or '.join(having)} ({model.architecture} has no token types or pooler)")

    @classmethod
    def check_data(cls, options: MLMOptions, packing: str, pair_task: Optional[str]) -> None:
        """A sentence-pair head learns the pair task the data was prepared with: NSP's labels under an SOP head would
        train next-sentence prediction and log it as sop_loss."""
        check_pair_data("objective.mlm.pair_head", options.pair_head, packing, pair_task)

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """MLM loss (+ NSP/SOP loss) and accuracies."""
        out = self.backbone.encode(self.backbone.base(self.model), batch["input_ids"], self.encoder_mask(batch),
                                   batch.get("token_type_ids"))
        loss, accuracy = self.predict(out.last_hidden_state, batch["labels"], prediction_index(batch))
        terms = {"mlm_loss": loss}
        metrics = {"mlm_accuracy": accuracy}
        if self.pair_head != "none":
            if "pair_label" not in batch:
                raise ConfigError(f"objective.mlm.pair_head={self.pair_head} needs data prepared with packing=pairs")
            logits = self.backbone.pair_logits(self.model, out.pooler_output)
            terms[f"{self.pair_head}_loss"] = pair_loss(logits, batch["pair_label"])
            metrics[f"{self.pair_head}_accuracy"] = (logits.argmax(-1) == batch["pair_label"]).float().mean()
        return terms, metrics

    def predict(self, hidden: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLM head's loss and accuracy at the predicted flat positions `index`."""
        return sparse_mlm(hidden, labels, self.backbone.mlm_head(self.model), index, self.vocab_loss_chunk)

    def flops_per_token(self, seq_len: int) -> float:
        """Encoder + sparse MLM head, trained."""
        mask_prob = self.mask_prob
        return flops.TRAIN * flops.mlm_forward(self.model.config, seq_len, mask_prob)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The masked LM (Bert/AlbertForPreTraining with a pair head, which AutoModelForMaskedLM also loads)."""
        return {"": self.model}
