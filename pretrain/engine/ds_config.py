"""The DeepSpeed config of a run: one template (deepspeed_configs/base.json) filled from the run config.

ZeRO stage, optimizer / parameter offload and precision are run-config keys (`train.zero_stage`,
`train.offload_optimizer`, `train.offload_params`, `train.precision`), written into the template's
"auto" fields with the batch sizes and clipping. `train.deepspeed_config` names a JSON of one's own
instead; its "auto" fields are filled the same way, and an explicit value that disagrees with the
run config is an error naming both.

bf16 is mixed precision by default: fp32 weights, gradients and optimizer, with the forward and
backward under `torch.autocast` (DeepSpeed's `torch_autocast` section), as the Hugging Face Trainer
and torchtitan run it. DeepSpeed's `bf16` section (bf16 weights beside fp32 master copies, copied
back after every step) is used when a JSON of one's own sets `bf16.enabled: true`, or when the
run resumes checkpoints saved that way. The template's switches that cost host time every step
without a use here are documented in deepspeed_configs/README.md.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Optional, Union

from core.errors import ConfigError
from core.json_file import read_json
from pretrain.config import RunConfig

# deepspeed_configs/ is a package of its own (data only), so a wheel installs the template beside pretrain/.
TEMPLATE = Path(importlib.util.find_spec("deepspeed_configs").origin).parent / "base.json"


# Keys whose values are credentials (DeepSpeed's comet monitor takes an api_key): never copied into a run folder.
_SECRET_KEY = re.compile(r"(api_?key|access_?key|private_?key|secret(_?key)?|password|passwd|token|credentials?)$",
                         re.IGNORECASE)
REDACTED = "<redacted>"


def redacted(node: Any) -> Any:
    """A copy of a JSON-like config with the values of secret-looking keys replaced, for files others may read."""
    if isinstance(node, dict):
        return {k: REDACTED if _SECRET_KEY.search(str(k)) and v is not None else redacted(v) for k, v in node.items()}
    if isinstance(node, list):
        return [redacted(v) for v in node]
    return node


def gradient_accumulation(global_batch: int, micro_batch: int, world: int) -> int:
    """Accumulation steps that keep the global batch fixed whatever the world size."""
    per_step = micro_batch * world
    if global_batch % per_step:
        raise ConfigError(
            f"train.global_batch_size={global_batch} is not divisible by micro_batch_size ({micro_batch}) x "
            f"world size ({world}) = {per_step}"
        )
    return global_batch // per_step


def _fill(node: dict[str, Any], key: str, value: Any, path: Path, config_key: str) -> None:
    if node.get(key, "auto") == "auto":
        node[key] = value
    elif node[key] != value:
        raise ConfigError(f"deepspeed config {path} sets '{key}'={node[key]!r} but {config_key} gives {value!r}: set "
                          f"'{key}' to \"auto\" in the file, or change {config_key}")


def _own_json(cfg: RunConfig) -> Optional[dict[str, Any]]:
    """The run's own DeepSpeed JSON as an object (None: no such file set, or one that does not read as a JSON
    object, which build_ds_config names)."""
    if not cfg.train.deepspeed_config:
        return None
    try:
        ds = json.loads(Path(cfg.train.deepspeed_config).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return ds if isinstance(ds, dict) else None


def json_zero_stage(cfg: RunConfig) -> Optional[int]:
    """The ZeRO stage the run's own DeepSpeed JSON fixes (None: no JSON, "auto", or none given)."""
    zero = (_own_json(cfg) or {}).get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return stage if type(stage) is int and 0 <= stage <= 3 else None


def explicit_bf16_weights(cfg: RunConfig) -> bool:
    """Whether the run's DeepSpeed JSON asks for DeepSpeed's bf16 weights (`"bf16": {"enabled": true}`)."""
    bf16 = (_own_json(cfg) or {}).get("bf16")
    return isinstance(bf16, dict) and bf16.get("enabled") is True


def bf16_weights_for(cfg: RunConfig, resumed: dict[str, Any]) -> Optional[bool]:
    """bf16 weights or autocast for a run that resumes `resumed` (a checkpoint's meta; {} when starting).

    A resumed run keeps its checkpoint's mode (DeepSpeed cannot load one into the other): an explicit JSON
    that asks for the other mode is an error; otherwise the mode follows the checkpoint. Checkpoints from
    before autocast was the default carry no mode and were saved with bf16 weights.
    """
    if cfg.train.precision != "bf16" or not resumed or resumed.get("precision") != "bf16":
        return None
    saved = bool(resumed.get("bf16_weights", True))
    if cfg.train.deepspeed_config and explicit_bf16_weights(cfg) != saved and _sets_bf16(cfg):
        raise ConfigError(
            f"the checkpoints of this run were saved with {'bf16 weights' if saved else 'bf16 autocast (fp32 weights)'} "
            f"but {cfg.train.deepspeed_config} sets \"bf16\": {{\"enabled\": {str(not saved).lower()}}}: DeepSpeed cannot "
            "change it on resume; set it to \"auto\", or start a new run")
    return saved


def _sets_bf16(cfg: RunConfig) -> bool:
    """Whether the run's own DeepSpeed JSON gives bf16.enabled an explicit true/false."""
    section = (_own_json(cfg) or {}).get("bf16")
    return isinstance(section, dict) and isinstance(section.get("enabled"), bool)


def build_ds_config(cfg: RunConfig, world: int, zero_stage: Optional[int] = None,
                    bf16_weights: Optional[bool] = None) -> dict[str, Any]:
    """The DeepSpeed config dict for this run and world size.

    `zero_stage` is the resolved stage (train.zero_stage, or what `auto` chose); `bf16_weights` picks
    DeepSpeed's bf16 weights over autocast in bf16 (None: as the JSON says, autocast by default).
    """
    if zero_stage is None:
        if cfg.train.zero_stage == "auto":
            raise ValueError("train.zero_stage=auto must be resolved (pretrain.engine.zero_stage.choose_stage) first")
        zero_stage = int(cfg.train.zero_stage)
    path, ds = _read_template(cfg)
    accum = gradient_accumulation(cfg.train.global_batch_size, cfg.train.micro_batch_size, world)
    _fill(ds, "train_micro_batch_size_per_gpu", cfg.train.micro_batch_size, path, "train.micro_batch_size")
    _fill(ds, "gradient_accumulation_steps", accum, path, "train.global_batch_size / (micro_batch_size x ranks)")
    _fill(ds, "train_batch_size", cfg.train.global_batch_size, path, "train.global_batch_size")
    _fill(ds, "gradient_clipping", cfg.optimizer.grad_clip, path, "optimizer.grad_clip")
    _fill_precision(ds, cfg, path, explicit_bf16_weights(cfg) if bf16_weights is None else bf16_weights)
    zero = ds.setdefault("zero_optimization", {})
    _fill(zero, "stage", zero_stage, path, "train.zero_stage")
    _fill_zero(ds, zero, cfg, world, path)
    if cfg.optimizer.name == "lamb":
        if zero.get("stage", 0) != 0:
            raise ConfigError(
                f"optimizer.name=lamb needs ZeRO stage 0 (train.zero_stage=0): LAMB's trust ratio is per "
                f"layer, and ZeRO stage {zero['stage']} hands the optimizer flat slices of many layers instead")
        ds["zero_allow_untested_optimizer"] = True
    ds.setdefault("steps_per_print", 1 << 30)
    return ds


def _read_template(cfg: RunConfig) -> tuple[Path, dict[str, Any]]:
    """The DeepSpeed JSON the run starts from (train.deepspeed_config, else the template), parsed."""
    path = Path(cfg.train.deepspeed_config) if cfg.train.deepspeed_config else TEMPLATE
    if path.is_dir():
        raise ConfigError(f"config key 'train.deepspeed_config': '{path}' is a folder; name the JSON file in it")
    if not path.is_file():
        raise ConfigError(f"config key 'train.deepspeed_config': file not found: {path}")
    ds = read_json(path, "deepspeed config", "fix it or set train.deepspeed_config to another file", ConfigError)
    if not isinstance(ds, dict):
        raise ConfigError(f"deepspeed config {path} must hold a JSON object at top level, not a {type(ds).__name__}")
    return path, ds


def _fill_precision(ds: dict[str, Any], cfg: RunConfig, path: Path, bf16_weights: bool) -> None:
    """fp16, bf16 weights or bf16 autocast over fp32 weights, as train.precision says."""
    if cfg.train.precision == "fp16":
        from deepspeed.accelerator import get_accelerator

        if not get_accelerator().is_fp16_supported():
            raise ConfigError("train.precision=fp16 is not supported on this device (DeepSpeed's CPU accelerator refuses "
                              "it without avx512_fp16); use bf16 or fp32 here, fp16 on a GPU")
    bf16 = cfg.train.precision == "bf16"
    precision_key = f"train.precision={cfg.train.precision}"
    _fill(ds.setdefault("fp16", {}), "enabled", cfg.train.precision == "fp16", path, precision_key)
    _fill(ds.setdefault("bf16", {}), "enabled", bf16 and bf16_weights, path, precision_key)
    autocast = ds.setdefault("torch_autocast", {})
    _fill(autocast, "enabled", bf16 and not bf16_weights, path, precision_key)
    if autocast["enabled"]:
        autocast.setdefault("dtype", "bfloat16")
        # Gradients reduced in fp32, as torchtitan's default: the listed module types would get bf16 reductions.
        autocast.setdefault("lower_precision_safe_modules", [])


def _fill_zero(ds: dict[str, Any], zero: dict[str, Any], cfg: RunConfig, world: int, path: Path) -> None:
    """Overlap, offload and stage-3 settings of the `zero_optimization` section, checked against the stage."""
    # Stage 0 has neither (grad_buckets.py overlaps there), nor has one rank anything to overlap; elsewhere a JSON's
    # own value stands against auto, and must agree with an explicit setting.
    setting, stage = cfg.train.overlap_grad_reduce, zero["stage"]
    overlap = stage > 0 and overlaps_grad_reduce(setting, world, stage)
    explicit = setting != "auto" and stage > 0 and world > 1
    for key in ("overlap_comm", "contiguous_gradients"):
        if zero.get(key) == "auto" or explicit:
            _fill(zero, key, overlap, path, f"train.overlap_grad_reduce={str(setting).lower()}")
    # A file of one's own may carry its own offload sections; the run config only adds them.
    if cfg.train.offload_optimizer:
        zero.setdefault("offload_optimizer", {"device": "cpu", "pin_memory": True})
    if cfg.train.offload_params:
        zero.setdefault("offload_param", {"device": "cpu", "pin_memory": True})
    offloads = {key: zero.get(key, {}).get("device", "none") != "none" for key in ("offload_optimizer", "offload_param")}
    if offloads["offload_optimizer"]:
        # The optimizer is ours (torch's, or DeepSpeedCPUAdam with optimizer.impl=deepspeed): DeepSpeed must not
        # insist on its own CPU Adam, whether the section came from the run config or a JSON of one's own.
        ds.setdefault("zero_force_ds_cpu_optimizer", False)
    if offloads["offload_param"] and zero["stage"] != 3:
        raise ConfigError(f"parameter offload needs ZeRO stage 3, not {zero['stage']}: set train.zero_stage=3 or "
                          "train.offload_params=false")
    if offloads["offload_optimizer"] and zero["stage"] == 0:
        raise ConfigError("optimizer offload needs ZeRO stage 1, 2 or 3: set train.zero_stage or train.offload_optimizer=false")
    if zero["stage"] == 3 and not _cuda():
        # DeepSpeed 0.19 waits only on the last handle of a coalesced all-gather; on gloo the
        # others may still be in flight (garbage parameters). Sequential all-gathers avoid it.
        zero["stage3_allgather_sequential"] = True


def overlaps_grad_reduce(setting: Union[str, bool], world: int, stage: int) -> bool:
    """Whether the gradients are all-reduced while backward runs (`train.overlap_grad_reduce`): never alone; auto at
    stage 0 over several ranks (the gradient buckets, which measured no slower on CPU), and at stages 1-2 with
    several GPU ranks (DeepSpeed's overlap_comm, whose per-parameter hooks on CPU, over gloo and without streams,
    only cost host time); off at stage 3, as before the setting existed."""
    if world == 1:
        return False
    if setting == "auto":
        return stage == 0 or (_cuda() and stage in (1, 2))
    return bool(setting)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
