"""Export from every ZeRO stage and precision: stages 0-3 in fp32 and bf16 (autocast) for BERT and ModernBERT, LAMB
(stage 0), and DeepSpeed's bf16 weights at stages 0 and 1, each trained on 2 ranks; every export loads in
AutoModelForMaskedLM and gives the training model's logits, BERT's frozen pooler and NSP head included (DeepSpeed writes
frozen parameters to its ZeRO files from stage 2 only, and stage 0 writes no ZeRO files at all)."""
import json

import pytest
import torch
from conftest import TINY_MODEL, restored_environ, train_runs_in_one_process


# A DeepSpeed JSON of one's own: DeepSpeed's bf16 weights, not autocast; and a (disabled) monitor's credential,
# which DeepSpeed is given but the run folder's copy must not hold.
SECRET = "not-a-real-comet-key-7f3a"
BF16_WEIGHTS = {"bf16": {"enabled": True}, "comet": {"enabled": False, "api_key": SECRET}}
MODERNBERT = "model.architecture=modernbert"  # TINY_MODEL's shape, ModernBERT's classes (no pooler, no NSP head)
CASES = {
    **{f"zero{stage}_{precision}": [f"train.zero_stage={stage}", f"train.precision={precision}"]
       for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")},
    **{f"modernbert_zero{stage}_{precision}": [f"train.zero_stage={stage}", f"train.precision={precision}", MODERNBERT]
       for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")},
    "lamb_fp32": ["train.zero_stage=0", "train.precision=fp32", "optimizer.name=lamb"],
    "lamb_bf16": ["train.zero_stage=0", "train.precision=bf16", "optimizer.name=lamb"],
    "zero0_bf16_weights": ["train.zero_stage=0", "train.precision=bf16", "train.deepspeed_config=BF16_WEIGHTS"],
    "zero1_bf16_weights": ["train.zero_stage=1", "train.precision=bf16", "train.deepspeed_config=BF16_WEIGHTS"],
}


@pytest.fixture(scope="module")
def exports(prepared, tmp_path_factory):
    """Every case trained 4 steps under one 2-rank launch, probed live, then exported in this process."""
    base = tmp_path_factory.mktemp("export_stages")
    own = base / "bf16_weights.json"
    own.write_text(json.dumps(BF16_WEIGHTS))
    runs = [{"probe_out": str(base / f"{name}.pt"),
             "args": ["--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", f"train.output_dir={base / name}",
                      *TINY_MODEL, "train.micro_batch_size=4", "train.global_batch_size=16", "train.max_steps=4",
                      "train.save_every=4", "train.eval_every=0", "schedule.warmup_steps=1", "optimizer.lr=3e-3",
                      *[a.replace("BF16_WEIGHTS", str(own)) for a in extra]]}
            for name, extra in CASES.items()]
    train_runs_in_one_process(runs, base / "runs.json")
    from pretrain.exporting.export import export

    out = {}
    with restored_environ():
        for name in CASES:
            out[name] = (export(base / name, base / f"{name}_hf"), torch.load(base / f"{name}.pt"),
                         json.loads((base / name / "deepspeed_config.json").read_text()))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_stage_and_precision_exports_the_training_model(exports, case):
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

    folder, probe, ds = exports[case]
    stage = int(CASES[case][0].split("=")[1])
    assert ds["zero_optimization"]["stage"] == stage  # the case ran at the stage it names
    modernbert = MODERNBERT in CASES[case]
    # ZeRO 1-2: the engine's foreach gradient norm gave DeepSpeed's own, bit for bit, at every step and group.
    norms = probe["grad_norms"]
    assert (len(norms) >= 4) if stage in (1, 2) else not norms, norms
    assert all(ours == deepspeeds for ours, deepspeeds in norms), norms
    # ZeRO 1-2: the engine's clipping, which reads no norm on the host, scaled rank 0's gradients as DeepSpeed's own
    # would, bit for bit, with the step's norms, a norm that clips, and each invalid norm DeepSpeed replaces.
    clips = probe["clips"]
    assert {name for name, _ in clips} == ({"step", "clipping", "-1.0", "inf", "nan"} if stage in (1, 2) else set()), clips
    assert all(same for _, same in clips), clips
    assert json.loads((folder / "config.json").read_text())["model_type"] == ("modernbert" if modernbert else "bert")
    bf16_weights = case.endswith("bf16_weights")
    assert ds["bf16"]["enabled"] is bf16_weights
    if bf16_weights:  # the run's copy of one's own JSON keeps the section, not the credential
        assert ds["comet"] == {"enabled": False, "api_key": "<redacted>"}
        assert SECRET not in (folder.parent / case / "deepspeed_config.json").read_text()
    assert ds["torch_autocast"]["enabled"] is (case.endswith("_bf16"))
    masked_lm = AutoModelForMaskedLM.from_pretrained(str(folder), local_files_only=True).eval()
    assert masked_lm.dtype == torch.float32
    inputs = {"input_ids": probe["input_ids"], "attention_mask": probe["attention_mask"]}
    with torch.no_grad():
        compared = [(masked_lm(**inputs).logits, probe["logits"][""].float())]
        if not modernbert:
            pretraining = AutoModelForPreTraining.from_pretrained(str(folder), local_files_only=True).eval()
            compared.append((pretraining(**inputs).seq_relationship_logits, probe["pair_logits"][""].float()))
    # The live model computed with fp32 weights, except with DeepSpeed's bf16 weights: the export holds their fp32
    # masters, which the bf16 copies round.
    tolerance = 0.15 if bf16_weights else 1e-5
    for got, live in compared:
        assert torch.allclose(got, live, atol=tolerance, rtol=0), (got - live).abs().max()
