"""Eager against compiled training, for a GPU node in a few minutes: the plain eager run (transformers' modules as
they are) against the fast path the gpu_base group trains with (`train.compile` by `--mode`: auto, as that group
runs, layers or the whole step; with `train.fused_qkv` unless `--no-fused-qkv`; `--compiled-set` adds more, such as
`train.vocab_loss_chunk=1024`), dropout 0, the same seed and data: both must log the same losses within `--tolerance`
(relative) at every step; the compiled run's export must load with transformers' own classes; tokens/s and MFU of
both are printed.

    python -m benchmarks.compile_check                                    # on a GPU: base shapes, bf16, 100 steps
    python -m benchmarks.compile_check --size tiny --steps 6 --precision fp32 --backbones bert --objectives mlm  # CPU

Each run is `python -m pretrain train` (one rank, `train.zero_stage=auto`) on `--data` (default the demo's shards)
with the shapes and recipes of benchmarks/gpu_throughput.py; TaCL continues a teacher of the backbone's own family
and shape, dropout 0, fresh weights. Exits 1 when a check fails. Results:
benchmarks/results/compile_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from benchmarks.arguments import REPO, add_shared, parse_checked, repo_pythonpath, results_file
from benchmarks.gpu_throughput import BACKBONES, OBJECTIVES, SHAPES, measure, point_overrides, teacher_folder
from pretrain.run_dir import RunDir

SEQ = 128
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]


def train(backbone: str, objective: str, compiled: bool, args: argparse.Namespace, run: Path,
          teacher: Optional[Path]) -> list[dict]:
    """One run (gpu_throughput's point, logged every step, dropout 0, a checkpoint at the end); its metrics rows."""
    shutil.rmtree(run, ignore_errors=True)
    point = {"objective": objective, "backbone": backbone, "seq": SEQ, "batch": args.batch, "compile": compiled}
    fast = [f"train.compile={args.mode}", f"train.fused_qkv={str(args.fused_qkv).lower()}", *args.compiled_set]
    overrides = [*point_overrides(point, args, Path(args.data), teacher, run), "train.log_every=1",
                 f"train.save_every={args.steps}", *NO_DROPOUT, "schedule.warmup_steps=2", "train.seed=0",
                 *(fast if compiled else ["train.compile=false"])]
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", "pretrain/configs/demo_mlm.yaml",
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{backbone} {objective} compile={compiled} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [r for r in RunDir(run).metric_rows() if r.get("split") == "train"]


def loads_natively(run: Path, out: Path) -> str:
    """Export the run's last checkpoint (its own read-back check included) and load the root model with
    transformers' Auto class; returns the class name."""
    import torch
    from transformers import AutoModel

    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pretrain", "export", "--checkpoint", str(run), "--out", str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": repo_pythonpath()}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"export of {run} failed:\n{proc.stderr[-3000:]}")
    model = AutoModel.from_pretrained(out)
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([[2, 100, 200, 3]])).last_hidden_state
    if not torch.isfinite(hidden).all():
        raise SystemExit(f"the export {out} gives non-finite hidden states")
    return type(model).__name__


def check(backbone: str, objective: str, args: argparse.Namespace, work: Path) -> dict:
    """Both runs of one (backbone, objective), the loss comparison and the export."""
    # TaCL continues its teacher, whose folder decides the model (family, shape, dropout): the MLM point's model.
    teacher = teacher_folder(backbone, SEQ, args, Path(args.data), work / f"{backbone}_teacher", NO_DROPOUT) \
        if objective == "tacl" else None
    eager = train(backbone, objective, False, args, work / f"{backbone}_{objective}_eager", teacher)
    compiled = train(backbone, objective, True, args, work / f"{backbone}_{objective}_compiled", teacher)
    pairs = [(a["loss"], b["loss"]) for a, b in zip(eager, compiled)]
    worst = max(abs(b - a) / max(abs(a), 1e-12) for a, b in pairs)
    row = {"backbone": backbone, "objective": objective, "steps": len(pairs), "max_relative_loss_difference": worst,
           "losses_agree": len(pairs) == args.steps and worst <= args.tolerance,
           "export_class": loads_natively(work / f"{backbone}_{objective}_compiled", work / f"{backbone}_{objective}_export")}
    warmup = min(args.warmup, args.steps - 1)
    for name, rows in (("eager", eager), ("compiled", compiled)):
        timed = measure(rows, warmup)
        row[f"{name}_tokens_per_s"], row[f"{name}_mfu"] = timed["tokens_per_s"], timed["mfu"]
    return row


def build_parser() -> argparse.ArgumentParser:
    """This check's arguments."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, choices={"backbones": list(BACKBONES), "objectives": list(OBJECTIVES)},
               backbones=list(BACKBONES), objectives=list(OBJECTIVES), steps=100, warmup=20, batch=64,
               precision="auto", data=str(REPO / "runs" / "demo" / "data"), work=str(REPO / "runs" / "compile_check"),
               out=results_file("compile_check"))
    parser.add_argument("--size", choices=list(SHAPES), default="base", help="model shape (tiny: the path on a CPU)")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="largest relative loss difference allowed")
    parser.add_argument("--mode", choices=["auto", "layers", "step"], default="auto",
                        help="train.compile of the compiled run (auto: what the gpu_base group runs)")
    parser.add_argument("--fused-qkv", action=argparse.BooleanOptionalAction, default=True,
                        help="train.fused_qkv in the compiled run (on in the gpu_base group)")
    parser.add_argument("--compiled-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more overrides for the compiled run only, e.g. train.vocab_loss_chunk=1024")
    add_shared(parser, set=[])  # both runs; the check's own settings (dropout, seed, logging) stay
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if args.steps < 1:
        return "--steps must be at least 1"
    if not args.tolerance > 0:
        return "--tolerance must be above 0"
    return ""


def main(argv: Optional[list[str]] = None) -> None:
    """Run every (backbone, objective); print a line each; exit 1 when any check fails."""
    args = parse_checked(build_parser(), check_args, argv)
    args.zero_stage, args.loader_workers = "auto", "auto"  # what point_overrides reads besides the shape
    rows = []
    for backbone in args.backbones:
        for objective in args.objectives:
            row = check(backbone, objective, args, Path(args.work))
            rows.append(row)
            mfu = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
            print(f"{backbone} {objective}: losses {'agree' if row['losses_agree'] else 'DIFFER'} (max relative "
                  f"difference {row['max_relative_loss_difference']:.2e} over {row['steps']} steps); export loads as "
                  f"{row['export_class']}; eager {row['eager_tokens_per_s']:,.0f} tokens/s MFU {mfu(row['eager_mfu'])}, "
                  f"compiled {row['compiled_tokens_per_s']:,.0f} tokens/s MFU {mfu(row['compiled_mfu'])}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    if not all(r["losses_agree"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
