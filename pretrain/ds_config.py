"""The DeepSpeed config of a run: one template (deepspeed_configs/base.json) filled from the run config.

ZeRO stage, optimizer / parameter offload and precision are run-config keys (`train.zero_stage`,
`train.offload_optimizer`, `train.offload_params`, `train.precision`), written into the template's
"auto" fields with the batch sizes and clipping. `train.deepspeed_config` names a JSON of one's own
instead; its "auto" fields are filled the same way, and an explicit value that disagrees with the
run config is an error naming both.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from pretrain.config import RunConfig

TEMPLATE = Path(__file__).resolve().parents[1] / "deepspeed_configs" / "base.json"


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


def build_ds_config(cfg: RunConfig, world: int) -> dict[str, Any]:
    """The DeepSpeed config dict for this run and world size."""
    path = Path(cfg.train.deepspeed_config) if cfg.train.deepspeed_config else TEMPLATE
    if not path.is_file():
        raise ConfigError(f"config key 'train.deepspeed_config': file not found: {path}")
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"deepspeed config {path} is not valid JSON: {exc}") from exc
    if cfg.train.precision == "fp16":
        from deepspeed.accelerator import get_accelerator

        if not get_accelerator().is_fp16_supported():
            raise ConfigError("train.precision=fp16 is not supported on this device (DeepSpeed's CPU accelerator refuses "
                              "it without avx512_fp16); use bf16 or fp32 here, fp16 on a GPU")
    accum = gradient_accumulation(cfg.train.global_batch_size, cfg.train.micro_batch_size, world)
    _fill(ds, "train_micro_batch_size_per_gpu", cfg.train.micro_batch_size, path, "train.micro_batch_size")
    _fill(ds, "gradient_accumulation_steps", accum, path, "train.global_batch_size / (micro_batch_size x ranks)")
    _fill(ds, "train_batch_size", cfg.train.global_batch_size, path, "train.global_batch_size")
    _fill(ds, "gradient_clipping", cfg.optimizer.grad_clip, path, "optimizer.grad_clip")
    for precision in ("bf16", "fp16"):
        section = ds.setdefault(precision, {})
        _fill(section, "enabled", cfg.train.precision == precision, path, f"train.precision={cfg.train.precision}")
    zero = ds.setdefault("zero_optimization", {})
    _fill(zero, "stage", cfg.train.zero_stage, path, "train.zero_stage")
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
    if zero["stage"] == 3:
        import torch

        if not torch.cuda.is_available():
            # DeepSpeed 0.19 waits only on the last handle of a coalesced all-gather; on gloo the
            # others may still be in flight (garbage parameters). Sequential all-gathers avoid it.
            zero["stage3_allgather_sequential"] = True
    if cfg.optimizer.name == "lamb":
        if zero.get("stage", 0) != 0:
            raise ConfigError(
                f"optimizer.name=lamb needs ZeRO stage 0 (train.zero_stage=0): LAMB's trust ratio is per "
                f"layer, and ZeRO stage {zero['stage']} hands the optimizer flat slices of many layers instead")
        ds["zero_allow_untested_optimizer"] = True
    ds.setdefault("steps_per_print", 1 << 30)
    return ds
