"""The FLOP formula behind MFU against torch's own FLOP counter on a real forward pass."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from model.flops import encoder_forward, mlm_head_forward
from model.objectives import ObjectiveConfig, build_objective


def _config():
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256)
    cfg._attn_implementation = "eager"
    return cfg


def test_encoder_forward_matches_the_counted_matmuls():
    cfg, seq = _config(), 48
    model = BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(5, 500, (2, seq))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids)
    counted = counter.get_total_flops() / (2 * seq)
    assert abs(encoder_forward(cfg, seq) - counted) / counted < 0.01


def test_mlm_training_flops_are_three_forwards_with_a_sparse_head():
    cfg, seq = _config(), 32
    m = build_objective(ObjectiveConfig(name="mlm"), cfg, mask_prob=0.2)  # the rate is bound when it is built
    # torch's count of the objective's own networks: the encoder at every token, the head at 20% of them.
    with FlopCounterMode(display=False) as encoder, torch.no_grad():
        m.model.bert(torch.randint(5, 500, (2, seq)))  # its pooler adds 2H² a sequence: 0.1% here
    with FlopCounterMode(display=False) as head, torch.no_grad():
        m.model.cls.predictions(torch.randn(10, cfg.hidden_size))
    want = 3 * (encoder.get_total_flops() / (2 * seq) + 0.2 * head.get_total_flops() / 10)
    assert abs(m.flops_per_token(seq) - want) / want < 0.01
    assert abs(head.get_total_flops() / 10 - mlm_head_forward(cfg)) / mlm_head_forward(cfg) < 0.01


def _counted(cfg, model, seq: int = 40) -> float:
    """torch's count of a forward's FLOPs per token."""
    ids = torch.randint(5, 500, (2, seq))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(ids)
    return counter.get_total_flops() / (2 * seq)


def test_modernbert_matches_the_counted_matmuls():
    """ModernBERT's formula (Wqkv, GeGLU) against torch's counter; the sequence is shorter than the local window,
    so every layer attends to all of it (eager attention computes the whole score matrix either way)."""
    from transformers import ModernBertConfig, ModernBertModel

    modern = ModernBertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=96, reference_compile=False, local_attention=128,
                              pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    modern._attn_implementation = "eager"
    counted = _counted(modern, ModernBertModel(modern))
    assert abs(encoder_forward(modern, 40) - counted) / counted < 0.01, (encoder_forward(modern, 40), counted)


def test_modernbert_global_layers_on_either_major_and_at_other_depths():
    """Which layers attend globally, from 5.x's per-layer list or 4.x's period, and for a resized (generator) depth
    on the period of the config (literal patterns: every 3rd layer from the first, or every 2nd)."""
    from types import SimpleNamespace

    from model.backbones.modernbert import ModernBertBackbone, global_layers

    listed = SimpleNamespace(num_hidden_layers=4, global_attn_every_n_layers=3,
                             layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])
    assert global_layers(listed) == [True, False, False, True]
    assert global_layers(listed, 2) == [True, False]
    assert global_layers(listed, 7) == [True, False, False, True, False, False, True]
    period = SimpleNamespace(num_hidden_layers=5, global_attn_every_n_layers=2)  # 4.x: no list
    assert global_layers(period) == [True, False, True, False, True]
    short = SimpleNamespace(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"])  # period unknown
    assert global_layers(short, 4) == [True, False, False, True]  # transformers' default period, 3
    # The attended span per layer at 100 tokens: all of them in global layers, the 10-token window elsewhere.
    shaped = SimpleNamespace(**vars(listed), hidden_size=8, intermediate_size=8, local_attention=10)
    assert ModernBertBackbone().encoder_flops(shaped, 100) == 4 * (8 * 64 + 6 * 64) + 4 * 8 * (100 + 10 + 10 + 100)


def test_relative_positions_match_the_counted_matmuls_where_transformers_has_them():
    """BERT's relative_key_query formula against torch's counter on transformers 4.x (the compatibility subset runs
    it there); transformers 5 has no relative positions, and the backbone refuses them."""
    from core.errors import ConfigError
    from model.backbones.bert import BertBackbone, relative_positions_available
    from model.encoder import EncoderConfig

    if not relative_positions_available():
        with pytest.raises(ConfigError, match="no relative position embeddings"):
            BertBackbone().check(EncoderConfig(position_embedding="relative_key_query"))
        return
    rel = _config()
    rel.position_embedding_type = "relative_key_query"
    counted = _counted(rel, BertModel(rel, add_pooling_layer=False))
    assert abs(encoder_forward(rel, 40) - counted) / counted < 0.01, (encoder_forward(rel, 40), counted)
