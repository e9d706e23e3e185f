"""XLNet as shipped in transformers: relative positional attention with a content and a query stream.

Yang et al. 2019, "XLNet: Generalized Autoregressive Pretraining for Language Understanding"
(zihangdai/xlnet). The masked LM is `XLNetLMHeadModel` (its `lm_loss` projection tied to the word
embeddings), which AutoModelForCausalLM loads and whose encoder AutoModel loads as `XLNetModel`.
Built without Transformer-XL's memory (`mem_len: None`): each sequence is read on its own. XLNet
has no pooler and no [CLS]-based pair head here; only the permutation LM objective runs on it.
"""
from __future__ import annotations

from transformers import XLNetLMHeadModel, XLNetModel

from model.backbones.base import Backbone, Head


class XLNetBackbone(Backbone):
    """transformers' XLNet classes."""

    model_type = "xlnet"
    has_pair_head = False

    def masked_lm(self, config, init_from=None, pair_head=False):
        return XLNetLMHeadModel.from_pretrained(init_from, config=config) if init_from else XLNetLMHeadModel(config)

    def encoder(self, config, init_from=None):
        return XLNetModel.from_pretrained(init_from, config=config) if init_from else XLNetModel(config)

    def mlm_head(self, model) -> Head:
        return model.lm_loss

    def output_projection(self, model):
        return model.lm_loss

    def encoder_flops(self, config, seq_len):
        # The content stream per token and layer: Q, K, V, O (8H²), the FFN (4HI), content scores and the weighted
        # sum (4SH); relative positions add the projection of 2S position embeddings (4H² per token) and the
        # position scores against them (4SH). The query stream is the objective's (it runs at targets only).
        h, i = config.d_model, config.d_inner
        return config.n_layer * (12 * h * h + 4 * h * i + 8 * seq_len * h)

    @staticmethod
    def query_stream_flops(config, seq_len: int) -> float:
        """Forward FLOPs of the query stream per predicted token: Q and O (4H²), the FFN (4HI), scores (8SH)."""
        h, i = config.d_model, config.d_inner
        return config.n_layer * (4 * h * h + 4 * h * i + 8 * seq_len * h)
