"""The training paths only a GPU reaches, each run once on a GPU node and checked, in a few minutes:

- `rank-gpu`: a rank whose LOCAL_RANK numbers a GPU its process cannot see exits 2 with one line that says how to
  launch, before it waits for any other rank;
- `fp16`: fp16 training from a loss scale far too high (2^24): the overflowing steps are skipped and the scale falls,
  every logged loss is finite, the loss falls; stopped half-way and resumed, the run goes on with the same loss
  scales and losses as one that was not stopped (the loss scaler's state is in the checkpoint);
- `fused-adam`: `optimizer.impl=deepspeed` (DeepSpeed's FusedAdam, a CUDA op built on first use with the node's
  nvcc) against `optimizer.impl=torch` (torch's AdamW), fp32: the same losses;
- `fused-lamb`: DeepSpeed's FusedLamb against a float64 reference of its own formula (another update than the
  project's LAMB, the paper's: README, "Optimizers and schedules"), and a run with it trains;
- `flash-attention`: ModernBERT with `model.attn_implementation=flash_attention_2` against sdpa, bf16: the same
  losses; where transformers finds no flash-attn package, the run must be refused in one line (exit 2);
- `workers`: `data.num_workers=auto` beside a GPU runs min(4, CPUs - 1) loader workers, as the README says;
- `nccl-peer-loss`: with two GPUs, two ranks over NCCL (benchmarks/peer_loss_time.py's runs), rank 1 signalled at
  step 5. Killed (SIGKILL): rank 0 exits 76 (peer lost) within 15 s, in one line naming the NCCL backend, which
  checks the README's "a dead process is seen at once" under NCCL (within a node its transports may hold no socket
  that closes: a FAIL then says the README is wrong there, not only the code). Frozen (SIGSTOP, as a lost host): rank 0 ends within
  `train.step_timeout_s` (30 s here) and a minute, and the check says how: exit 76, or torn down by NCCL's watchdog
  (`TORCH_NCCL_ASYNC_ERROR_HANDLING=3`: what the README leaves to be checked on a GPU), and what the flight
  recorder dumped. Not run on a node with one GPU.

    python -m benchmarks.gpu_paths                                  # every check; the demo's shards
    python -m benchmarks.gpu_paths --checks fp16 fused-adam --data runs/bench_gpu/data128

Each run is `python -m pretrain train` with a tiny BERT (gpu_throughput's `tiny` shape), dropout 0, one rank, ended
past `--run-timeout-s`. A check the node cannot run (two GPUs; a CUDA op without a toolkit: no CUDA_HOME, nvcc or ninja) says why and does
not fail (an op that fails to compile or load does); a check that raises fails with its error, and the next one
runs. The checks run in the order listed above whatever `--checks` says (fused-lamb, whose formula check holds a
CUDA context in this process, last: on GPUs in exclusive-process mode the runs after it could not open the GPU). Exits 1 when a check fails, 2 without a GPU.
Results: benchmarks/results/gpu_paths.json, written after every check.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from benchmarks.arguments import REPO, add_shared, parse_checked, repo_pythonpath, results_file
from benchmarks.gpu_throughput import BACKBONES, MODERNBERT_FFN, SHAPES
from core.atomic_files import write_text_atomic
from pretrain.run_dir import RunDir

PASS, FAIL, NOT_RUN = "pass", "FAIL", "not run"
FP16_SCALE_POWER = 24  # far above what a tiny model's gradients fit in fp16 (65,504): the first steps overflow


def tiny(backbone: str) -> list[str]:
    """gpu_throughput's tiny shape of `backbone`, as run-config overrides."""
    shape = {**SHAPES["tiny"], **({"intermediate_size": MODERNBERT_FFN["tiny"]} if backbone == "modernbert" else {})}
    return [f"model.{key}={value}" for key, value in shape.items()]


@dataclass
class Outcome:
    """One check's verdict and what it saw."""

    check: str
    verdict: str
    detail: str
    figures: dict = field(default_factory=dict)


@dataclass
class Run:
    """One `python -m pretrain train`'s exit status, seconds, stderr's tail and logged training rows."""

    code: int
    seconds: float
    stderr: str
    rows: list[dict]
    log: str

    @property
    def errors(self) -> list[str]:
        """stderr's one-line errors (`error: ...`, what a refused run says), in order."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


CONFIG = "pretrain/configs/demo_mlm.yaml"  # under the checks' own overrides


def run_overrides(out: Path, args: argparse.Namespace, *overrides: str, backbone: str = "bert") -> list[str]:
    """The run config of one run (over CONFIG): the tiny `backbone` on `args.data` into `out`, logged every step,
    then `overrides`."""
    return [*BACKBONES[backbone], *tiny(backbone), f"data.path={args.data}", f"train.output_dir={out}",
            f"train.max_steps={args.steps}", f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch}", "train.log_every=1", "train.eval_every=0",
            f"train.save_every={args.steps * 10}", "train.seed=0", "schedule.warmup_steps=5", "optimizer.lr=1e-3",
            "model.dropout=0", "model.attention_dropout=0", "train.compile=false", "data.num_workers=1", *overrides]


def train(out: Path, args: argparse.Namespace, *overrides: str, backbone: str = "bert",
          env: Optional[dict[str, str]] = None, fresh: bool = True) -> Run:
    """One run (`run_overrides`) into `out`, emptied first where `fresh`."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "pretrain", "train", "--config", CONFIG,
               *run_overrides(out, args, *overrides, backbone=backbone)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # its loader workers too, when it must be ended
                            env={**os.environ, "PYTHONPATH": repo_pythonpath(), "HF_HUB_OFFLINE": "1", **(env or {})})
    try:
        _, stderr = proc.communicate(timeout=args.run_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        stderr += f"\nerror: ended by benchmarks.gpu_paths after --run-timeout-s {args.run_timeout_s:g} s"
    except BaseException:  # this script stopped (the queue's SIGTERM, a Ctrl-C): the run must not keep the GPU
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    run_dir = RunDir(out)
    rows = [r for r in run_dir.metric_rows() if r.get("split") == "train"] if run_dir.metrics.is_file() else []
    log = run_dir.text_log.read_text() if run_dir.text_log.is_file() else ""
    return Run(proc.returncode, time.perf_counter() - started, stderr[-3000:], rows, log)


def toolkit_missing(line: str) -> bool:
    """Whether load_op's line ("... did not build here (WHY): what to do") says the node has no toolkit to build the
    op with (no CUDA_HOME, nvcc or ninja), not that a compile or a load failed. Only WHY is read: the advice after
    it names CUDA_HOME too."""
    if "did not build here (" not in line:
        return False
    why = line.split("did not build here (", 1)[1].rsplit("): ", 1)[0]
    return any(mark in why for mark in ("CUDA_HOME", "MissingCUDAException", "nvcc: not found", "ninja"))


def not_built(run: Run) -> str:
    """The run's one line where it stopped because the node has no toolkit to build a DeepSpeed op with (not the path
    checked), else "". An op that fails to compile or load is no such case."""
    lines = [line for line in run.errors if toolkit_missing(line)]
    return f"the node has no toolkit to build the op: {lines[-1]}" if run.code == 2 and lines else ""


def ran(run: Run, what: str) -> str:
    """"" where the run ended 0, else what it ended with."""
    return "" if run.code == 0 else f"{what} exited {run.code}: {(run.stderr.strip().splitlines() or [''])[-1]}"


def loss_difference(a: list[dict], b: list[dict], steps: Optional[range] = None) -> tuple[float, int]:
    """The largest relative difference between two runs' losses at the steps both logged (within `steps`), and how
    many steps were compared."""
    first = {r["step"]: r["loss"] for r in a}
    pairs = [(first[r["step"]], r["loss"]) for r in b if r["step"] in first and (steps is None or r["step"] in steps)]
    worst = max((abs(y - x) / max(abs(x), 1e-12) for x, y in pairs), default=math.inf)
    return worst, len(pairs)


def losses_agree(name: str, a: list[dict], b: list[dict], steps: int, tolerance: float) -> Outcome:
    """PASS where both runs logged every step and their losses agree within `tolerance` (relative)."""
    worst, compared = loss_difference(a, b)
    good = compared == steps and worst <= tolerance
    return Outcome(name, PASS if good else FAIL, f"largest relative loss difference {worst:.2e} over {compared} of "
                   f"{steps} steps (tolerance {tolerance:g})", {"max_relative_loss_difference": worst,
                                                                  "steps_compared": compared})


def fp16_verdict(whole: list[dict], resumed: list[dict], steps: int, stop_at: int, tolerance: float) -> Outcome:
    """The fp16 check's verdict from the uninterrupted run's rows and the stopped-then-resumed run's."""
    problems = []
    scales = [r.get("loss_scale") for r in whole]
    if len(whole) != steps or None in scales:
        problems.append(f"{len(whole)} of {steps} steps logged, {scales.count(None)} without a loss scale")
    elif not min(scales) < 2 ** FP16_SCALE_POWER:
        problems.append(f"the loss scale never fell below 2^{FP16_SCALE_POWER}: no overflowing step was skipped")
    if not all(math.isfinite(r["loss"]) for r in whole):
        problems.append("a logged loss is not finite")
    elif len(whole) >= 10 and not (sum(r["loss"] for r in whole[-5:]) < sum(r["loss"] for r in whole[:5])):
        problems.append("the loss of the last 5 steps is not below the first 5's")
    after = range(stop_at + 1, steps + 1)
    by_step = {r["step"]: r.get("loss_scale") for r in whole}
    changed = [r["step"] for r in resumed if r["step"] in after and r.get("loss_scale") != by_step.get(r["step"])]
    if changed:
        problems.append(f"after the resume the loss scale differs from the uninterrupted run's at steps {changed[:5]}")
    worst, compared = loss_difference(whole, resumed, after)
    if compared != len(after) or worst > tolerance:
        problems.append(f"after the resume {compared} of {len(after)} steps compared, largest relative loss "
                        f"difference {worst:.2e} (tolerance {tolerance:g})")
    figures = {"loss_scales": sorted({s for s in scales if s is not None}), "first_loss": whole[0]["loss"] if whole else None,
               "last_loss": whole[-1]["loss"] if whole else None, "resumed_max_relative_loss_difference": worst}
    return Outcome("fp16", FAIL if problems else PASS, "; ".join(problems) or
                   f"loss scales {figures['loss_scales']}, loss {figures['first_loss']:.3f} -> {figures['last_loss']:.3f}; "
                   f"resumed at step {stop_at}: the same scales, losses within {worst:.1e}", figures)


def check_rank_gpu(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """A rank numbered past the GPUs it sees: exit 2 with the SetupError line, without waiting for rank 0."""
    env = {"RANK": str(gpus), "WORLD_SIZE": str(gpus + 1), "LOCAL_RANK": str(gpus), "LOCAL_WORLD_SIZE": str(gpus + 1),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}
    run = train(work / "rank_gpu", args, "train.init_timeout_s=60", env=env)  # were it to wait, not for 10 minutes
    said = f"LOCAL_RANK={gpus}, but this process sees {gpus} GPU(s)"
    lines = run.errors
    good = run.code == 2 and len(lines) == 1 and said in lines[0] and "Traceback" not in run.stderr
    return Outcome("rank-gpu", PASS if good else FAIL,
                   f"exit {run.code} after {run.seconds:.0f} s: {(lines or run.stderr.strip().splitlines() or [''])[-1][:200]}",
                   {"exit_code": run.code, "seconds": run.seconds})


def check_fp16(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """fp16 from a loss scale of 2^24, uninterrupted and stopped half-way then resumed."""
    config = json.loads((REPO / "deepspeed_configs" / "base.json").read_text())
    # The scale doubles after 10 steps without overflow: a resume that lost the scaler's state would double it later.
    config["fp16"].update(initial_scale_power=FP16_SCALE_POWER, loss_scale_window=10)
    work.mkdir(parents=True, exist_ok=True)
    (work / "fp16_deepspeed.json").write_text(json.dumps(config, indent=2))
    fp16 = ("train.precision=fp16", f"train.deepspeed_config={work / 'fp16_deepspeed.json'}")
    stop_at = args.steps // 2
    whole, resumed, failed = stopped_and_resumed(args, work / "fp16", stop_at, *fp16)
    if failed:
        return Outcome("fp16", FAIL, failed)
    return fp16_verdict(whole.rows, resumed.rows, args.steps, stop_at, args.tolerance)


def stopped_and_resumed(args: argparse.Namespace, work: Path, stop_at: int, *overrides: str) -> tuple[Run, Run, str]:
    """The run uninterrupted, and the same run stopped after `stop_at` steps (saved there) then resumed by the same
    command to the end; what failed ("" for nothing)."""
    whole = train(work / "whole", args, *overrides)
    first = train(work / "resumed", args, *overrides, f"train.stop_after={stop_at}", f"train.save_every={stop_at}")
    second = train(work / "resumed", args, *overrides, f"train.save_every={stop_at}", fresh=False) \
        if first.code == 0 else first
    return whole, second, (ran(whole, "the uninterrupted run") or ran(first, "the first part")
                           or ran(second, "the resumed part"))


def check_fused_adam(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """optimizer.impl=deepspeed (FusedAdam; DeepSpeedCPUAdam on a CPU) against torch's AdamW, fp32."""
    runs = {impl: train(work / f"adamw_{impl}", args, "train.precision=fp32", f"optimizer.impl={impl}")
            for impl in ("torch", "deepspeed")}
    unbuilt = not_built(runs["deepspeed"])
    if unbuilt:  # else an op that failed to build fails the check, below
        return Outcome("fused-adam", NOT_RUN, unbuilt)
    failed = ran(runs["torch"], "optimizer.impl=torch") or ran(runs["deepspeed"], "optimizer.impl=deepspeed")
    if failed:
        return Outcome("fused-adam", FAIL, failed)
    return losses_agree("fused-adam", runs["torch"].rows, runs["deepspeed"].rows, args.steps, args.tolerance)


def fused_lamb_reference(params: list, grads: list, lr: float, betas: tuple[float, float], eps: float,
                         weight_decay: float, max_coeff: float = 10.0, min_coeff: float = 0.01) -> list:
    """DeepSpeed's FusedLamb in float64, as its CUDA kernel computes it (csrc/lamb/fused_lamb_cuda_kernel.cu), over
    `grads` (one list a step): raw moments; u = m / (sqrt(v) + eps) + weight_decay * p; the trust ratio ||p|| / ||u||
    clamped to [min_coeff, max_coeff], 1 where either norm is 0; p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * ratio * u.
    The parameters after the last step. As FusedLamb runs here: one parameter group, no gradient scale, no
    max_grad_norm, bias_correction on, eps outside the square root, fp32 gradients."""
    b1, b2 = betas
    params = [p.double().clone() for p in params]
    m = [p.new_zeros(p.shape) for p in params]
    v = [p.new_zeros(p.shape) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        step = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for p, g, m_i, v_i in zip(params, step_grads, m, v):
            g = g.double()
            m_i.mul_(b1).add_(g, alpha=1 - b1)
            v_i.mul_(b2).addcmul_(g, g, value=1 - b2)
            u = m_i / (v_i.sqrt() + eps) + weight_decay * p
            w_norm, u_norm = p.norm().item(), u.norm().item()
            ratio = min(max(w_norm / u_norm, min_coeff), max_coeff) if w_norm and u_norm else 1.0
            p.sub_(step * ratio * u)
    return params


LAMB_RUN = ("train.precision=fp32", "optimizer.name=lamb", "optimizer.impl=deepspeed", "train.zero_stage=0")


def check_fused_lamb(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """FusedLamb steps as its formula says (float64 reference, 8 steps on tensors whose trust ratios are inside, above
    and below the clamp, and 0 norms), and a run with optimizer.impl=deepspeed, name=lamb trains. Not compared with the
    project's LAMB, the paper's, which is another update (pretrain/engine/optim.py)."""
    import torch
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.op_builder import FusedLambBuilder

    from core.errors import SetupError
    from pretrain.engine.optim import load_op, ops_build_in_this_venv

    ops_build_in_this_venv()  # where the trainer's run builds it too: one build
    try:
        load_op(lambda: FusedLambBuilder().load(), "FusedLamb", "this check", "the trainer would stop the same way")
    except SetupError as err:
        missing = toolkit_missing(str(err))
        return Outcome("fused-lamb", NOT_RUN if missing else FAIL,
                       f"the node has no toolkit to build the op: {err}" if missing else str(err))
    generator = torch.Generator().manual_seed(0)
    shapes_scales = [((64, 64), 0.02), ((64,), 1.0), ((64,), 0.0), ((32, 16), 1e3), ((8, 8), 1e-6)]
    start = [torch.randn(shape, generator=generator) * scale for shape, scale in shapes_scales]
    grads = [[torch.randn(p.shape, generator=generator) for p in start] for _ in range(8)]
    hyper = {"lr": 1e-2, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.01}
    live = [torch.nn.Parameter(p.cuda()) for p in start]
    optimizer = FusedLamb(live, **hyper)
    for step_grads in grads:
        for p, g in zip(live, step_grads):
            p.grad = g.cuda()
        optimizer.step()
    expected = fused_lamb_reference(start, grads, **hyper)
    worst = max(((p.detach().cpu().double() - e).abs().max() / e.abs().max().clamp_min(1e-12)).item()
                for p, e in zip(live, expected))
    run = train(work / "fused_lamb", args, *LAMB_RUN)
    problems = [] if worst <= 1e-5 else [f"FusedLamb's parameters differ from its formula by {worst:.2e} (relative to "
                                          "each tensor's largest, 1e-5 allowed)"]
    losses = [r["loss"] for r in run.rows]
    if run.code != 0:
        problems.append(ran(run, "optimizer.impl=deepspeed, name=lamb"))
    elif len(losses) != args.steps or not sum(losses[-5:]) < sum(losses[:5]):
        problems.append(f"the run logged {len(losses)} of {args.steps} steps, its loss "
                        f"{losses[0] if losses else float('nan'):.3f} -> {losses[-1] if losses else float('nan'):.3f}")
    return Outcome("fused-lamb", FAIL if problems else PASS, "; ".join(problems) or
                   f"FusedLamb within {worst:.1e} of its formula over 8 steps; a run trained, loss {losses[0]:.3f} -> "
                   f"{losses[-1]:.3f}", {"formula_max_relative_difference": worst})


def check_flash_attention(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """ModernBERT with flash_attention_2 against sdpa, bf16; without flash-attn, the one-line refusal."""
    from transformers.utils import is_flash_attn_2_available

    flash = train(work / "flash_attention_2", args, "train.precision=bf16", "model.attn_implementation=flash_attention_2",
                  backbone="modernbert")
    if not is_flash_attn_2_available():
        lines = flash.errors
        good = flash.code == 2 and len(lines) == 1 and "flash-attn" in lines[0] and "Traceback" not in flash.stderr
        return Outcome("flash-attention", PASS if good else FAIL, "flash-attn is not installed here, so only the "
                       f"refusal was checked: exit {flash.code}, {(lines or [''])[0][:160]!r}")
    sdpa = train(work / "sdpa", args, "train.precision=bf16", "model.attn_implementation=sdpa", backbone="modernbert")
    failed = ran(flash, "flash_attention_2") or ran(sdpa, "sdpa")
    if failed:
        return Outcome("flash-attention", FAIL, failed)
    return losses_agree("flash-attention", sdpa.rows, flash.rows, args.steps, args.bf16_tolerance)


def check_workers(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """data.num_workers=auto beside a GPU: min(4, CPUs - 1) loader workers, at least 1."""
    run = train(work / "workers", args, "data.num_workers=auto")
    if run.code != 0:
        return Outcome("workers", FAIL, ran(run, "the run"))
    expected = max(1, min(4, len(os.sched_getaffinity(0)) - 1))
    said = f"{expected} loader worker(s) per rank (data.num_workers=auto)"
    return Outcome("workers", PASS if said in run.log else FAIL,
                   f"expected {said!r}: {'logged' if said in run.log else 'not in train.log'}", {"expected": expected})


def check_nccl_peer_loss(args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """Two ranks over NCCL. Rank 1 killed at step 5: rank 0 exits 76 within 15 s. Frozen: rank 0 ends within the
    step timeout and a minute, by exit 76 or NCCL's watchdog (said, with the flight recorder's dumps)."""
    if gpus < 2:
        return Outcome("nccl-peer-loss", NOT_RUN, f"needs two GPUs; this node shows {gpus}")
    from benchmarks.peer_loss_time import one_case
    from pretrain.lifecycle.exit_status import EXIT_PEER_LOST

    problems, said, figures, timeout_s = [], [], {}, 30
    for case, limit in (("sigkill", 15.0), ("sigstop", timeout_s + 60.0)):
        result = one_case(case, Path(args.data).resolve(), work.resolve() / "nccl", 5, args.batch, limit + 60,
                          extra=(*BACKBONES["bert"], *tiny("bert"), f"train.step_timeout_s={timeout_s}"))
        code = result["exit_code"]
        how = ("still running" if code is None else f"exit {code}" if code >= 0
               else f"killed by {signal.Signals(-code).name}")
        dumps = sorted(p.name for p in RunDir(work.resolve() / "nccl" / f"run_{case}").flight_recorder.glob("*"))
        figures[case] = {**result, "ended_by": how, "flight_recorder": dumps}
        said.append(f"{case}: {how} after {result['seconds']} s, {len(dumps)} flight-recorder dump(s)")
        if case == "sigkill" and not (code == EXIT_PEER_LOST and result["seconds"] <= limit
                                      and "backend nccl" in result["line"]):
            problems.append(f"sigkill: rank 0 {how} after {result['seconds']} s (exit 76 within {limit:g} s, naming "
                            f"backend nccl, expected): {result['line'][:160]!r}")
        if case == "sigstop" and (code is None or result["seconds"] > limit):
            problems.append(f"sigstop: rank 0 {how} after {result['seconds']} s (an end within {limit:g} s expected)")
    return Outcome("nccl-peer-loss", FAIL if problems else PASS, "; ".join(problems + said), figures)


# In the order they run (fused-lamb last: its formula check holds a CUDA context in this process).
CHECKS: dict[str, Callable[[argparse.Namespace, Path, int], Outcome]] = {
    "rank-gpu": check_rank_gpu, "fp16": check_fp16, "fused-adam": check_fused_adam,
    "flash-attention": check_flash_attention, "workers": check_workers, "nccl-peer-loss": check_nccl_peer_loss,
    "fused-lamb": check_fused_lamb}


def build_parser() -> argparse.ArgumentParser:
    """This check's arguments."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, steps=40, batch=32, data=str(REPO / "runs" / "demo" / "data"),
               work=str(REPO / "runs" / "gpu_paths"), out=results_file("gpu_paths"))
    parser.add_argument("--checks", nargs="+", choices=list(CHECKS), default=list(CHECKS), help="the checks to run")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="largest relative loss difference in fp32 and across fp16's resume")
    parser.add_argument("--bf16-tolerance", type=float, default=1e-2, help="the same for flash-attention's bf16 runs")
    parser.add_argument("--run-timeout-s", type=float, default=600,
                        help="a training run still going after this is ended and fails its check")
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if args.steps < 10:
        return "--steps must be at least 10 (fp16 stops half-way and compares the loss of the first and last 5 steps)"
    if not (args.tolerance > 0 and args.bf16_tolerance > 0 and args.run_timeout_s > 0):
        return "--tolerance, --bf16-tolerance and --run-timeout-s must be above 0"
    return ""


class Terminated(BaseException):
    """SIGTERM (the GPU queue ending this entry): past the checks' own error handling, through train()'s, which ends
    the run it waits for, so that no run keeps the GPU."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


def finite(value: object) -> object:
    """`value` with every float that is not finite as None: results that strict JSON readers take."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def visible_gpus() -> tuple[int, str]:
    """How many GPUs torch sees here, and the first one's name ("" without one)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count, torch.cuda.get_device_name(0) if count else ""


def run_check(name: str, args: argparse.Namespace, work: Path, gpus: int) -> Outcome:
    """One check; one that raises fails with its error's last line (the rest still run)."""
    started = time.perf_counter()
    try:
        outcome = CHECKS[name](args, work, gpus)
    except (Exception, SystemExit) as err:  # a helper's SystemExit (peer_loss_time) included; not Terminated
        text = (str(err).strip().splitlines() or [""])[-1]
        outcome = Outcome(name, FAIL, f"the check raised {type(err).__name__}: {text}")
    outcome.figures["seconds"] = round(time.perf_counter() - started, 1)
    return outcome


def main(argv: Optional[list[str]] = None) -> None:
    """Run the chosen checks; print a line each, and the results file after each; exit 1 when any fails."""
    args = parse_checked(build_parser(), check_args, argv)
    # The runs start in this process's folder's terms and run from the repository's (cwd=REPO).
    args.data, args.work, args.out = (str(Path(p).resolve()) for p in (args.data, args.work, args.out))
    gpus, device = visible_gpus()
    if not gpus:
        print("error: benchmarks.gpu_paths checks what only a GPU runs, and torch sees no GPU here "
              "(torch.cuda.is_available() is False): run it on a GPU node", file=sys.stderr)
        raise SystemExit(2)
    if not (Path(args.data) / "train").is_dir():
        print(f"error: --data {args.data} holds no prepared dataset (no train/ folder): run `make demo` or "
              "`python -m pretrain prepare` first, or name one", file=sys.stderr)
        raise SystemExit(2)
    import torch

    signal.signal(signal.SIGTERM, _terminated)
    chosen, outcomes = [name for name in CHECKS if name in args.checks], []
    for name in chosen:
        try:
            outcome = run_check(name, args, Path(args.work), gpus)
        except Terminated:
            print(f"stopped by SIGTERM during {name}: {args.out} holds the checks before it", file=sys.stderr)
            raise SystemExit(128 + signal.SIGTERM) from None
        outcomes.append(outcome)
        print(f"{name}: {outcome.verdict} ({outcome.figures['seconds']:.0f} s): {outcome.detail}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.out), json.dumps(finite({
            "device": device, "gpus": gpus, "torch": torch.__version__, "args": vars(args),
            "outcomes": [vars(o) for o in outcomes], "not_yet_run": chosen[len(outcomes):]}),
            indent=2, default=str, allow_nan=False) + "\n")
    if any(o.verdict == FAIL for o in outcomes):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
