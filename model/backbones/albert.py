"""ALBERT as shipped in transformers: factorized embeddings (E → H) and layers that share their parameters.

Lan et al. 2020, "ALBERT: A Lite BERT for Self-supervised Learning of Language Representations"
(google-research/albert). The masked LM is always `AlbertForPreTraining` (MLM head + SOP head on
the pooled [CLS]), so the export loads in AutoModel, AutoModelForMaskedLM and AutoModelForPreTraining;
without a pair task the pooler and SOP head stay frozen at their initial values. The MLM head maps
H → E before the decoder, which is tied to the E-wide token embeddings. ALBERT is built here for
the objectives that need only a masked LM and a bare encoder (`provides`, `Objective.needs`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from transformers import AlbertConfig, AlbertForPreTraining, AlbertModel, PretrainedConfig, PreTrainedModel

from core.errors import ConfigError

from model.backbones.base import LOAD_DTYPE, load_pretrained
from model.backbones.bert import BertBackbone, BertOptions, _positions
from model.vocabulary_loss import VocabularyHead

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


# The factorized embedding size when the config leaves it unset (Lan et al. 2020 use E = 128 at every H).
EMBEDDING_SIZE = 128


@dataclass
class AlbertOptions(BertOptions):
    """ALBERT's own `model.*` keys: BERT's, and its factorization and sharing."""

    # The token embedding size E, projected to hidden_size (unset: min(128, hidden_size)).
    embedding_size: Optional[int] = None
    # How many parameter groups the layers share (unset: 1, ALBERT's default, every layer uses the same weights).
    num_hidden_groups: Optional[int] = None


class AlbertBackbone(BertBackbone):
    """transformers' ALBERT classes (BERT's uniform access, ALBERT's heads and FLOPs)."""

    model_type = "albert"
    config_class = AlbertConfig
    provides = frozenset({"masked_lm", "encoder", "pair_head"})
    options_class = AlbertOptions
    config_keys = {**BertBackbone.config_keys, "embedding_size": ("embedding_size",),
                   "num_hidden_groups": ("num_hidden_groups",)}

    def hf_config(self, cfg: EncoderConfig, tokenizer: dict) -> PretrainedConfig:
        """An AlbertConfig for this shape, vocabulary and special ids (factorized embeddings, shared layer groups)."""
        return AlbertConfig(
            vocab_size=tokenizer["vocab_size"],
            embedding_size=cfg.embedding_size or min(EMBEDDING_SIZE, cfg.hidden_size),
            hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_hidden_groups=cfg.num_hidden_groups or 1,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, inner_group_num=1,
            max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout, type_vocab_size=2, pad_token_id=tokenizer["pad_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"],
            **_positions(cfg.position_embedding),
        )

    def check(self, cfg: EncoderConfig) -> None:
        """Refuse (ConfigError) BERT's refusals, an embedding size outside [1, H] and groups not dividing the layers."""
        super().check(cfg)
        if cfg.embedding_size is not None and not 0 < cfg.embedding_size <= cfg.hidden_size:
            raise ConfigError(f"config key 'model.embedding_size' ({cfg.embedding_size}) must be in "
                              f"[1, model.hidden_size={cfg.hidden_size}]")
        groups = 1 if cfg.num_hidden_groups is None else cfg.num_hidden_groups
        if groups < 1 or cfg.num_layers % groups:
            raise ConfigError(f"config key 'model.num_hidden_groups' ({groups}) must divide model.num_layers "
                              f"({cfg.num_layers})")

    def masked_lm(self, config: PretrainedConfig, init_from: Optional[str] = None,
                  pair_head: bool = False) -> PreTrainedModel:
        """An AlbertForPreTraining (MLM + SOP head), its pooler and SOP head frozen without a pair task."""
        model = (load_pretrained(AlbertForPreTraining, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                 else AlbertForPreTraining(config))
        if not pair_head:
            model.albert.pooler.requires_grad_(False)
            model.sop_classifier.requires_grad_(False)
        return model

    def encoder(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """The bare AlbertModel, its (unused) pooler frozen."""
        model = (load_pretrained(AlbertModel, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                 else AlbertModel(config))
        model.pooler.requires_grad_(False)
        return model

    def discriminator(self, config: PretrainedConfig,  # pragma: no cover - not in `provides`
                      init_from: Optional[str] = None) -> PreTrainedModel:
        """Not available: ALBERT has no replaced-token discriminator here (NotImplementedError)."""
        raise NotImplementedError("ALBERT has no replaced-token discriminator here")

    def generator(self, config: PretrainedConfig, width: float, layers: int,  # pragma: no cover - not in `provides`
                  owner: PreTrainedModel) -> PreTrainedModel:
        """Not available: ALBERT has no generator here (NotImplementedError)."""
        raise NotImplementedError("ALBERT has no generator here")

    def mlm_head(self, model: PreTrainedModel) -> VocabularyHead:
        """ALBERT's MLM head: dense → activation → LayerNorm (H → E), then the decoder tied to the embeddings."""
        head = model.predictions
        return VocabularyHead(lambda hidden: head.LayerNorm(head.activation(head.dense(hidden))), head.decoder)

    def pair_logits(self, model: PreTrainedModel, pooled: torch.Tensor) -> torch.Tensor:
        """SOP logits [B, 2] from the pooled output."""
        return model.sop_classifier(pooled)

    def encoder_flops(self, config: PretrainedConfig, seq_len: int) -> float:
        """BERT's forward FLOPs per token plus the E → H embedding projection."""
        # BERT's layers (sharing parameters saves memory, not FLOPs: every layer still runs) plus the E → H projection.
        return 2 * config.embedding_size * config.hidden_size + super().encoder_flops(config, seq_len)
