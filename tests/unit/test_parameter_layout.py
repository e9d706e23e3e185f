"""A checkpoint's parameters against a built model: names, what is trained and what is frozen, shapes."""
from transformers import BertConfig, BertForPreTraining

from pretrain.checkpointing.parameter_layout import built_layout, layout_differences


def _bert(hidden=32, frozen_pooler=False):
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=16))
    if frozen_pooler:  # as an MLM without a pair head builds it
        model.bert.pooler.requires_grad_(False)
    return model


def test_the_same_model_matches_and_each_kind_of_difference_is_named():
    base = built_layout(_bert())
    assert layout_differences(base, built_layout(_bert())) == []
    frozen = layout_differences(base, built_layout(_bert(frozen_pooler=True)))
    assert frozen == ["2 frozen here but trained in the checkpoint (bert.pooler.dense.bias, bert.pooler.dense.weight)"]
    assert layout_differences(built_layout(_bert(frozen_pooler=True)), base) == [
        "2 trained here but frozen in the checkpoint (bert.pooler.dense.bias, bert.pooler.dense.weight)"]
    wider = layout_differences(base, built_layout(_bert(hidden=48)))
    widened = sum(1 for t in _bert().state_dict().values() if 32 in t.shape)  # every entry with a hidden-size axis
    assert len(wider) == 1 and wider[0].startswith(f"{widened} of another shape (") and "[32] -> [48]" in wider[0], wider
    del_head = built_layout(_bert())
    for name in [n for n in del_head[1] if n.startswith("cls.seq_relationship")]:
        del del_head[1][name], del_head[0][name]
    assert layout_differences(del_head, base) == [
        "2 built here but not in the checkpoint (cls.seq_relationship.bias, cls.seq_relationship.weight)"]
    assert layout_differences(base, del_head) == [
        "2 in the checkpoint but not built here (cls.seq_relationship.bias, cls.seq_relationship.weight)"]


def test_a_stage_0_checkpoint_lists_no_trained_set_and_is_compared_by_entries_and_shapes():
    _, entries = built_layout(_bert())
    assert layout_differences((None, entries), built_layout(_bert(frozen_pooler=True))) == []
    assert "of another shape" in layout_differences((None, entries), built_layout(_bert(hidden=48)))[0]
    placeholders = {n: None for n in entries}  # ZeRO-3's empty slices: names only
    assert layout_differences((None, placeholders), built_layout(_bert(hidden=48))) == []
