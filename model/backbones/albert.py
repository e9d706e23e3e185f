"""ALBERT as shipped in transformers: factorized embeddings (E → H) and layers that share their parameters.

Lan et al. 2020, "ALBERT: A Lite BERT for Self-supervised Learning of Language Representations"
(google-research/albert). The masked LM is always `AlbertForPreTraining` (MLM head + SOP head on
the pooled [CLS]), so the export loads in AutoModel, AutoModelForMaskedLM and AutoModelForPreTraining;
without a pair task the pooler and SOP head stay frozen at their initial values. The MLM head maps
H → E before the decoder, which is tied to the E-wide token embeddings. ALBERT is built here for
the objectives that need only a masked LM and a bare encoder (`Objective.architectures`).
"""
from __future__ import annotations

from transformers import AlbertForPreTraining, AlbertModel

from model.backbones.base import Head
from model.backbones.bert import BertBackbone


class AlbertBackbone(BertBackbone):
    """transformers' ALBERT classes (BERT's uniform access, ALBERT's heads and FLOPs)."""

    model_type = "albert"
    has_pair_head = True

    def masked_lm(self, config, init_from=None, pair_head=False):
        model = AlbertForPreTraining.from_pretrained(init_from, config=config) if init_from else AlbertForPreTraining(config)
        if not pair_head:
            model.albert.pooler.requires_grad_(False)
            model.sop_classifier.requires_grad_(False)
        return model

    def encoder(self, config, init_from=None):
        model = AlbertModel.from_pretrained(init_from, config=config) if init_from else AlbertModel(config)
        model.pooler.requires_grad_(False)
        return model

    def discriminator(self, config, init_from=None):  # pragma: no cover - refused by Objective.architectures
        raise NotImplementedError("ALBERT has no replaced-token discriminator here")

    def generator(self, config, width, layers, owner):  # pragma: no cover - refused by Objective.architectures
        raise NotImplementedError("ALBERT has no generator here")

    def mlm_head(self, model) -> Head:
        return model.predictions

    def output_projection(self, model):
        return model.predictions.decoder

    def pair_logits(self, model, pooled):
        return model.sop_classifier(pooled)

    def encoder_flops(self, config, seq_len):
        # BERT's layers (sharing parameters saves memory, not FLOPs: every layer still runs) plus the E → H projection.
        return 2 * config.embedding_size * config.hidden_size + super().encoder_flops(config, seq_len)
