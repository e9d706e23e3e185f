"""ModernBERT as shipped in transformers: rotary positions, GeGLU, pre-norm, no biases, local/global attention.

The RTD discriminator is `ModernBertForTokenClassification` with one label (its head is
dense → GELU → LayerNorm → Linear(H, 1), ELECTRA's discriminator head with a norm). ModernBERT
has no embedding projection, so a generator narrower than the main model keeps embeddings of
its own (tied to its own decoder) instead of sharing the main model's; at full width it shares
them. No token types and no pooler: sentence-pair heads (NSP/SOP) are BERT-only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from transformers import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForTokenClassification,
    ModernBertModel,
    PretrainedConfig,
    PreTrainedModel,
)

from core.config_io import check_range
from core.errors import ConfigError
from model.backbones.base import LOAD_DTYPE, Backbone, load_pretrained
from model.backbones.bert import scaled_shape
from model.vocabulary_loss import VocabularyHead

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


# transformers' default for global_attn_every_n_layers (4.x and 5.x).
DEFAULT_GLOBAL_EVERY = 3


def global_layers(config: PretrainedConfig, layers: int | None = None) -> list[bool]:
    """Which layers attend globally: transformers 5 lists each layer's kind (`layer_types`), 4.x repeats one
    pattern (`global_attn_every_n_layers`); a depth other than the config's repeats the pattern."""
    layers = config.num_hidden_layers if layers is None else layers
    kinds = getattr(config, "layer_types", None)
    if kinds and layers <= len(kinds):
        return [kind == "full_attention" for kind in kinds[:layers]]
    every = getattr(config, "global_attn_every_n_layers", None)
    if every is None and kinds and "full_attention" in kinds[1:]:
        every = kinds.index("full_attention", 1)
    every = max(1, every or DEFAULT_GLOBAL_EVERY)
    return [layer % every == 0 for layer in range(layers)]


@dataclass
class ModernBertOptions:
    """ModernBERT's own `model.*` keys."""

    # The sliding-window width of the local layers, and every n-th layer attends globally.
    local_attention: int = 128
    global_attn_every_n_layers: int = DEFAULT_GLOBAL_EVERY


class ModernBertBackbone(Backbone):
    """transformers' ModernBERT classes."""

    model_type = "modernbert"
    config_class = ModernBertConfig
    options_class = ModernBertOptions
    provides = frozenset({"masked_lm", "encoder", "discriminator", "generator", "hidden_projection"})
    # flash_attention_2: transformers' unpadded path, on a GPU with the flash-attn package.
    attention_kernels = ("sdpa", "eager", "flash_attention_2")
    config_keys = {**Backbone.config_keys, "dropout": ("embedding_dropout", "mlp_dropout"),
                   "attention_dropout": ("attention_dropout",), "local_attention": ("local_attention",)}

    def check(self, cfg: EncoderConfig) -> None:
        """The base's refusals, and a local window of at least 2 tokens (transformers' window is half of it each
        side: 1 or less leaves a token only itself) and a global layer every n >= 1 layers."""
        super().check(cfg)
        check_range("model", cfg, ("local_attention",), at_least=2)
        check_range("model", cfg, ("global_attn_every_n_layers",), at_least=1)

    def compile_mode(self, rotary_tables: bool) -> str:
        """The whole step where cos and sin come from tables: compiled whole it ran faster than per layer, with
        the cos/sin computed in the graph slower (BENCHMARKS.md, "The second run of the GPU queue")."""
        return "step" if rotary_tables else "layers"

    def hf_config(self, cfg: EncoderConfig, tokenizer: dict) -> PretrainedConfig:
        """A ModernBertConfig for this shape, vocabulary, special ids and local/global attention pattern."""
        return ModernBertConfig(
            vocab_size=tokenizer["vocab_size"], hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings, embedding_dropout=cfg.dropout,
            mlp_dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
            local_attention=cfg.local_attention, global_attn_every_n_layers=cfg.global_attn_every_n_layers,
            pad_token_id=tokenizer["pad_id"], cls_token_id=tokenizer["cls_id"], sep_token_id=tokenizer["sep_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"],
            # Compiling is a GPU choice made outside the model; the config must not depend on the machine.
            reference_compile=False,
        )

    def folder_values(self, config: PretrainedConfig) -> dict[str, object]:
        """The base's, and `global_attn_every_n_layers` read from the layers' kinds (transformers 5 saves only
        `layer_types`): the smallest n whose pattern they follow, None when they follow none."""
        values = super().folder_values(config)
        kinds = global_layers(config)
        values["global_attn_every_n_layers"] = next(
            (n for n in range(1, len(kinds) + 1) if kinds == [layer % n == 0 for layer in range(len(kinds))]), None)
        return values

    def from_folder(self, path: str) -> PretrainedConfig:
        """The folder's checked config, with transformers' own compilation turned off."""
        config = super().from_folder(path)
        config.reference_compile = False
        return config

    def resized(self, config: PretrainedConfig, **changes: Any) -> PretrainedConfig:
        """A copy of the config with some fields changed, its per-layer attention kinds following a new depth."""
        out = super().resized(config, **changes)
        if "num_hidden_layers" in changes and getattr(out, "layer_types", None) is not None:
            # transformers 5 lists each layer's attention kind once, at init; a resized depth needs its own list.
            out.layer_types = ["full_attention" if full else "sliding_attention"
                               for full in global_layers(config, out.num_hidden_layers)]
        return out

    def attention(self, config: PretrainedConfig, requested: str) -> str:
        """The requested kernel; flash_attention_2 is refused (ConfigError) where flash-attn is not available."""
        if requested == "flash_attention_2":
            from transformers.utils import is_flash_attn_2_available

            if not is_flash_attn_2_available():
                raise ConfigError("config key 'model.attn_implementation=flash_attention_2' needs the flash-attn "
                                  "package and a GPU")
        return requested

    def masked_lm(self, config: PretrainedConfig, init_from: Optional[str] = None,
                  pair_head: bool = False) -> PreTrainedModel:
        """A ModernBertForMaskedLM, fresh or from a folder; a pair head is refused (ConfigError)."""
        if pair_head:
            raise ConfigError("ModernBERT has no sentence-pair head: use model.architecture=bert for NSP/SOP")
        return (load_pretrained(ModernBertForMaskedLM, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                else ModernBertForMaskedLM(config))

    def encoder(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """The bare ModernBertModel, fresh or from a folder."""
        return (load_pretrained(ModernBertModel, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                else ModernBertModel(config))

    def discriminator(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """A one-label ModernBertForTokenClassification (the RTD discriminator), fresh or from a folder."""
        config = self.resized(config, num_labels=1)
        if init_from:
            return load_pretrained(ModernBertForTokenClassification, init_from, config=config, dtype=LOAD_DTYPE)
        return ModernBertForTokenClassification(config)

    def generator(self, config: PretrainedConfig, width: float, layers: int, owner: PreTrainedModel) -> PreTrainedModel:
        """A smaller masked LM: on `owner`'s embeddings at full width, with embeddings of its own when narrower."""
        if width >= 1.0:
            model = self.masked_lm(self.resized(config, num_hidden_layers=layers))
            self.share_embeddings(owner, model)
            self.tie_decoder(model, self.word_embeddings(owner))
            return model
        return ModernBertForMaskedLM(self.resized(config, num_hidden_layers=layers, **scaled_shape(config, width)))

    def mlm_head(self, model: PreTrainedModel) -> VocabularyHead:
        """ModernBERT's MLM head and decoder."""
        return VocabularyHead(model.head, model.decoder)

    def encoder_flops(self, config: PretrainedConfig, seq_len: int) -> float:
        """Forward FLOPs per token of the ModernBERT encoder (local layers attend over their window only)."""
        # Wqkv + Wo (8H²), GeGLU: Wi to 2I and Wo back (6HI); scores and weighted sum over the
        # attended span: the whole sequence in global layers, the local window elsewhere.
        h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
        spans = [seq_len if full else min(seq_len, config.local_attention) for full in global_layers(config)]
        return n * (8 * h * h + 6 * h * i) + sum(4 * s * h for s in spans)
