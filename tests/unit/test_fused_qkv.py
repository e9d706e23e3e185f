"""train.fused_qkv: BERT-layout attention computes Q, K and V with one matmul over its three weights, and nothing a
user sees changes: the outputs and every gradient are the unfused model's, the parameters keep transformers' names,
and ZeRO-3 (which gathers each projection only when its own module runs) is refused."""
import copy

import pytest
import torch

from core.errors import ConfigError
from model.backbones import backbone_for
from model.encoder import EncoderConfig, model_config
from model.fused_qkv import fuse_qkv
from pretrain.config import TrainConfig

TOK = {"vocab_size": 120, "pad_id": 0, "cls_id": 2, "sep_id": 3, "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]}


def _bert_config(dropout=0.0):
    enc = EncoderConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=64,
                        dropout=dropout, attention_dropout=dropout)
    return model_config(enc, TOK, 64)


@pytest.mark.parametrize("build", ["masked_lm", "discriminator", "generator"])
def test_fused_model_gives_the_unfused_outputs_and_gradients(build):
    backbone, config = backbone_for("bert"), _bert_config()
    torch.manual_seed(0)
    if build == "generator":  # ELECTRA's narrower generator beside a discriminator (ElectraSelfAttention)
        owner = backbone.discriminator(config)
        model = backbone.generator(config, 0.5, 2, owner)
    else:
        model = getattr(backbone, build)(config)
    fused = copy.deepcopy(model)
    names = [n for n, _ in model.named_parameters()]
    assert fuse_qkv(fused) == 2
    assert [n for n, _ in fused.named_parameters()] == names  # transformers' own layout: query, key, value
    ids = torch.randint(5, 120, (3, 17), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    outputs = []
    for m in (model, fused):
        out = m(input_ids=ids, attention_mask=mask)
        logits = out.logits if hasattr(out, "logits") else out.prediction_logits
        (logits.double() ** 2).mean().backward()
        outputs.append((logits.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
    (want, want_grads), (got, got_grads) = outputs
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got_grads.keys() == want_grads.keys() and any(".query." in n for n in got_grads)
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_fused_attention_dropout_still_applies_in_training():
    model = backbone_for("bert").encoder(_bert_config(dropout=0.5))
    fuse_qkv(model)
    ids = torch.randint(5, 120, (2, 9), generator=torch.Generator().manual_seed(2))
    model.train()
    torch.manual_seed(0)
    a = model(input_ids=ids).last_hidden_state
    torch.manual_seed(1)
    b = model(input_ids=ids).last_hidden_state
    model.eval()
    c, d = model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state
    assert not torch.equal(a, b) and torch.equal(c, d)


def test_modernbert_has_nothing_to_fuse():
    enc = EncoderConfig(architecture="modernbert", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                        max_position_embeddings=64)
    assert fuse_qkv(backbone_for("modernbert").masked_lm(model_config(enc, TOK, 64))) == 0


def test_fused_qkv_with_zero3_is_refused():
    with pytest.raises(ConfigError, match="train.fused_qkv=true needs ZeRO stage 0-2"):
        TrainConfig(fused_qkv=True, zero_stage=3).validate()
    TrainConfig(fused_qkv=True, zero_stage=2).validate()


def test_only_transformers_own_classes_are_fused_not_their_subclasses():
    """A subclass may compute its scores itself (transformers 4.x's per-kernel classes did): it keeps its forward."""
    from transformers.models.bert.modeling_bert import BertSelfAttention

    class Scored(BertSelfAttention):
        pass

    config = _bert_config()
    holder = torch.nn.ModuleList([BertSelfAttention(config), Scored(config)])
    assert fuse_qkv(holder) == 1 and "forward" in vars(holder[0]) and "forward" not in vars(holder[1])
