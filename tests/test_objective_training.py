"""Every objective through the real trainer: 2 ranks on DeepSpeed ZeRO-2 (and ZeRO-3 for TaCL and COCO-LM)."""
import json
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL, run_cli

pytestmark = pytest.mark.slow

OBJECTIVES = {
    "mlm_nsp": ["objective.name=mlm", "objective.mlm.pair_head=nsp"],
    "electra": ["objective.name=electra", "objective.electra.generator_width=0.5"],
    "coco_lm": ["objective.name=coco_lm", "objective.coco_lm.generator_layers=1", "masking.strategy=coco", "masking.crop_ratio=0.9"],
    "taco": ["objective.name=taco", "objective.taco.negatives=10"],
}


@pytest.fixture(scope="module")
def pairs_data(tmp_path_factory, corpus_file):
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare
    from pretrain.config_io import load_config

    out = tmp_path_factory.mktemp("pairs") / "data"
    return prepare(load_config(PrepareConfig, None, [
        f"output_dir={out}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]", "tokenizer.vocab_size=400",
        "tokenizer.character_coverage=1.0", "seq_len=64", "val_fraction=0.1", "packing=pairs", "pair_task=nsp"]))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, prepared):
    """A tiny HF BERT folder with the fixture's vocabulary: TaCL's starting checkpoint (teacher)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("tiny_bert") / "bert"
    BertForMaskedLM(BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(str(path))
    return path


def _train(data, out, extra, stage=2, steps=8):
    return run_cli("pretrain", [
        "train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
        "train.micro_batch_size=4", "train.global_batch_size=16", f"train.max_steps={steps}", f"train.save_every={steps}",
        "train.log_every=2", "train.eval_every=0", "schedule.warmup_steps=2", "optimizer.lr=2e-3",
        f"train.deepspeed_config=deepspeed_configs/zero{stage}.json", *extra], nproc=2)


def _losses(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line]


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_zero2_two_ranks(name, prepared, pairs_data, tmp_path):
    data = pairs_data if name == "mlm_nsp" else prepared
    _train(data, tmp_path / "run", OBJECTIVES[name])
    rows = _losses(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    expected_terms = {"mlm_nsp": {"mlm_loss", "nsp_loss"}, "electra": {"generator_mlm_loss", "rtd_loss"},
                      "coco_lm": {"generator_mlm_loss", "copy_loss", "clm_loss", "scl_loss"}, "taco": {"mlm_loss", "tc_loss"}}[name]
    assert expected_terms <= set(rows[0])
    assert (tmp_path / "run" / "checkpoints" / "step_00000008" / "COMPLETE").is_file()


def test_tacl_zero2_two_ranks(prepared, tiny_bert, tmp_path):
    _train(prepared, tmp_path / "run", ["objective.name=tacl", f"model.init_from={tiny_bert}", "objective.tacl.temperature=0.1"])
    rows = _losses(tmp_path / "run")
    assert {"mlm_loss", "tacl_loss"} <= set(rows[0]) and rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.parametrize("name", ["coco_lm", "tacl"])
def test_zero3_two_ranks(name, prepared, tiny_bert, tmp_path):
    extra = OBJECTIVES["coco_lm"] if name == "coco_lm" else ["objective.name=tacl", f"model.init_from={tiny_bert}"]
    _train(prepared, tmp_path / "run", extra, stage=3, steps=6)
    rows = _losses(tmp_path / "run")
    assert len(rows) == 6 and rows[-1]["loss"] < rows[0]["loss"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "run" / "checkpoints"), tag="step_00000006")
    if name == "tacl":  # the teacher under ZeRO-3 is still exactly the starting checkpoint
        from safetensors.torch import load_file

        start = load_file(str(tiny_bert / "model.safetensors"))
        for key, value in start.items():
            if key.startswith("bert.") and not key.startswith("bert.pooler"):
                assert torch.equal(state["teacher." + key[len("bert."):]], value), key


def test_tacl_from_real_minilm(corpus_file, tmp_path):
    """TaCL from the real MiniLM-L6 checkpoint (BertModel, no MLM head: the head is created, decoder tied)."""
    from safetensors.torch import load_file

    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare
    from pretrain.config_io import load_config
    from test_tokenizer import minilm_dir

    data = prepare(load_config(PrepareConfig, None, [
        f"output_dir={tmp_path / 'data'}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
        f"tokenizer.pretrained={minilm_dir()}", "seq_len=64", "val_fraction=0"]))
    out = tmp_path / "run"
    run_cli("pretrain", [
        "train", "--config", "pretrain/configs/tacl_minilm.yaml", f"data.path={data}", f"train.output_dir={out}",
        f"model.init_from={minilm_dir()}", "train.micro_batch_size=4", "train.global_batch_size=8", "train.max_steps=3",
        "train.save_every=3", "train.log_every=1", "schedule.warmup_steps=1", "optimizer.lr=1e-4"], nproc=2)
    module = torch.load(out / "checkpoints" / "step_00000003" / "mp_rank_00_model_states.pt", map_location="cpu",
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
