"""Every objective on every backbone: trains a step, and its export loads in transformers' own Auto classes with no
custom code, no newly initialised root weights, and the live model's outputs."""
import functools
import json

import numpy as np
import pytest
import torch

from data_pipeline.batches import MaskingCollate
from data_pipeline.masking import MaskingConfig, batch_prediction_slots, build_masking
from data_pipeline.shards import read_manifest
from pretrain.exporting.export import write_tokenizer
from model.backbones import Backbone
from model.backbones.base import relative_positions_available
from core.errors import ConfigError
from model.encoder import EncoderConfig, model_config
from model.objectives import ObjectiveConfig, build_objective, objective_class, runs_on
from data_pipeline.dataset_dir import DatasetDir

BACKBONES = {
    "bert": {"architecture": "bert"},
    "modernbert": {"architecture": "modernbert", "local_attention": 16},  # below the batches' 40: sliding windows run
    "albert": {"architecture": "albert", "embedding_size": 16},
    "xlnet": {"architecture": "xlnet"},
}
if relative_positions_available():  # transformers 4.x: the compatibility subset (tests/process/test_transformers_versions.py)
    BACKBONES["bert-relkq"] = {"architecture": "bert", "position_embedding": "relative_key_query"}
OBJECTIVES = ("mlm", "electra", "coco_lm", "taco", "tacl", "spanbert", "declutr", "xlnet")
# Every objective on every backbone that provides what it needs.
MATRIX = [(b, o) for b in BACKBONES for o in OBJECTIVES
          if BACKBONES[b]["architecture"] in runs_on(objective_class(o))]
# Root folders that carry an MLM head (fill-mask works); generator/ sub-folders always do.
MLM_ROOT = {"mlm", "taco", "tacl", "spanbert", "declutr"}


def _config(backbone: str, tok: dict, num_layers: int = 2):
    enc = EncoderConfig(hidden_size=32, num_layers=num_layers, num_heads=2, intermediate_size=64, max_position_embeddings=64,
                        dropout=0.0, attention_dropout=0.0, **BACKBONES[backbone])
    return model_config(enc, tok, 64)


def _batch(tok: dict, name: str, seed: int = 0, padded: bool = True, budget=None) -> dict:
    """A batch as the loader's collate builds it (row 2 shorter and padded unless `padded` is false), flags included;
    `budget(rows, seq_len)` in place of the run's prediction budget."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, tok["vocab_size"], (6, 40), generator=g)
    ids[:, 0], ids[:, -1] = tok["cls_id"], tok["sep_id"]
    if padded:
        ids[2, 30:], ids[2, 29] = tok["pad_id"], tok["sep_id"]
    masking = MaskingConfig(**objective_class(name).masking)  # what the objective declares it needs
    starts = torch.rand(tok["vocab_size"], generator=g) < 0.6 if masking.strategy in ("span", "plm") else None
    transform = build_masking(masking, tok["vocab_size"], tok["mask_id"], tok["special_ids"], pad_id=tok["pad_id"],
                              cls_id=tok["cls_id"], sep_id=tok["sep_id"], word_starts=starts)
    if name in ("declutr", "xlnet"):  # views (DeCLUTR) and permutations (XLNet) per sample, as the loader builds them
        transform = objective_class(name).wrap_masking(ObjectiveConfig().declutr, transform, tok["pad_id"], tok["cls_id"],
                                                       tok["sep_id"])
    rows = [{"input_ids": row[row != tok["pad_id"]].numpy(), "token_type_ids": np.zeros(int((row != tok["pad_id"]).sum())),
             "sample_id": i} for i, row in enumerate(ids)]
    # The run's collate: a batch's predictions padded to its own budget (batch_prediction_slots), not every row's.
    return MaskingCollate(transform, tok["pad_id"], seed,
                          batch_slots=budget or functools.partial(batch_prediction_slots, masking))(rows)


def _build(backbone: str, name: str, tok: dict, tmp_path, num_layers: int = 2, options: ObjectiveConfig | None = None):
    config = _config(backbone, tok, num_layers)
    options = options or ObjectiveConfig(name=name)
    options.coco_lm.generator_layers = 1
    options.taco.negatives = 8
    torch.manual_seed(0)
    init_from = None
    if name == "tacl":  # TaCL continues a checkpoint: a fresh masked LM of this backbone stands in for it
        init_from = tmp_path / "teacher"
        build_objective(ObjectiveConfig(name="mlm"), config).model.save_pretrained(str(init_from))
    return build_objective(options, config, str(init_from) if init_from else None)


def _logits(out) -> torch.Tensor:
    """Token logits of a head model's output (BertForPreTraining calls them prediction_logits)."""
    return out.logits if getattr(out, "logits", None) is not None else out.prediction_logits


@pytest.mark.parametrize("backbone,name", MATRIX, ids=[f"{o}-{b}" for b, o in MATRIX])
def test_export_loads_natively(backbone, name, prepared, tmp_path):
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForPreTraining,
        AutoModelForTokenClassification,
        AutoTokenizer,
        pipeline,
    )

    tok = read_manifest(prepared)["tokenizer"]
    objective = _build(backbone, name, tok, tmp_path)
    objective.train()
    loss, metrics = objective(_batch(tok, name))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
    objective.eval()
    probe = _batch(tok, "mlm", seed=1)
    inputs = {"input_ids": probe["original_input_ids"], "attention_mask": probe["attention_mask"]}
    models = objective.hf_models()
    assert set(models) == ({"", "generator"} if name in ("electra", "coco_lm") else {""})
    for sub, live in models.items():
        folder = tmp_path / "export" / sub
        live.save_pretrained(str(folder))
        write_tokenizer(DatasetDir(prepared).tokenizer, live, folder)
        saved = json.loads((folder / "config.json").read_text())
        assert saved["model_type"] == ("modernbert" if backbone == "modernbert" else saved["model_type"])
        assert "auto_map" not in saved  # nothing asks for trust_remote_code
        with torch.no_grad():
            want = Backbone.base(live)(**inputs).last_hidden_state
        encoder, info = AutoModel.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"], (sub, info["missing_keys"])
        with torch.no_grad():
            got = encoder.eval()(**inputs).last_hidden_state
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (sub, (got - want).abs().max())
        # As users call an encoder: the tokenizer's output straight into the model (ModernBERT has no token types).
        with torch.no_grad():
            encoder(**AutoTokenizer.from_pretrained(folder)(["In the beginning God created the heaven."], return_tensors="pt"))
        if name == "xlnet":
            cls = AutoModelForCausalLM
        elif sub == "generator" or name in MLM_ROOT:
            cls = AutoModelForMaskedLM
        elif name == "electra":
            cls = AutoModelForTokenClassification if backbone == "modernbert" else AutoModelForPreTraining
        else:
            continue
        model, info = cls.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"], (sub, info["missing_keys"])
        assert cls is AutoModelForMaskedLM or type(model) is type(live), (cls, type(model))
        with torch.no_grad():
            got_logits, want_logits = _logits(model.eval()(**inputs)), _logits(live(**inputs))
        assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
        if cls is AutoModelForMaskedLM:
            fill = pipeline("fill-mask", model=str(folder), tokenizer=AutoTokenizer.from_pretrained(str(folder)))
            preds = fill(f"In the beginning God created the heaven and the {fill.tokenizer.mask_token}.", top_k=3)
            assert len(preds) == 3 and all(0.0 <= p["score"] <= 1.0 for p in preds)
    for head_name, head in objective.side_heads().items():  # SpanBERT's SBO head, beside the root
        head.save(tmp_path / "export", head_name)
        loaded = type(head).load(tmp_path / "export", head_name).eval()
        x = torch.randn(5, head.shape.hidden_size)
        offsets = torch.tensor([1, 2, 3, 40, 1])
        with torch.no_grad():
            assert torch.equal(loaded(x, x.flip(0), offsets), head.eval()(x, x.flip(0), offsets))


# Each objective's loss as the README writes it: its terms, and the option that weights each one (None: weight 1).
WEIGHTED = {
    "electra": {"generator_mlm_loss": None, "rtd_loss": "rtd_weight"},
    "coco_lm": {"generator_mlm_loss": None, "copy_loss": "copy_weight", "clm_loss": None, "scl_loss": "scl_weight"},
    "tacl": {"mlm_loss": None, "tacl_loss": "weight"},
    "taco": {"mlm_loss": None, "tc_loss": "weight"},
    "spanbert": {"mlm_loss": None, "sbo_loss": "sbo_weight"},
    "declutr": {"declutr_loss": None, "mlm_loss": "mlm_weight"},
}


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_each_loss_weight_option_weights_its_own_term(name, prepared, tmp_path):
    """A weight whose name stopped matching its term would weight it 1 with no error: ELECTRA would train RTD at 1, not
    50. The total must be the README's sum of the terms the objective logged, each at the weight set here."""
    tok = read_manifest(prepared)["tokenizer"]
    options = ObjectiveConfig(name=name)
    weights = {term: 1.0 for term in WEIGHTED[name]}
    for number, (term, key) in enumerate(t for t in WEIGHTED[name].items() if t[1]):
        weights[term] = 3.0 + 4.0 * number
        setattr(getattr(options, name), key, weights[term])
    objective = _build("bert", name, tok, tmp_path, options=options)
    objective.eval()
    total, logged = objective(_batch(tok, name))
    expected = sum(w * logged[term].double() for term, w in weights.items())
    assert abs(total.item() - expected.item()) <= 1e-5 * abs(expected.item()), (total.item(), expected.item(), logged)
    assert all(logged[term] != 0 for term in weights)  # a zero term would pass with any weight
    defaults = ObjectiveConfig()
    assert defaults.electra.rtd_weight == 50 and defaults.coco_lm.copy_weight == 50  # "50 · RTD", "50 · copy"


def test_generator_shares_the_main_embeddings_where_widths_match():
    """COCO-LM's full-width generator reads the main model's embedding module on both backbones; a narrower
    ModernBERT ELECTRA generator keeps its own (no projection exists), a narrower BERT one projects the shared ones."""
    tok = {"vocab_size": 120, "pad_id": 0, "cls_id": 2, "sep_id": 3}
    for backbone in ("bert", "modernbert"):
        config = _config(backbone, tok)
        coco = build_objective(ObjectiveConfig(name="coco_lm"), config)
        assert Backbone.base(coco.generator).embeddings is coco.main.embeddings
        emb = Backbone.word_embeddings(coco.main).weight
        assert coco.generator.get_output_embeddings().weight is emb and coco.clm_head.weight is emb
        electra = build_objective(ObjectiveConfig(name="electra"), config)
        shared = Backbone.base(electra.generator).embeddings is Backbone.base(electra.discriminator).embeddings
        assert shared == (backbone == "bert")


@pytest.mark.parametrize("backbone", ["bert", "modernbert"])
def test_coco_lm_narrow_generator(backbone, tmp_path):
    """coco_lm.generator_width=0.5: a half-width generator that trains with the main model, shares the embeddings
    the way ELECTRA's narrow generator does, and leaves the CLM head tied to the main model's embeddings."""
    tok = {"vocab_size": 120, "pad_id": 0, "cls_id": 2, "sep_id": 3, "mask_id": 4, "special_ids": [0, 1, 2, 3, 4]}
    options = ObjectiveConfig(name="coco_lm")
    options.coco_lm.generator_layers, options.coco_lm.generator_width = 1, 0.5
    torch.manual_seed(0)
    coco = build_objective(options, _config(backbone, tok))
    assert coco.generator.config.hidden_size == 16 and coco.main.config.hidden_size == 32
    shared = Backbone.base(coco.generator).embeddings is Backbone.base(coco.main).embeddings
    assert shared == (backbone == "bert")
    assert coco.clm_head.weight is Backbone.word_embeddings(coco.main).weight
    coco.train()
    loss, metrics = coco(_batch(tok, "coco_lm"))
    loss.backward()
    assert torch.isfinite(loss) and metrics["generator_mlm_loss"] > 0
    own = [p for n, p in coco.generator.named_parameters() if "embeddings" not in n]
    assert own and all(p.grad is not None for p in own)


def test_objectives_refuse_backbones_that_lack_what_they_need(prepared):
    """ALBERT has no discriminator or generator, and its output projection reads E-wide vectors; XLNet's head model
    is driven only by the permutation LM: each refusal names what is missing and where the objective runs."""
    tok = read_manifest(prepared)["tokenizer"]
    refused = {("albert", "electra"): "discriminator, generator", ("albert", "coco_lm"): "generator",
               ("albert", "spanbert"): "hidden_projection", ("albert", "xlnet"): "permutation_lm",
               ("xlnet", "mlm"): "masked_lm", ("xlnet", "tacl"): "encoder, masked_lm", ("bert", "xlnet"): "permutation_lm"}
    for (backbone, name), missing in refused.items():
        with pytest.raises(ConfigError, match=rf"objective.name={name} runs on model.architecture .* not "
                                              rf"{BACKBONES[backbone]['architecture']} \(it has no {missing}\)"):
            build_objective(ObjectiveConfig(name=name), _config(backbone, tok))
    assert [o for o in OBJECTIVES if "albert" in runs_on(objective_class(o))] == ["mlm", "taco", "tacl", "declutr"]


def test_albert_layers_share_their_groups_weights_as_model_num_hidden_groups_says(prepared):
    tok = read_manifest(prepared)["tokenizer"]
    enc = EncoderConfig(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64, max_position_embeddings=64,
                        architecture="albert", embedding_size=16, num_hidden_groups=2)
    model = build_objective(ObjectiveConfig(name="mlm"), model_config(enc, tok, 64)).model
    groups = model.albert.encoder.albert_layer_groups
    assert model.config.num_hidden_groups == 2 and len(groups) == 2
    h, e, layer = 32, 16, 4 * (32 * 32 + 32) + 2 * 32 * 64 + 64 + 32 + 2 * 2 * 32  # one layer, as in the test below
    assert sum(p.numel() for p in model.albert.encoder.parameters()) == 2 * layer + e * h + h  # two sets for 4 layers
    queries = [dict(g.named_parameters())["albert_layers.0.attention.query.weight"] for g in groups]
    assert not torch.equal(*queries)  # drawn apart
    with pytest.raises(ConfigError, match=r"'model.num_hidden_groups' \(3\) must divide model.num_layers \(4\)"):
        EncoderConfig(hidden_size=32, num_layers=4, num_heads=2, architecture="albert", num_hidden_groups=3).validate()


def test_albert_is_smaller_than_bert_and_exports_its_sop_head(prepared, tmp_path):
    """Factorized embeddings + one shared layer: far fewer parameters than BERT of the same H and depth; the
    MLM + SOP model loads as AlbertForPreTraining with both heads' outputs, and as AutoModelForMaskedLM."""
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

    tok = read_manifest(prepared)["tokenizer"]
    options = ObjectiveConfig(name="mlm")
    options.mlm.pair_head = "sop"
    torch.manual_seed(0)
    albert = build_objective(options, _config("albert", tok))
    bert = build_objective(options, _config("bert", tok))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    h, e, v, layers = 32, 16, tok["vocab_size"], 2
    layer = 4 * (h * h + h) + 2 * h * 64 + 64 + h + 2 * 2 * h  # attention, FFN, biases and two LayerNorms
    # One layer's weights for both layers, plus the E -> H projection.
    assert count(bert.model.bert.encoder) == layers * layer and count(albert.model.albert.encoder) == layer + e * h + h
    assert albert.model.albert.embeddings.word_embeddings.weight.shape == (v, e)
    assert count(albert.model) < count(bert.model) - v * (h - e) - (layers - 1) * layer + e * h + h
    albert.train()
    batch = _batch(tok, "mlm")
    batch["pair_label"] = torch.tensor([0, 1, 0, 1, 1, 0])
    loss, metrics = albert(batch)
    loss.backward()
    assert {"mlm_loss", "sop_loss", "sop_accuracy"} <= set(metrics)
    assert albert.model.sop_classifier.classifier.weight.grad is not None
    albert.eval()
    albert.model.save_pretrained(str(tmp_path / "albert"))
    ids, mask = batch["original_input_ids"], batch["attention_mask"]
    pre = AutoModelForPreTraining.from_pretrained(tmp_path / "albert").eval()
    assert type(pre).__name__ == "AlbertForPreTraining"
    with torch.no_grad():
        got, want = pre(input_ids=ids, attention_mask=mask), albert.model(input_ids=ids, attention_mask=mask)
        assert torch.allclose(got.prediction_logits, want.prediction_logits, atol=1e-5, rtol=0)
        assert torch.allclose(got.sop_logits, want.sop_logits, atol=1e-5, rtol=0)
        mlm = AutoModelForMaskedLM.from_pretrained(tmp_path / "albert").eval()
        assert torch.allclose(mlm(input_ids=ids, attention_mask=mask).logits, want.prediction_logits, atol=1e-5, rtol=0)


def test_every_objective_names_a_loader_its_export_fits():
    """The model card's usage line: each objective's export_loader is a transformers Auto class, and the export's root
    loads in it (checked by class above for every objective on every backbone)."""
    import transformers

    from model.objectives import REGISTRY

    for name in REGISTRY:
        spec = objective_class(name)
        assert spec.export_loader.startswith("Auto") and hasattr(transformers, spec.export_loader), name
        assert "{root}" in spec.export_holds, name
    assert objective_class("mlm").export_loader == "AutoModelForMaskedLM"
    assert objective_class("xlnet").export_loader == "AutoModelForCausalLM"
