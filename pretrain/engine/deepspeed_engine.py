"""The DeepSpeed engine, set up and driven at the least host cost per step.

DeepSpeed stays the engine: ZeRO partitioning, mixed precision, checkpoints, elastic resume. What it
does every step without a use for this run is configured around, here and in deepspeed_configs/base.json
(the figures: BENCHMARKS.md, "Host overhead of a step"):
- Alone at stage 0, DeepSpeed still all-reduces the gradients (flatten, a collective, copy back): an
  identity, skipped. Over several ranks with `train.overlap_grad_reduce`, grad_buckets.py reduces them instead,
  during backward rather than after it.
- At stage 0 with fp32 weights (fp32, or bf16 under autocast), the gradient norm and clipping are
  torch's foreach kernels, run here at the accumulation boundary. DeepSpeed's own takes one norm per
  parameter, all-reduces the norm once more, builds its constants from host memory (on a GPU, a copy
  that waits for the device), and keeps no norm to log.
- At ZeRO 1 and 2, DeepSpeed's own norm of the partition's gradients stays, with its all-reduce, its fp64
  accumulation and its invalid-norm sentinel, but as one foreach kernel over all the gradients instead of
  a cast, a norm and a copy per parameter (no model or pipeline parallelism here, which that loop is for).
  Its clipping reads the norm on the host no more: an invalid norm is replaced on the device, as DeepSpeed does it
  on the host.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch import nn

from core.errors import CheckpointError
from pretrain.checkpointing import checkpoint as ckpt
from pretrain.engine.grad_buckets import GradientBuckets
from pretrain.engine.optim import replay_step_products

if TYPE_CHECKING:  # annotations only: deepspeed is imported where an engine is built
    from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer

Batch = dict[str, Any]  # tensors, and the loader's per-batch flags as Python values


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A loader's batch on the device (pinned host memory copies without waiting); its flags stay on the host."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class Engine:
    """One micro-batch at a time through a DeepSpeed engine, and the engine's state in checkpoints. `ds`, the DeepSpeed
    engine itself, stays inside this class (and the tests that look at it)."""

    def __init__(self, ds_engine, grad_clip: float, clip_here: bool, accumulation: int = 1,
                 reschedule: Optional[Callable[[Any], None]] = None, buckets: Optional[GradientBuckets] = None) -> None:
        self.ds = ds_engine
        # Stage 0 over several ranks with train.overlap_grad_reduce: the reduction DeepSpeed would run after backward.
        self.buckets = buckets
        # Called with the LR scheduler after a checkpoint loads: the schedule follows this launch's config.
        self.reschedule = reschedule
        self.accumulation = accumulation  # micro-batches per optimizer step
        self.grad_clip = grad_clip
        self.clip_here = clip_here
        self._norm: Optional[torch.Tensor] = None
        self._params: list[nn.Parameter] = [p for p in ds_engine.module.parameters() if p.requires_grad]
        self.compiled = ""  # what build_engine compiled (train.compile), for the log

    @property
    def device(self) -> torch.device:
        """Where batches go."""
        return self.ds.device

    @property
    def module(self) -> nn.Module:
        """The objective module."""
        return self.ds.module

    def micro_step(self, batch: Batch, boundary: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward and backward of one micro-batch; at the accumulation boundary, clipping and the optimizer step."""
        loss, metrics = self.ds(batch)
        reduce_here = boundary and self.buckets is not None
        if reduce_here:
            self.buckets.arm()
        self.ds.backward(loss)
        if reduce_here:
            self.buckets.finish()
        if boundary and self.clip_here:
            self._clip()  # gradients are final here: reduced in the boundary's backward (DeepSpeed's, or the buckets)
        self.ds.step()
        return loss, metrics

    def _clip(self) -> None:
        """Clip the gradients to `grad_clip` by their global norm, which is kept for the log (no host read)."""
        self._norm = torch.nn.utils.clip_grad_norm_(self._params, self.grad_clip, foreach=True)

    def eval_step(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The objective's loss and metrics on one batch, no gradient kept by the caller's no_grad."""
        return self.ds(batch)

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the engine runs."""
        return self.ds.zero_optimization_stage()

    @property
    def bf16_weights(self) -> bool:
        """Whether DeepSpeed keeps the weights in bf16 (its bf16 mode) rather than fp32 under autocast."""
        return self.ds.bfloat16_enabled()

    def save_checkpoint(self, folder: Path, step: int, client_state: dict[str, Any], keep_last: int,
                        run_files: dict[str, str]) -> str:
        """Save the weights, optimizer and schedule with `client_state` and `run_files` beside them; the tag."""
        return ckpt.save(self.ds, folder, step, client_state, keep_last, run_files=run_files)

    def load_checkpoint(self, folder: Path, tag: str) -> dict[str, Any]:
        """Load the weights, optimizer and schedule of `tag`; its client state."""
        state = ckpt.load(self.ds, folder, tag)
        replay_step_products(self.ds.basic_optimizer)  # the optimizer handed to DeepSpeed, under any ZeRO wrapper
        if self.reschedule is not None:
            self.reschedule(self.ds.lr_scheduler)
        return state

    def load_untrained_state(self, folder: Path, tag: str) -> int:
        """The module's buffers and frozen parameters from `tag`'s own files; how many were loaded.

        DeepSpeed's universal load (a resume on another number of ranks) restores the trained parameters only: the
        rest kept its freshly built values, so ELECTRA's two-stage generator, frozen at the switch, and its stage flag
        came back as built and the switch ran again over the discriminator's encoder."""
        weights = ckpt.untrained_state(folder, tag)
        module = self.ds.module
        kept = set(module.state_dict(keep_vars=True))  # persistent buffers only: the others are rebuilt, never saved
        targets = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
        targets += [(n, b) for n, b in module.named_buffers() if n in kept]
        missing = [n for n, _ in targets if n not in weights]
        if missing:
            raise CheckpointError(f"checkpoint '{Path(folder) / tag}' lacks {len(missing)} of the model's buffers and "
                                  f"frozen parameters ({', '.join(missing[:3])}): it was not saved by this model; "
                                  "resume it with the config it was saved with")
        partitioned = [p for _, p in targets if hasattr(p, "ds_id")]
        gathered = contextlib.nullcontext()
        if partitioned:  # ZeRO-3: every rank holds a slice; rank 0 writes the whole and DeepSpeed splits it again
            import deepspeed  # not at the top: importing this module must not import DeepSpeed (TYPE_CHECKING above)

            gathered = deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0)
        with gathered, torch.no_grad():
            for name, tensor in targets:
                tensor.copy_(weights[name])
        return len(targets)

    def lr(self) -> float:
        """The learning rate of the step about to run."""
        return float(self.ds.get_lr()[0])

    def grad_norm(self) -> Union[None, float, torch.Tensor]:
        """The last step's gradient norm before clipping: a device tensor (read at the next metrics drain), a float, or None."""
        if self.clip_here:
            return self._norm.detach() if self._norm is not None else None
        return self.ds.get_global_grad_norm()

    def loss_scale(self) -> Optional[float]:
        """fp16's current loss scale (None in other precisions)."""
        optimizer = self.ds.optimizer
        return getattr(optimizer, "cur_scale", None) or getattr(optimizer, "loss_scale", None)

    def eval(self) -> None:
        """Evaluation mode (dropout off)."""
        self.ds.eval()

    def train(self) -> None:
        """Training mode."""
        self.ds.train()


def clips_here(ds_config: dict[str, Any]) -> bool:
    """Whether this module clips (stage 0 without DeepSpeed's fp16/bf16 optimizers, which clip their fp32 masters)."""
    stage = ds_config.get("zero_optimization", {}).get("stage", 0)
    half = ds_config.get("fp16", {}).get("enabled") or ds_config.get("bf16", {}).get("enabled")
    return stage == 0 and not half and float(ds_config.get("gradient_clipping", 0) or 0) > 0


def compile_step(objective: nn.Module) -> None:
    """torch.compile over the objective's `terms`: its encoders, heads, losses and metrics, in place.

    The objectives gather a fixed count of predicted positions per batch and read nothing back, so a train or
    evaluation step traces as one graph and its backward compiles with it. The weighted sum of the terms and their
    detached copies for the log stay outside: compiled together, a one-term loss and its detached copy left
    inductor as one tensor without grad_fn (torch 2.14). Parameter names (checkpoints, exports) are unchanged.
    dynamic=False: every micro-batch of a run has one shape, and a validation batch of another shape gets a graph
    of its own instead of turning the training graph dynamic."""
    objective.terms = torch.compile(objective.terms, dynamic=False)


def repeated_layers(model: nn.Module) -> list[nn.Module]:
    """The modules held in innermost ModuleLists: the encoder layers of every network (BERT's `encoder.layer`,
    ModernBERT's `layers`, ALBERT's shared `albert_layers`, XLNet's `layer`), each a compile region."""
    return [child for module in model.modules() if isinstance(module, nn.ModuleList)
            for child in module if not any(isinstance(m, nn.ModuleList) for m in child.modules())]


def compile_layers(model: nn.Module) -> int:
    """Regional torch.compile: every repeated layer compiled in place (same-shaped layers share one compiled graph;
    parameter names, so checkpoints and exports, are unchanged). Returns how many layers were compiled."""
    layers = repeated_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


def compile_regions(objective: nn.Module) -> list[str]:
    """torch.compile over each method the objective names in `compile_regions` (a head and its loss), in place: the
    upcast logits, their softmax, its gradient and the accuracy fuse into a few passes. Returns the names."""
    names = list(getattr(objective, "compile_regions", ()))
    for name in names:
        setattr(objective, name, torch.compile(getattr(objective, name), dynamic=False))
    return names


def compiles_whole_step(mode: Union[bool, str]) -> bool:
    """Whether `train.compile` (true or "step") traces the objective's whole step as one graph."""
    return mode is True or mode == "step"


def compile_objective(model: nn.Module, mode: Union[bool, str]) -> str:
    """Compile as `train.compile` says (true or "step": the whole step; "layers": each encoder layer, and the
    objective's head-and-loss regions); what was compiled, for the log ("" for nothing)."""
    if compiles_whole_step(mode):
        compile_step(model)
        return "the objective's step (encoders, heads and losses)"
    if mode == "layers":
        layers, regions = compile_layers(model), compile_regions(model)
        return f"{layers} encoder layer(s), each on its own" + (f", and {', '.join(regions)}" if regions else "")
    if mode is not False:  # "auto" is resolved before here (pretrain/engine/setup.py); anything else is a bug
        raise ValueError(f"compile mode {mode!r} is not one of false, true, 'step', 'layers'")
    return ""


def foreach_zero_grad_norm(optimizer: Optional[Union[torch.optim.Optimizer, DeepSpeedOptimizer]]) -> bool:
    """Give a ZeRO-1/2 optimizer a gradient norm computed by one foreach kernel; False where its own must stay."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer, pg_utils
    from deepspeed.runtime.zero.utils import get_norm_dtype
    from deepspeed import comm

    if not isinstance(optimizer, DeepSpeedZeroOptimizer) or pg_utils.is_parallel(optimizer.model_parallel_group):
        return False
    own = optimizer.get_grad_norm_direct
    norm_dtype = get_norm_dtype()

    def grad_norm(gradients: list[torch.Tensor], params: list[nn.Parameter], norm_type: float = 2) -> torch.Tensor:
        if float(norm_type) != 2.0 or any(getattr(p, "ds_pipe_replicated", False) for p in params):
            return own(gradients, params, norm_type)
        # As DeepSpeed's: padding gradients skipped, paired with the parameters, squared norms summed over ranks.
        grads = [g.detach() for g, _ in zip((g for g in gradients if not getattr(g, "_zero_padding", False)), params)]
        if grads:
            total = torch.stack(torch._foreach_norm(grads, 2.0, dtype=norm_dtype)).pow(2).sum().float()
        else:
            total = torch.zeros((), dtype=torch.float32, device=optimizer.device)
        comm.all_reduce(total, op=comm.ReduceOp.SUM, group=optimizer.dp_process_group)
        total = total.pow(0.5)
        # DeepSpeed's sentinel for an invalid norm, as its mask_nan_or_inf_with_val_inplace sets it, but filled from
        # a Python number: that helper builds its -1 with torch.tensor(..., device=...), a copy from pageable host
        # memory that on a GPU waits for the device's queue, twice a step (once per parameter group).
        return total.masked_fill_(~torch.isfinite(total), -1.0)

    optimizer.get_grad_norm_direct = grad_norm
    return True


def device_side_clip(optimizer: Optional[Union[torch.optim.Optimizer, DeepSpeedOptimizer]]) -> bool:
    """Let a ZeRO-1/2 optimizer clip by its gradient norm without reading it on the host; False where its own stays.

    DeepSpeed 0.19.8 tests the norm on the host before clipping, once per parameter group (is_invalid_grad_norm), to
    clip by an infinite norm where the norm is not finite or is its -1 sentinel. On a GPU each test waits for the
    backward and its reduction to finish. The same substitution made on the device gives the same factor."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(optimizer, DeepSpeedZeroOptimizer):
        return False
    own = optimizer.unscale_and_clip_grads

    def unscale_and_clip_grads(grad_groups_flat: list, total_norm: Any) -> None:
        if not optimizer.clip_grad > 0.0 or not torch.is_tensor(total_norm):
            return own(grad_groups_flat, total_norm)
        # DeepSpeed's arithmetic, in its order (the norm is of the loss-scaled gradients), so the factor is its own
        # to the bit; only the invalid norm's substitution moved to the device.
        norm = total_norm.masked_fill(~torch.isfinite(total_norm) | (total_norm < 0), float("inf"))
        clip = torch.clamp(((norm / optimizer.loss_scale) + 1e-6) / optimizer.clip_grad, min=1.0)
        combined_scale = clip * optimizer.loss_scale
        for grad in grad_groups_flat:
            for part in grad if isinstance(grad, list) else [grad]:
                part.data.mul_(1. / combined_scale)

    optimizer.unscale_and_clip_grads = unscale_and_clip_grads
    return True


def build_engine(model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Optional[torch.optim.lr_scheduler.LRScheduler], ds_config: dict[str, Any], world: int,
                 compile: Union[bool, str] = False, reschedule: Optional[Callable[[Any], None]] = None,
                 grad_buckets_bytes: int = 0) -> Engine:
    """deepspeed.initialize with `ds_config` (as written to the run folder), then the host-cost settings above; at stage
    0 over several ranks with `grad_buckets_bytes` (> 0), gradient buckets of that size in place of DeepSpeed's reduction."""
    import deepspeed

    compiled = compile_objective(model, compile)

    clip_here = clips_here(ds_config)
    grad_clip = float(ds_config.get("gradient_clipping", 0) or 0)
    given = {**ds_config, "gradient_clipping": 0.0} if clip_here else ds_config
    ds_engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=given)
    stage0 = ds_engine.zero_optimization_stage() == 0
    buckets = None
    if stage0 and world > 1 and grad_buckets_bytes > 0:
        buckets = GradientBuckets([p for p in ds_engine.module.parameters() if p.requires_grad], world,
                                  grad_buckets_bytes)
    if stage0 and (world == 1 or buckets is not None):
        ds_engine.enable_backward_allreduce = False
    foreach_zero_grad_norm(ds_engine.optimizer)
    device_side_clip(ds_engine.optimizer)
    engine = Engine(ds_engine, grad_clip, clip_here, int(ds_config["gradient_accumulation_steps"]), reschedule, buckets)
    engine.compiled = compiled
    return engine
