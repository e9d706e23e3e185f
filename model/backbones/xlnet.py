"""XLNet as shipped in transformers: relative positional attention with a content and a query stream.

Yang et al. 2019, "XLNet: Generalized Autoregressive Pretraining for Language Understanding"
(zihangdai/xlnet). The masked LM is `XLNetLMHeadModel` (its `lm_loss` projection tied to the word
embeddings), which AutoModelForCausalLM loads and whose encoder AutoModel loads as `XLNetModel`.
Built without Transformer-XL's memory (`mem_len: None`): each sequence is read on its own. XLNet
has no pooler and no [CLS]-based pair head here; only the permutation LM objective runs on it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from transformers import PretrainedConfig, PreTrainedModel, XLNetConfig, XLNetLMHeadModel, XLNetModel

from model.backbones.base import LOAD_DTYPE, Backbone, load_pretrained
from model.vocabulary_loss import VocabularyHead

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig


# What XLNet's sequence summary (its classification heads) reads: transformers' default is the last token, where
# XLNet's own tokenizer puts <cls> and pads on the left; this project's tokenizer puts [CLS] first and pads on the
# right, so the last token of every shorter row of a batch is padding.
SUMMARY_TYPE = "first"


class XLNetBackbone(Backbone):
    """transformers' XLNet classes."""

    model_type = "xlnet"
    config_class = XLNetConfig
    # Its masked_lm is XLNetLMHeadModel, whose two-stream attention only the permutation LM drives.
    provides = frozenset({"permutation_lm"})
    # No position table (relative attention) and one dropout for every sublayer.
    config_keys = {"vocab_size": ("vocab_size",), "hidden_size": ("d_model",), "num_layers": ("n_layer",),
                   "num_heads": ("n_head",), "intermediate_size": ("d_inner",), "dropout": ("dropout",)}

    def hf_config(self, cfg: EncoderConfig, tokenizer: dict) -> PretrainedConfig:
        """An XLNetConfig for this shape, vocabulary and special ids, without Transformer-XL memory."""
        # No Transformer-XL memory (mem_len None): every sequence is read on its own, as in pre-training here.
        return XLNetConfig(
            vocab_size=tokenizer["vocab_size"], d_model=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
            d_inner=cfg.intermediate_size, ff_activation="gelu", untie_r=True, attn_type="bi", mem_len=None,
            reuse_len=None, bi_data=False, clamp_len=-1, same_length=False, dropout=cfg.dropout,
            use_mems_eval=False, use_mems_train=False, pad_token_id=tokenizer["pad_id"],
            bos_token_id=tokenizer["cls_id"], eos_token_id=tokenizer["sep_id"], summary_type=SUMMARY_TYPE,
        )

    def for_export(self, config: PretrainedConfig) -> None:
        """A classification head reads the first token, where this project's tokenizer puts [CLS] (an export of a run
        made before the config said so included)."""
        config.summary_type = SUMMARY_TYPE

    def attention(self, config: PretrainedConfig, requested: str) -> str:
        """Always eager: XLNet's relative attention has no other path."""
        return "eager"  # XLNet's relative attention has no other path in transformers

    def masked_lm(self, config: PretrainedConfig, init_from: Optional[str] = None,
                  pair_head: bool = False) -> PreTrainedModel:
        """An XLNetLMHeadModel, fresh or from a folder (no pair head: `pair_head` is not read)."""
        return (load_pretrained(XLNetLMHeadModel, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                else XLNetLMHeadModel(config))

    def encoder(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """The bare XLNetModel, fresh or from a folder."""
        return (load_pretrained(XLNetModel, init_from, config=config, dtype=LOAD_DTYPE) if init_from
                else XLNetModel(config))

    def mlm_head(self, model: PreTrainedModel) -> VocabularyHead:
        """XLNet's LM head: no transform, the `lm_loss` projection tied to the word embeddings."""
        return VocabularyHead(lambda hidden: hidden, model.lm_loss)

    def encoder_flops(self, config: PretrainedConfig, seq_len: int) -> float:
        """Forward FLOPs per token of XLNet's content stream (relative positions included)."""
        # The content stream per token and layer: Q, K, V, O (8H²), the FFN (4HI), content scores and the weighted
        # sum (4SH); relative positions add the projection of 2S position embeddings (4H² per token) and the
        # position scores against them (4SH). The query stream is the objective's (it runs at targets only).
        h, i = config.d_model, config.d_inner
        return config.n_layer * (12 * h * h + 4 * h * i + 8 * seq_len * h)

    @staticmethod
    def query_stream_flops(config: PretrainedConfig, seq_len: int) -> float:
        """Forward FLOPs of the query stream per predicted token: Q and O (4H²), the FFN (4HI), scores (8SH)."""
        h, i = config.d_model, config.d_inner
        return config.n_layer * (4 * h * h + 4 * h * i + 8 * seq_len * h)
