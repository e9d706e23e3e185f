"""Host overhead of a training step: the trainer against a plain PyTorch loop of the same transformers model.

    python -m benchmarks.host_overhead                                  # CPU proxy: ModernBERT and BERT, ZeRO-2, auto precision
    python -m benchmarks.host_overhead --stages 0 1 2 3 auto --pairs 3  # every stage
    python -m benchmarks.host_overhead --shape base --device cuda --batch 64 --threads 0   # BERT-base / ModernBERT-base on a GPU

The proxy is narrow and deep (hidden 64, 12 layers, 2 heads, FFN 256; micro-batch 4 x 128, one thread): many
parameters and kernels per FLOP, as BERT-base is on a GPU, so the host's per-parameter and per-kernel work shows on a
CPU. For each (backbone, ZeRO stage, precision):
- trainer: `python -m pretrain train` (the DeepSpeed engine, the loader on the demo's real MDS shards, masking in the
  loader's worker, metrics, preemption checks), throughput from its own log windows after the first;
- plain: the same transformers masked LM built from the config the trainer would export (`AutoModelForMaskedLM`), on
  batches masked the same way: encoder, MLM head at the masked positions only, cross-entropy, backward,
  `clip_grad_norm_`, fused AdamW, `zero_grad()`; autocast in bf16 over fp32 weights; timed over windows of the
  same length.
The two run alternately (`--pairs` times, each a fresh process); `trainer / plain` is each pair's ratio of
samples/s, then the median. With `--phases`, one more instrumented run of each times every phase of a step
(exclusive of the phases nested in it; on a GPU with a device synchronize at each boundary, so that table measures
device time, not throughput) and prints the ms per step. Results: benchmarks/results/host_overhead.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional
from benchmarks import kernel_profile
from benchmarks.arguments import add_shared, parse_checked, repo_pythonpath, results_file
from benchmarks.machine import machine
from pretrain.run_dir import RunDir
from data_pipeline.dataset_dir import DatasetDir

if TYPE_CHECKING:  # annotations only: torch and transformers are imported inside the functions that run them
    import torch
    from torch import nn
    from transformers import PreTrainedModel

    from pretrain.config import RunConfig

REPO = Path(__file__).resolve().parents[1]

SHAPES = {"proxy": dict(hidden_size=64, num_layers=12, num_heads=2, intermediate_size=256),
          "tiny": dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256),  # gpu_throughput.py --tiny
          # BERT-base; ModernBERT's GeGLU FFN at 1152 keeps its parameters near BERT-base's.
          "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)}
MODERNBERT_BASE_FFN = 1152
BACKBONES = {"modernbert": ["model=modernbert_small"],
             "bert": ["model=bert_small"]}
# The phases of a step, in the order the table prints them.
PHASES = ("batch fetch", "batch copy", "forward", "backward", "gradient reduce", "gradient norm + clip",
          "overflow check", "optimizer", "parameter copy-back", "engine other", "timers", "metrics",
          "preemption check", "loop other")


def case_overrides(case: dict, args: argparse.Namespace) -> list[str]:
    """The run config's overrides for one case, shared by the trainer and the plain loop."""
    shape = dict(SHAPES[args.shape])
    if args.shape == "base" and case["backbone"] == "modernbert":
        shape["intermediate_size"] = MODERNBERT_BASE_FFN
    return [*BACKBONES[case["backbone"]], *[f"model.{k}={v}" for k, v in shape.items()],
            f"model.max_position_embeddings={args.seq}", f"data.path={args.data}", "masking.mask_prob=0.15",
            f"train.precision={case['precision']}", f"train.zero_stage={case['stage']}",
            f"train.micro_batch_size={args.batch}", f"train.global_batch_size={args.batch}"]


def trainer_command(case: dict, args: argparse.Namespace, out: Path) -> list[str]:
    """`python -m pretrain train` for one case: no evaluation, no checkpoint inside the timed steps."""
    return [sys.executable, "-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml",
            *case_overrides(case, args), f"train.output_dir={out}", f"train.max_steps={args.steps}",
            f"train.log_every={args.window}", f"train.save_every={args.steps * 10}", "train.eval_every=0",
            "train.resume=never", "schedule.warmup_steps=2", f"data.num_workers={args.loader_workers}", *args.set]


def thread_env(args: argparse.Namespace) -> dict:
    """The environment of every measured process: the same torch thread count on both sides."""
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def run_trainer(case: dict, args: argparse.Namespace, work: Path) -> dict:
    """Samples/s of the trainer: the median of its logged windows after the first."""
    out = Path(tempfile.mkdtemp(prefix="trainer_", dir=work))  # a fresh run folder each time (resume=never)
    proc = subprocess.run(trainer_command(case, args, out), cwd=REPO, env=thread_env(args), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer failed ({case}):\n{proc.stderr[-4000:]}")
    rows = RunDir(out).metric_rows()
    shutil.rmtree(out, ignore_errors=True)
    windows = [r["samples_per_s"] for r in rows if r["split"] == "train" and "samples_per_s" in r][1:]
    if not windows:
        raise RuntimeError("the trainer logged no window after the first: raise --steps")
    return {"samples_per_s": statistics.median(windows), "windows": windows}


def run_worker(kind: str, case: dict, args: argparse.Namespace) -> dict:
    """Run this script as a fresh process in worker mode and read the JSON line it prints last."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--case", json.dumps(case),
           *sys.argv[1:]]
    proc = subprocess.run(cmd, cwd=REPO, env=thread_env(args), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed ({case}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the plain loop ---------------------------------------------------------------------------------------------
def plain_model(case: dict, args: argparse.Namespace) -> tuple[RunConfig, str, dict, PreTrainedModel, nn.Module,
                                                             Callable[[torch.Tensor], torch.Tensor]]:
    """The transformers masked LM the trainer would export, built from the same resolved run config, and its parts."""
    import torch
    from transformers import AutoModelForMaskedLM

    from core.config_io import load_config
    from data_pipeline.shards import read_manifest
    from model.encoder import model_config as build_model_config
    from pretrain.config import RunConfig
    from pretrain.engine.hardware import resolve_precision

    cfg = load_config(RunConfig, str(REPO / "pretrain/configs/demo_mlm.yaml"), case_overrides(case, args))
    precision, _ = resolve_precision(cfg.train.precision)
    tok = read_manifest(Path(args.data))["tokenizer"]
    torch.manual_seed(0)
    config = build_model_config(cfg.model, tok, args.seq)
    model = AutoModelForMaskedLM.from_config(config, attn_implementation=config._attn_implementation)
    if case["backbone"] == "bert":
        encoder, head = model.bert, model.cls.predictions
    else:
        encoder, head = model.model, (lambda h: model.decoder(model.head(h)))
    return cfg, precision, tok, model, encoder, head


def plain_batches(cfg: RunConfig, tok: dict, args: argparse.Namespace) -> list[dict]:
    """One batch per step of random ordinary tokens, masked by the project's masking as the loader masks them.

    A fresh batch each step, as the trainer reads: the sparse head's row count (the masked tokens) then varies
    from step to step on both sides. On a CPU each new row count costs oneDNN a JIT compile of its matmul
    kernels; a plain loop cycling through a few batches would reuse their kernels and gain that.
    """
    import torch

    from data_pipeline.masking import build_masking

    gen = torch.Generator().manual_seed(0)
    masking = build_masking(cfg.masking, tok["vocab_size"], tok["mask_id"], tok["special_ids"], pad_id=tok["pad_id"],
                            cls_id=tok["cls_id"], sep_id=tok["sep_id"])
    out = []
    for _ in range(max(args.steps, 1)):
        ids = torch.randint(max(tok["special_ids"]) + 1, tok["vocab_size"], (args.batch, args.seq), generator=gen)
        ids[:, 0], ids[:, -1] = tok["cls_id"], tok["sep_id"]
        out.append(masking({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                            "token_type_ids": torch.zeros_like(ids)}, gen))
    return out


def masked_positions(labels: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` masked positions of each row, as indices (rows, count): a static shape where the boolean mask's
    count changes every step. A row with fewer masked tokens fills up with unmasked ones, whose labels are ignored."""
    import torch

    order = torch.arange(labels.shape[1], 0, -1, device=labels.device)  # ties broken towards the earlier position
    return ((labels != -100) * (labels.shape[1] + 1) + order).topk(count, dim=1).indices


def static_mlm_loss(encoder: nn.Module, head: Callable[[torch.Tensor], torch.Tensor], batch: dict, types: set,
                    count: int) -> torch.Tensor:
    """MLM cross-entropy over `count` gathered positions per row: every shape fixed, so one graph holds it all."""
    import torch.nn.functional as F

    hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     **{k: batch[k] for k in types}).last_hidden_state
    index = masked_positions(batch["labels"], count)
    picked = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1])).flatten(0, 1)
    return F.cross_entropy(head(picked).float(), batch["labels"].gather(1, index).flatten(), ignore_index=-100)


def make_plain_step(case: dict, args: argparse.Namespace,
                    clock: Optional["PhaseClock"] = None) -> tuple[Callable[[int], None], str]:
    """The plain loop's step `i` (its batch, forward, backward, clipping, fused AdamW), and the precision it runs in."""
    import torch
    import torch.nn.functional as F

    from core.host_memory import keep_freed_memory

    # The trainer's process keeps freed heap memory (core/host_memory.py); so does the plain loop's, or the ratio
    # would compare two allocators' page faults (a plain loop without it took 0 to 1,500 fresh pages a step, by
    # chance) instead of two loops.
    keep_freed_memory()
    cfg, precision, tok, model, encoder, head = plain_model(case, args)
    device = torch.device(args.device)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optimizer.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=tuple(cfg.optimizer.betas),
                            eps=cfg.optimizer.eps, fused=True)
    if getattr(args, "plain_compile", False) and cfg.masking.strategy in ("bert", "coco"):
        cfg.masking = dataclasses.replace(cfg.masking, count="exact")  # the same count in every row: nothing padded
    batches = plain_batches(cfg, tok, args)
    types = {"token_type_ids"} if case["backbone"] == "bert" else set()
    timed = clock.timed if clock else (lambda phase, fn: fn)
    pinned = device.type == "cuda"

    def fetch(i):
        return batches[i % len(batches)]

    def copy(batch):
        return {k: (v.pin_memory() if pinned else v).to(device, non_blocking=True) for k, v in batch.items()}

    if getattr(args, "plain_compile", False):
        # One graph over encoder, head and loss (torch.compile), the masked positions gathered to a fixed count.
        count = int(max((b["labels"] != -100).sum(1).max() for b in batches))
        loss_fn = torch.compile(functools.partial(static_mlm_loss, encoder, head, types=types, count=count))

        def forward(batch):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return loss_fn(batch=batch)
    else:
        def forward(batch):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 **{k: batch[k] for k in types}).last_hidden_state
                picked = batch["labels"] != -100
                logits = head(hidden[picked])
            return F.cross_entropy(logits.float(), batch["labels"][picked])

    def clip():
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)

    fetch, copy, forward, backward = (timed("batch fetch", fetch), timed("batch copy", copy), timed("forward", forward),
                                      timed("backward", lambda loss: loss.backward()))
    clip, update, zero = timed("gradient norm + clip", clip), timed("optimizer", opt.step), timed("optimizer", opt.zero_grad)

    def step(i: int) -> None:
        backward(forward(copy(fetch(i))))
        clip()
        update()
        zero()

    return step, precision


def plain_loop(case: dict, args: argparse.Namespace, clock: Optional["PhaseClock"] = None) -> dict:
    """Samples/s of the plain loop over windows of `--window` steps (the median after the first)."""
    import torch

    step, precision = make_plain_step(case, args, clock)
    windows, start = [], time.perf_counter()
    for i in range(args.steps):
        if clock:
            clock.begin_step(i)
        step(i)
        if (i + 1) % args.window == 0:
            if args.device == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            windows.append(args.batch * args.window / (now - start))
            start = now
    if len(windows) < 2:
        raise RuntimeError(f"the plain loop timed {len(windows)} window(s) of {args.window} steps and the first is "
                           "not counted: raise --steps")
    result = {"samples_per_s": statistics.median(windows[1:]), "windows": windows, "precision": precision}
    profiled = getattr(args, "kernel_steps", 0)
    if profiled and clock is None:  # after the timed steps, which the profiler would slow; not in a phase table
        prof = kernel_profile.start_profile()
        for i in range(args.steps, args.steps + profiled):
            step(i)
        result["kernels"] = kernel_profile.kernel_times(kernel_profile.stop_profile(prof), profiled)
    return result


def interleaved(case: dict, args: argparse.Namespace) -> dict:
    """The trainer and the plain loop taking turns step by step in one process: ms per step of each, free of drift.

    Each trainer step is timed from the start of its train_step to the start of the next (so its logging, metrics
    and preemption checks count), and a plain step runs just before it on a model of its own.
    """
    import torch

    from pretrain.cli import main
    from pretrain.trainer import Trainer

    plain_step, _ = make_plain_step(case, args)
    sync = (lambda: torch.cuda.synchronize()) if args.device == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"trainer": [], "plain": []}
    marks: dict[str, float] = {}
    original = Trainer.train_step

    def train_step(self):
        sync()
        now = time.perf_counter()
        if "trainer" in marks and self.step >= args.warmup:
            times["trainer"].append(now - marks["trainer"])
        plain_step(self.step)
        sync()
        done = time.perf_counter()
        if self.step >= args.warmup:
            times["plain"].append(done - now)
        marks["trainer"] = done
        return original(self)

    Trainer.train_step = train_step
    with tempfile.TemporaryDirectory(prefix="host_overhead_") as work:
        cmd = trainer_command(case, args, Path(work) / "trainer")
        if main(cmd[cmd.index("train"):]) != 0:
            raise RuntimeError("the trainer failed")
    # Means, not medians: a logging step's drain is one step in `window` and belongs in the trainer's cost.
    trainer_ms, plain_ms = (1e3 * statistics.fmean(times[k]) for k in ("trainer", "plain"))
    return {"trainer_ms": trainer_ms, "plain_ms": plain_ms, "ratio": plain_ms / trainer_ms, "steps": len(times["plain"])}


# ---- phase timing -----------------------------------------------------------------------------------------------
class PhaseClock:
    """Exclusive wall time per phase: a phase nested in another is taken out of the outer one."""

    def __init__(self, warmup: int, sync: bool) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.stack: list[str] = []
        self.mark = 0.0
        self.warmup, self.sync, self.steps = warmup, sync, 0
        self.first: Optional[float] = None
        self.first_usage: Optional[resource.struct_rusage] = None
        self.last_usage: Optional[resource.struct_rusage] = None
        self.last = 0.0

    def _now(self) -> float:
        if self.sync:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def enter(self, phase: str) -> None:
        """Start `phase`, pausing the one it is nested in."""
        now = self._now()
        if self.stack:
            self.totals[self.stack[-1]] += now - self.mark
        self.stack.append(phase)
        self.mark = now

    def leave(self) -> None:
        """End the innermost phase, resuming the one around it."""
        now = self._now()
        self.totals[self.stack.pop()] += now - self.mark
        self.mark = now
        self.last = now

    def begin_step(self, index: int) -> None:
        """Called as step `index` (0-based) starts: the totals restart once the warm-up steps are done."""
        if index == self.warmup:
            self.totals.clear()
            self.first = self._now()
            self.first_usage = resource.getrusage(resource.RUSAGE_SELF)
        if index >= self.warmup:
            self.steps = index - self.warmup + 1
            self.last_usage = resource.getrusage(resource.RUSAGE_SELF)  # the steps before this one are whole

    def timed(self, phase: str, fn: Callable) -> Callable:
        """`fn`, timed as `phase`."""
        clock = self

        @functools.wraps(fn)
        def wrapper(*a, **k):
            clock.enter(phase)
            try:
                return fn(*a, **k)
            finally:
                clock.leave()

        return wrapper

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Replace `owner.name` (a class's method or a module's function) by a timed one.

        A name that is gone raises: a silent skip would move its time into "loop other"."""
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None:
            raise AttributeError(f"the phase table times {getattr(owner, '__name__', owner)}.{name} ({phase}), which "
                                 "no longer exists: update benchmarks/host_overhead.py")
        setattr(owner, name, self.timed(phase, fn))

    def report(self) -> dict:
        """ms per step by phase, and the step's wall time (the part no phase claims is 'loop other')."""
        wall = (self.last - self.first) if self.first is not None else 0.0
        steps = max(self.steps, 1)
        out = {phase: 1e3 * self.totals.get(phase, 0.0) / steps for phase in PHASES if phase != "loop other"}
        out["loop other"] = max(0.0, 1e3 * wall / steps - sum(out.values()))
        out["step"] = 1e3 * wall / steps
        if self.steps > 1:  # the training process's fresh pages and kernel time: host cost no phase wrapper sees
            first, last, whole = self.first_usage, self.last_usage, self.steps - 1
            out["page faults"] = (last.ru_minflt - first.ru_minflt) / whole
            out["kernel ms"] = 1e3 * (last.ru_stime - first.ru_stime) / whole
        return out


def instrument_trainer(clock: PhaseClock) -> None:
    """Time the trainer's and DeepSpeed's step phases (whatever of them this DeepSpeed version has)."""
    import deepspeed.runtime.bf16_optimizer as bf16_opt
    import deepspeed.runtime.zero.stage3 as stage3
    import deepspeed.runtime.zero.stage_1_and_2 as stage12
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils.timer import ThroughputTimer

    from pretrain.engine.deepspeed_engine import Engine
    from pretrain.observe.metrics import MetricsReporter, MetricWindow
    from pretrain.lifecycle.preemption import PreemptionGuard
    from pretrain.trainer import Trainer

    original_train_step = Trainer.train_step

    def train_step(self):
        clock.begin_step(self.step)
        clock.enter("loop other")
        try:
            return original_train_step(self)
        finally:
            clock.leave()

    Trainer.train_step = train_step
    table = [
        (Trainer, "_next_batch", "batch fetch"), (Trainer, "_to_device", "batch copy"),
        (DeepSpeedEngine, "forward", "forward"), (DeepSpeedEngine, "backward", "backward"),
        (DeepSpeedEngine, "allreduce_gradients", "gradient reduce"), (DeepSpeedEngine, "step", "engine other"),
        (DeepSpeedEngine, "clip_fp32_gradients", "gradient norm + clip"),
        (ThroughputTimer, "start", "timers"), (ThroughputTimer, "stop", "timers"),
        (stage12.DeepSpeedZeroOptimizer, "reduce_ready_partitions_and_remove_grads", "gradient reduce"),
        (stage12.DeepSpeedZeroOptimizer, "reduce_gradients", "gradient reduce"),
        (stage12.DeepSpeedZeroOptimizer, "scaled_global_norm", "gradient norm + clip"),
        (stage12.DeepSpeedZeroOptimizer, "unscale_and_clip_grads", "gradient norm + clip"),
        (stage12.DeepSpeedZeroOptimizer, "check_overflow", "overflow check"),
        (stage12.DeepSpeedZeroOptimizer, "_optimizer_step", "optimizer"),
        (stage12.DeepSpeedZeroOptimizer, "_update_model_bit16_weights", "parameter copy-back"),
        (stage12, "all_gather_dp_groups", "parameter copy-back"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "reduce_ready_partitions_and_remove_grads", "gradient reduce"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "_get_norm_groups", "gradient norm + clip"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "unscale_and_clip_grads", "gradient norm + clip"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "has_overflow", "overflow check"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "_optimizer_step", "optimizer"),
        (stage3.DeepSpeedZeroOptimizer_Stage3, "_reassign_or_swap_out_partitioned_parameters", "parameter copy-back"),
        (bf16_opt.BF16_Optimizer, "get_grads_for_norm", "gradient norm + clip"),
        (bf16_opt.BF16_Optimizer, "update_hp_grads", "gradient reduce"),
        (bf16_opt.BF16_Optimizer, "update_lp_params", "parameter copy-back"),
        (torch.optim.Adam, "step", "optimizer"),  # AdamW inherits it
        (MetricWindow, "add", "metrics"), (MetricWindow, "end_step", "metrics"), (MetricsReporter, "drain", "metrics"),
        (PreemptionGuard, "poll", "preemption check"), (Engine, "_clip", "gradient norm + clip"),
    ]
    for owner, name, phase in table:
        clock.wrap(owner, name, phase)


def trainer_phases(case: dict, args: argparse.Namespace) -> dict:
    """One instrumented trainer run in this process: ms per step by phase after the warm-up steps."""
    import torch

    clock = PhaseClock(args.warmup, sync=args.device == "cuda" and torch.cuda.is_available())
    instrument_trainer(clock)
    from pretrain.cli import main

    with tempfile.TemporaryDirectory(prefix="host_overhead_") as work:
        cmd = trainer_command(case, args, Path(work) / "trainer")
        code = main(cmd[cmd.index("train"):])
    if code != 0:
        raise RuntimeError(f"trainer exited {code}")
    return clock.report()


def plain_phases(case: dict, args: argparse.Namespace) -> dict:
    """One instrumented plain run: ms per step by phase after the warm-up steps."""
    import torch

    clock = PhaseClock(args.warmup, sync=args.device == "cuda" and torch.cuda.is_available())
    plain_loop(case, args, clock)
    return clock.report()


# ---- the comparison ---------------------------------------------------------------------------------------------
def ensure_data(args: argparse.Namespace) -> None:
    """The demo's shards (KJV, 8k unigram, 128-token packing), prepared once."""
    if DatasetDir(args.data).is_complete():
        return
    subprocess.run([sys.executable, "-m", "data_pipeline", "prepare", "--config", "data_pipeline/configs/demo.yaml",
                    f"output_dir={args.data}", "compression=zstd"], cwd=REPO, check=True, env=thread_env(args))  # as recorded


def fits_one_epoch(data: Path, batch: int, steps: int) -> None:
    """Refuse a run longer than one pass over the training split: at its end the trainer's loader starts a new pass
    (measured by `loader_throughput --pass-restarts`), a cost the plain loop's batches never pay."""
    from data_pipeline.shards import read_manifest

    sequences = read_manifest(data)["splits"]["train"]["sequences"]
    if steps * batch > sequences:
        raise SystemExit(f"{data} holds {sequences // batch} batches of {batch} per pass, fewer than the {steps} steps "
                         f"asked for: the loader would restart inside the timing; give more data or fewer steps")


def compare(case: dict, args: argparse.Namespace) -> dict:
    """Alternated trainer and plain runs of one case, then the phase breakdown of each if asked."""
    pairs = []
    with tempfile.TemporaryDirectory(prefix="host_overhead_") as work:
        for i in range(args.pairs):
            order = ("trainer", "plain") if i % 2 == 0 else ("plain", "trainer")
            got = {}
            for kind in order:
                got[kind] = run_trainer(case, args, Path(work)) if kind == "trainer" else run_worker("plain", case, args)
            pairs.append({"trainer": got["trainer"]["samples_per_s"], "plain": got["plain"]["samples_per_s"],
                          "ratio": got["trainer"]["samples_per_s"] / got["plain"]["samples_per_s"]})
            print(f"  {case} pair {i + 1}: trainer {pairs[-1]['trainer']:.2f}, plain {pairs[-1]['plain']:.2f} samples/s, "
                  f"ratio {pairs[-1]['ratio']:.3f}", flush=True)
    ratios = [p["ratio"] for p in pairs]
    out = {**case, "pairs": pairs}
    if pairs:
        out.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                   trainer_median=statistics.median(p["trainer"] for p in pairs),
                   plain_median=statistics.median(p["plain"] for p in pairs))
    if args.interleaved:
        runs = [run_worker("interleaved", case, args) for _ in range(args.interleaved)]
        out["interleaved"] = {"runs": runs, "ratio_median": statistics.median(r["ratio"] for r in runs),
                              "trainer_ms": statistics.median(r["trainer_ms"] for r in runs),
                              "plain_ms": statistics.median(r["plain_ms"] for r in runs)}
        print(f"  {case} interleaved: " + ", ".join(f"{r['ratio']:.3f}" for r in runs), flush=True)
    if args.phases:
        out["phases"] = {"trainer": run_worker("trainer-phases", case, args), "plain": run_worker("plain-phases", case, args)}
    return out


def print_tables(results: list[dict], info: dict, args: argparse.Namespace) -> None:
    """The ratio table and, when measured, the per-phase table."""
    where = info["gpu"] or f"{info['cpu']} ({info['cpu_flags']}), {args.threads or 'all'} thread(s)"
    print(f"\n{where}; {args.shape} shape, micro-batch {args.batch} x {args.seq}, {args.steps} steps in windows of "
          f"{args.window}, {args.pairs} alternated pairs; torch {info['torch']}, deepspeed {info['deepspeed']}, "
          f"commit {info['commit']}")
    print("| backbone | ZeRO | precision | plain samples/s | trainer samples/s | trainer / plain (min-max) | interleaved: trainer ms, plain ms, ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        inter = r.get("interleaved")
        cell = f"{inter['trainer_ms']:.1f}, {inter['plain_ms']:.1f}, **{inter['ratio_median']:.3f}**" if inter else ""
        paired = (f"{r['plain_median']:.2f} | {r['trainer_median']:.2f} | **{r['ratio_median']:.3f}** "
                  f"({r['ratio_min']:.3f}-{r['ratio_max']:.3f})") if r["pairs"] else " | | "
        print(f"| {r['backbone']} | {r['stage']} | {r['resolved_precision']} | {paired} | {cell} |")
    with_phases = [r for r in results if "phases" in r]
    if not with_phases:
        return
    print("\nms per step by phase (exclusive; one instrumented run each, after the warm-up)")
    heads = [f"{r['backbone']} Z{r['stage']} {side}" for r in with_phases for side in ("trainer", "plain")]
    print("| phase | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for phase in (*PHASES, "step", "page faults", "kernel ms"):
        cells = [f"{r['phases'][side].get(phase, 0.0):.{0 if phase == 'page faults' else 2}f}" for r in with_phases
                 for side in ("trainer", "plain")]
        name = {"step": "**step**", "page faults": "page faults per step (training process)",
                "kernel ms": "kernel time per step, ms (training process)"}.get(phase, phase)
        print(f"| {name} | " + " | ".join(cells) + " |")


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, choices={"backbones": list(BACKBONES)}, backbones=["modernbert", "bert"])
    parser.add_argument("--stages", nargs="+", default=["2"], choices=["0", "1", "2", "3", "auto"])
    add_shared(parser, precision="auto")
    parser.add_argument("--shape", default="proxy", choices=list(SHAPES))
    add_shared(parser, batch=4, seq=128, steps=60)
    parser.add_argument("--window", type=int, default=10)
    add_shared(parser, warmup=10)
    parser.add_argument("--pairs", type=int, default=3)
    add_shared(parser, threads=1, loader_workers="auto")  # resolved below, as data.num_workers=auto would be
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_shared(parser, set=[])  # the trainer only, not the plain loop: a lever to measure
    parser.add_argument("--interleaved", type=int, default=0, metavar="RUNS",
                        help="also run the trainer and the plain loop step by step in one process, RUNS times")
    parser.add_argument("--phases", action="store_true", help="also time each phase of a step (one more run of each)")
    parser.add_argument("--kernel-steps", type=int, default=0, metavar="STEPS",
                        help="profile the plain loop for STEPS more steps after the timed ones: ms per step by kernel")
    parser.add_argument("--plain-compile", action="store_true",
                        help="compile the plain loop's forward, head and loss as one graph (torch.compile), the masked "
                             "positions gathered to the largest count per row of its batches")
    add_shared(parser, data=str(REPO / "runs" / "bench" / "data"), out=results_file("host_overhead"))
    parser.add_argument("--worker", choices=["plain", "plain-phases", "trainer-phases", "interleaved"], help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if not 0 <= args.warmup < args.steps:
        return "--warmup must be below --steps (each side is timed after its warm-up)"
    if not 0 < args.window <= args.steps // 2:
        return "--window must be at least 1 and fit --steps twice (the first window is not counted)"
    return ""


def main(argv: Optional[list[str]] = None) -> None:
    """Run every case and print the tables."""
    args = parse_checked(build_parser(), check_args, argv)
    if args.loader_workers == "auto":
        from data_pipeline.loader import cpus_per_rank, loader_workers

        args.loader_workers = loader_workers("auto", args.device == "cuda", cpus_per_rank(local_ranks=1))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.worker:
        import logging

        logging.disable(logging.WARNING)
        case = json.loads(args.case)
        work = {"plain": plain_loop, "plain-phases": plain_phases, "trainer-phases": trainer_phases,
                "interleaved": interleaved}[args.worker]
        result = work(case, args)
        sys.stdout.flush()
        print(json.dumps(result), flush=True)
        os._exit(0)  # the trainer's process group and loader workers need no orderly teardown here
    ensure_data(args)
    fits_one_epoch(Path(args.data), args.batch, args.steps)
    from pretrain.engine.hardware import resolve_precision

    info = machine()
    results = []
    for backbone in args.backbones:
        for stage in args.stages:
            case = {"backbone": backbone, "stage": stage, "precision": args.precision,
                    "resolved_precision": resolve_precision(args.precision)[0]}
            results.append(compare(case, args))
    print_tables(results, info, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": info, "args": {k: v for k, v in vars(args).items() if k not in
                                                                    ("worker", "case")}, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
