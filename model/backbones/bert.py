"""BERT (absolute positions; relative ones in transformers 4.x only), with ELECTRA's classes for the RTD discriminator.

ELECTRA's encoder has BERT's layout and parameter names, so the discriminator is transformers'
`ElectraForPreTraining` (its export loads in AutoModelForPreTraining and AutoModel), and a
generator narrower than the main model is an `ElectraForMaskedLM` whose embedding size is the
main model's width: it reads the shared embeddings through its own projection, as in the paper.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

import torch
from transformers import (
    BertConfig,
    BertForPreTraining,
    BertModel,
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraPreTrainedModel,
    PretrainedConfig,
    PreTrainedModel,
)

from core.errors import ConfigError
from model.backbones.base import (
    LOAD_DTYPE,
    RELATIVE_POSITIONS,
    Backbone,
    load_pretrained,
    relative_positions_available,
    relative_refusal,
    transformers_major,
)
from model.vocabulary_loss import VocabularyHead

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


def _positions(position_embedding: str) -> dict:
    """The position option as a config field where the installed transformers has it; a relative one is refused
    where it does not (5.x would build absolute positions without a word)."""
    if relative_positions_available():
        return {"position_embedding_type": position_embedding}
    if position_embedding in RELATIVE_POSITIONS:
        raise ConfigError(relative_refusal(f"config key 'model.position_embedding={position_embedding}'"))
    return {}


def scaled_shape(config: PretrainedConfig, width: float) -> dict:
    """Hidden size, heads and FFN size at `width` × the config's, heads dividing the hidden size."""
    heads = max(1, round(config.num_attention_heads * width))
    hidden = max(heads, round(config.hidden_size * width / heads) * heads)
    return {"hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": max(1, round(config.intermediate_size * width))}


def electra_config(config: BertConfig, **shape: Any) -> ElectraConfig:
    """The ElectraConfig with this BERT's vocabulary, positions and dropout (embedding size = BERT's width)."""
    fields = dict(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
                  type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id,
                  hidden_dropout_prob=config.hidden_dropout_prob,
                  attention_probs_dropout_prob=config.attention_probs_dropout_prob, embedding_size=config.hidden_size,
                  **_positions(getattr(config, "position_embedding_type", "absolute")), hidden_size=config.hidden_size,
                  num_hidden_layers=config.num_hidden_layers,
                  num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size)
    fields.update(shape)
    out = ElectraConfig(**fields)
    # transformers 4.x has no SDPA path for ELECTRA; 5.x runs BERT's attention choice.
    out._attn_implementation = config._attn_implementation if transformers_major() >= 5 else "eager"
    return out


def warm_start_from_bert(target: PreTrainedModel, init_from: str) -> None:
    """Load a BERT folder's encoder into an ELECTRA model's encoder (same layout and names); heads stay fresh."""
    bert = load_pretrained(BertModel, init_from, add_pooling_layer=False, dtype=LOAD_DTYPE)
    missing, unexpected = Backbone.base(target).load_state_dict(bert.state_dict(), strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ConfigError(f"model.init_from '{init_from}' does not fit ELECTRA's encoder: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


@dataclass
class BertOptions:
    """BERT's own `model.*` keys."""

    # transformers' own position options. The relative ones exist in transformers 4.x only (with eager attention);
    # under 5.x they are refused, and ModernBERT is the relative-position (rotary) backbone.
    position_embedding: Literal["absolute", "relative_key", "relative_key_query"] = "absolute"


class BertBackbone(Backbone):
    """transformers' BERT classes."""

    model_type = "bert"
    config_class = BertConfig
    provides = frozenset({"masked_lm", "encoder", "discriminator", "generator", "hidden_projection", "pair_head"})
    options_class = BertOptions
    config_keys = {**Backbone.config_keys, "position_embedding": ("position_embedding_type",)}

    def hf_config(self, cfg: EncoderConfig, tokenizer: dict) -> PretrainedConfig:
        """A BertConfig for this shape, vocabulary and pad id (two token types, the position option)."""
        return BertConfig(
            vocab_size=tokenizer["vocab_size"], hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout, pad_token_id=tokenizer["pad_id"], type_vocab_size=2,
            **_positions(cfg.position_embedding),
        )

    def check(self, cfg: EncoderConfig) -> None:
        """Refuse (ConfigError) the base refusals and relative positions under transformers 5."""
        super().check(cfg)
        if cfg.position_embedding in RELATIVE_POSITIONS and not relative_positions_available():
            raise ConfigError(relative_refusal(f"config key 'model.position_embedding={cfg.position_embedding}' "
                                               f"(model.architecture={self.model_type})"))

    def version_limit(self, config: PretrainedConfig) -> Optional[str]:
        """"<5" for relative positions (transformers 5 removed them), else None."""
        return "<5" if getattr(config, "position_embedding_type", "absolute") in RELATIVE_POSITIONS else None

    def attention(self, config: PretrainedConfig, requested: str) -> str:
        """The requested kernel for absolute positions; eager for relative ones."""
        # transformers 4.x has no SDPA path for its relative positions.
        return requested if getattr(config, "position_embedding_type", "absolute") == "absolute" else "eager"

    def masked_lm(self, config: PretrainedConfig, init_from: Optional[str] = None,
                  pair_head: bool = False) -> PreTrainedModel:
        """A BertForPreTraining (MLM + NSP head), its pooler and NSP head frozen without a pair task."""
        # Always BertForPreTraining, the layout of Google's BERT checkpoints: AutoModel then finds
        # every weight it builds (the pooler too) and AutoModelForMaskedLM loads the same folder.
        # Without a pair task the pooler and NSP head stay frozen at their initial values.
        model = (load_pretrained(BertForPreTraining, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                 else BertForPreTraining(config))
        if not pair_head:
            model.bert.pooler.requires_grad_(False)
            model.cls.seq_relationship.requires_grad_(False)
        return model

    def encoder(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """The bare BertModel, its (unused) pooler frozen."""
        # With its (frozen, unused) pooler, so that AutoModel reports no newly initialised weights.
        model = (load_pretrained(BertModel, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                 else BertModel(config))
        model.pooler.requires_grad_(False)
        return model

    def discriminator(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """An ElectraForPreTraining of this BERT's shape, its encoder warm-started from a BERT folder when given."""
        model = ElectraForPreTraining(electra_config(config))
        if init_from:
            warm_start_from_bert(model, init_from)
        return model

    def generator(self, config: PretrainedConfig, width: float, layers: int, owner: PreTrainedModel) -> PreTrainedModel:
        """A smaller masked LM (ELECTRA's when narrower or beside an ELECTRA) on `owner`'s embeddings, decoder tied."""
        # ELECTRA's generator class carries the projection a narrower generator needs; beside a
        # BertModel at full width (COCO-LM) the generator is this backbone's own masked LM.
        if isinstance(owner, ElectraPreTrainedModel) or width < 1.0:
            shape = scaled_shape(config, width) if width < 1.0 else {}
            model = ElectraForMaskedLM(electra_config(config, num_hidden_layers=layers, **shape))
        else:
            model = self.masked_lm(self.resized(config, num_hidden_layers=layers))
        self.share_embeddings(owner, model)
        self.tie_decoder(model, self.word_embeddings(owner))
        return model

    def mlm_head(self, model: PreTrainedModel) -> VocabularyHead:
        """The MLM head's transform and decoder (ELECTRA generator's or BERT's)."""
        if isinstance(model, ElectraForMaskedLM):
            return VocabularyHead(model.generator_predictions, model.generator_lm_head)
        return VocabularyHead(model.cls.predictions.transform, model.cls.predictions.decoder)

    def pair_logits(self, model: PreTrainedModel, pooled: torch.Tensor) -> torch.Tensor:
        """NSP logits [B, 2] from the pooled output."""
        return model.cls.seq_relationship(pooled)

    def encoder_flops(self, config: PretrainedConfig, seq_len: int) -> float:
        """Forward FLOPs per token of the BERT encoder (relative positions included)."""
        # Q, K, V, output (8H²), the FFN (4HI), scores and weighted sum (4SH); relative positions add
        # one [S, S, d] product per head for keys (relative_key) and one more for queries.
        h, i = config.hidden_size, config.intermediate_size
        relative = {"absolute": 0, "relative_key": 1, "relative_key_query": 2}[getattr(config, "position_embedding_type", "absolute")]
        return config.num_hidden_layers * (8 * h * h + 4 * h * i + (4 + 2 * relative) * seq_len * h)
