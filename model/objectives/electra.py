"""ELECTRA: a small MLM generator corrupts the input; the discriminator detects replaced tokens.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
Generators" (google-research/electra, run_pretraining.py): the generator is a smaller
Transformer sharing the token and position embeddings with the discriminator; replacements are
sampled from its softmax without gradient; the discriminator's binary loss runs over all non-pad
tokens with weight λ = 50; total = generator MLM + λ · RTD.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from transformers import BertConfig, ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, PreTrainedModel

from data_pipeline.masking import IGNORE_INDEX
from model import flops
from model.objectives.base import Batch, ElectraOptions, Objective
from model.objectives.mlm import at_least_fp32, sparse_mlm


def rtd_loss(logits: torch.Tensor, replaced: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy (target: token was replaced) over positions where mask is true."""
    losses = F.binary_cross_entropy_with_logits(at_least_fp32(logits), replaced.float(), reduction="none")
    mask = mask.to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def _electra_configs(config: BertConfig, options: ElectraOptions) -> tuple[ElectraConfig, ElectraConfig]:
    common = dict(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
                  type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id,
                  hidden_dropout_prob=config.hidden_dropout_prob,
                  attention_probs_dropout_prob=config.attention_probs_dropout_prob, embedding_size=config.hidden_size)
    disc = ElectraConfig(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                         num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size, **common)
    heads = max(1, round(config.num_attention_heads * options.generator_width))
    width = max(heads, round(config.hidden_size * options.generator_width / heads) * heads)
    gen = ElectraConfig(hidden_size=width, num_hidden_layers=max(1, round(config.num_hidden_layers * options.generator_depth)),
                        num_attention_heads=heads, intermediate_size=max(1, round(config.intermediate_size * options.generator_width)),
                        **common)
    for c in (disc, gen):
        c._attn_implementation = "eager"  # transformers 4.57 has no SDPA path for ELECTRA
    return disc, gen


def warm_start_from_bert(discriminator: ElectraForPreTraining, init_from: str) -> None:
    """Load a BERT folder's encoder into the discriminator: ELECTRA's encoder has BERT's layout and parameter names.

    The generator (and the discriminator's RTD head) start fresh; the generator shares the loaded embeddings.
    """
    from transformers import BertModel

    bert = BertModel.from_pretrained(init_from, add_pooling_layer=False)
    missing, unexpected = discriminator.electra.load_state_dict(bert.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"model.init_from '{init_from}' does not fit ELECTRA's encoder: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


class Electra(Objective):
    """Generator (ElectraForMaskedLM) and discriminator (ElectraForPreTraining) with shared embeddings."""

    def __init__(self, config: BertConfig, options: ElectraOptions, init_from: Optional[str] = None) -> None:
        super().__init__()
        disc_cfg, gen_cfg = _electra_configs(config, options)
        self.discriminator = ElectraForPreTraining(disc_cfg)
        self.generator = ElectraForMaskedLM(gen_cfg)
        if init_from:
            warm_start_from_bert(self.discriminator, init_from)
        # One embedding module for both networks (token, position, type, LayerNorm), and the
        # generator's output projection tied to the shared token embeddings.
        self.generator.electra.embeddings = self.discriminator.electra.embeddings
        self.generator.generator_lm_head.weight = self.discriminator.electra.embeddings.word_embeddings.weight
        self.weights = {"rtd_loss": options.rtd_weight}

    def _generator_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.generator.generator_lm_head(self.generator.generator_predictions(hidden))

    def terms(self, batch: Batch):
        """Generator MLM and discriminator RTD losses."""
        attention = batch["attention_mask"]
        types = batch.get("token_type_ids")
        gen_hidden = self.generator.electra(batch["input_ids"], attention_mask=attention, token_type_ids=types).last_hidden_state
        gen_loss, gen_accuracy = sparse_mlm(gen_hidden, batch["labels"], self._generator_head)
        picked = batch["labels"] != IGNORE_INDEX
        with torch.no_grad():
            logits = self._generator_head(gen_hidden[picked].detach()).float()
            sampled = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        corrupted = batch["input_ids"].clone()
        corrupted[picked] = sampled
        replaced = corrupted != batch["original_input_ids"]
        disc_logits = self.discriminator(corrupted, attention_mask=attention, token_type_ids=types).logits
        rtd = rtd_loss(disc_logits, replaced, attention.bool())
        with torch.no_grad():
            rtd_accuracy = ((disc_logits > 0) == replaced)[attention.bool()].float().mean()
        return {"generator_mlm_loss": gen_loss, "rtd_loss": rtd}, {
            "generator_accuracy": gen_accuracy, "rtd_accuracy": rtd_accuracy, "replaced_fraction": replaced[attention.bool()].float().mean()}

    def flops_per_token(self, seq_len: int, mask_prob: float = 0.15) -> float:
        """Generator (trained, MLM head at masked tokens) + discriminator (trained, 1-unit head at every token)."""
        g, d = self.generator.config, self.discriminator.config
        gen = flops.encoder_forward(g, seq_len) + mask_prob * flops.mlm_head_forward(g, g.embedding_size)
        disc = flops.encoder_forward(d, seq_len) + 2 * d.hidden_size * (d.hidden_size + 1)
        return flops.TRAIN * (gen + disc)

    def hf_models(self) -> dict[str, PreTrainedModel]:
        """The discriminator with its RTD head (AutoModel loads its encoder), and the generator."""
        return {"": self.discriminator, "generator": self.generator}
