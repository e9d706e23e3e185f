"""SpanBERT (MLM + SBO), ALBERT (MLM + SOP), DeCLUTR (span contrastive + MLM), XLNet (permutation LM) and ELECTRA's
two-stage training through the real trainer on 2 ranks:
ZeRO 1, 2 and 3; a run stopped and resumed (ELECTRA: on both sides of its stage switch) ends with the same losses,
sample order and weights as one that was not; the export loads in transformers' own classes."""
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL, prepare_corpus, restored_environ, train_runs_in_one_process
from model.objectives import masking_overrides
from pretrain.run_dir import RunDir


STEPS = 8
SWITCH = 4  # ELECTRA two-stage: the generator alone for steps 1-4, RTD from step 5
ELECTRA_TWO_STAGE = ["objective.name=electra", "objective.electra.generator_width=1.0",
                     f"objective.electra.two_stage_generator_steps={SWITCH}"]
ALBERT = ["model.architecture=albert", "model.embedding_size=16", "objective.name=mlm", "objective.mlm.pair_head=sop",
          "masking.strategy=ngram", "masking.max_span=3"]
SPANBERT = ["objective.name=spanbert", *masking_overrides("spanbert")]
# XLNet trains from its example config (objective, masking, backbone); the architecture undoes TINY_MODEL's BERT.
# (Each family at two stages or more; ZeRO-1, which no objective changes, with SpanBERT and DeCLUTR.)
XLNET = ["--config", "pretrain/configs/xlnet.yaml", "model.architecture=xlnet"]
DECLUTR = ["objective.name=declutr", "objective.declutr.spans.min_span_tokens=4", "objective.declutr.spans.max_span_tokens=40",
           "objective.declutr.spans.positives=2"]
# name: (data, overrides, ZeRO stage, the steps each resumed segment runs)
CASES = {
    "spanbert-zero1": ("plain", SPANBERT, 1, [3, 5]),
    "spanbert-modernbert-zero3": ("plain", SPANBERT + ["model.architecture=modernbert"], 3, [3, 5]),
    "albert-zero2": ("sop", ALBERT, 2, [3, 5]),
    "declutr-zero2": ("documents", DECLUTR, 2, [5, 3]),
    "xlnet-zero3": ("plain", XLNET, 3, [5, 3]),
    # XLNet builds fp32 position embeddings beside half-precision weights: bf16 must train (and resume) too.
    "xlnet-bf16-zero2": ("plain", XLNET + ["train.precision=bf16"], 2, [3, 5]),
    "declutr-modernbert-zero1": ("documents", DECLUTR + ["model.architecture=modernbert"], 1, [3, 5]),
    "albert-zero3": ("sop", ALBERT, 3, [5, 3]),
    # Stopped before the switch (step 3), then across it (steps 4-6: the switch at 5), then after it.
    "electra_two_stage-zero2": ("plain", ELECTRA_TWO_STAGE, 2, [3, 3, 2]),
    "electra_two_stage-modernbert-zero3": ("plain", ELECTRA_TWO_STAGE + ["model.architecture=modernbert"], 3, [3, 3, 2]),
}


@pytest.fixture(scope="module")
def sop_data(tmp_path_factory, corpus_file):
    return prepare_corpus(tmp_path_factory.mktemp("sop") / "data", corpus_file, "packing=pairs", "pair_task=sop")


def _args(data: Path, out: Path, extra: list[str], stage: int, stop_after: int = 0, save_every: int = STEPS) -> list[str]:
    config = ["--config", "pretrain/configs/demo_mlm.yaml"]
    if extra[:1] == ["--config"]:  # a case trained from its own example config
        config, extra = extra[:2], extra[2:]
    return [*config, f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=16", f"train.max_steps={STEPS}", f"train.save_every={save_every}",
            "train.log_every=1", "train.eval_every=0", "train.record_samples=true", "schedule.warmup_steps=2",
            "optimizer.lr=2e-3", "model.dropout=0.1", "model.attention_dropout=0.1", f"train.zero_stage={stage}",
            f"train.stop_after={stop_after}", "train.keep_last=10", *extra]


@pytest.fixture(scope="module")
def runs(prepared, sop_data, document_data, tmp_path_factory):
    """Each case trained straight through and in resumed segments: one torchrun per ZeRO stage, its runs in turn."""
    base = tmp_path_factory.mktemp("family")
    by_stage: dict[int, list] = {}
    out = {}
    for name, (data, extra, stage, segments) in CASES.items():
        data_dir = {"sop": sop_data, "documents": document_data}.get(data, prepared)
        straight, resumed = base / f"{name}-straight", base / f"{name}-resumed"
        todo = by_stage.setdefault(stage, [])
        # A stop and the last step always save; only ELECTRA's tests read tags between them (4 and 6).
        save_every = 2 if name.startswith("electra_two_stage") else STEPS
        todo.append({"probe_out": str(base / f"{name}.probe.pt"),
                     "args": _args(data_dir, straight, extra, stage, save_every=save_every)})
        for steps in segments:
            todo.append({"args": _args(data_dir, resumed, extra, stage, steps)})
        out[name] = (straight, resumed, base / f"{name}.probe.pt")
    for stage, todo in sorted(by_stage.items()):
        train_runs_in_one_process(todo, base / f"zero{stage}.json")
    return out


def _rows(run: Path) -> list[dict]:
    return RunDir(run).metric_rows("train")


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    """Every weight and buffer of a checkpoint (fp32 masters of the trained ones, the frozen ones as saved)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with restored_environ():
        return get_fp32_state_dict_from_zero_checkpoint(str(RunDir(run).checkpoints), tag=f"step_{step:08d}")


@pytest.mark.parametrize("name", list(CASES))
def test_resumed_run_equals_the_uninterrupted_one(name, runs):
    straight, resumed, _ = runs[name]
    a, b = _rows(straight), _rows(resumed)
    assert [r["step"] for r in a] == list(range(1, STEPS + 1)) == [r["step"] for r in b]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # every step, exactly
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in a)
    for rank in (0, 1):
        samples = lambda run: (run / "samples" / f"rank{rank}.jsonl").read_text()  # noqa: E731
        assert samples(straight) == samples(resumed) and samples(straight).count("\n") == STEPS
    wa, wb = _weights(straight, STEPS), _weights(resumed, STEPS)
    assert wa.keys() == wb.keys()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    terms = {"spanbert": {"mlm_loss", "sbo_loss", "sbo_accuracy"}, "albert": {"mlm_loss", "sop_loss", "sop_accuracy"},
             "electra_two_stage": {"generator_mlm_loss", "electra_stage"},
             "declutr": {"declutr_loss", "mlm_loss", "declutr_retrieval_accuracy"},
             "xlnet": {"plm_loss", "plm_accuracy"}}[name.split("-")[0]]
    assert terms <= set(a[0])


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("electra_two_stage")])
def test_two_stage_electra_switches_once_from_the_generator(name, runs):
    """Steps 1-4: MLM only; from step 5: RTD only, against a frozen generator that is the step-4 encoder and head;
    the discriminator goes on from that same encoder."""
    straight, _, _ = runs[name]
    rows = _rows(straight)
    assert [r["electra_stage"] for r in rows] == [1.0] * SWITCH + [2.0] * (STEPS - SWITCH)
    assert all("rtd_loss" not in r for r in rows[:SWITCH]) and all("rtd_auc" in r for r in rows[SWITCH:])
    before, after, end = _weights(straight, SWITCH), _weights(straight, SWITCH + 2), _weights(straight, STEPS)
    assert int(before["switched"]) == 0 and int(after["switched"]) == 1
    prefix = "discriminator." + ("model." if "modernbert" in name else "electra.")
    encoder = [k for k in before if k.startswith(prefix)]
    assert len(encoder) > 10
    for key in encoder:
        frozen = key.replace("discriminator.", "generator.", 1)
        assert torch.equal(end[frozen], before[key]), key  # the generator froze at the switch
    moved = [k for k in encoder if "embeddings" not in k and not torch.equal(end[k], before[k])]
    assert len(moved) > 0.8 * len([k for k in encoder if "embeddings" not in k])  # the discriminator trained on
    mlm_head = [k for k in before if k.startswith("stage_one.") and not k.startswith("stage_one." + prefix.split(".")[1])]
    assert mlm_head and all(torch.equal(end[k.replace("stage_one.", "generator.", 1)], before[k]) for k in mlm_head)


@pytest.mark.parametrize("name", ["spanbert-modernbert-zero3", "albert-zero2", "electra_two_stage-zero2", "declutr-zero2",
                                  "xlnet-zero3"])
def test_export_loads_in_transformers_classes(name, runs, tmp_path):
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForPreTraining

    from model.heads import SpanBoundaryHead
    from pretrain.exporting.export import export

    straight, _, probe_path = runs[name]
    out = tmp_path / "hf"
    with restored_environ():
        export(straight, out)
    probe = torch.load(probe_path)
    inputs = {"input_ids": probe["input_ids"], "attention_mask": probe["attention_mask"]}
    for sub, hidden in probe["hidden"].items():
        folder = out / sub if sub else out
        assert "auto_map" not in json.loads((folder / "config.json").read_text())
        encoder, info = AutoModel.from_pretrained(folder, output_loading_info=True)
        assert sub or not info["missing_keys"], info
        with torch.no_grad():
            assert torch.allclose(encoder.eval()(**inputs).last_hidden_state, hidden, atol=1e-5, rtol=0), sub
    root = json.loads((out / "config.json").read_text())["architectures"][0]
    if name.startswith("spanbert"):
        assert root == "ModernBertForMaskedLM"
        head = SpanBoundaryHead.load(out)
        assert head.shape.hidden_size == 32 and (out / "span_boundary_head.safetensors").is_file()
        state = _weights(straight, STEPS)
        assert all(torch.equal(v, state["sbo_head." + k]) for k, v in head.state_dict().items())
        mlm = AutoModelForMaskedLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert torch.allclose(mlm(**inputs).logits, probe["logits"][""], atol=1e-5, rtol=0)
    elif name.startswith("albert"):
        assert root == "AlbertForPreTraining"
        model = AutoModelForPreTraining.from_pretrained(out).eval()
        assert type(model).__name__ == "AlbertForPreTraining"
        with torch.no_grad():
            assert torch.allclose(model(**inputs).prediction_logits, probe["logits"][""], atol=1e-5, rtol=0)
        assert type(AutoModelForMaskedLM.from_pretrained(out)).__name__ == "AlbertForMaskedLM"
    elif name.startswith("xlnet"):
        assert root == "XLNetLMHeadModel" and type(encoder).__name__ == "XLNetModel"
        lm = AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(lm).__name__ == "XLNetLMHeadModel"
        with torch.no_grad():
            assert torch.allclose(lm(**inputs).logits, probe["logits"][""], atol=1e-5, rtol=0)
        _classifies_a_row_the_same_padded_or_not(out)
    elif name.startswith("declutr"):
        assert root == "BertForPreTraining"
        mlm = AutoModelForMaskedLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert torch.allclose(mlm(**inputs).logits, probe["logits"][""], atol=1e-5, rtol=0)
    else:
        assert root == "ElectraForPreTraining" and set(probe["hidden"]) == {"", "generator"}
        generator = AutoModelForMaskedLM.from_pretrained(out / "generator").eval()
        with torch.no_grad():
            assert torch.allclose(generator(**inputs).logits, probe["logits"]["generator"], atol=1e-5, rtol=0)


def _classifies_a_row_the_same_padded_or_not(export: Path) -> None:
    """XLNet's classification heads read the last token by default (where XLNet's own tokenizer puts <cls>); this
    project's tokenizer puts [CLS] first and batches pad on the right, so every shorter row of a batch was classified
    from a [PAD]. The export's config reads the first token, and so does fine-tuning (an older export included)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from evaluation.finetune import _build_model
    from evaluation.tasks import TaskSpec

    assert json.loads((export / "config.json").read_text())["summary_type"] == "first"
    tokenizer = AutoTokenizer.from_pretrained(export)
    short, long = tokenizer(["in the beginning", "and the earth was without form and void"])["input_ids"]
    assert short[0] == tokenizer.cls_token_id and len(short) < len(long)
    alone = torch.tensor([short])
    batch = torch.tensor([short + [tokenizer.pad_token_id] * (len(long) - len(short)), long])
    mask = (torch.arange(len(long)) < torch.tensor([[len(short)], [len(long)]])).long()
    older = export.parent / "older"  # an export written before its config said so
    AutoModelForSequenceClassification.from_pretrained(export, num_labels=2).save_pretrained(older)
    config = json.loads((older / "config.json").read_text())
    (older / "config.json").write_text(json.dumps({**config, "summary_type": "last"}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (export / name).is_file():
            (older / name).write_bytes((export / name).read_bytes())
    spec = TaskSpec(name="pairs", text="text", num_labels=2)
    for folder in (export, older):
        torch.manual_seed(0)
        model = _build_model(str(folder), spec).eval()
        with torch.no_grad():
            by_itself = model(input_ids=alone, attention_mask=torch.ones_like(alone)).logits[0]
            in_a_batch = model(input_ids=batch, attention_mask=mask).logits[0]
        assert torch.allclose(by_itself, in_a_batch, atol=1e-5, rtol=0), (folder, by_itself, in_a_batch)


# What a user starts from an ALBERT or XLNet export: its own example recipe, the model group replaced by the folder's.
FROM_EXPORT = {"albert-zero2": ("sop", ["--config", "pretrain/configs/demo_mlm.yaml", "objective.mlm.pair_head=sop",
                                        "masking.strategy=ngram", "masking.max_span=3"]),
               "xlnet-zero3": ("plain", ["--config", "pretrain/configs/xlnet.yaml"])}


@pytest.mark.parametrize("name", list(FROM_EXPORT))
def test_a_run_started_from_an_export_of_the_family_starts_from_its_weights(name, runs, prepared, sop_data, tmp_path):
    """`model=pretrained model.init_from=EXPORT` with an ALBERT or XLNet export: the folder decides the family and
    shape, and a step at learning rate 0 exports every weight it started from (heads included), bit for bit."""
    from conftest import run_cli
    from safetensors.torch import load_file

    from pretrain.exporting.export import export

    data, recipe = FROM_EXPORT[name]
    start, run, again = tmp_path / "start", tmp_path / "run", tmp_path / "again"
    with restored_environ():
        export(runs[name][0], start)
    run_cli("pretrain", ["train", *recipe, f"data.path={sop_data if data == 'sop' else prepared}",
                         f"train.output_dir={run}", "model=pretrained", f"model.init_from={start}",
                         "optimizer.lr=0", "train.max_steps=1", "train.micro_batch_size=4", "train.global_batch_size=4",
                         "train.precision=fp32", "train.eval_every=0", "data.num_workers=0"])
    with restored_environ():
        export(run, again)
    config = lambda folder: json.loads((folder / "config.json").read_text())  # noqa: E731
    shape = ("model_type", "architectures", "hidden_size" if name.startswith("albert") else "d_model", "vocab_size")
    assert [config(again).get(k) for k in shape] == [config(start).get(k) for k in shape]
    assert config(again)["model_type"] == name.split("-")[0]
    want, got = load_file(start / "model.safetensors"), load_file(again / "model.safetensors")
    assert len(want) > 10 and want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
