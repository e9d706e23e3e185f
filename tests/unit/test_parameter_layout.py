"""A checkpoint's parameters against a built model: names, what is trained and what is frozen, shapes."""
import torch
from transformers import BertConfig, BertForPreTraining

from pretrain.checkpointing.checkpoint import MODULE_STATES, ZERO3_MODULE_STATES
from pretrain.checkpointing.parameter_layout import (built_groups, built_layout, group_differences, layout_differences,
                                                     layout_refusal, saved_groups, saved_layout)


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


def _deepspeed_files(folder, model, zero3=False):
    """A tag's module-states file as DeepSpeed 0.19 writes it: the state dict (ZeRO-3: empty placeholders, one file
    per rank), the trained parameters' full shapes per optimizer group, the frozen ones' (ZeRO-3) apart."""
    trained = [(n, p.shape) for n, p in model.named_parameters() if p.requires_grad]
    states = {"module": {n: torch.empty(0) if zero3 else t for n, t in model.state_dict().items()},
              "param_shapes": [dict(trained[::2]), dict(trained[1::2])], "buffer_names": [],
              "frozen_param_shapes": {n: p.shape for n, p in model.named_parameters() if not p.requires_grad}
              if zero3 else None}
    folder.mkdir()
    torch.save(states, folder / (ZERO3_MODULE_STATES if zero3 else MODULE_STATES))
    return folder


def test_the_checkpoint_files_of_every_stage_are_read_as_deepspeed_writes_them(tmp_path):
    """Stages 1-2 (one file, whole tensors) and 3 (per-rank files of placeholders; shapes in param_shapes and
    frozen_param_shapes); the MLM decoder tied to the embeddings is two entries but one trained parameter."""
    for zero3 in (False, True):
        saved = saved_layout(_deepspeed_files(tmp_path / f"zero3_{zero3}", _bert(frozen_pooler=True), zero3))
        assert layout_differences(saved, built_layout(_bert(frozen_pooler=True))) == [], zero3
        assert "cls.predictions.decoder.weight" in saved[1] and "cls.predictions.decoder.weight" not in saved[0]
        wider = layout_differences(saved, built_layout(_bert(hidden=48, frozen_pooler=True)))
        assert len(wider) == 1 and "bert.embeddings.LayerNorm.bias [32] -> [48]" in wider[0], wider
        assert layout_differences(saved, built_layout(_bert())) == [
            "2 trained here but frozen in the checkpoint (bert.pooler.dense.bias, bert.pooler.dense.weight)"]


def test_a_parameter_without_elements_is_counted_as_deepspeed_counts_it():
    """DeepSpeed lists an empty trainable parameter with the frozen ones: so does the built side."""
    model = _bert()
    model.register_parameter("empty", torch.nn.Parameter(torch.empty(0)))
    trained, entries = built_layout(model)
    assert "empty" not in trained and entries["empty"] == (0,)


def test_the_refusal_blames_the_changed_options_or_else_the_code(tmp_path):
    differences = ["2 in the checkpoint but not built here (gen.a, gen.b)", "1 of another shape (w [4] -> [8])"]
    head = (f"checkpoint {tmp_path} holds other parameters than this launch builds: 2 in the checkpoint but not built "
            "here (gen.a, gen.b); 1 of another shape (w [4] -> [8]). ")
    tail = ", or start a new run from its export (model.init_from)"
    changed = layout_refusal(tmp_path, differences, " (objective.generator_layers 2 -> 4)")
    assert changed == head + ("An option that shapes the model differs from the one it was saved with "
                              "(objective.generator_layers 2 -> 4): resume with that config") + tail
    same = layout_refusal(tmp_path, differences, "")
    assert same == head + ("The config is the one it was saved with, so the code that builds the model or its "
                           "optimizer differs (another version of this project or of transformers): resume with the "
                           "code that saved it") + tail


def _xlnet():
    from transformers import XLNetConfig, XLNetLMHeadModel

    return XLNetLMHeadModel(XLNetConfig(vocab_size=50, d_model=32, n_layer=2, n_head=2, d_inner=64))


def test_xlnets_relative_attention_biases_are_not_decayed():
    """XLNet keeps every *bias out of weight decay: its 2-d r_w/r_r/r_s biases too, beside the 1-d ones."""
    decay, no_decay = built_groups(_xlnet())
    relative = {f"transformer.layer.{i}.rel_attn.{b}" for i in range(2) for b in ("r_w_bias", "r_r_bias", "r_s_bias")}
    assert relative <= set(no_decay) and not relative & set(decay)
    assert "transformer.layer.0.rel_attn.q" in decay and "transformer.mask_emb" in decay
    assert "transformer.layer.0.ff.layer_1.bias" in no_decay and "transformer.layer.0.ff.layer_norm.weight" in no_decay
    bert_decay, bert_no_decay = built_groups(_bert())  # BERT's groups: its matrices, and its 1-d parameters
    model = _bert()
    assert set(bert_decay) == {n for n, p in model.named_parameters() if p.ndim == 2}
    assert set(bert_no_decay) == {n for n, p in model.named_parameters() if p.ndim == 1}


def test_a_checkpoint_whose_optimizer_grouped_parameters_otherwise_is_refused(tmp_path):
    """A checkpoint written when XLNet's relative biases were decayed: the same parameters, in other optimizer groups
    (ZeRO's named groups; a plain optimizer's sizes), which DeepSpeed would load into the wrong group's moments."""
    model = _xlnet()
    decay, no_decay = built_groups(model)
    moved = [n for n in no_decay if n.endswith(("r_w_bias", "r_r_bias", "r_s_bias"))]
    old = [decay + moved, [n for n in no_decay if n not in moved]]
    shapes = dict((n, p.shape) for n, p in model.named_parameters())
    for name, groups in (("same", [decay, no_decay]), ("old", old)):
        (tmp_path / name).mkdir()
        torch.save({"module": model.state_dict(), "param_shapes": [{n: shapes[n] for n in g} for g in groups]},
                   tmp_path / name / MODULE_STATES)
        (tmp_path / f"{name}_plain").mkdir()
        plain = {"state": {}, "param_groups": [{"params": list(range(len(g)))} for g in groups]}
        torch.save({"module": model.state_dict(), "optimizer": plain, "param_shapes": None},
                   tmp_path / f"{name}_plain" / MODULE_STATES)
    built = built_groups(model)
    assert saved_groups(tmp_path / "same") == [set(decay), set(no_decay)]
    assert group_differences(saved_groups(tmp_path / "same"), built) == []
    assert group_differences(saved_groups(tmp_path / "same_plain"), built) == []
    assert group_differences(saved_groups(tmp_path / "old"), built) == [
        "6 in another optimizer group (weight decay) than in the checkpoint (transformer.layer.0.rel_attn.r_r_bias, "
        "transformer.layer.0.rel_attn.r_s_bias, transformer.layer.0.rel_attn.r_w_bias, ...)"]
    assert group_differences(saved_groups(tmp_path / "old_plain"), built) == [
        f"optimizer groups of {[len(decay) + 6, len(no_decay) - 6]} parameters in the checkpoint but "
        f"{[len(decay), len(no_decay)]} here"]
    # ZeRO-3 saves sub-groups (each group split every sub_group_size elements): the same grouping, not a change.
    sub_groups = [set(decay[:5]), set(decay[5:]), set(no_decay[:3]), set(no_decay[3:])]
    assert group_differences(sub_groups, built) == []
    assert group_differences([set(decay[:5]), set(decay[5:] + moved), set(no_decay[:3]) - set(moved),
                              set(no_decay[3:]) - set(moved)], built)[0].startswith("6 in another optimizer group")
    (tmp_path / "stage0").mkdir()  # neither listed: nothing to compare
    torch.save({"module": model.state_dict(), "param_shapes": None}, tmp_path / "stage0" / MODULE_STATES)
    assert saved_groups(tmp_path / "stage0") is None
