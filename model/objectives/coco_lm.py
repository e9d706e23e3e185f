"""COCO-LM: corrective language modelling and sequence contrastive learning on generator-corrupted text.

Meng et al. 2021, "COCO-LM: Correcting and Contrasting Text Sequences for Language Model
Pretraining" (microsoft/COCO-LM; the pre-training code was not released, the authors posted the
loss skeleton in the repository's issues). An auxiliary MLM generator (main width, fewer layers,
sharing word/position embeddings and the embedding LayerNorm, tied MLM head) fills 15% [MASK]ed
positions by sampling its softmax in a no-grad, dropout-free pass. The main Transformer reads
the corrupted text and learns:
- copy: Linear(H, 1) at every non-pad token, BCE against "unchanged"; weight 50;
- corrective LM at the masked positions: a tied head with bias; cross-entropy weighted by the
  stop-gradient probability of "replaced", p_copy(0) (the skeleton), or the paper's
  -log(1[x = orig] sg(p1) + sg(p0) softmax(x_orig));
- SCL: [CLS] through dense → GELU → LayerNorm, cosine similarity / τ between the corrupted
  sequence and a contiguous crop of the original; both views of the batch are the pool (2B − 2
  negatives per anchor); symmetric, averaged.
Total = generator MLM + 50 · copy + CLM + SCL. T5-style relative position buckets are not
implemented: they would make the export need custom code.
"""
from __future__ import annotations

import copy as copy_module
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForMaskedLM, BertModel, PreTrainedModel
from transformers.models.bert.modeling_bert import BertLMPredictionHead

from data_pipeline.masking import IGNORE_INDEX
from model import flops
from model.objectives.base import Batch, CocoLMOptions, Objective
from model.objectives.mlm import at_least_fp32, sparse_mlm


def copy_loss(copy_logits: torch.Tensor, unchanged: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean BCE of the copy head (target: the token is unchanged) over positions where mask is true."""
    losses = F.binary_cross_entropy_with_logits(at_least_fp32(copy_logits), unchanged.float(), reduction="none")
    mask = mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def corrective_lm_loss(clm_logits: torch.Tensor, targets: torch.Tensor, copy_logits: torch.Tensor,
                       corrupted: torch.Tensor, form: str = "weighted") -> torch.Tensor:
    """Corrective LM over N masked positions. clm_logits [N, V]; targets, copy_logits, corrupted [N].

    p1 = sigmoid(copy_logits) is P(unchanged), p0 = 1 - p1; both are stop-gradient here (the copy
    head learns from copy_loss only).
    weighted: mean_i p0_i · CE(clm_logits_i, target_i)
    paper:    mean_i -log(1[corrupted_i = target_i] · p1_i + p0_i · softmax(clm_logits_i)[target_i])
    """
    if targets.numel() == 0:
        return clm_logits.sum() * 0.0
    copy_logits = at_least_fp32(copy_logits.detach())
    log_probs = torch.log_softmax(at_least_fp32(clm_logits), dim=-1).gather(1, targets[:, None]).squeeze(1)
    if form == "weighted":
        return (torch.sigmoid(-copy_logits) * -log_probs).mean()
    # log(1[same]·p1 + p0·p) as a log-sum-exp of log-sigmoids: a saturated copy head (p0 rounding
    # to 0 in fp32) must not give -inf + -inf = inf and NaN gradients.
    log_p1 = torch.where(corrupted == targets, F.logsigmoid(copy_logits), torch.full_like(copy_logits, float("-inf")))
    return -torch.logaddexp(log_p1, F.logsigmoid(-copy_logits) + log_probs).mean()


def scl_loss(z_corrupted: torch.Tensor, z_crop: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Symmetric InfoNCE over the 2B [CLS] vectors: each view's positive is the other view of its sequence."""
    z = F.normalize(at_least_fp32(torch.cat([z_corrupted, z_crop])), dim=-1)
    n = z_corrupted.shape[0]
    sims = z @ z.T / temperature
    sims = sims.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sims, targets)


class CocoLM(Objective):
    """Main Transformer with copy, corrective-LM and SCL heads, plus the auxiliary generator."""

    def __init__(self, config: BertConfig, options: CocoLMOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        self.options = options
        self.main = BertModel.from_pretrained(init_from, config=config, add_pooling_layer=False) if init_from \
            else BertModel(config, add_pooling_layer=False)
        gen_config = copy_module.deepcopy(config)
        gen_config.num_hidden_layers = options.generator_layers
        self.generator = BertForMaskedLM(gen_config)
        self.generator.bert.embeddings = self.main.embeddings
        word_embeddings = self.main.embeddings.word_embeddings.weight
        self.generator.cls.predictions.decoder.weight = word_embeddings
        self.clm_head = BertLMPredictionHead(config)
        self.copy_head = nn.Linear(config.hidden_size, 1)
        self.scl_head = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.GELU(),
                                      nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps))
        for head in (self.clm_head, self.copy_head, self.scl_head):
            head.apply(self.main._init_weights)  # BERT's normal(0.02), not PyTorch's default
        # Tie only after initialising: the decoder must not re-initialise the shared embeddings.
        self.clm_head.decoder.weight = word_embeddings
        self.weights = {"copy_loss": options.copy_weight, "scl_loss": options.scl_weight}

    def _sample(self, masked: torch.Tensor, attention: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """Replacements from the generator's softmax, in a no-grad pass with dropout off."""
        was_training = self.generator.training
        self.generator.eval()
        with torch.no_grad():
            hidden = self.generator.bert(masked, attention_mask=attention).last_hidden_state
            logits = self.generator.cls.predictions(hidden[picked]).float()
            sampled = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        self.generator.train(was_training)
        return sampled

    def terms(self, batch: Batch):
        """Generator MLM, copy, corrective LM and SCL losses."""
        if "crop_input_ids" not in batch:
            raise ValueError("objective coco_lm needs the crop view: set masking.crop_ratio (0.9 in the paper)")
        masked, attention, original = batch["input_ids"], batch["attention_mask"], batch["original_input_ids"]
        labels = batch["labels"]
        picked = labels != IGNORE_INDEX
        gen_hidden = self.generator.bert(masked, attention_mask=attention).last_hidden_state
        gen_loss, gen_accuracy = sparse_mlm(gen_hidden, labels, self.generator.cls.predictions)
        corrupted = original.clone()
        corrupted[picked] = self._sample(masked, attention, picked)
        unchanged = corrupted == original
        hidden = self.main(corrupted, attention_mask=attention).last_hidden_state
        copy_logits = self.copy_head(hidden).squeeze(-1)
        copy = copy_loss(copy_logits, unchanged, attention.bool())
        clm_logits = self.clm_head(hidden[picked])
        clm = corrective_lm_loss(clm_logits, original[picked], copy_logits[picked], corrupted[picked], self.options.clm_form)
        crop_hidden = self.main(batch["crop_input_ids"], attention_mask=batch["crop_attention_mask"]).last_hidden_state
        scl = scl_loss(self.scl_head(hidden[:, 0]), self.scl_head(crop_hidden[:, 0]), self.options.scl_temperature)
        with torch.no_grad():
            metrics = {
                "generator_accuracy": gen_accuracy,
                "replaced_fraction": (~unchanged)[attention.bool()].float().mean(),
                "copy_accuracy": ((copy_logits > 0) == unchanged)[attention.bool()].float().mean(),
                "clm_accuracy": (clm_logits.argmax(-1) == original[picked]).float().mean() if picked.any() else gen_loss.new_zeros(()),
            }
        return {"generator_mlm_loss": gen_loss, "copy_loss": copy, "clm_loss": clm, "scl_loss": scl}, metrics

    def flops_per_token(self, seq_len: int, mask_prob: float = 0.15) -> float:
        """Generator trained + its no-grad sampling pass + main trained on the corrupted text and on the crop."""
        g, m = self.generator.config, self.main.config
        gen = flops.encoder_forward(g, seq_len) + mask_prob * flops.mlm_head_forward(g)
        ratio = 0.9  # COCO-LM's crop; the exact ratio only moves this estimate slightly
        main = flops.encoder_forward(m, seq_len) + mask_prob * flops.mlm_head_forward(m)
        crop = ratio * flops.encoder_forward(m, int(ratio * seq_len))
        return flops.TRAIN * (gen + main + crop) + gen

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The main Transformer as a BertModel (AutoModel), and the generator as a masked LM."""
        return {"": self.main, "generator": self.generator}
