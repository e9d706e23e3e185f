"""BERT-base and ModernBERT-base training throughput and MFU per GPU: MLM, COCO-LM and TaCL, seq 128 and 512, against
a bare PyTorch loop of the same model, over a micro-batch sweep, with and without torch.compile, and the GPU's idle
fraction from a profiler trace.

    python -m benchmarks.corpora --out runs/corpora
    python -m benchmarks.gpu_throughput                       # on a GPU machine (one process, one GPU): micro-batches 64 and 256 at seq 128, 16 and 64 at 512
    python -m benchmarks.gpu_throughput --batches-128 32 64 128 --batches-512 8 16 32 --compile off on --profile
    python -m benchmarks.gpu_throughput --seqs 128 --batches-128 256 --compile on --set train.fused_qkv=true
    python -m benchmarks.gpu_throughput --tiny --steps 20 --warmup 5 --batches-128 8 --batches-512 2   # the path on a CPU

Each point is a real `python -m pretrain train` run (torchrun, one rank, `train.zero_stage=auto`, so stage 0 on one
GPU; bf16) of a base-shaped model (hidden 768, 12 layers, 12 heads; BERT's FFN 3072, ModernBERT's GeGLU 1152 so the
parameters are close; BERT's 30,522-token WordPiece vocabulary) on real packed shards (WordNet glosses + KJV, MiniLM's
WordPiece tokenizer): the loader, masking in its workers and the engine are all in the timing. tokens/s and MFU are the
trainer's own logged values (MFU = the objective's `flops_per_token` x tokens/s / the GPU's dense bf16 peak,
model/flops.py), the median over logged intervals after `--warmup` steps. TaCL's teacher is the masked LM of the MLM
point (the backbone's family, shape and dropout) with fresh weights; COCO-LM's generator has 4 layers (the paper's
base setting).

`bare` is the same transformers masked LM in a plain loop (benchmarks/host_overhead.py: the encoder, the MLM head at
the masked positions, cross-entropy, backward, clipping, fused AdamW, autocast bf16), the same shape and batch, on
random tokens: the yardstick of what the kernels cost. `bare compiled` is that loop with its forward, head and loss
compiled as one graph (`host_overhead.py --plain-compile`: the masked positions gathered to a fixed count per row,
masking `count=exact`, as the trainer's points use): the yardstick of what one compiled step gets from the same modules. `--profile` runs each trainer point once more in this process
under torch.profiler for `--profile-steps` steps after the warm-up: the idle fraction is the share of that wall time
in which no GPU kernel ran, and the host's waits for the device inside an op are counted per step
(benchmarks/host_waits.py, which also reads the trace written beside the results). Writes
benchmarks/results/gpu_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from benchmarks import host_waits, kernel_profile
from benchmarks.arguments import add_shared, parse_checked, results_file
from benchmarks.host_overhead import fits_one_epoch
from benchmarks.machine import machine
from core.atomic_files import write_text_atomic
from benchmarks.repro_common import REPO, minilm_dir, prepare, run, setup_logging
from data_pipeline.dataset_dir import DatasetDir
from pretrain.run_dir import RunDir

SHAPES = {"base": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072},
          "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 256}}
MODERNBERT_FFN = {"base": 1152, "tiny": 256}  # base: ModernBERT's GeGLU at BERT-base's parameter count
BACKBONES = {"bert": ["model.architecture=bert", "model.position_embedding=absolute"],
             "modernbert": ["model.architecture=modernbert"]}
# The papers' 15% (the demo config's recipe masks 30%), exactly round(0.15 · n) per row as google-research/bert and
# COCO-LM pick them and as the bare loop does: every row then fills its prediction slots, none padded.
EXACT_15 = ["masking.mask_prob=0.15", "masking.count=exact"]
OBJECTIVES = {"mlm": ["objective.name=mlm", "masking.strategy=bert", *EXACT_15],
              "coco_lm": ["objective.name=coco_lm", "masking.strategy=coco", "masking.crop_ratio=0.9", *EXACT_15],
              "tacl": ["objective.name=tacl", "masking.strategy=bert", *EXACT_15]}


def teacher_folder(backbone: str, seq: int, args: argparse.Namespace, data: Path, out: Path,
                   extra: Sequence[str] = ()) -> Path:
    """TaCL's teacher: the masked LM this backbone's MLM point trains (its family, shape, dropout and vocabulary, the
    run-config overrides and `extra` included), fresh weights, as a transformers folder with the data's tokenizer.
    The folder decides the student's model, so a teacher of another family or dropout would measure another model."""
    import torch
    from transformers import AutoTokenizer

    from core.config_io import load_config
    from data_pipeline.shards import read_manifest
    from model.backbones import backbone_for
    from model.encoder import model_config
    from pretrain.config import RunConfig

    point = {"objective": "mlm", "backbone": backbone, "seq": seq, "batch": 1, "compile": False}
    cfg = load_config(RunConfig, REPO / "pretrain" / "configs" / "demo_mlm.yaml",
                      [*point_overrides(point, args, data, None, out / "unused"), *extra])
    manifest = read_manifest(data)
    config = model_config(cfg.model, manifest["tokenizer"], manifest["seq_len"])
    torch.manual_seed(0)
    shutil.rmtree(out, ignore_errors=True)  # rebuilt each time: the overrides it follows may have changed
    backbone_for(config).masked_lm(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(DatasetDir(data).tokenizer).save_pretrained(out)
    return out


def measure(rows: list[dict], warmup: int) -> dict:
    """Median tokens/s, MFU and peak memory over the logged training intervals after warm-up."""
    train = [r for r in rows if r.get("split") == "train" and r["step"] > warmup and "tokens_per_s" in r]
    if not train:
        raise SystemExit("no training interval after the warm-up was logged: raise --steps or lower --warmup")
    out = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in train),
           "samples_per_s": statistics.median(r["samples_per_s"] for r in train),
           "model_tflops_per_device": statistics.median(r["model_tflops_per_device"] for r in train),
           "peak_memory_gib": max(r.get("peak_memory_gib", 0.0) for r in train), "intervals": len(train)}
    mfu = [r["mfu"] for r in train if "mfu" in r]
    out["mfu"] = statistics.median(mfu) if mfu else None
    return out


def point_overrides(point: dict, args: argparse.Namespace, data: Path, teacher: Optional[Path],
                    run_dir: Path) -> list[str]:
    """The run config of one (objective, backbone, seq, batch, compile) point."""
    shape = dict(SHAPES[args.size])
    if point["backbone"] == "modernbert":
        shape["intermediate_size"] = MODERNBERT_FFN[args.size]
    overrides = [*BACKBONES[point["backbone"]], *[f"model.{k}={v}" for k, v in shape.items()], *OBJECTIVES[point["objective"]],
                 f"data.path={data}", f"model.max_position_embeddings={max(512, point['seq'])}", f"train.output_dir={run_dir}",
                 f"train.max_steps={args.steps}", f"train.micro_batch_size={point['batch']}",
                 f"train.global_batch_size={point['batch']}", f"train.precision={args.precision}", "train.log_every=5",
                 f"train.save_every={args.steps * 10}", "train.resume=never", "train.eval_every=0",
                 "schedule.warmup_steps=10", "optimizer.lr=1e-4", f"train.zero_stage={args.zero_stage}",
                 f"train.compile={str(point['compile']).lower()}", f"data.num_workers={args.loader_workers}",
                 *getattr(args, "set", ())]  # compile_check builds its points here too
    if point["objective"] == "tacl":
        overrides.append(f"model.init_from={teacher}")
    if point["objective"] == "coco_lm":
        overrides.append(f"objective.coco_lm.generator_layers={1 if args.size == 'tiny' else 4}")
    return overrides


def bare_loop(point: dict, args: argparse.Namespace, data: Path, compiled: bool = False) -> dict:
    """tokens/s of the bare transformers loop at this point (MLM only), in a fresh process; `compiled`: forward, head
    and loss as one torch.compile graph, a fixed masked count per row."""
    cmd = [sys.executable, "-m", "benchmarks.host_overhead", *(["--plain-compile"] if compiled else []),
           "--worker", "plain", "--case",
           json.dumps({"backbone": point["backbone"], "stage": "0", "precision": args.precision}),
           "--shape", args.size, "--batch", str(point["batch"]), "--seq", str(point["seq"]),
           "--steps", str(args.steps), "--window", "5", "--data", str(data), "--device", args.device,
           # torchrun gives the trainer one thread per rank; on a CPU the bare loop gets the same.
           "--threads", "1" if args.device == "cpu" else "0",
           *(["--kernel-steps", str(args.profile_steps)] if args.profile and compiled else [])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed: {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": result["samples_per_s"] * point["seq"], "kernels": result.get("kernels")}


def trace_path(out: Path, point: dict) -> Path:
    """Where a profiled point's trace goes: beside the results file and named after it too, since the GPU queue's
    entries share one folder and several of them profile the same point."""
    return out.parent / f"{out.stem}_trace_{point['objective']}_{point['backbone']}_{point['seq']}_b{point['batch']}.json"


def profile_worker(point: dict, args: argparse.Namespace, data: Path, teacher: Optional[Path]) -> dict:
    """One trainer run in this process with torch.profiler over `--profile-steps` steps after the warm-up: the share
    of that wall time with no GPU kernel running (None on a CPU), and the device time per step of each kernel."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from pretrain.cli import main
    from pretrain.trainer import Trainer

    if args.host_wait_each_step:
        from benchmarks.waiting_trainer import wait_each_step

        wait_each_step()
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    span: dict[str, float] = {}
    original = Trainer.train_step

    def train_step(self):
        if self.step == args.warmup:
            prof.start()
            span["start"] = time.perf_counter()
        result = original(self)
        if self.step == args.warmup + args.profile_steps:
            if cuda:
                torch.cuda.synchronize()
            span["end"] = time.perf_counter()
            prof.stop()
        return result

    Trainer.train_step = train_step
    with tempfile.TemporaryDirectory(prefix="gpu_profile_") as work:
        # The run ends with the profile: the steps after it measure nothing here (the later override wins).
        overrides = [*point_overrides(point, args, data, teacher, Path(work) / "run"),
                     f"train.max_steps={args.warmup + args.profile_steps}"]
        if main(["train", "--config", "pretrain/configs/demo_mlm.yaml", *overrides]) != 0:
            raise RuntimeError("the profiled trainer run failed")
    if "end" not in span:
        return {"idle_fraction": None}
    kernels = kernel_profile.kernel_times(prof, args.profile_steps)
    trace = trace_path(Path(args.out), point)
    prof.export_chrome_trace(str(trace))
    # Where the host waited for the device in the profiled steps (none on a CPU, which has no queue to wait for).
    waited = host_waits.summary(host_waits.read_events(trace), args.profile_steps)
    if not cuda:
        return {"idle_fraction": None, "kernels": kernels, "trace": str(trace), "host_waits": waited}
    busy = kernel_profile.gpu_busy_us(prof)
    wall_us = 1e6 * (span["end"] - span["start"])
    return {"idle_fraction": max(0.0, 1.0 - busy / wall_us), "profiled_steps": args.profile_steps, "trace": str(trace),
            "kernels": kernels, "host_waits": waited}


def ensure_data(seq: int, corpora: Path, work: Path) -> Path:
    """The prepared dataset of `seq` tokens a row under `work`, prepared from `corpora` when missing. Shards
    prepared here travel to a GPU machine, which lacks the MiniLM package the tokenizer comes from."""
    data = work / f"data{seq}"
    if not DatasetDir(data).is_complete():
        prepare({"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                              "text_documents": "paragraph"}],
                 "tokenizer": {"pretrained": str(minilm_dir())}, "seq_len": seq, "packing": "full",
                 "val_fraction": 0.01}, data)
    return data


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, choices={"objectives": list(OBJECTIVES), "backbones": list(BACKBONES)}, corpora="runs/corpora",
               work="runs/bench_gpu", objectives=list(OBJECTIVES), backbones=list(BACKBONES))
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    # 64 / 16: the points measured before issue 28; 256 / 64: where BERT-base fills an H100 or H200 (BENCHMARKS.md).
    parser.add_argument("--batches-128", type=int, nargs="+", default=[64, 256], help="micro-batches per GPU at seq 128 (a sweep)")
    parser.add_argument("--batches-512", type=int, nargs="+", default=[16, 64], help="micro-batches per GPU at seq 512")
    parser.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"], help="train.compile values to run")
    parser.add_argument("--zero-stage", default="auto")
    add_shared(parser, set=[])  # every trainer point
    add_shared(parser, choices={"precision": ["bf16", "fp16", "fp32"]}, loader_workers="auto", steps=60, warmup=20,
               precision="bf16")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare loop (MLM points)")
    parser.add_argument("--profile", action="store_true", help="also profile each point: the GPU's idle fraction, and the device time by kernel "
                             "kind of the trainer against the compiled bare loop")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model (checks the path on a CPU)")
    parser.add_argument("--host-wait-each-step", action="store_true",
                        help="the trainer as before c94c865: the host waits for the device at the end of every step "
                             "(benchmarks/waiting_trainer.py), the other side of what removing that wait gained")
    add_shared(parser, out=results_file("gpu_throughput"))
    parser.add_argument("--worker", choices=["profile"], help=argparse.SUPPRESS)
    parser.add_argument("--point", help=argparse.SUPPRESS)
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if not 0 <= args.warmup < args.steps:
        return "--warmup must be below --steps (a point is timed after its warm-up)"
    return ""


def main() -> None:
    """Run every point and print the table."""
    args = parse_checked(build_parser(), check_args)
    args.size = "tiny" if args.tiny else "base"
    import torch

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    setup_logging()
    corpora, work = Path(args.corpora).resolve(), Path(args.work).resolve()
    if args.worker:
        point = json.loads(args.point)
        result = profile_worker(point, args, Path(point["data"]), point["teacher"] and Path(point["teacher"]))
        print(json.dumps(result), flush=True)
        os._exit(0)
    info = run_info(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results = []
    datasets = {seq: work / f"data{seq}" for seq in args.seqs}
    for seq, data in datasets.items():  # every point's data checked before the first point spends device time
        ensure_data(seq, corpora, work)
        for batch in (args.batches_128 if seq <= 128 else args.batches_512):
            fits_one_epoch(data, batch, args.steps)
    for seq, data in datasets.items():
        for backbone in args.backbones:
            teacher = teacher_folder(backbone, seq, args, data, work / f"teacher_{backbone}_{args.size}_{seq}") \
                if "tacl" in args.objectives else None
            for batch in (args.batches_128 if seq <= 128 else args.batches_512):
                for name in args.objectives:
                    for compiled in args.compile:
                        point = {"objective": name, "backbone": backbone, "seq": seq, "batch": batch, "compile": compiled == "on"}
                        results.append(run_point(point, args, data, teacher, work))
                        # Written after every point: a run cut short (a lease, a time limit) keeps what it measured.
                        write_text_atomic(Path(args.out), json.dumps({**info, "rows": results}, indent=2) + "\n")
    print_table(results, info, args)


def run_point(point: dict, args: argparse.Namespace, data: Path, teacher: Optional[Path], work: Path) -> dict:
    """One trainer run at `point`, with the bare loop beside an MLM point and the profile if asked."""
    from pretrain.engine.setup import compiled_in_log  # not at the top: it imports transformers, 4-5 s here

    run_dir = work / f"{point['objective']}_{point['backbone']}_seq{point['seq']}_b{point['batch']}_" \
                     f"{'on' if point['compile'] else 'off'}_{args.size}"
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = "benchmarks.waiting_trainer" if args.host_wait_each_step else "pretrain"
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
         trainer, "train", "--config", "pretrain/configs/demo_mlm.yaml",
         *point_overrides(point, args, data, teacher, run_dir)])
    row = {**point, **measure(RunDir(run_dir).metric_rows(), args.warmup),
           "compiled": compiled_in_log(RunDir(run_dir).text_log.read_text(encoding="utf-8")),
           "host_wait_each_step": args.host_wait_each_step}
    if point["objective"] == "mlm" and not args.no_bare:
        # The eager yardstick beside an eager point, the compiled one (one graph per step) beside every point.
        if not point["compile"]:
            row["bare_tokens_per_s"] = bare_loop(point, args, data)["tokens_per_s"]
            row["vs_bare"] = row["tokens_per_s"] / row["bare_tokens_per_s"]
        compiled_bare = bare_loop(point, args, data, compiled=True)
        row["bare_compiled_tokens_per_s"] = compiled_bare["tokens_per_s"]
        row["vs_bare_compiled"] = row["tokens_per_s"] / row["bare_compiled_tokens_per_s"]
        if compiled_bare["kernels"]:
            row["bare_compiled_kernels"] = kernel_summary(compiled_bare["kernels"])
    if args.profile:
        cmd = [sys.executable, "-m", "benchmarks.gpu_throughput", *sys.argv[1:], "--worker", "profile",
               "--point", json.dumps({**point, "data": str(data), "teacher": teacher and str(teacher)})]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"profile failed: {proc.stderr[-3000:]}")
        profiled = json.loads(proc.stdout.strip().splitlines()[-1])
        if profiled.get("kernels"):
            profiled["kernels"] = kernel_summary(profiled["kernels"])
        row.update(profiled)
    return row


def kernel_summary(times: dict[str, float]) -> dict:
    """A profile's ms per step by kernel kind, and its longest kernels (the whole list would swamp the results)."""
    return {"by_kind": kernel_profile.by_kind(times), "top": kernel_profile.top_kernels(times, 25)}


def run_info(args: argparse.Namespace) -> dict:
    """The device, versions, commit and arguments every result row was measured with."""
    info = machine()  # the same record as host_overhead.py's
    return {"device": info["gpu"] or f"CPU ({info['cores']} cores)", "machine": platform.platform(), **info,
            "args": {k: v for k, v in vars(args).items() if k not in ("worker", "point")}}


def print_table(results: list[dict], info: dict, args: argparse.Namespace) -> None:
    """The results as a markdown table."""
    print(f"\n{info['device']}; {args.size}, {args.precision}, train.zero_stage={args.zero_stage}, 1 rank, "
          f"steps {args.warmup}..{args.steps}"
          + ("; the host waiting for the device once a step (--host-wait-each-step)" if args.host_wait_each_step else ""))
    print("| objective | backbone | seq | micro-batch | compile | tokens/s/GPU | MFU | vs bare loop | vs compiled bare loop "
          "| GPU idle | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        bare = f"{r['vs_bare']:.2f}" if "vs_bare" in r else ""
        compiled = f"{r['vs_bare_compiled']:.2f}" if "vs_bare_compiled" in r else ""
        idle = f"{100 * r['idle_fraction']:.1f}%" if r.get("idle_fraction") is not None else ""
        print(f"| {r['objective']} | {r['backbone']} | {r['seq']} | {r['batch']} | {'on' if r['compile'] else 'off'} | "
              f"{r['tokens_per_s']:,.0f} | {mfu} | {bare} | {compiled} | {idle} | {r['peak_memory_gib']:.1f} |")
    for r in results:
        waited = r.get("host_waits")
        if waited:
            where = "; ".join(f"{w['count']} in {w['ops']}" for w in waited["in"])
            print(f"\n{r['objective']} {r['backbone']} seq {r['seq']} x {r['batch']}: the host waited for the device "
                  f"{waited['per_step']:.1f} time(s) a step inside an op, {waited['ms_per_step']:.2f} ms"
                  + (f" ({where}; python -m benchmarks.host_waits {r['trace']} says after what)" if where else ""))
    for r in results:
        if r.get("kernels") and r.get("bare_compiled_kernels"):
            print(f"\n{r['objective']} {r['backbone']} seq {r['seq']} x {r['batch']}, compile {'on' if r['compile'] else 'off'}: "
                  f"device time per step by kernel kind, the trainer against the compiled bare loop")
            print(kernel_profile.kind_table({"trainer": r["kernels"]["by_kind"],
                                             "compiled bare": r["bare_compiled_kernels"]["by_kind"]}))


if __name__ == "__main__":
    main()
