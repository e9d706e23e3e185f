"""The main Transformer encoder's typed config, and the transformers config (BERT, ModernBERT or ALBERT) built from it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from transformers import AlbertConfig, BertConfig, ModernBertConfig, PretrainedConfig, XLNetConfig

from core.errors import ConfigError

ARCHITECTURES = ("bert", "modernbert", "albert", "xlnet")
CONFIG_CLASSES = {"bert": BertConfig, "modernbert": ModernBertConfig, "albert": AlbertConfig, "xlnet": XLNetConfig}
# ALBERT's factorized embedding size when the config leaves it unset (Lan et al. 2020 use E = 128 at every H).
ALBERT_EMBEDDING_SIZE = 128


@dataclass
class EncoderConfig:
    """Shape of the encoder. `vocab_size` defaults to the tokenizer's and must match it."""

    # bert: transformers' BertModel; modernbert: transformers' ModernBertModel (rotary, GeGLU, no biases);
    # albert: transformers' AlbertModel (factorized embeddings, layers sharing parameters);
    # xlnet: transformers' XLNetModel (two-stream relative attention; for permutation LM, without memory).
    architecture: Literal["bert", "modernbert", "albert", "xlnet"] = "bert"
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    # BERT only: transformers' own position options (relative ones need eager attention in 4.57).
    position_embedding: Literal["absolute", "relative_key", "relative_key_query"] = "absolute"
    dropout: float = 0.1
    attention_dropout: float = 0.1
    # sdpa (default), eager, or flash_attention_2 (ModernBERT on a GPU with flash-attn: the unpadded path).
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # ModernBERT only: sliding-window width of the local layers, and every n-th layer attends globally.
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    # ALBERT only: the token embedding size E (projected to hidden_size; unset: min(128, hidden_size)) and how
    # many parameter groups the layers share (1, ALBERT's default: every layer uses the same weights).
    embedding_size: Optional[int] = None
    num_hidden_groups: Optional[int] = None
    vocab_size: Optional[int] = None
    # A Hugging Face BERT or ModernBERT folder to start from (shape and weights; the fields above
    # are ignored). A missing MLM head is created, with its decoder tied to the word embeddings.
    init_from: Optional[str] = None

    def validate(self) -> None:
        """Catch shapes and combinations the backbone cannot build."""
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"config key 'model.hidden_size' ({self.hidden_size}) must be divisible by 'model.num_heads' ({self.num_heads})"
            )
        if self.architecture in ("modernbert", "xlnet") and self.position_embedding != "absolute":
            raise ConfigError("config key 'model.position_embedding' applies to architectures bert and albert "
                              f"({self.architecture} has its own relative positions)")
        if self.architecture != "modernbert" and self.attn_implementation == "flash_attention_2":
            raise ConfigError("config key 'model.attn_implementation=flash_attention_2' needs model.architecture=modernbert")
        if self.architecture != "albert":
            for key in ("embedding_size", "num_hidden_groups"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"config key 'model.{key}' applies to architecture=albert only")
            return
        if self.embedding_size is not None and not 0 < self.embedding_size <= self.hidden_size:
            raise ConfigError(f"config key 'model.embedding_size' ({self.embedding_size}) must be in "
                              f"[1, model.hidden_size={self.hidden_size}]")
        groups = self.num_hidden_groups or 1
        if groups < 1 or self.num_layers % groups:
            raise ConfigError(f"config key 'model.num_hidden_groups' ({groups}) must divide model.num_layers "
                              f"({self.num_layers})")


def attention_for(config: PretrainedConfig, requested: str) -> str:
    """The attention kernel to use: relative positions in BERT run eagerly (transformers has no SDPA path for them)."""
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or config.model_type == "xlnet":
        return "eager"
    if requested == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise ConfigError("config key 'model.attn_implementation=flash_attention_2' needs the flash-attn package and a GPU")
    return requested


def _check_data_fit(vocab: int, positions: int, expected_vocab: int, seq_len: int, where: str) -> None:
    if vocab != expected_vocab:
        raise ConfigError(f"{where} has a vocabulary of {vocab} but the dataset's tokenizer has {expected_vocab} tokens; "
                          "prepare the data with a matching tokenizer (or leave model.vocab_size unset)")
    if seq_len > positions:
        raise ConfigError(f"the dataset's sequences are {seq_len} tokens but {where} has {positions} positions")


def model_config(cfg: EncoderConfig, tokenizer: dict, seq_len: int) -> PretrainedConfig:
    """The transformers config for this encoder (fresh, or `init_from`'s), checked against the tokenizer and data.

    `tokenizer` is the data manifest's tokenizer entry (vocab_size and the special ids).
    """
    if cfg.init_from:
        return pretrained_config(cfg, tokenizer["vocab_size"], seq_len)
    vocab = tokenizer["vocab_size"]
    if cfg.vocab_size is not None:
        _check_data_fit(cfg.vocab_size, cfg.max_position_embeddings, vocab, seq_len, "config key 'model.vocab_size'")
    _check_data_fit(vocab, cfg.max_position_embeddings, vocab, seq_len, "'model.max_position_embeddings'")
    if cfg.architecture == "bert":
        config = BertConfig(
            vocab_size=vocab, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout, pad_token_id=tokenizer["pad_id"], type_vocab_size=2,
            position_embedding_type=cfg.position_embedding,
        )
    elif cfg.architecture == "xlnet":
        # No Transformer-XL memory (mem_len None): every sequence is read on its own, as in pre-training here.
        config = XLNetConfig(
            vocab_size=vocab, d_model=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
            d_inner=cfg.intermediate_size, ff_activation="gelu", untie_r=True, attn_type="bi", mem_len=None,
            reuse_len=None, bi_data=False, clamp_len=-1, same_length=False, dropout=cfg.dropout,
            use_mems_eval=False, use_mems_train=False, pad_token_id=tokenizer["pad_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"],
        )
    elif cfg.architecture == "albert":
        config = AlbertConfig(
            vocab_size=vocab, embedding_size=cfg.embedding_size or min(ALBERT_EMBEDDING_SIZE, cfg.hidden_size),
            hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_hidden_groups=cfg.num_hidden_groups or 1,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, inner_group_num=1,
            max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout, type_vocab_size=2, pad_token_id=tokenizer["pad_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"],
            position_embedding_type=cfg.position_embedding,
        )
    else:
        config = ModernBertConfig(
            vocab_size=vocab, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings, embedding_dropout=cfg.dropout,
            mlp_dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
            local_attention=cfg.local_attention, global_attn_every_n_layers=cfg.global_attn_every_n_layers,
            pad_token_id=tokenizer["pad_id"], cls_token_id=tokenizer["cls_id"], sep_token_id=tokenizer["sep_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"],
            # Compiling is a GPU choice made outside the model; the config must not depend on the machine.
            reference_compile=False,
        )
    config._attn_implementation = attention_for(config, cfg.attn_implementation)
    return config


def pretrained_config(cfg: EncoderConfig, vocab_size: int, seq_len: int) -> PretrainedConfig:
    """The config of the `init_from` folder (BERT or ModernBERT), checked against the tokenizer and data."""
    path = Path(cfg.init_from)
    if not (path / "config.json").is_file():
        raise ConfigError(f"config key 'model.init_from': '{path}' is not a Hugging Face model folder (no config.json)")
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"config key 'model.init_from': '{path}' is a {model_type} model; supported: {', '.join(ARCHITECTURES)}")
    config = CONFIG_CLASSES[model_type].from_pretrained(str(path))
    if model_type == "modernbert":
        config.reference_compile = False
    _check_data_fit(config.vocab_size, config.max_position_embeddings, vocab_size, seq_len, f"'model.init_from' {path}")
    config._attn_implementation = attention_for(config, cfg.attn_implementation)
    return config


def config_from_dict(data: dict, attn_implementation: str = "sdpa") -> PretrainedConfig:
    """A saved model_config.json back as its transformers config (export, evaluation)."""
    cls = CONFIG_CLASSES[data.get("model_type", "bert")]
    config = cls.from_dict(data)
    config._attn_implementation = attention_for(config, attn_implementation)
    return config
