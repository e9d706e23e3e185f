"""COCO-LM: corrective language modelling and sequence contrastive learning on generator-corrupted text.

Meng et al. 2021, "COCO-LM: Correcting and Contrasting Text Sequences for Language Model
Pretraining" (microsoft/COCO-LM: the model code with every head was released, the pre-training
loss was not; the authors posted the loss skeleton in the repository's issues). An auxiliary MLM
generator (main width, fewer layers: 2 small, 4 base; sharing the embedding module, tied MLM
head; `generator_width` < 1 makes it narrower, sharing embeddings where the widths allow) fills
15% [MASK]ed positions by sampling its softmax (no temperature) in a no-grad,
dropout-free pass. The main Transformer reads the corrupted text and learns:
- copy: Linear(H, 1) at every non-pad token, BCE against "unchanged" (a sample equal to the
  original counts as unchanged); weight 50;
- corrective LM at the masked positions: as the released model code, the tied embedding matrix
  plus a bias, with no transform; cross-entropy weighted by the stop-gradient probability of
  "replaced", p_copy(0) (the skeleton), or the paper's -log(1[x = orig] sg(p1) + sg(p0) softmax(x_orig));
- SCL: [CLS] through dense → GELU → LayerNorm, cosine similarity / τ (1) between the corrupted
  sequence and a contiguous crop of the original; both views of the batch are the pool (2B − 2
  negatives per anchor); symmetric, averaged.
Total = generator MLM + 50 · copy + CLM + SCL.

Where this differs from the paper: positions are transformers' own (the paper uses T5-style
relative buckets, 32 bins up to distance 128, which would make the export need custom code);
pretrain/configs/coco_lm.yaml uses ModernBERT's rotary positions (relative too), and BERT's
`relative_key_query` is the closest option on BERT. Masking picks exactly round(0.15 · n) tokens
(`masking.count=exact`) in that config.
`generator: uniform` draws replacements uniformly instead of from the generator (a plumbing check).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from core.config_io import check_range
from core.errors import ConfigError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig
from model import flops
from model.backbones import backbone_for
from model.diagnostics import detection_metrics, masked_mean, retrieval_accuracy
from model.objectives.base import Batch, Objective
from model.objectives.electra import sample_replacements
from model.objectives.mlm import (at_index, at_least_fp32, full_precision, prediction_accuracy, prediction_index,
                                  put_at_index, sparse_mlm)

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


def copy_loss(copy_logits: torch.Tensor, unchanged: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean BCE of the copy head (target: the token is unchanged) over positions where mask is true."""
    losses = F.binary_cross_entropy_with_logits(at_least_fp32(copy_logits), unchanged.float(), reduction="none")
    mask = mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def corrective_lm_loss(clm_logits: torch.Tensor, targets: torch.Tensor, copy_logits: torch.Tensor,
                       corrupted: torch.Tensor, form: str = "weighted") -> torch.Tensor:
    """Corrective LM over N masked positions. clm_logits [N, V]; targets, copy_logits, corrupted [N]; a target of
    IGNORE_INDEX (a row's padding up to its fixed count of positions) counts nowhere.

    p1 = sigmoid(copy_logits) is P(unchanged), p0 = 1 - p1; both are stop-gradient here (the copy
    head learns from copy_loss only).
    weighted: mean_i p0_i · CE(clm_logits_i, target_i)
    paper:    mean_i -log(1[corrupted_i = target_i] · p1_i + p0_i · softmax(clm_logits_i)[target_i])
    """
    if targets.numel() == 0:
        return clm_logits.sum() * 0.0
    copy_logits = at_least_fp32(copy_logits.detach())
    real = targets != IGNORE_INDEX
    targets = targets.clamp(min=0)
    log_probs = torch.log_softmax(at_least_fp32(clm_logits), dim=-1).gather(1, targets[:, None]).squeeze(1)
    if form == "weighted":
        losses = torch.sigmoid(-copy_logits) * -log_probs
    else:
        # log(1[same]·p1 + p0·p) as a log-sum-exp of log-sigmoids: a saturated copy head (p0 rounding
        # to 0 in fp32) must not give -inf + -inf = inf and NaN gradients.
        log_p1 = torch.where(corrupted == targets, F.logsigmoid(copy_logits), torch.full_like(copy_logits, float("-inf")))
        losses = -torch.logaddexp(log_p1, F.logsigmoid(-copy_logits) + log_probs)
    return torch.where(real, losses, 0.0).sum() / real.sum().clamp(min=1)


def scl_logits(z_corrupted: torch.Tensor, z_crop: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities / τ among the 2B [CLS] vectors (self excluded), and each row's positive column."""
    n = z_corrupted.shape[0]
    with full_precision(z_corrupted):
        z = F.normalize(at_least_fp32(torch.cat([z_corrupted, z_crop])), dim=-1)
        sims = z @ z.T / temperature
    sims = sims.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    # Row i's positive is row i + n, and row n + i's is row i: built on the device (a host tensor's copy would wait
    # for the device's queue, once a micro-step).
    targets = (torch.arange(2 * n, device=z.device) + n) % (2 * n)
    return sims, targets


def scl_loss(z_corrupted: torch.Tensor, z_crop: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Symmetric InfoNCE over the 2B [CLS] vectors: each view's positive is the other view of its sequence."""
    return F.cross_entropy(*scl_logits(z_corrupted, z_crop, temperature))


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

    def validate(self) -> None:
        """A generator of at least one layer and at most the main model's width; a positive temperature; weights
        that do not turn a loss into one maximised."""
        prefix = "objective.coco_lm"
        check_range(prefix, self, ("generator_layers",), at_least=1)
        check_range(prefix, self, ("generator_width",), above=0, at_most=1)
        check_range(prefix, self, ("scl_temperature",), above=0)
        check_range(prefix, self, ("copy_weight", "scl_weight"), at_least=0)


class CocoLM(Objective):
    """Main Transformer with copy, corrective-LM and SCL heads, plus the auxiliary generator."""

    needs = frozenset({"encoder", "generator"})
    export_holds = "the main Transformer as `{root}`; the auxiliary generator as `{generator}` in `generator/`"
    options_class = CocoLMOptions
    compile_regions = ("generator_predict", "correct")
    masking = {"strategy": "coco", "crop_ratio": 0.9}

    def __init__(self, config: PretrainedConfig, options: CocoLMOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.options = options
        self.main = self.backbone.encoder(config, init_from)
        self.generator = self.backbone.generator(config, options.generator_width, options.generator_layers, self.main)
        # The authors' released model code: the CLM head is the tied embedding matrix plus a zero-initialised
        # bias, with no transform; the copy head a Linear(H, 1); the SCL head dense -> GELU -> LayerNorm.
        self.clm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.copy_head = nn.Linear(config.hidden_size, 1)
        self.scl_head = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU(),
                                      nn.LayerNorm(config.hidden_size, eps=getattr(config, "layer_norm_eps", 1e-12)))
        for head in (self.copy_head, self.scl_head):
            for module in head.modules():
                if isinstance(module, nn.Linear):  # BERT's normal(0.02), not PyTorch's default
                    nn.init.normal_(module.weight, std=config.initializer_range)
                    nn.init.zeros_(module.bias)
        nn.init.zeros_(self.clm_head.bias)
        self.clm_head.weight = self.backbone.word_embeddings(self.main).weight
        self.weights = {"copy_loss": options.copy_weight, "scl_loss": options.scl_weight}

    @classmethod
    def check_config(cls, options: CocoLMOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """COCO-LM corrupts all-[MASK] input and contrasts a crop view."""
        if masking.strategy != "coco" or masking.crop_ratio is None:
            raise ConfigError("objective coco_lm corrupts all-[MASK] input and contrasts a crop: set masking.strategy=coco "
                              "and masking.crop_ratio=0.9")

    def _sample(self, masked: torch.Tensor, attention: Optional[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
        """Replacements [N] at the flat positions `index` from the generator's softmax (no-grad pass, dropout off), or
        uniform draws."""
        was_training = self.generator.training
        self.generator.eval()
        with torch.no_grad():
            hidden = self.backbone.encode(self.backbone.base(self.generator), masked, attention).last_hidden_state
            logits = self.backbone.mlm_head(self.generator)(at_index(hidden, index))
            sampled = sample_replacements(logits, self.options.generator)
        self.generator.train(was_training)
        return sampled

    def generator_predict(self, hidden: torch.Tensor, labels: torch.Tensor,
                          index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The generator's MLM loss and accuracy at the predicted flat positions `index`."""
        return sparse_mlm(hidden, labels, self.backbone.mlm_head(self.generator), index, self.vocab_loss_chunk)

    def correct(self, hidden: torch.Tensor, copy_logits: torch.Tensor, corrupted: torch.Tensor, targets: torch.Tensor,
                index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The corrective LM's loss and accuracy at the predicted flat positions `index` (`targets` [N]: the original
        token where a slot holds a masked position, IGNORE_INDEX in the padding slots)."""
        logits = at_least_fp32(self.clm_head(at_index(hidden, index)))  # one upcast for both
        loss = corrective_lm_loss(logits, targets, at_index(copy_logits, index), at_index(corrupted, index),
                                  self.options.clm_form)
        return loss, prediction_accuracy(logits, targets)

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Generator MLM, copy, corrective LM and SCL losses, with copy and SCL retrieval diagnostics."""
        if "crop_input_ids" not in batch:
            raise ConfigError("objective coco_lm needs the crop view: set masking.crop_ratio (0.9 in the paper)")
        masked, attention, original = batch["input_ids"], batch["attention_mask"], batch["original_input_ids"]
        labels, index = batch["labels"], prediction_index(batch)
        picked = at_index(labels, index) != IGNORE_INDEX  # [N]: the slots that hold a masked position
        bb = self.backbone
        given = self.encoder_mask(batch)
        gen_hidden = bb.encode(bb.base(self.generator), masked, given).last_hidden_state
        gen_loss, gen_accuracy = self.generator_predict(gen_hidden, labels, index)
        # Padding slots write back the original token (they all point at one unpicked position).
        kept = at_index(original, index)
        corrupted = put_at_index(original, index, torch.where(picked, self._sample(masked, given, index), kept))
        unchanged = corrupted == original
        hidden = bb.encode(self.main, corrupted, given).last_hidden_state
        copy_logits = self.copy_head(hidden).squeeze(-1)
        valid = attention.bool()
        copy = copy_loss(copy_logits, unchanged, valid)
        clm, clm_accuracy = self.correct(hidden, copy_logits, corrupted, torch.where(picked, kept, IGNORE_INDEX), index)
        crop = bb.encode(self.main, batch["crop_input_ids"], self.encoder_mask(batch, "crop_attention_mask"))
        crop_hidden = crop.last_hidden_state
        sims, targets = scl_logits(self.scl_head(hidden[:, 0]), self.scl_head(crop_hidden[:, 0]), self.options.scl_temperature)
        scl = F.cross_entropy(sims, targets)
        with torch.no_grad():
            metrics = {
                "generator_accuracy": gen_accuracy,
                "replaced_fraction": masked_mean(~unchanged, valid),
                "copy_accuracy": masked_mean((copy_logits > 0) == unchanged, valid),
                "clm_accuracy": clm_accuracy,
                # The replaced class scored by -copy_logit, so the AUC reads like ELECTRA's RTD AUC.
                **detection_metrics(-copy_logits.detach(), ~unchanged, valid, "copy"),
                "scl_retrieval_accuracy": retrieval_accuracy(sims.detach(), targets),
            }
        return {"generator_mlm_loss": gen_loss, "copy_loss": copy, "clm_loss": clm, "scl_loss": scl}, metrics

    def flops_per_token(self, seq_len: int) -> float:
        """Generator trained + its no-grad sampling pass + main trained on the corrupted text and on the crop."""
        mask_prob = self.mask_prob
        g, m = self.generator.config, self.main.config
        gen = flops.mlm_forward(g, seq_len, mask_prob)
        ratio = 0.9  # COCO-LM's crop; the exact ratio only moves this estimate slightly
        main = flops.mlm_forward(m, seq_len, mask_prob)
        crop = ratio * flops.encoder_forward(m, int(ratio * seq_len))
        return flops.TRAIN * (gen + main + crop) + gen

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The main Transformer as the backbone's bare encoder (AutoModel), and the generator as a masked LM."""
        return {"": self.main, "generator": self.generator}
