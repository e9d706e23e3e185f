"""ELECTRA: a small MLM generator corrupts the input; the discriminator detects replaced tokens.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
Generators" (google-research/electra, run_pretraining.py): the generator is a smaller
Transformer sharing the token and position embeddings with the discriminator; replacements are
sampled from its softmax without gradient (a sample equal to the original counts as not
replaced); the discriminator's binary loss runs over all non-pad tokens with weight λ = 50;
total = generator MLM + λ · RTD.

Paper defaults and where this differs:
- generator input: of the picked tokens 85% become [MASK] and 15% stay (no random tokens): set
  `masking.mask_token_fraction=0.85 masking.random_token_fraction=0` (pretrain/configs/electra.yaml);
  ELECTRA picks exactly round(0.15 · n) positions: `masking.count=exact`;
- Adam β2 = 0.999 and ε = 1e-6 (configs/electra.yaml; the project's optimizer default is β2 0.98);
- the discriminator is transformers' ElectraForPreTraining on BERT and ModernBertForTokenClassification
  (one label) on ModernBERT; a ModernBERT generator narrower than the discriminator cannot share
  the embeddings (no projection in ModernBERT) and keeps its own;
- `generator: uniform` replaces the picked tokens with uniform draws from the vocabulary instead
  of the generator's samples: a plumbing check that the discriminator can learn at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel

from data_pipeline.masking import IGNORE_INDEX
from model import flops
from model.backbones import backbone_for
from model.diagnostics import detection_metrics
from model.objectives.base import Batch, Objective
from model.objectives.mlm import at_least_fp32, sparse_mlm


def rtd_loss(logits: torch.Tensor, replaced: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy (target: token was replaced) over positions where mask is true."""
    losses = F.binary_cross_entropy_with_logits(at_least_fp32(logits), replaced.float(), reduction="none")
    mask = mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def sample_replacements(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """Tokens for the picked positions: a draw from the generator's softmax, or uniform over the vocabulary."""
    if mode == "uniform":
        return torch.randint(logits.shape[-1], (logits.shape[0],), device=logits.device)
    return torch.multinomial(torch.softmax(logits.float(), -1), 1).squeeze(1)


@dataclass
class ElectraOptions:
    """ELECTRA: generator size as fractions of the discriminator, and the RTD weight λ."""

    generator_width: float = 0.25
    generator_depth: float = 1.0
    rtd_weight: float = 50.0
    # mlm: replacements sampled from the generator; uniform: drawn uniformly (a plumbing check).
    generator: Literal["mlm", "uniform"] = "mlm"


class Electra(Objective):
    """Generator and discriminator of the config's backbone, with shared embeddings where the widths allow."""

    options_class = ElectraOptions

    def __init__(self, config: PretrainedConfig, options: ElectraOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.options = options
        self.discriminator = self.backbone.discriminator(config, init_from)
        layers = max(1, round(config.num_hidden_layers * options.generator_depth))
        self.generator = self.backbone.generator(config, options.generator_width, layers, self.discriminator)
        self.weights = {"rtd_loss": options.rtd_weight}

    def terms(self, batch: Batch):
        """Generator MLM and discriminator RTD losses, with the RTD head's detection diagnostics."""
        attention = batch["attention_mask"]
        types = batch.get("token_type_ids")
        gen_base = self.backbone.base(self.generator)
        gen_head = self.backbone.mlm_head(self.generator)
        gen_hidden = self.backbone.encode(gen_base, batch["input_ids"], attention, types).last_hidden_state
        gen_loss, gen_accuracy = sparse_mlm(gen_hidden, batch["labels"], gen_head)
        picked = batch["labels"] != IGNORE_INDEX
        with torch.no_grad():
            sampled = sample_replacements(gen_head(gen_hidden[picked].detach()), self.options.generator)
        corrupted = batch["input_ids"].clone()
        corrupted[picked] = sampled
        replaced = corrupted != batch["original_input_ids"]
        disc_logits = self.backbone.rtd_logits(self.discriminator, corrupted, attention, types)
        valid = attention.bool()
        rtd = rtd_loss(disc_logits, replaced, valid)
        with torch.no_grad():
            metrics = {"generator_accuracy": gen_accuracy,
                       "rtd_accuracy": ((disc_logits > 0) == replaced)[valid].float().mean(),
                       "replaced_fraction": replaced[valid].float().mean(),
                       **detection_metrics(disc_logits, replaced, valid, "rtd")}
        return {"generator_mlm_loss": gen_loss, "rtd_loss": rtd}, metrics

    def flops_per_token(self, seq_len: int, mask_prob: float = 0.15) -> float:
        """Generator (trained, MLM head at masked tokens) + discriminator (trained, 1-unit head at every token)."""
        d = self.discriminator.config
        disc = flops.encoder_forward(d, seq_len) + 2 * d.hidden_size * (d.hidden_size + 1)
        return flops.TRAIN * (flops.mlm_forward(self.generator.config, seq_len, mask_prob) + disc)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The discriminator with its RTD head (AutoModel loads its encoder), and the generator."""
        return {"": self.discriminator, "generator": self.generator}
