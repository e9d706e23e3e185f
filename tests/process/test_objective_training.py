"""Every objective through the real trainer on 2 ranks, at ZeRO-2 and ZeRO-3 (and on ModernBERT at ZeRO-2), then
through the export: the HF folders reproduce the training model's outputs and load in the Auto classes with new heads."""
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, prepare_corpus, restored_environ, run_cli, train_runs_in_one_process
from model.objectives import masking_overrides
from pretrain.run_dir import RunDir


OBJECTIVES = {
    "mlm_nsp": ["objective.name=mlm", "objective.mlm.pair_head=nsp"],
    "electra": ["objective.name=electra", "objective.electra.generator_width=0.5"],
    "coco_lm": ["objective.name=coco_lm", "objective.coco_lm.generator_layers=1", *masking_overrides("coco_lm")],
    "taco": ["objective.name=taco", "objective.taco.negatives=10"],
}


@pytest.fixture(scope="module")
def pairs_data(tmp_path_factory, corpus_file):
    return prepare_corpus(tmp_path_factory.mktemp("pairs") / "data", corpus_file, "packing=pairs", "pair_task=nsp")


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory, prepared):
    """A tiny HF ModernBERT folder with the fixture's vocabulary: TaCL's teacher on the ModernBERT backbone."""
    from transformers import ModernBertForMaskedLM

    from data_pipeline.shards import read_manifest
    from model.encoder import EncoderConfig, model_config

    torch.manual_seed(4)
    path = tmp_path_factory.mktemp("tiny_modernbert") / "modernbert"
    enc = EncoderConfig(architecture="modernbert", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        max_position_embeddings=64)
    ModernBertForMaskedLM(model_config(enc, read_manifest(prepared)["tokenizer"], 64)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, prepared):
    """A tiny HF BERT folder with the fixture's vocabulary: TaCL's starting checkpoint (teacher)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("tiny_bert") / "bert"
    BertForMaskedLM(BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(str(path))
    return path


def _args(data, out, extra, stage, steps):
    return ["--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=16", f"train.max_steps={steps}", f"train.save_every={steps}",
            "train.log_every=2", "train.eval_every=0", "schedule.warmup_steps=2", "optimizer.lr=2e-3",
            f"train.zero_stage={stage}", *extra]


STEPS = {2: 8, 3: 6}


BERT_NAMES = ("coco_lm", "electra", "mlm_nsp", "taco", "tacl")
# The ModernBERT variants (no sentence-pair head there: plain MLM instead of MLM + NSP).
MODERN = {"mlm": ["objective.name=mlm"], "electra": OBJECTIVES["electra"], "coco_lm": OBJECTIVES["coco_lm"],
          "taco": OBJECTIVES["taco"], "tacl": []}


@pytest.fixture(scope="module")
def runs(prepared, pairs_data, tiny_bert, tiny_modernbert, tmp_path_factory):
    """Every objective trained on 2 ranks at ZeRO-2 and at ZeRO-3 (ModernBERT at ZeRO-2), with probes of the live model.

    One torchrun per stage trains its runs one after the other (tests/helpers/train_and_probe.py --runs):
    a process start costs ~10 s, a run here ~3 s.
    """
    base = tmp_path_factory.mktemp("objectives")
    out = {}
    for stage in (2, 3):
        todo = []
        cases = [(name, "bert") for name in BERT_NAMES] + ([(name, "modernbert") for name in MODERN] if stage == 2 else [])
        for name, backbone in cases:
            data = pairs_data if name == "mlm_nsp" else prepared
            teacher = tiny_bert if backbone == "bert" else tiny_modernbert
            extra = ["objective.name=tacl", f"model.init_from={teacher}", f"model.architecture={backbone}",
                     "objective.tacl.temperature=0.1"] \
                if name == "tacl" else OBJECTIVES[name] if backbone == "bert" else MODERN[name] + ["model.architecture=modernbert"]
            key = name if backbone == "bert" else f"{name}-modernbert"
            run, probe = base / f"{key}-zero{stage}", base / f"{key}-zero{stage}.probe.pt"
            todo.append({"probe_out": str(probe), "args": _args(data, run, extra, stage, STEPS[stage])})
            out[(key, stage)] = (run, probe)
        train_runs_in_one_process(todo, base / f"zero{stage}.json", timeout=600)
    return out


def _losses(out: Path) -> list[dict]:
    return RunDir(out).metric_rows("train")


TERMS = {"mlm_nsp": {"mlm_loss", "nsp_loss"}, "electra": {"generator_mlm_loss", "rtd_loss", "rtd_auc"},
         "coco_lm": {"generator_mlm_loss", "copy_loss", "clm_loss", "scl_loss", "copy_auc", "scl_retrieval_accuracy"},
         "taco": {"mlm_loss", "tc_loss", "tc_retrieval_accuracy"}, "tacl": {"mlm_loss", "tacl_loss"}, "mlm": {"mlm_loss"}}
# What the export's root folder is, by objective; sub-folders are masked LMs.
ROOT_CLASS = {"mlm_nsp": "BertForPreTraining", "electra": "ElectraForPreTraining", "coco_lm": "BertModel",
              "taco": "BertForPreTraining", "tacl": "BertForPreTraining",
              "mlm-modernbert": "ModernBertForMaskedLM", "electra-modernbert": "ModernBertForTokenClassification",
              "coco_lm-modernbert": "ModernBertModel", "taco-modernbert": "ModernBertForMaskedLM",
              "tacl-modernbert": "ModernBertForMaskedLM"}


def _check_export(name: str, run: Path, probe_path: Path, out: Path) -> None:
    """The export reproduces the training model's hidden states and logits; it loads as Auto* with new heads."""
    from safetensors.torch import load_file
    from transformers import (
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForPreTraining,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    from pretrain.exporting.export import export

    with restored_environ():  # export sets RANK etc. for DeepSpeed; later launches must not inherit them
        export(run, out)
    probe = torch.load(probe_path)
    inputs = {"input_ids": probe["input_ids"], "attention_mask": probe["attention_mask"]}
    assert set(probe["hidden"]) == ({"", "generator"} if name.split("-")[0] in ("electra", "coco_lm") else {""})
    objective = name.split("-")[0]
    modern = name.endswith("-modernbert")
    for sub, hidden in probe["hidden"].items():
        folder = out / sub if sub else out
        encoder, info = AutoModel.from_pretrained(folder, output_loading_info=True)
        assert sub or not info["missing_keys"], info  # the root folder holds every weight AutoModel builds
        with torch.no_grad():
            got = encoder.eval()(**inputs).last_hidden_state
        assert torch.allclose(got, hidden, atol=1e-5, rtol=0), (name, sub, (got - hidden).abs().max())
        if sub in probe["logits"]:
            if sub == "generator" or objective in ("taco", "tacl", "mlm"):
                cls = AutoModelForMaskedLM
            else:
                cls = AutoModelForTokenClassification if modern else AutoModelForPreTraining
            model = cls.from_pretrained(folder).eval()
            assert sub or cls is AutoModelForMaskedLM or type(model).__name__ == ROOT_CLASS[name]
            with torch.no_grad():
                out_ = model(**inputs)
            logits = out_.logits if hasattr(out_, "logits") else out_.prediction_logits
            assert torch.allclose(logits, probe["logits"][sub], atol=1e-5, rtol=0), (name, sub)
    root_type = json.loads((out / "config.json").read_text())["architectures"][0]
    assert root_type == ROOT_CLASS[name]
    saved = load_file(str(out / "model.safetensors"))
    for head_cls in (AutoModelForSequenceClassification, AutoModelForTokenClassification):
        model = head_cls.from_pretrained(out, num_labels=3, ignore_mismatched_sizes=True).eval()
        prefix = model.base_model_prefix + "."
        base = getattr(model, model.base_model_prefix).state_dict()
        arrived = {}
        for key, value in saved.items():  # every exported encoder weight arrives; only the head is new
            key = key[len(prefix):] if key.startswith(prefix) else key
            if key in base:
                assert torch.equal(base[key], value), (head_cls.__name__, key)
                arrived[key] = True
        new = [k for k in base if k not in arrived and not k.endswith("position_ids")]
        assert new == [] and len(arrived) >= 2 * 6 + 1, (head_cls.__name__, new, len(arrived))
        with torch.no_grad():
            assert model(**inputs).logits.shape[-1] == 3
    card = (out / "README.md").read_text()
    last = _losses(run)[-1]
    assert f"`{objective.split('_nsp')[0]}`" in card and f"step {last['step']}" in card and f"loss {last['loss']:.4f}" in card
    assert "tokens" in card and "manifest.json" in card
    # Only an export whose root class is a classifier (ModernBERT ELECTRA's 1-label RTD head) needs the advice.
    assert ("ignore_mismatched_sizes=True" in card) == root_type.endswith("Classification"), root_type


CASES = [(n, stage) for stage in (2, 3) for n in BERT_NAMES] + \
    [(f"{n}-modernbert", 2) for n in MODERN]


@pytest.mark.parametrize("name,stage", CASES, ids=[f"{n}-zero{s}" for n, s in CASES])
def test_objective_trains_and_exports(name, stage, runs, tiny_bert, tmp_path):
    run, probe = runs[(name, stage)]
    steps = STEPS[stage]
    rows = _losses(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert TERMS[name.split("-")[0]] <= set(rows[0])
    tag = RunDir(run).checkpoints / f"step_{steps:08d}"
    assert (tag / "COMPLETE").is_file()
    if name == "tacl" and stage == 3:  # the teacher under ZeRO-3 is still exactly the starting checkpoint
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        from safetensors.torch import load_file

        with restored_environ():
            state = get_fp32_state_dict_from_zero_checkpoint(str(RunDir(run).checkpoints), tag=tag.name)
        start = load_file(str(tiny_bert / "model.safetensors"))
        for key, value in start.items():
            if key.startswith("bert.") and not key.startswith("bert.pooler"):
                assert torch.equal(state["teacher." + key[len("bert."):]], value), key
    _check_export(name, run, probe, tmp_path / "hf")


def test_tacl_from_real_minilm(corpus_file, tmp_path):
    """TaCL from the real MiniLM-L6 checkpoint (BertModel, no MLM head: the head is created, decoder tied)."""
    from safetensors.torch import load_file
    from test_tokenizer import minilm_dir

    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    data = prepare(load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'data'}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
        f"tokenizer.pretrained={minilm_dir()}", "seq_len=64", "val_fraction=0"]))
    out = tmp_path / "run"
    run_cli("pretrain", [
        "train", "--config", "pretrain/configs/tacl_minilm.yaml", f"data.path={data}", f"train.output_dir={out}",
        f"model.init_from={minilm_dir()}", "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=3",
        "train.save_every=3", "train.log_every=1", "schedule.warmup_steps=1", "optimizer.lr=1e-4", "train.precision=fp32"], nproc=2)
    module = torch.load(RunDir(out).checkpoints / "step_00000003" / "mp_rank_00_model_states.pt", map_location="cpu",
                        weights_only=False)["module"]
    start = load_file(str(minilm_dir() / "model.safetensors"))
    encoder_keys = [k for k in start if not k.startswith("pooler.") and not k.endswith("position_ids")]  # a buffer
    assert len(encoder_keys) > 90
    for key in encoder_keys:  # MiniLM's keys have no "bert." prefix
        assert torch.equal(module["teacher." + key], start[key]), key
    changed = [k for k in encoder_keys if not torch.equal(module["student.bert." + k], start[k])]
    assert len(changed) > 0.9 * len(encoder_keys)
    # The created MLM head is tied to the (trained) word embeddings.
    assert torch.equal(module["student.cls.predictions.decoder.weight"], module["student.bert.embeddings.word_embeddings.weight"])
    rows = _losses(out)
    assert {"mlm_loss", "tacl_loss"} <= set(rows[0])


@pytest.mark.parametrize("name", ["electra", "taco"])
def test_validation_is_a_function_of_the_weights_and_leaves_trainings_draws_alone(prepared, tmp_path, name):
    """ELECTRA's replacements and TACO's negatives are sampled while evaluating too: drawn from the training's own
    generators, two evaluations of the same weights (learning rate 0) differed, and evaluating moved every later
    training draw, so a resume with another train.eval_every did not train as the run it continued."""
    runs = {every: tmp_path / f"every{every}" for every in (0, 2)}
    train_runs_in_one_process([{"args": [*_args(prepared, out, OBJECTIVES[name], 2, 6), f"train.eval_every={every}",
                                         "train.eval_batches=2", "optimizer.lr=0", "train.log_every=1"]}
                               for every, out in runs.items()], tmp_path / "runs.json")
    evaluations = RunDir(runs[2]).metric_rows("validation")
    assert [row["step"] for row in evaluations] == [2, 4, 6]
    measured = {key for key in evaluations[0] if key.startswith(("rtd_", "taco_", "tc_"))}
    assert measured, evaluations[0]  # the sampled terms are there to compare
    for row in evaluations[1:]:
        assert {k: row[k] for k in measured} == {k: evaluations[0][k] for k in measured}, (row, evaluations[0])
    losses = {every: [row["loss"] for row in RunDir(out).metric_rows("train")] for every, out in runs.items()}
    assert len(losses[0]) == 6 and losses[0] == losses[2]  # every step's draws as without evaluations
