"""From the run config to a running engine: the ZeRO stage, the DeepSpeed config, the optimizer and schedule.

The trainer gets the engine (its accumulation steps included) and the lines that say what was chosen for the
user; it reads no DeepSpeed key. The checkpoint manager is asked, not written into: whether a universal
checkpoint must be loaded is its answer, which becomes a DeepSpeed config flag here.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Union

from torch import nn

from core import distributed as dist
from core.errors import ConfigError
from model.backbones import backbone_for
from model.fused_qkv import fuse_qkv
from model.rotary_tables import tabulate_rotary
from pretrain.checkpointing.resume_choice import ResumePlan
from pretrain.config import RunConfig
from pretrain.engine.ds_config import (bf16_weights_for, build_ds_config, json_zero_stage, overlaps_grad_reduce,
                                       redacted)
from pretrain.engine.deepspeed_engine import Engine, build_engine, compiles_whole_step
from pretrain.engine.optim import build_optimizer, build_scheduler, optimizer_note, reset_schedule, schedule_warning
from pretrain.engine.zero_stage import choose_stage, device_memory_bytes


def zero_stage_for(cfg: RunConfig, objective: nn.Module, world: int, resumed: dict[str, Any]) -> tuple[int, str]:
    """The ZeRO stage to run at, and a line that says where it came from."""
    requested = cfg.train.zero_stage
    if requested != "auto":
        return int(requested), f"ZeRO stage {requested} (train.zero_stage)"
    resumed_stage = resumed.get("zero_stage")  # a resumed run keeps it (choose_stage), whatever else holds now
    if resumed_stage is None:
        fixed = json_zero_stage(cfg)
        if fixed is not None:
            return fixed, f"ZeRO stage {fixed} (train.zero_stage=auto: {cfg.train.deepspeed_config} sets it)"
        if cfg.optimizer.name == "lamb":
            return 0, "ZeRO stage 0 (train.zero_stage=auto: optimizer.name=lamb runs at stage 0 only)"
    params = {id(p): p for p in objective.parameters()}.values()
    trainable = sum(p.numel() for p in params if p.requires_grad)
    memory, name = device_memory_bytes(dist.local_world_size())
    stage, why = choose_stage(trainable, sum(p.numel() for p in params) - trainable, world, memory, name,
                              resumed_stage, buckets=resumed_stage is None and stage0_buckets(cfg, world, resumed))
    return stage, f"ZeRO stage {stage} (train.zero_stage=auto: {why})"


def stage0_buckets(cfg: RunConfig, world: int, resumed: dict[str, Any]) -> bool:
    """Whether a run over several ranks at ZeRO stage 0 would all-reduce its gradients in buckets during backward:
    train.overlap_grad_reduce allows it, stage 0 can run at all (no optimizer or parameter offload, which need
    ZeRO 1-3) and its DeepSpeed config has nothing the buckets do not reproduce (DeepSpeed's bf16 weights, a
    reduction setting of a JSON of one's own)."""
    if world == 1 or not overlaps_grad_reduce(cfg.train.overlap_grad_reduce, world, 0):
        return False
    try:
        ds_config = build_ds_config(cfg, world, 0, bf16_weights_for(cfg, resumed))
    except ConfigError:
        return False  # stage 0 cannot run (offload); the chosen stage's config names any problem
    return not bucket_blockers(ds_config)


def bucket_blockers(ds_config: dict[str, Any]) -> str:
    """What in a stage-0 DeepSpeed config the gradient buckets do not reproduce ("" for nothing): DeepSpeed's bf16
    weights accumulate their gradients in buffers of their own, and the buckets average as DeepSpeed's defaults do."""
    found = []
    if ds_config.get("bf16", {}).get("enabled") is True:
        found.append("DeepSpeed's bf16 weights (\"bf16\": {\"enabled\": true})")
    for key, default in (("prescale_gradients", False), ("gradient_predivide_factor", 1.0), ("gradient_allreduce_op", "mean"),
                         ("communication_data_type", None), ("sparse_gradients", False)):
        if ds_config.get(key, default) != default:
            found.append(f"{key}={ds_config[key]!r}")
    return ", ".join(found)


def drops_unpadded_mask(setting: str, compile: Union[bool, str]) -> bool:
    """Whether the encoders get no attention mask for a batch the loader padded nothing in (`train.unpadded_mask`):
    auto drops it unless the objective's whole step is one compiled graph, where keeping it measured faster."""
    if setting == "auto":
        return not compiles_whole_step(compile)
    return setting == "drop"


_COMPILED = ("compiled ", " with torch.compile (train.compile): the first steps wait for the compiler")


def compiled_note(what: str) -> str:
    """The log line that says what `train.compile` compiled."""
    return what.join(_COMPILED)


def compiled_in_log(text: str) -> str:
    """What a run's log says `train.compile` compiled ("" for nothing): with `auto`, the mode it took."""
    found = re.search(re.escape(_COMPILED[0]) + "(.+?)" + re.escape(_COMPILED[1]), text)
    return found.group(1) if found else ""


def compile_mode_for(cfg: RunConfig, tables: bool) -> tuple[Union[bool, str], str]:
    """`train.compile` as the run applies it (auto: the backbone's `compile_mode`, told whether its rotary tables went
    in), and a log line for auto ("" otherwise)."""
    if cfg.train.compile != "auto":
        return cfg.train.compile, ""
    mode = backbone_for(cfg.model.architecture).compile_mode(tables)
    return mode, f"train.compile=auto: {mode} (what {cfg.model.architecture} measured fastest in on a GPU)"


def apply_model_levers(cfg: RunConfig, objective: nn.Module) -> tuple[Union[bool, str], list[str]]:
    """Apply the `train.*` keys that change how the objective's modules compute (not what): the compile mode the run
    applies, and a log line for each."""
    notes = []
    if cfg.train.fused_qkv:
        notes.append(f"Q, K and V as one matmul in {fuse_qkv(objective)} attention layer(s) (train.fused_qkv)")
    tabulated = tabulate_rotary(objective, dist.local_device()) if cfg.train.rotary_tables else 0
    if tabulated:
        notes.append(f"rotary cos/sin read from tables in {tabulated} ModernBERT encoder(s) (train.rotary_tables)")
    # After the tables: a ModernBERT whose tables could not go in (a rope type whose frequencies change, or a
    # transformers without per-kind rotary modules) is not the one whose whole step measured fastest.
    compile_mode, compile_note = compile_mode_for(cfg, tabulated > 0)
    notes += [compile_note] if compile_note else []
    objective.drop_unpadded_mask = drops_unpadded_mask(cfg.train.unpadded_mask, compile_mode)
    if not objective.drop_unpadded_mask:
        notes.append(f"unpadded batches keep their attention mask (train.unpadded_mask={cfg.train.unpadded_mask}, "
                     f"train.compile={str(compile_mode).lower()})")
    if cfg.train.vocab_loss_chunk:
        objective.vocab_loss_chunk = cfg.train.vocab_loss_chunk
        notes.append(f"the MLM heads' vocabulary projection fused with the loss, {cfg.train.vocab_loss_chunk} rows at a "
                     "time (train.vocab_loss_chunk)")
    return compile_mode, notes


def set_up_engine(cfg: RunConfig, objective: nn.Module, resume: ResumePlan) -> tuple[Engine, list[str], str]:
    """The engine around `objective` for this run (resuming what `resume` chose), notes for the log, and the DeepSpeed
    config it was given as the run folder keeps it (JSON, secrets redacted)."""
    world = dist.world_size()
    stage, stage_note = zero_stage_for(cfg, objective, world, resume.meta)
    ds_config = build_ds_config(cfg, world, stage, bf16_weights_for(cfg, resume.meta))
    if resume.load_universal:
        ds_config.setdefault("checkpoint", {})["load_universal"] = True
    given = json.dumps(redacted(ds_config), indent=2) + "\n"
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") != "none"
    optimizer = build_optimizer(objective, cfg.optimizer, offload=offload)
    scheduler = build_scheduler(optimizer, cfg.train.max_steps, cfg.schedule)
    # A resumed run's schedule follows this launch's max_steps and schedule, not the saved ones.
    reschedule = functools.partial(reset_schedule, max_steps=cfg.train.max_steps, cfg=cfg.schedule, lr=cfg.optimizer.lr)
    levers = (("compile", cfg.train.compile, "false"), ("fused_qkv", cfg.train.fused_qkv, "false"),
              ("vocab_loss_chunk", cfg.train.vocab_loss_chunk, "0"))
    for key, value, off in levers:
        if value and stage == 3:
            raise ConfigError(f"train.{key}={str(value).lower()} needs ZeRO stage 0-2, and {stage_note}: set "
                              f"train.zero_stage or train.{key}={off}")
    compile_mode, lever_notes = apply_model_levers(cfg, objective)
    warmup = schedule_warning(cfg.train.max_steps, cfg.schedule)
    notes = [stage_note, optimizer_note(optimizer, cfg.optimizer), *([warmup] if warmup else []), *lever_notes]
    buckets = stage == 0 and overlaps_grad_reduce(cfg.train.overlap_grad_reduce, world, stage)
    if buckets:
        unsupported = bucket_blockers(ds_config)
        if unsupported and cfg.train.overlap_grad_reduce is True:
            raise ConfigError(f"train.overlap_grad_reduce=true at ZeRO stage 0 does not support {unsupported}: set "
                              "train.overlap_grad_reduce=auto or false, or remove it")
        buckets = not unsupported
        notes.append("gradients all-reduced in buckets during backward (train.overlap_grad_reduce)" if buckets else
                     f"gradients all-reduced after backward, by DeepSpeed ({unsupported})")
    engine = build_engine(objective, optimizer, scheduler, ds_config, world, compile=compile_mode,
                          reschedule=reschedule,
                          grad_buckets_bytes=int(cfg.train.grad_bucket_mb * 2**20) if buckets else 0)
    if engine.compiled:
        notes.append(compiled_note(engine.compiled))
    return engine, notes, given
