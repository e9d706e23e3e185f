"""The main Transformer encoder: a Hugging Face BERT built from a small typed config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from transformers import BertConfig

from pretrain.config_io import ConfigError


@dataclass
class EncoderConfig:
    """Shape of the BERT encoder. `vocab_size` defaults to the tokenizer's and must match it."""

    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    vocab_size: Optional[int] = None
    # A Hugging Face BERT folder to start from (shape and weights; the fields above are ignored).
    # A missing MLM head is created, with its decoder tied to the word embeddings.
    init_from: Optional[str] = None

    def validate(self) -> None:
        """Catch shapes BERT cannot build."""
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"config key 'model.hidden_size' ({self.hidden_size}) must be divisible by 'model.num_heads' ({self.num_heads})"
            )


def bert_config(cfg: EncoderConfig, vocab_size: int, pad_id: int, seq_len: int) -> BertConfig:
    """The transformers BertConfig for this encoder, checked against the tokenizer and data."""
    if cfg.vocab_size is not None and cfg.vocab_size != vocab_size:
        raise ConfigError(
            f"config key 'model.vocab_size' is {cfg.vocab_size} but the dataset's tokenizer has {vocab_size} tokens; "
            "leave model.vocab_size unset or prepare the data with a matching tokenizer"
        )
    if seq_len > cfg.max_position_embeddings:
        raise ConfigError(
            f"the dataset's sequences are {seq_len} tokens but 'model.max_position_embeddings' is {cfg.max_position_embeddings}"
        )
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.attention_dropout,
        pad_token_id=pad_id,
        type_vocab_size=2,
    )
    config._attn_implementation = cfg.attn_implementation
    return config


def pretrained_bert_config(cfg: EncoderConfig, vocab_size: int, seq_len: int) -> BertConfig:
    """The BertConfig of `cfg.init_from`, checked against the tokenizer and data."""
    from pathlib import Path

    path = Path(cfg.init_from)
    if not (path / "config.json").is_file():
        raise ConfigError(f"config key 'model.init_from': '{path}' is not a Hugging Face model folder (no config.json)")
    config = BertConfig.from_pretrained(str(path))
    if config.model_type != "bert":
        raise ConfigError(f"config key 'model.init_from': '{path}' is a {config.model_type} model, not BERT")
    if config.vocab_size != vocab_size:
        raise ConfigError(
            f"'model.init_from' {path} has a vocabulary of {config.vocab_size} but the dataset's tokenizer has "
            f"{vocab_size} tokens; prepare the data with tokenizer.pretrained={path}"
        )
    if seq_len > config.max_position_embeddings:
        raise ConfigError(f"the dataset's sequences are {seq_len} tokens but {path} has {config.max_position_embeddings} positions")
    config._attn_implementation = cfg.attn_implementation
    return config
