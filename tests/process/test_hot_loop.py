"""The training step reads nothing back from the device: metrics wait on the device until the logging flush.

tests/helpers/count_host_reads.py patches every tensor -> Python read (item, tolist, float(), int(),
bool(), ...) and records the project's own reads, inside a training step or outside it; a dispatch mode
below every library records each step's reads whatever code made them. On a GPU each one would make the
host wait for the device's queue; so would a tensor built in the step from Python data (which the dispatch
mode records too) or by a factory given no device (which a function mode records), by the copy to the device.
"""
import json
from collections import Counter

import pytest
from conftest import TINY_MODEL, run_cli

from model.objectives import REGISTRY, masking_overrides, objective_class, runs_on

# Every registered objective, with the masking it declares, on the first backbone it runs on (TINY_MODEL is BERT);
# and MLM on ModernBERT, the demo's and the GPU recipe's backbone, whose step runs the project's rotary tables.
OBJECTIVE_ARGS = {
    name: [*masking_overrides(name), f"model.architecture={runs_on(objective_class(name))[0]}"] for name in REGISTRY
} | {"electra_two_stage": ["objective.name=electra", "objective.electra.generator_width=1.0",
                          "objective.electra.two_stage_generator_steps=3"],
     "mlm_modernbert": ["objective.name=mlm", "model.architecture=modernbert"]}
# What the step still reads back, by objective, and why (TACO's index sampling is data-dependent; two-stage
# ELECTRA reads its switch buffer once, after any checkpoint load, and copies the generator at the switch).
KNOWN = {"taco": {"model/objectives/taco.py"}, "electra_two_stage": {"model/objectives/electra.py"}}
# What other libraries read in a step, and why. The runs train at the demo's ZeRO-2 (demo_mlm.yaml), where DeepSpeed
# 0.19.8 checks its gradient norm on the host (is_invalid_grad_norm) once, to skip a step on a non-finite norm (with
# fp32 weights, as under autocast; DeepSpeed's bf16 weights skip it unless bf16.check_grad_overflow). Its clipping
# checked it again per parameter group: the engine's device_side_clip does that on the device. At stage 0 (one GPU)
# nothing reads (BENCHMARKS.md, "Unpadded batches").
ZERO_NORM_CHECK, ZERO_NORM_READS = "deepspeed/runtime/utils.py", 1
# A new pass's DataLoader iterator draws its base seed on a host tensor (torch.empty((), dtype=torch.int64).random_()),
# under streaming's __iter__, or under the loader's _get_iterator where it watches its workers start: no device value.
LOADER_SEED = {"streaming/base/dataloader.py", "data_pipeline/loader.py"}


def _teacher(overrides: list[str], folder) -> str:
    """A fresh masked LM of the run's shape and tokenizer, saved as a Hugging Face folder."""
    from core.config_io import load_config
    from data_pipeline.shards import read_manifest
    from model.encoder import model_config
    from model.objectives import ObjectiveConfig, build_objective
    from pretrain.config import RunConfig

    cfg = load_config(RunConfig, overrides[1], overrides[2:])
    manifest = read_manifest(cfg.data.path)
    config = model_config(cfg.model, manifest["tokenizer"], manifest["seq_len"])
    build_objective(ObjectiveConfig(name="mlm"), config).model.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def reads(prepared, document_data, tmp_path_factory) -> dict:
    """Every objective trained 4 steps in one process (logging every 3: a window filling, its flush, then one the end
    cuts short) with its reads recorded."""
    base = tmp_path_factory.mktemp("reads")
    common = ["--config", "pretrain/configs/demo_mlm.yaml", f"data.path={prepared}", *TINY_MODEL]
    teacher = _teacher(common, base / "teacher")  # TaCL continues a checkpoint
    runs = {name: [*common, f"train.output_dir={base / name}", "train.micro_batch_size=4", "train.global_batch_size=8",
                   "train.max_steps=4", "train.log_every=3", "train.save_every=4", "train.eval_every=4",
                   "train.eval_batches=1", f"objective.name={name}", *extra,
                   *([f"model.init_from={teacher}"] if name == "tacl" else []),
                   *([f"data.path={document_data}"] if name == "declutr" else [])]  # spans within one document
            for name, extra in OBJECTIVE_ARGS.items()}  # a later name wins
    (base / "runs.json").write_text(json.dumps(runs))
    run_cli("tests/helpers/count_host_reads.py", [str(base / "reads.json"), str(base / "runs.json")])
    return json.loads((base / "reads.json").read_text())


@pytest.mark.parametrize("objective", sorted(OBJECTIVE_ARGS))
def test_no_host_reads_inside_a_training_step(reads, objective):
    records, padded_steps = reads[objective]["records"], set(reads[objective]["padded_steps"])
    # Masking and crop views run on the loader's CPU batch before it moves: reads there wait for no device.
    in_step = Counter(r["where"] for r in records if r["in_step"] and not r["where"].startswith("data_pipeline/"))
    allowed = KNOWN.get(objective, set())
    assert not [w for w in in_step if w.rsplit(":", 1)[0] not in allowed], in_step
    # Every read any code made in the step (DeepSpeed's, torch's, transformers', the project's), seen below them all.
    # transformers reads an attention mask it is handed (to drop it when all ones): only a padded column is handed.
    dispatched = [(r["step"], r["where"].rsplit(":", 1)[0]) for r in reads[objective]["dispatched"]]
    anywhere = [(step, where) for step, where in dispatched if step not in padded_steps
                and where not in allowed | {ZERO_NORM_CHECK} | LOADER_SEED]
    assert not anywhere, anywhere
    # Nor does any code build a tensor from Python data in the step (torch.tensor(...), indexing by a list): on a GPU
    # its copy from pageable host memory waits for the device's queue as a read does. An H200 profile found one a
    # step, the metric window putting its names in order (BENCHMARKS.md, "A host sync a step").
    made = [(r["step"], r["where"]) for r in reads[objective]["made"] if r["where"].rsplit(":", 1)[0] not in allowed]
    assert not made, made
    # Nor a tensor a factory builds on the host for want of a device (torch.arange(n) beside device tensors): its copy
    # to the device is from pageable memory too. On a CPU that copy is no op at all, so the factory call is what shows.
    built = [(r["step"], r["where"]) for r in reads[objective]["host_built"]
             if r["where"].rsplit(":", 1)[0] not in allowed | LOADER_SEED]
    assert not built, built
    norm_checks = Counter(step for step, where in dispatched if where == ZERO_NORM_CHECK)
    assert norm_checks == {step: ZERO_NORM_READS for step in range(4)}, norm_checks
    if objective not in ("declutr", "xlnet"):  # DeCLUTR's spans are padded; XLNet's attention reads no mask
        assert len(padded_steps) < 4, padded_steps  # the prepared data packs full rows: most batches have no padding
    # The metrics leave the device at the flushes only: after steps 3 (log) and 4 (the last: log, checkpoint, evaluation).
    flushes = {r["step"] for r in records if r["where"].startswith("pretrain/observe/metrics.py")}
    assert flushes == {3, 4}, flushes
    # The per-step exchange of preemption flags is on host tensors (a gloo group on a GPU run).
    assert {r["step"] for r in records if r["where"].startswith("pretrain/lifecycle/preemption.py")} == set(range(1, 5))
