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

Two-stage training (the paper's §3.2 alternative, `two_stage_generator_steps: n`): for steps 1..n
only the generator trains, with MLM; then the discriminator starts from the generator's weights and
trains on RTD while the generator stays frozen. Both must have the same size. It is built so that
no trainable weight is ever overwritten (an optimizer's fp32 master copy would undo that): the
trainable encoder is the discriminator's from the start, and stage 1 trains it through an MLM head;
at the switch, that encoder and head are copied into a separate frozen generator, and the same
trainable weights go on as the discriminator. The switch happens at the start of step n + 1
(`begin_step`) and is recorded in the `switched` buffer, so a resume on either side of it (and an
export) sees the same model.
"""
from __future__ import annotations

import contextlib
import copy
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
from model.diagnostics import detection_metrics, masked_mean
from model.objectives.base import Batch, Objective
from model.objectives.mlm import at_index, at_least_fp32, prediction_index, put_at_index, sparse_mlm

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


def rtd_loss(logits: torch.Tensor, replaced: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy (target: token was replaced) over positions where mask is true."""
    losses = F.binary_cross_entropy_with_logits(at_least_fp32(logits), replaced.float(), reduction="none")
    mask = mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def sample_replacements(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """Tokens for the picked positions: a draw from the generator's softmax, or uniform over the vocabulary.

    The draw inverts the cumulative softmax at one uniform variate per row (u in [0, total), the first
    index whose cumulative probability exceeds u: a zero-probability token is never drawn).
    torch.multinomial draws an exponential variate for every vocabulary entry instead, many times slower on a CPU
    (BENCHMARKS.md, "Host overhead of a step").
    """
    if mode == "uniform":
        return torch.randint(logits.shape[-1], (logits.shape[0],), device=logits.device)
    cdf = torch.softmax(logits.float(), -1).cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)


@dataclass
class ElectraOptions:
    """ELECTRA: generator size as fractions of the discriminator, and the RTD weight λ."""

    generator_width: float = 0.25
    generator_depth: float = 1.0
    rtd_weight: float = 50.0
    # mlm: replacements sampled from the generator; uniform: drawn uniformly (a plumbing check).
    generator: Literal["mlm", "uniform"] = "mlm"
    # > 0: two-stage training, the generator alone with MLM for this many steps, then the discriminator
    # (initialised from it) with RTD against the frozen generator. Needs generator_width = generator_depth = 1.
    two_stage_generator_steps: int = 0

    def validate(self) -> None:
        """A generator width in (0, 1] of the discriminator's (a wider one was built at its width), a depth above 0
        (0 was built as one layer); a non-negative weight."""
        check_range("objective.electra", self, ("generator_width",), above=0, at_most=1)
        check_range("objective.electra", self, ("generator_depth",), above=0)
        check_range("objective.electra", self, ("rtd_weight",), at_least=0)


def copy_weights(source: nn.Module, target: nn.Module) -> None:
    """target's weights := source's (same architecture), also when ZeRO-3 holds both partitioned."""
    params = [p for p in (*source.parameters(), *target.parameters()) if hasattr(p, "ds_id")]
    gathered = contextlib.nullcontext()
    if params:  # ZeRO-3: gather both, copy, and let rank 0's result be re-partitioned (every rank copies the same)
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(params, modifier_rank=0)
    with gathered, torch.no_grad():
        target.load_state_dict(source.state_dict())


class Electra(Objective):
    """Generator and discriminator of the config's backbone, with shared embeddings where the widths allow."""

    needs = frozenset({"discriminator", "generator"})
    export_holds = ("the discriminator as `{root}` (encoder + replaced-token-detection head); the generator as "
                    "`{generator}` in `generator/`")
    options_class = ElectraOptions

    def __init__(self, config: PretrainedConfig, options: ElectraOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.options = options
        self.discriminator = self.backbone.discriminator(config, init_from)
        layers = max(1, round(config.num_hidden_layers * options.generator_depth))
        self.generator = self.backbone.generator(config, options.generator_width, layers, self.discriminator)
        self.weights = {"rtd_loss": options.rtd_weight}
        self.two_stage = options.two_stage_generator_steps > 0
        if self.two_stage:
            # Stage 1's generator: the discriminator's own encoder under an MLM head (tied to its embeddings).
            self.stage_one = self.generator
            self.backbone.share_base(self.discriminator, self.stage_one)
            # The frozen generator of stage 2: its own copy of everything, filled at the switch.
            self.generator = copy.deepcopy(self.stage_one).requires_grad_(False).eval()
            self.register_buffer("switched", torch.zeros((), dtype=torch.long))
        # The buffer read once (after any checkpoint load), so each micro-batch does not sync with the device.
        self._switched: Optional[bool] = None

    @classmethod
    def check_config(cls, options: ElectraOptions, model: EncoderConfig, masking: MaskingConfig) -> None:
        """Two-stage training initialises the discriminator from the generator: same size, sampled replacements."""
        if options.two_stage_generator_steps < 0:
            raise ConfigError("config key 'objective.electra.two_stage_generator_steps' must be >= 0")
        if options.two_stage_generator_steps and (options.generator_width != 1.0 or options.generator_depth != 1.0
                                                  or options.generator != "mlm"):
            raise ConfigError("objective.electra.two_stage_generator_steps needs a generator of the discriminator's "
                              "size (generator_width=1.0, generator_depth=1.0) sampling from its MLM (generator=mlm)")

    def train(self, mode: bool = True) -> "Electra":
        """Train mode for the trainable models; the frozen two-stage generator always samples without dropout."""
        super().train(mode)
        if self.two_stage:
            self.generator.eval()
        return self

    @property
    def stage(self) -> int:
        """1 while only the generator trains (two-stage, before the switch), else 2."""
        if not self.two_stage:
            return 2
        if self._switched is None:
            self._switched = bool(self.switched)
        return 2 if self._switched else 1

    def begin_step(self, step: int) -> None:
        """At the first step after the generator-only phase, freeze a copy of the generator and go on with RTD."""
        if self.two_stage and step > self.options.two_stage_generator_steps and self.stage == 1:
            copy_weights(self.stage_one, self.generator)
            self.switched.fill_(1)
            self._switched = True

    def terms(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Generator MLM and discriminator RTD losses, with the RTD head's detection diagnostics."""
        if self.two_stage:
            return self._stage_one_terms(batch) if self.stage == 1 else self._stage_two_terms(batch)
        types = batch.get("token_type_ids")
        gen_base = self.backbone.base(self.generator)
        gen_head = self.backbone.mlm_head(self.generator)
        gen_hidden = self.backbone.encode(gen_base, batch["input_ids"], self.encoder_mask(batch),
                                          types).last_hidden_state
        index = prediction_index(batch)
        gen_loss, gen_accuracy = sparse_mlm(gen_hidden, batch["labels"], gen_head, index, self.vocab_loss_chunk)
        with torch.no_grad():
            logits = gen_head(at_index(gen_hidden, index).detach())
            sampled = sample_replacements(logits, self.options.generator)
        rtd, metrics = self._detect(batch, index, sampled)
        return {"generator_mlm_loss": gen_loss, "rtd_loss": rtd}, {"generator_accuracy": gen_accuracy, **metrics}

    def _detect(self, batch: Batch, index: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The discriminator on the input with `sampled` [N] at the predicted flat positions `index` (padding slots,
        whose label is ignored, keep their token): RTD loss and detection metrics."""
        attention, ids = batch["attention_mask"], batch["input_ids"]
        picked = at_index(batch["labels"], index) != IGNORE_INDEX
        corrupted = put_at_index(ids, index, torch.where(picked, sampled, at_index(ids, index)))
        replaced = corrupted != batch["original_input_ids"]
        disc_logits = self.backbone.rtd_logits(self.discriminator, corrupted, self.encoder_mask(batch),
                                               batch.get("token_type_ids"))
        valid = attention.bool()
        rtd = rtd_loss(disc_logits, replaced, valid)
        with torch.no_grad():
            metrics = {"rtd_accuracy": masked_mean((disc_logits > 0) == replaced, valid),
                       "replaced_fraction": masked_mean(replaced, valid),
                       **detection_metrics(disc_logits, replaced, valid, "rtd")}
        return rtd, metrics

    def _stage_one_terms(self, batch: Batch):
        """Two-stage, before the switch: MLM through the (future discriminator's) encoder; no RTD yet."""
        hidden = self.backbone.encode(self.backbone.base(self.stage_one), batch["input_ids"], self.encoder_mask(batch),
                                      batch.get("token_type_ids")).last_hidden_state
        loss, accuracy = sparse_mlm(hidden, batch["labels"], self.backbone.mlm_head(self.stage_one),
                                    prediction_index(batch), self.vocab_loss_chunk)
        return {"generator_mlm_loss": loss}, {"generator_accuracy": accuracy, "electra_stage": loss.new_tensor(1.0)}

    def _stage_two_terms(self, batch: Batch):
        """Two-stage, after the switch: RTD against the frozen generator's samples (its MLM loss is a metric)."""
        types = batch.get("token_type_ids")
        index = prediction_index(batch)
        with torch.no_grad():
            gen_hidden = self.backbone.encode(self.backbone.base(self.generator), batch["input_ids"],
                                              self.encoder_mask(batch), types).last_hidden_state
            head = self.backbone.mlm_head(self.generator)
            gen_loss, gen_accuracy = sparse_mlm(gen_hidden, batch["labels"], head, index, self.vocab_loss_chunk)
            sampled = sample_replacements(head(at_index(gen_hidden, index)), "mlm")
        rtd, metrics = self._detect(batch, index, sampled)
        # Stage 1's MLM head is unused now, but ZeRO-3 keeps a parameter's last gradient once it stops getting
        # one, and that stale gradient would go on moving the head and counting in the clipping norm: the head
        # runs on zero rows, so its gradient is an exact zero every step.
        rtd = rtd + self.backbone.mlm_head(self.stage_one)(gen_hidden[:0]).sum()
        metrics.update(generator_mlm_loss=gen_loss, generator_accuracy=gen_accuracy, electra_stage=rtd.new_tensor(2.0))
        return {"rtd_loss": rtd}, metrics

    def flops_per_token(self, seq_len: int) -> float:
        """Generator (trained, MLM head at masked tokens) + discriminator (trained, 1-unit head at every token).

        Two-stage: stage 1 trains the generator only; stage 2 trains the discriminator and runs the frozen
        generator forward (1×)."""
        mask_prob = self.mask_prob
        d = self.discriminator.config
        disc = flops.encoder_forward(d, seq_len) + 2 * d.hidden_size * (d.hidden_size + 1)
        generator = flops.mlm_forward(self.generator.config, seq_len, mask_prob)
        if not self.two_stage:
            return flops.TRAIN * (generator + disc)
        return flops.TRAIN * generator if self.stage == 1 else flops.TRAIN * disc + generator

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The discriminator with its RTD head (AutoModel loads its encoder), and the generator (two-stage:
        the frozen one after the switch, the MLM head over the discriminator's encoder before it)."""
        generator = self.stage_one if self.two_stage and self.stage == 1 else self.generator
        return {"": self.discriminator, "generator": generator}
