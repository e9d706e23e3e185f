"""The main Transformer encoder's typed config, and the transformers config its backbone builds from it."""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from transformers import PretrainedConfig

from core.config_io import coerce_value, field_types
from core.errors import CheckpointError, ConfigError, InputDataError
from data_pipeline.tokenizer import has_tokenizer, vocabulary_difference
from model.backbones import REGISTRY, backbone_for
from model.backbones.base import CONFIG_VALUE_ERRORS, Backbone, check_saved_config, family_keys, read_model_folder


# A fresh encoder's shape and dropout: these keys' values when they are left unset and there is no `init_from` folder.
FRESH = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512,
         "dropout": 0.1, "attention_dropout": 0.1}
# Keys that change no parameter: with an `init_from` folder, a value set is applied over the folder's.
APPLIED_OVER_FOLDER = ("dropout", "attention_dropout")


@dataclass
class EncoderShape:
    """What every family reads: the encoder's shape, dropout and attention kernel. `vocab_size` defaults to the
    tokenizer's and must match it."""

    # A name in model/backbones' registry: bert (transformers' BertModel); modernbert (ModernBertModel: rotary,
    # GeGLU, no biases); albert (AlbertModel: factorized embeddings, layers sharing parameters); xlnet (XLNetModel:
    # two-stream relative attention, for permutation LM, without memory). Unset: the family of the `init_from`
    # folder, else bert.
    architecture: Optional[str] = None
    # The shape and dropout. Unset (null): the `init_from` folder's, else FRESH's (hidden 256, 4 layers of 4 heads,
    # FFN 1024, 512 positions, dropout 0.1). With a folder, a shape key set to another value than the folder's is
    # refused (its weights have the folder's shape) and a dropout key set is applied over the folder's.
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    dropout: Optional[float] = None
    attention_dropout: Optional[float] = None
    # sdpa (default), eager, or flash_attention_2 (ModernBERT on a GPU with flash-attn: the unpadded path).
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    vocab_size: Optional[int] = None
    # A Hugging Face folder of a registered family to start from (its weights, family and shape; see above for the
    # keys set beside it). A missing MLM head is created, with its decoder tied to the word embeddings.
    init_from: Optional[str] = None

    def __post_init__(self) -> None:
        folder = folder_config(self.init_from)
        if self.architecture is None:
            self.architecture = folder.model_type if folder is not None else "bert"
        from_folder = folder_values(folder) if folder is not None and folder.model_type == self.architecture else {}
        unset = family_keys() if from_folder else {}  # a family's own key at its default counts as unset
        types_ = field_types(type(self)) if from_folder else {}
        for key, value in from_folder.items():
            current = getattr(self, key, None)
            if value is not None and (current is None or (key in unset and current == unset[key])):
                try:
                    setattr(self, key, coerce_value(value, types_[key], f"model.{key}"))
                except ConfigError:  # transformers 4.x reads any value; the folder is refused where it is read
                    pass
        for key, value in FRESH.items():
            if getattr(self, key) is None and key not in from_folder:  # the folder's may be None: it has two values
                setattr(self, key, value)

    def validate(self) -> None:
        """Catch shapes and combinations the backbone cannot build."""
        if self.architecture not in REGISTRY:
            raise ConfigError(f"config key 'model.architecture': unknown architecture {self.architecture!r}; "
                              f"known: {', '.join(REGISTRY)}")
        check_against_folder(self)
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"config key 'model.{key}' must be >= 1, got {getattr(self, key)}")
        for key in ("dropout", "attention_dropout"):
            if getattr(self, key) is not None and not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"config key 'model.{key}' must be in [0, 1), got {getattr(self, key)}")
        if self.hidden_size is not None and self.num_heads is not None and self.hidden_size % self.num_heads:
            raise ConfigError(
                f"config key 'model.hidden_size' ({self.hidden_size}) must be divisible by 'model.num_heads' ({self.num_heads})"
            )
        backbone_for(self.architecture).check(self)


def folder_config(init_from: Optional[str]) -> Optional[PretrainedConfig]:
    """The transformers config of a model folder of a registered family, read leniently: None when there is no
    folder, or its config.json is missing, unreadable or of another family (`pretrained_config` refuses those in one
    line, where the folder is read for training)."""
    if not init_from:
        return None
    try:
        data = json.loads((Path(init_from) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str) or data["model_type"] not in REGISTRY:
        return None
    try:
        return backbone_for(data["model_type"]).config_class.from_dict(data)
    except CONFIG_VALUE_ERRORS:
        return None


def folder_values(config: PretrainedConfig) -> dict[str, object]:
    """The `model.*` keys its family reads with their values in this transformers config (None: no single value)."""
    return backbone_for(config.model_type).folder_values(config)


def trained_keys(saved: dict) -> list[str]:
    """`key=value` overrides that make a run config name the model a saved model config describes: its family, the
    shape and dropout keys the family reads, and the other families' keys unset (an export builds what was trained,
    whatever the config says)."""
    family = saved.get("model_type", "bert")
    values = folder_values(backbone_for(family).config_class.from_dict(saved))
    others = {key: unset for key, unset in family_keys().items() if key not in values}
    return [f"model.architecture={family}", *(f"model.{key}={json.dumps(value)}" for key, value in values.items()
                                              if value is not None),
            *(f"model.{key}={json.dumps(unset)}" for key, unset in others.items())]


def check_against_folder(cfg: EncoderShape) -> None:
    """Refuse an `architecture` that is not the family of the `init_from` folder, and shape keys set to other values
    than the folder's: the folder decides what is built, and a run configured as one model that trains another
    measures and reports the wrong model."""
    folder = folder_config(cfg.init_from)
    if folder is None:
        return
    # Before its values are compared: a folder this transformers would run differently is refused as such.
    check_saved_config(folder.to_dict(), f"config key 'model.init_from': '{cfg.init_from}'")
    family = folder.model_type
    if family != cfg.architecture:
        raise ConfigError(f"config key 'model.architecture' is {cfg.architecture}, but model.init_from "
                          f"'{cfg.init_from}' holds a {family} model: set model.architecture={family}, or leave it "
                          "unset (then the folder's family is used)")
    differ = [(key, getattr(cfg, key), value) for key, value in folder_values(folder).items()
              if key not in APPLIED_OVER_FOLDER and value is not None and getattr(cfg, key) is not None
              and getattr(cfg, key) != value]
    if differ:
        raise ConfigError(
            f"model.init_from '{cfg.init_from}' holds a {family} model with "
            f"{', '.join(f'{key} {theirs}' for key, _, theirs in differ)}, but the config sets "
            f"{', '.join(f'model.{key}={mine}' for key, mine, _ in differ)}: the folder decides the shape; leave these "
            "keys unset (model.KEY=null, or model=pretrained over a model group) or set them to the folder's values")


def _encoder_config_class() -> type:
    """The `model` config section: the shape every family reads, then each registered family's own keys (its
    `options_class`, in model/backbones/), flat beside them so a key reads `model.local_attention`.

    Built from the registry, as the `objective` section is: a new family with keys of its own is one file and one
    registry line. A key two families share (ALBERT's positions are BERT's) is declared once with one default.
    """
    own: dict[str, tuple] = {}
    for name in REGISTRY:
        options = backbone_for(name).options_class
        hints = typing.get_type_hints(options)
        for f in dataclasses.fields(options):
            if f.name in own and own[f.name][2].default != f.default:
                raise TypeError(f"model.{f.name} has two defaults: {own[f.name][2].default!r} and {f.default!r} ({name})")
            own.setdefault(f.name, (f.name, hints[f.name], dataclasses.field(default=f.default)))
    cls = dataclasses.make_dataclass("EncoderConfig", list(own.values()), bases=(EncoderShape,))
    cls.__module__ = __name__
    cls.__doc__ = "The encoder's shape and every registered family's own keys (a family refuses the others' keys)."
    return cls


EncoderConfig = _encoder_config_class()


def attention_for(config: PretrainedConfig, requested: str) -> str:
    """The attention kernel to use: the backbone's answer for this config (BERT's relative positions run eagerly)."""
    return backbone_for(config).attention(config, requested)


def _check_data_fit(vocab: int, positions: Optional[int], expected_vocab: int, seq_len: int, where: str) -> None:
    if vocab != expected_vocab:
        raise ConfigError(f"{where} has a vocabulary of {vocab} but the dataset's tokenizer has {expected_vocab} tokens; "
                          "prepare the data with a matching tokenizer (or leave model.vocab_size unset)")
    if positions is not None and seq_len > positions:
        raise ConfigError(f"the dataset's sequences are {seq_len} tokens but {where} has {positions} positions")


def model_config(cfg: EncoderConfig, tokenizer: dict, seq_len: int,
                 tokenizer_dir: Optional[Path] = None) -> PretrainedConfig:
    """The transformers config for this encoder (fresh, or `init_from`'s), checked against the tokenizer and data.

    `tokenizer` is the data manifest's tokenizer entry (vocab_size and the special ids); `tokenizer_dir`, the
    dataset's tokenizer folder, which an `init_from` folder's own tokenizer must agree with token for token.
    """
    if cfg.init_from:
        return pretrained_config(cfg, tokenizer["vocab_size"], seq_len, tokenizer_dir)
    vocab = tokenizer["vocab_size"]
    backbone = backbone_for(cfg.architecture)
    positions = _table_size(backbone, cfg.max_position_embeddings)
    if cfg.vocab_size is not None:
        _check_data_fit(cfg.vocab_size, positions, vocab, seq_len, "config key 'model.vocab_size'")
    _check_data_fit(vocab, positions, vocab, seq_len, "'model.max_position_embeddings'")
    config = backbone.hf_config(cfg, tokenizer)
    config._attn_implementation = backbone.attention(config, cfg.attn_implementation)
    return config


def pretrained_config(cfg: EncoderConfig, vocab_size: int, seq_len: int,
                      tokenizer_dir: Optional[Path] = None) -> PretrainedConfig:
    """The config of the `init_from` folder (a registered family), checked against the tokenizer (and, where both
    folders hold one, the dataset's tokenizer in `tokenizer_dir`) and the data."""
    path = Path(cfg.init_from)
    if not (path / "config.json").is_file():
        raise ConfigError(f"config key 'model.init_from': '{path}' is not a Hugging Face model folder (no config.json)")
    try:
        model_type = read_model_folder(path).get("model_type")  # the family first; from_folder reads the weights
    except CheckpointError as exc:
        raise CheckpointError(f"config key 'model.init_from': {exc}") from None
    if model_type not in REGISTRY:  # read_model_folder refused a config.json without one
        raise ConfigError(f"config key 'model.init_from': '{path}' is a {model_type} model; supported: {', '.join(REGISTRY)}")
    check_against_folder(cfg)
    backbone = backbone_for(model_type)
    config = backbone.from_folder(str(path))
    for key in APPLIED_OVER_FOLDER:  # the folder's own unless set (then filled from it, or None: left as it is)
        if getattr(cfg, key) is not None:
            for attr in backbone.config_keys.get(key, ()):
                setattr(config, attr, getattr(cfg, key))
    check_saved_config(config.to_dict(), f"config key 'model.init_from': '{path}'")
    _check_data_fit(config.vocab_size, _table_size(backbone, config.max_position_embeddings), vocab_size, seq_len,
                    f"'model.init_from' {path}")
    if tokenizer_dir is not None and has_tokenizer(path):
        _check_same_vocabulary(path, tokenizer_dir)
    config._attn_implementation = backbone.attention(config, cfg.attn_implementation)
    return config


def _check_same_vocabulary(folder: Path, tokenizer_dir: Path) -> None:
    """Refuse a starting folder whose tokenizer maps tokens to other ids than the dataset's: its embeddings (and a
    teacher's) would read another vocabulary's ids, for the whole run, at the same vocabulary size."""
    try:
        difference = vocabulary_difference(folder, tokenizer_dir)
    except InputDataError as exc:  # the dataset's loaded when the data was opened: the folder's is the unreadable one
        raise InputDataError(f"config key 'model.init_from' ({folder}): its tokenizer cannot be compared with the "
                             f"dataset's: {exc}") from exc
    if difference:
        raise ConfigError(f"'model.init_from' {folder} has another tokenizer than the dataset's ({difference}): its "
                          f"embeddings index the other one's ids; prepare the data with its tokenizer "
                          f"(tokenizer.pretrained={folder})")


def _table_size(backbone: Backbone, positions: int) -> Optional[int]:
    """The positions a sequence must fit in, None for a family without a position table (XLNet's relative attention,
    whose transformers config says -1 and whose fresh one ignores model.max_position_embeddings)."""
    return positions if "max_position_embeddings" in backbone.config_keys else None


def config_from_dict(data: dict, attn_implementation: str = "sdpa", where: str = "the saved model config") -> PretrainedConfig:
    """A saved model_config.json back as its transformers config (export, evaluation), refused when the installed
    transformers would run it differently (`where` names it in the message)."""
    check_saved_config(data, where)
    config = backbone_for(data.get("model_type", "bert")).config_class.from_dict(data)
    config._attn_implementation = attention_for(config, attn_implementation)
    return config
