"""A new backbone and a new objective are each one class plus one registry line: both are defined in this module
alone (their registry lines patched in), then configured (the backbone's own key and the objective's own option
included), built, trained a step, FLOP-counted and exported, and the export loads in transformers' Auto classes with
the live model's outputs."""
import dataclasses
import json

import pytest
import torch
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM, DistilBertConfig, DistilBertForMaskedLM, DistilBertModel

import model.backbones as backbones
import model.objectives as objectives
from core.config_io import config_to_dict, load_config
from core.errors import ConfigError
from data_pipeline.shards import read_manifest
from model import flops
from model.backbones import Backbone, backbone_for
import model.encoder as encoder
from model.encoder import model_config
from model.objectives.base import Objective
from model.objectives.mlm import sparse_mlm
from pretrain.config import RunConfig
from pretrain.exporting.model_card import render
from pretrain.run_dir import RunDir


@dataclasses.dataclass
class DistilBertOptions:
    """The toy family's own key."""

    sinusoidal_pos_embds: bool = False


class DistilBertBackbone(Backbone):
    """transformers' DistilBERT: no token types, no pooler, a masked LM and a bare encoder."""

    model_type = "distilbert"
    config_class = DistilBertConfig
    options_class = DistilBertOptions
    provides = frozenset({"masked_lm", "encoder", "hidden_projection"})

    def hf_config(self, cfg, tokenizer):
        return DistilBertConfig(vocab_size=tokenizer["vocab_size"], dim=cfg.hidden_size, n_layers=cfg.num_layers,
                                n_heads=cfg.num_heads, hidden_dim=cfg.intermediate_size,
                                max_position_embeddings=cfg.max_position_embeddings, dropout=cfg.dropout,
                                attention_dropout=cfg.attention_dropout, pad_token_id=tokenizer["pad_id"],
                                sinusoidal_pos_embds=cfg.sinusoidal_pos_embds)

    def masked_lm(self, config, init_from=None, pair_head=False):
        return DistilBertForMaskedLM.from_pretrained(init_from, config=config) if init_from else DistilBertForMaskedLM(config)

    def encoder(self, config, init_from=None):
        return DistilBertModel.from_pretrained(init_from, config=config) if init_from else DistilBertModel(config)

    def mlm_head(self, model):
        return lambda hidden: model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(hidden))))

    def output_projection(self, model):
        return model.vocab_projector

    def encoder_flops(self, config, seq_len):
        h, i = config.dim, config.hidden_dim
        return config.n_layers * (8 * h * h + 4 * h * i + 4 * seq_len * h)


@dataclasses.dataclass
class ToyOptions:
    """The toy objective's one option."""

    scale: float = 1.0


class ToyObjective(Objective):
    """MLM whose loss is scaled: the smallest objective with options, FLOPs, a model card and an export."""

    options_class = ToyOptions
    export_holds = "`{root}` trained by the toy objective"
    export_loader = "AutoModelForMaskedLM"

    def __init__(self, config, options: ToyOptions, init_from=None) -> None:
        super().__init__()
        self.backbone = backbone_for(config)
        self.model = self.backbone.masked_lm(config, init_from)
        self.weights = {"toy_loss": options.scale}

    def terms(self, batch):
        hidden = self.backbone.encode(self.backbone.base(self.model), batch["input_ids"], batch["attention_mask"],
                                      batch.get("token_type_ids")).last_hidden_state
        loss, accuracy = sparse_mlm(hidden, batch["labels"], self.backbone.mlm_head(self.model))
        return {"toy_loss": loss}, {"toy_accuracy": accuracy}

    def flops_per_token(self, seq_len: int) -> float:
        return flops.TRAIN * flops.mlm_forward(self.model.config, seq_len, self.mask_prob)

    def hf_models(self) -> dict[str, nn.Module]:
        return {"": self.model}


@pytest.fixture
def registered(monkeypatch):
    """The two registry lines a real addition writes into model/backbones/__init__.py and model/objectives/__init__.py."""
    monkeypatch.setitem(backbones.REGISTRY, "distilbert", f"{__name__}:DistilBertBackbone")
    monkeypatch.setitem(objectives.REGISTRY, "toy", f"{__name__}:ToyObjective")
    # The typed `objective` and `model` sections, now with `objective.toy` and `model.sinusoidal_pos_embds`.
    return objectives._objective_config_class(), encoder._encoder_config_class()


def test_toy_backbone_and_objective_train_and_export(registered, prepared, tmp_path):
    objective_config, encoder_config = registered
    run_config = dataclasses.make_dataclass("Run", [
        ("objective", objective_config, dataclasses.field(default_factory=objective_config)),
        ("model", encoder_config, dataclasses.field(default_factory=encoder_config))])
    cfg = load_config(run_config, None, ["model.architecture=distilbert", "model.hidden_size=32", "model.num_layers=2",
                                         "model.num_heads=2", "model.intermediate_size=64", "model.dropout=0.0",
                                         "model.attention_dropout=0.0", "model.sinusoidal_pos_embds=true",
                                         "objective.name=toy", "objective.toy.scale=2.0"])
    cfg.model.validate()
    spec = objectives.resolve_objective(cfg.objective, cfg.model, None)  # the path a training run takes
    manifest = read_manifest(prepared)
    tok = manifest["tokenizer"]
    config = model_config(cfg.model, tok, 64)
    assert type(config) is DistilBertConfig and (config.dim, config.n_layers, config.vocab_size) == (32, 2, tok["vocab_size"])
    assert config.sinusoidal_pos_embds is True  # the family's own key reached its transformers config
    torch.manual_seed(0)
    toy = spec.build(config, mask_prob=0.2)

    # One training step: the option weights the loss, gradients reach the encoder.
    ids = torch.randint(10, tok["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[:, 3::5] = ids[:, 3::5]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss, metrics = toy(batch)
    assert torch.isclose(loss, 2.0 * metrics["toy_loss"])
    loss.backward()
    assert toy.model.distilbert.transformer.layer[0].attention.q_lin.weight.grad.abs().sum() > 0
    # FLOPs at the bound masking rate: the encoder's matmuls plus the head at 20% of the tokens.
    head = 2 * 32 * 32 + 2 * 32 * tok["vocab_size"]
    assert toy.flops_per_token(24) == pytest.approx(3 * (2 * (8 * 32 * 32 + 4 * 32 * 64 + 4 * 24 * 32) + 0.2 * head))

    # Export: the HF folder loads natively with the live outputs; the model card comes from the objective class.
    toy.eval()
    folder = tmp_path / "export"
    toy.hf_models()[""].save_pretrained(str(folder))
    with torch.no_grad():
        want = toy.model(input_ids=ids).logits
        got = AutoModelForMaskedLM.from_pretrained(folder).eval()(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
        assert type(AutoModel.from_pretrained(folder)).__name__ == "DistilBertModel"
    run_cfg = config_to_dict(RunConfig())
    run_cfg["objective"] = {"name": "toy", "toy": {"scale": 2.0}}
    card = render(run_cfg, json.loads((folder / "config.json").read_text()), manifest, {"step": 3}, "step_3",
                  RunDir(tmp_path / "run"), {"": 1}, {"": "DistilBertForMaskedLM"})
    assert "This folder holds `DistilBertForMaskedLM` trained by the toy objective." in card
    assert "model = AutoModelForMaskedLM.from_pretrained(PATH)" in card and "- distilbert: " in card


def test_toy_backbone_refuses_keys_it_does_not_read_and_objectives_it_cannot_run(registered):
    """Other families' keys, kernels it lacks, objectives needing what it does not provide: one line each; and its own
    key, set for another family, is refused naming the toy family."""
    EncoderConfig = registered[1]
    with pytest.raises(ConfigError, match="'model.position_embedding' does not apply to model.architecture=distilbert"):
        EncoderConfig(architecture="distilbert", position_embedding="relative_key").validate()
    with pytest.raises(ConfigError, match=r"'model.sinusoidal_pos_embds' does not apply to model.architecture=bert "
                                          r"\(model.architecture=distilbert reads it\)"):
        EncoderConfig(architecture="bert", sinusoidal_pos_embds=True).validate()
    with pytest.raises(ConfigError, match="flash_attention_2.*not available for model.architecture=distilbert"):
        EncoderConfig(architecture="distilbert", attn_implementation="flash_attention_2").validate()
    with pytest.raises(ConfigError, match="unknown architecture 'distilbertt'; known: bert, .*distilbert"):
        EncoderConfig(architecture="distilbertt").validate()
    config = DistilBertConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    with pytest.raises(ConfigError, match=r"objective.name=electra runs on .* not distilbert \(it has no discriminator"):
        objectives.build_objective(registered[0](name="electra"), config)
    assert "distilbert" in objectives.runs_on(objectives.objective_class("tacl"))
