"""The DeepSpeed config matrix on 2 CPU ranks (ZeRO stage x bf16 x offload, written into one template; fp16 needs a
GPU), a DeepSpeed JSON of one's own, LAMB, DeepSpeed's CPU Adam, and exact resume under ZeRO-3 with offload."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROCESS_ENV, REPO, TINY_MODEL, run_cli, run_python
from pretrain.run_dir import RunDir



def _args(data, out, *extra):
    return ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={data}", f"train.output_dir={out}", *TINY_MODEL,
            "train.micro_batch_size=4", "train.global_batch_size=16", "train.eval_every=0", "schedule.warmup_steps=2",
            "optimizer.lr=3e-3", *extra]


def _losses(out: Path) -> dict[int, float]:
    rows = RunDir(out).metric_rows()
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.parametrize("stage,extra", [
    (1, ["train.precision=bf16"]),
    (2, ["train.precision=bf16"]),
    (3, ["train.precision=bf16"]),
    (2, ["train.precision=bf16", "train.offload_optimizer=true"]),
    (0, ["optimizer.name=lamb", "optimizer.lr=1e-2"]),
])
def test_config_trains_on_two_ranks(prepared, tmp_path, stage, extra):
    out = tmp_path / "run"
    run_cli("pretrain", _args(prepared, out, f"train.zero_stage={stage}", "train.max_steps=8", "train.save_every=8",
                              *extra), nproc=2)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 9)) and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert losses[8] < losses[1]
    meta = json.loads((RunDir(out).checkpoints / "step_00000008" / "meta.json").read_text())
    assert meta["zero_stage"] == stage and meta["world_size"] == 2
    written = json.loads((out / "deepspeed_config.json").read_text())  # what DeepSpeed was given
    assert written["zero_optimization"]["stage"] == stage
    # bf16 is autocast over fp32 weights; DeepSpeed's bf16 weights only when a JSON asks for them.
    assert written["torch_autocast"]["enabled"] == ("train.precision=bf16" in extra) and written["bf16"]["enabled"] is False
    assert ("offload_optimizer" in written["zero_optimization"]) == ("train.offload_optimizer=true" in extra)


def test_stage0_gradient_buckets_train_as_deepspeeds_own_reduction(prepared, tmp_path):
    """train.overlap_grad_reduce at ZeRO stage 0 on 2 ranks (several buckets, accumulation 2, dropout, so the ranks'
    gradients differ): the weights and losses are DeepSpeed's own reduction's, bit for bit. The buckets' side runs
    as `train.zero_stage: auto` chooses it on several ranks where the model fits."""
    common = ["train.zero_stage=0", "train.max_steps=6", "train.save_every=6", "model.dropout=0.1",
              "model.attention_dropout=0.1"]
    runs = {"deepspeed": ["train.overlap_grad_reduce=false"],
            "buckets": ["train.zero_stage=auto", "train.overlap_grad_reduce=true", "train.grad_bucket_mb=0.01"]}
    logs = {name: run_cli("pretrain", _args(prepared, tmp_path / name, *common, *extra), nproc=2).stdout
            for name, extra in runs.items()}
    assert "ZeRO stage 0 (train.zero_stage=auto: 2 ranks: nothing sharded" in logs["buckets"]
    assert "gradients all-reduced in buckets during backward" in logs["buckets"]
    assert "in buckets" not in logs["deepspeed"]
    assert _losses(tmp_path / "buckets") == _losses(tmp_path / "deepspeed") and len(_losses(tmp_path / "buckets")) == 6
    from pretrain.checkpointing.checkpoint import fp32_weights

    a, b = (fp32_weights(RunDir(tmp_path / name).checkpoints, "step_00000006") for name in runs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # DeepSpeed's bf16 weights keep their gradients in buffers of their own: asked for anyway, a named refusal.
    own = tmp_path / "bf16_weights.json"
    own.write_text(json.dumps({"bf16": {"enabled": True}}))
    refused = run_cli("pretrain", _args(prepared, tmp_path / "refused", *common, "train.precision=bf16",
                                        f"train.deepspeed_config={own}", "train.overlap_grad_reduce=true"),
                      nproc=2, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "train.overlap_grad_reduce=true at ZeRO stage 0 does not support DeepSpeed's bf16 weights" in refused.stderr


def test_a_deepspeed_json_of_ones_own_is_filled_and_checked(tmp_path):
    """An explicit value that disagrees with the run config is named with both keys; "auto" fields are filled."""
    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig
    from pretrain.engine.ds_config import build_ds_config

    run_yaml = REPO / "pretrain" / "configs" / "demo_mlm.yaml"
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": "auto", "overlap_comm": False}}))
    cfg = load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}", "train.precision=fp32"])
    with pytest.raises(ConfigError) as exc:
        build_ds_config(cfg, 1)
    assert "'enabled'=True" in str(exc.value) and "train.precision=fp32" in str(exc.value) and str(own) in str(exc.value)
    own.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_clipping": "auto"}))
    with pytest.raises(ConfigError, match="'stage'=1 but train.zero_stage gives 2"):
        build_ds_config(load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}"]), 1)
    cfg = load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}", "train.zero_stage=1", "train.precision=bf16",
                                            "train.micro_batch_size=4", "train.global_batch_size=16", "optimizer.grad_clip=0.5"])
    ds = build_ds_config(cfg, 2)
    assert ds["zero_optimization"] == {"stage": 1} and ds["gradient_accumulation_steps"] == 2
    assert ds["torch_autocast"]["enabled"] is True and ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    assert ds["torch_autocast"]["lower_precision_safe_modules"] == [] and ds["gradient_clipping"] == 0.5
    # A JSON that asks for DeepSpeed's bf16 weights gets them, and no autocast.
    own.write_text(json.dumps({"bf16": {"enabled": True}}))
    ds = build_ds_config(load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}", "train.precision=bf16"]), 1)
    assert ds["bf16"]["enabled"] is True and ds["torch_autocast"]["enabled"] is False
    own.write_text(json.dumps({"zero_optimization": {"stage": 1}, "gradient_clipping": "auto"}))
    # The template, with offload asked for: the sections appear; parameter offload needs ZeRO-3.
    ds = build_ds_config(load_config(RunConfig, run_yaml, ["train.zero_stage=3", "train.offload_optimizer=true",
                                                           "train.offload_params=true"]), 1)
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # A JSON of one's own with its own offload section: DeepSpeed must take the project's optimizer;
    # an offload "device: none" is no offload (so ZeRO-0 accepts it).
    own.write_text(json.dumps({"zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "cpu"}}}))
    ds = build_ds_config(load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}"]), 1)
    assert ds["zero_force_ds_cpu_optimizer"] is False
    own.write_text(json.dumps({"zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "none"}}}))
    ds = build_ds_config(load_config(RunConfig, run_yaml, [f"train.deepspeed_config={own}", "train.zero_stage=0"]), 1)
    assert "zero_force_ds_cpu_optimizer" not in ds


def test_fp16_follows_what_the_accelerator_supports(monkeypatch):
    """fp16 is enabled where DeepSpeed's accelerator runs it (a GPU, a CPU with avx512_fp16) and refused by name elsewhere."""
    from deepspeed.accelerator import get_accelerator

    from core.config_io import load_config
    from core.errors import ConfigError
    from pretrain.config import RunConfig
    from pretrain.engine.ds_config import build_ds_config

    cfg = load_config(RunConfig, REPO / "pretrain" / "configs" / "demo_mlm.yaml", ["train.precision=fp16"])
    accelerator = get_accelerator()
    here = bool(accelerator.is_fp16_supported())
    # This machine's own answer first, then the other one, so both branches run on any hardware.
    for supported in (here, not here):
        monkeypatch.setattr(type(accelerator), "is_fp16_supported", lambda self, answer=supported: answer)
        if supported:
            ds = build_ds_config(cfg, 1)
            assert ds["fp16"]["enabled"] is True and ds["bf16"]["enabled"] is False
        else:
            with pytest.raises(ConfigError, match="train.precision=fp16 is not supported"):
                build_ds_config(cfg, 1)


@pytest.mark.parametrize("impl", ["torch", "deepspeed"])
def test_zero3_offloaded_resume_is_exact(prepared, tmp_path, impl):
    """ZeRO-3 in fp32 with parameters and optimizer state offloaded to the host (train.offload_params,
    train.offload_optimizer), stepped by torch's AdamW or DeepSpeedCPUAdam. (ZeRO-2 in bf16 on 2 ranks:
    test_family_objectives' xlnet-bf16-zero2; on one rank, killed at random: test_train_resume's kill -9 test.)"""
    z3 = ["train.zero_stage=3", "train.precision=fp32", "train.offload_params=true", "train.offload_optimizer=true",
          "train.max_steps=12", "train.save_every=4", "model.dropout=0.1", "model.attention_dropout=0.1",
          "train.record_samples=true", f"optimizer.impl={impl}",
          "train.eval_every=4", "train.eval_batches=2"]  # validation forwards through ZeRO-3's gathered parameters
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run_cli("pretrain", _args(prepared, straight, *z3), nproc=2)
    run_cli("pretrain", _args(prepared, out, *z3, "train.stop_after=6"), nproc=2)
    run_cli("pretrain", _args(prepared, out, *z3), nproc=2)
    assert _losses(out) == _losses(straight)
    validation = lambda run: [{k: v for k, v in r.items() if k != "train_seconds"}  # noqa: E731
                              for r in RunDir(run).metric_rows() if r["split"] == "validation"]
    assert [r["step"] for r in validation(out)] == [4, 8, 12] and validation(out) == validation(straight)
    assert validation(out)[-1]["mlm_loss"] < validation(out)[0]["mlm_loss"], validation(out)  # it evaluates what trains
    zero = json.loads((out / "deepspeed_config.json").read_text())["zero_optimization"]
    assert [zero.get(k, {}).get("device") for k in ("offload_param", "offload_optimizer")] == ["cpu", "cpu"]
    samples = lambda run: (run / "samples" / "rank1.jsonl").read_text()  # noqa: E731
    assert samples(out) == samples(straight) and samples(out).count("\n") == 12
    from pretrain.checkpointing.checkpoint import fp32_weights

    a = fp32_weights(RunDir(straight).checkpoints, "step_00000012")
    b = fp32_weights(RunDir(out).checkpoints, "step_00000012")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_deepspeed_cpu_adam_steps_as_torch_adamw_and_resumes_exactly(prepared, tmp_path):
    """optimizer.impl=deepspeed on a CPU (DeepSpeedCPUAdam, stepping ZeRO-2's offloaded optimizer on 2 ranks): its
    losses are torch's AdamW's to 1e-5, and a run stopped and resumed ends with the same weights, bit for bit (its C++
    beta powers are rebuilt at the resume, pretrain/engine/optim.py: replay_step_products)."""
    common = ["train.zero_stage=2", "train.offload_optimizer=true", "train.max_steps=10", "train.save_every=5",
              "model.dropout=0.1", "model.attention_dropout=0.1", "train.record_samples=true"]
    logs = {impl: run_cli("pretrain", _args(prepared, tmp_path / impl, *common, f"optimizer.impl={impl}"), nproc=2).stdout
            for impl in ("deepspeed", "torch")}
    # The op is the one `make` built into the venv (a bare pytest finds the same folder: pretrain/engine/optim.py).
    assert (f"optimizer DeepSpeedCPUAdam (optimizer.name=adamw, optimizer.impl=deepspeed, its op in "
            f"{Path(sys.prefix) / 'torch_extensions'})") in logs["deepspeed"]
    assert "optimizer torch's fused AdamW (optimizer.name=adamw, optimizer.impl=torch)" in logs["torch"]
    got, ref = _losses(tmp_path / "deepspeed"), _losses(tmp_path / "torch")
    assert sorted(got) == sorted(ref) == list(range(1, 11))
    assert all(abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]) for s in ref), (got, ref)
    out, ds = tmp_path / "resumed", [*common, "optimizer.impl=deepspeed"]
    run_cli("pretrain", _args(prepared, out, *ds, "train.stop_after=3"), nproc=2)
    assert "resumed from" in run_cli("pretrain", _args(prepared, out, *ds), nproc=2).stdout
    assert _losses(out) == got
    samples = lambda run: (run / "samples" / "rank1.jsonl").read_text()  # noqa: E731
    assert samples(out) == samples(tmp_path / "deepspeed")
    from pretrain.checkpointing.checkpoint import fp32_weights

    a = fp32_weights(RunDir(tmp_path / "deepspeed").checkpoints, "step_00000010")
    b = fp32_weights(RunDir(out).checkpoints, "step_00000010")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_a_cpu_adam_op_that_does_not_build_is_named_in_one_line(prepared, tmp_path):
    """DeepSpeed's C++ op does not compile (an empty extensions folder; CXX a compiler that answers torch's version
    checks, then fails every compile with the error a missing Python.h gives): exit 2, one line that names the
    op, the compiler's error and optimizer.impl=torch, no traceback."""
    cxx = tmp_path / "cxx"
    cxx.write_text('#!/bin/sh\ncase "$*" in *-dumpversion*|*--version*|-v|-E*) exec c++ "$@" ;; esac\n'
                   'echo "cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory" >&2\nexit 1\n')
    cxx.chmod(0o755)
    env = {**os.environ, **PROCESS_ENV, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "CXX": str(cxx)}
    # Forked: both are read when the op builds (torch.utils.cpp_extension), not when torch or DeepSpeed is imported.
    proc = run_python(["-m", "pretrain", *_args(prepared, tmp_path / "run", "train.max_steps=1", "optimizer.impl=deepspeed")],
                      env=env, read_later=("CXX", "TORCH_EXTENSIONS_DIR"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ("error: optimizer.impl=deepspeed on a CPU or with optimizer offload needs DeepSpeed's CPU Adam op, which "
            "did not build here (cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory): use "
            "optimizer.impl=torch") in proc.stderr
    assert not RunDir(tmp_path / "run").checkpoints.exists()


def test_a_run_saved_with_deepspeeds_bf16_weights_resumes_with_them_exactly(prepared, tmp_path):
    """Checkpoints saved with DeepSpeed's bf16 weights (a JSON of one's own) resume in that mode when the relaunch
    gives no JSON (plain train.precision=bf16 would be autocast over fp32 weights), and end as an uninterrupted run."""
    own = tmp_path / "bf16_weights.json"
    own.write_text(json.dumps({"bf16": {"enabled": True}}))
    common = ["train.precision=bf16", "train.zero_stage=1", "train.max_steps=8", "train.save_every=4"]
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run_cli("pretrain", _args(prepared, straight, *common, f"train.deepspeed_config={own}"))
    run_cli("pretrain", _args(prepared, out, *common, f"train.deepspeed_config={own}", "train.stop_after=3"))
    run_cli("pretrain", _args(prepared, out, *common))
    written = json.loads((out / "deepspeed_config.json").read_text())
    assert written["bf16"]["enabled"] is True and written["torch_autocast"]["enabled"] is False
    assert _losses(out) == _losses(straight) and len(_losses(out)) == 8
    from pretrain.checkpointing.checkpoint import fp32_weights

    a = fp32_weights(RunDir(straight).checkpoints, "step_00000008")
    b = fp32_weights(RunDir(out).checkpoints, "step_00000008")
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_secret_looking_keys_are_redacted_in_what_a_run_folder_keeps():
    """Credentials in a DeepSpeed JSON of one's own (a monitor's api_key) are not copied; everything else is."""
    from pretrain.engine.ds_config import REDACTED, redacted

    given = {"comet": {"enabled": True, "api_key": "k-123", "project": "p"}, "wandb": {"team": "t"},
             "list": [{"ApiKey": "k-456"}, {"max_tokens": 8}], "auth_token": None, "train_batch_size": 32,
             "storage": {"aws_secret_access_key": "s", "hf_token": "h", "private_key": "p", "credentials": "c",
                         "SecretKey": "m"}}
    got = redacted(given)
    assert got == {"comet": {"enabled": True, "api_key": REDACTED, "project": "p"}, "wandb": {"team": "t"},
                   "list": [{"ApiKey": REDACTED}, {"max_tokens": 8}], "auth_token": None, "train_batch_size": 32,
                   "storage": {k: REDACTED for k in given["storage"]}}
    assert given["comet"]["api_key"] == "k-123"  # the engine's own config is not touched


def test_py_cpuinfo_answers_deepspeeds_op_builds_once_per_process(monkeypatch):
    """DeepSpeed's CPU op build asks py-cpuinfo about the CPU (each answer a fresh interpreter and a second's sleep):
    through `loaded` (what CPU Adam's build runs in), its two questions and any later ones cost one answer, each
    caller its own copy. (A made-up answer, and the build's flags only: a real build would be redone for it.)"""
    import cpuinfo  # its import runs `file` (platform.architecture): a process test
    from deepspeed.ops.op_builder import CPUAdamBuilder

    from pretrain.engine.optim import loaded

    asked = []
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: asked.append(1) or {"arch": "X86_64", "flags": ["avx2"]})

    class FlagsOnly(CPUAdamBuilder):
        def load(self) -> tuple[str, str]:
            return self.cpu_arch(), self.simd_width()  # the two questions the build asks

    # The made-up answer reached DeepSpeed (this CPU's own would not say AVX2 alone everywhere), and once.
    assert loaded(FlagsOnly)()[1] == "-D__AVX256__" and len(asked) == 1
    assert loaded(FlagsOnly)()[1] == "-D__AVX256__" and len(asked) == 1  # a second op's build
    copy = cpuinfo.get_cpu_info()
    copy["arch"] = "changed by a caller"
    assert cpuinfo.get_cpu_info()["arch"] == "X86_64" and len(asked) == 1
