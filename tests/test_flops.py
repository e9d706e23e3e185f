"""The FLOP formula behind MFU against torch's own FLOP counter on a real forward pass."""
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
    want = 3 * (encoder_forward(cfg, seq) + 0.2 * mlm_head_forward(cfg))
    assert abs(m.flops_per_token(seq) - want) < 1e-6 * want
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m.model.cls.predictions(torch.randn(10, cfg.hidden_size))
    assert abs(counter.get_total_flops() / 10 - mlm_head_forward(cfg)) / mlm_head_forward(cfg) < 0.01


def test_relative_positions_and_modernbert_match_the_counted_matmuls():
    """The backbones' FLOP formulas against torch's counter: BERT with relative_key_query, and ModernBERT (GeGLU)."""
    from transformers import ModernBertConfig, ModernBertModel

    seq = 40
    rel = _config()
    rel.position_embedding_type = "relative_key_query"
    modern = ModernBertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=96, reference_compile=False, local_attention=128,
                              pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    modern._attn_implementation = "eager"
    for cfg, model in ((rel, BertModel(rel, add_pooling_layer=False)), (modern, ModernBertModel(modern))):
        ids = torch.randint(5, 500, (2, seq))
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.eval()(ids)
        counted = counter.get_total_flops() / (2 * seq)
        assert abs(encoder_forward(cfg, seq) - counted) / counted < 0.01, (cfg.model_type, encoder_forward(cfg, seq), counted)
