"""Step efficiency: the trainer against a plain PyTorch loop of the same modules, and MFU against the measured peak.

    python -m benchmarks.step_efficiency                                   # every objective, both backbones, 512 / 4 layers
    python -m benchmarks.step_efficiency --shape base --objectives mlm     # BERT-base shape (768 / 12 layers)
    python -m benchmarks.step_efficiency --precision bf16                  # on a machine with AMX or a GPU

For each objective and backbone, at the same micro-batch (16 x 128 tokens, one process, `--threads` threads):
- trainer: `python -m pretrain train` (DeepSpeed ZeRO-2 engine, the objective's example config, real MDS shards
  of the KJV, masking in the loader, metrics, the preemption checks), timed by its own log windows after warm-up;
- plain: the same objective module, built from the same resolved config in this process, on one batch masked
  the same way, forward + backward + fused AdamW (+ autocast in bf16), gradients zeroed in place, no DeepSpeed and no loader; the median step.
`trainer / plain` is the ratio of samples/s: each trainer run against the plain run just before it, the
median over `--repeats` alternated pairs. MFU is the objective's model FLOPs (its `flops_per_token`) per second
over the dense-matmul peak measured for the precision on this machine (`pretrain/engine/hardware.py`).
TaCL is left out: it needs a teacher checkpoint of the same shape (its step is an MLM step plus a teacher forward).
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
import time
from pathlib import Path
from benchmarks.arguments import add_shared
from pretrain.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"mlm": "pretrain/configs/demo_mlm.yaml", "electra": "pretrain/configs/electra.yaml",
           "coco_lm": "pretrain/configs/coco_lm.yaml", "taco": "pretrain/configs/taco.yaml"}
BACKBONES = {"modernbert": "modernbert_small", "bert": "bert_small"}
SHAPES = {"512x4": dict(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
          "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)}


def prepare_data(work: Path) -> Path:
    """The KJV with an 8k sentencepiece tokenizer in 128-token sequences (as the demo)."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    return prepare(load_config(PrepareConfig, str(REPO / "data_pipeline/configs/demo.yaml"),
                               [f"output_dir={work / 'data'}", "val_fraction=0.02"]))


def overrides(objective: str, backbone: str, shape: str, data: Path, args) -> list[str]:
    """The run config's overrides shared by the trainer and the plain loop."""
    return [f"model={BACKBONES[backbone]}", *[f"model.{k}={v}" for k, v in SHAPES[shape].items()],
            "model.max_position_embeddings=128", f"data.path={data}", f"train.precision={args.precision}",
            f"train.micro_batch_size={args.batch}", f"train.global_batch_size={args.batch}"]


def run_trainer(objective: str, backbone: str, shape: str, data: Path, work: Path, args) -> dict:
    """Samples/s and MFU as the trainer logs them, averaged over the windows after the first."""
    out = work / f"run_{objective}_{backbone}_{shape}"
    steps = args.log_every * (args.windows + 1)
    cmd = [sys.executable, "-m", "pretrain", "train", "--config", CONFIGS[objective],
           *overrides(objective, backbone, shape, data, args), f"train.output_dir={out}", f"train.max_steps={steps}",
           f"train.log_every={args.log_every}", f"train.save_every={steps * 10}", "train.eval_every=0", "schedule.warmup_steps=2"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer failed for {objective}/{backbone}/{shape}:\n{proc.stderr[-3000:]}")
    rows = RunDir(out).metric_rows()
    windows = [r for r in rows if r["split"] == "train" and "samples_per_s" in r][1:]
    return {"samples_per_s": statistics.mean(r["samples_per_s"] for r in windows),
            "mfu": statistics.mean(r["mfu"] for r in windows) if all("mfu" in r for r in windows) else None}


def plain_setup(objective: str, backbone: str, shape: str, data: Path, args) -> dict:
    """The objective module built from the run config, one masked batch, and a `step()` of fwd + bwd + fused AdamW."""
    import torch

    from core.config_io import load_config
    from data_pipeline.masking import build_masking
    from data_pipeline.shards import read_manifest
    from model.encoder import model_config as build_model_config
    from model.objectives import build_objective
    from pretrain.config import RunConfig
    from pretrain.engine.hardware import device_peak_tflops, resolve_precision

    cfg = load_config(RunConfig, str(REPO / CONFIGS[objective]), overrides(objective, backbone, shape, data, args))
    precision, _ = resolve_precision(cfg.train.precision)
    tok = read_manifest(data)["tokenizer"]
    torch.manual_seed(0)
    model = build_objective(cfg.objective, build_model_config(cfg.model, tok, 128), cfg.model.init_from,
                            cfg.masking.mask_prob)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, tok["vocab_size"], (args.batch, 128), generator=gen)
    ids[:, 0], ids[:, -1] = tok["cls_id"], tok["sep_id"]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    batch = build_masking(cfg.masking, tok["vocab_size"], tok["mask_id"], tok["special_ids"], pad_id=tok["pad_id"],
                          cls_id=tok["cls_id"], sep_id=tok["sep_id"])(batch, gen)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss, _ = model(batch)
        loss.backward()
        opt.step()
        # Kept, not freed: fresh gradient tensors each step cost page faults on CPU (DeepSpeed keeps its buffers too).
        opt.zero_grad(set_to_none=False)

    return {"step": step, "flops": model.flops_per_token(128) * args.batch * 128,
            "peak": device_peak_tflops(precision)[0], "precision": precision, "params": sum(p.numel() for p in params)}


def run_plain(objective: str, backbone: str, shape: str, data: Path, args) -> dict:
    """Median step of forward + backward + fused AdamW of the same modules on one masked batch."""
    plain = plain_setup(objective, backbone, shape, data, args)
    times = []
    for i in range(args.plain_warmup + args.plain_steps):
        start = time.perf_counter()
        plain["step"]()
        if i >= args.plain_warmup:
            times.append(time.perf_counter() - start)
    step = statistics.median(times)
    return {"samples_per_s": args.batch / step, "mfu": plain["flops"] / step / 1e12 / plain["peak"],
            "precision": plain["precision"], "params": plain["params"]}


CATEGORIES = (  # first match wins; names are aten ops as the profiler reports them
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
    ("attention", ("scaled_dot_product", "flash_attention", "aten::_softmax", "aten::softmax")),
    ("optimizer", ("Optimizer.step", "aten::_fused_adamw", "_fused_adam")),
    ("embedding / gather", ("aten::embedding", "aten::index", "aten::gather", "aten::masked_select", "aten::nonzero")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax")),
    ("norm", ("layer_norm", "native_layer_norm")),
)


def profile_step(objective: str, backbone: str, shape: str, data: Path, args) -> dict:
    """Self CPU time of one plain step (after warm-up) by op category: matmuls, attention, optimizer, ..."""
    from torch.profiler import ProfilerActivity, profile

    plain = plain_setup(objective, backbone, shape, data, args)
    for _ in range(args.plain_warmup):
        plain["step"]()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        plain["step"]()
    shares: dict[str, float] = {}
    for e in prof.key_averages():
        category = next((c for c, keys in CATEGORIES if any(k in e.key for k in keys)), "element-wise and other")
        shares[category] = shares.get(category, 0.0) + e.self_cpu_time_total
    total = sum(shares.values())
    return {k: round(v / total, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def main() -> None:
    """Run every (objective, backbone) at the shape; print a table and write JSON."""
    parser = argparse.ArgumentParser()
    add_shared(parser, choices={"objectives": list(CONFIGS), "backbones": list(BACKBONES)}, objectives=list(CONFIGS),
               backbones=list(BACKBONES))
    parser.add_argument("--shape", default="512x4", choices=list(SHAPES))
    add_shared(parser, choices={"precision": ["auto", "fp32", "bf16"]}, precision="auto", batch=16, threads=2)
    parser.add_argument("--log-every", type=int, default=3, help="trainer steps per timing window")
    parser.add_argument("--windows", type=int, default=2, help="timed trainer windows after the first (warm-up)")
    parser.add_argument("--plain-warmup", type=int, default=2)
    parser.add_argument("--plain-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="alternate plain and trainer runs this many times; medians")
    parser.add_argument("--profile", action="store_true", help="also profile the plain step by op category")
    add_shared(parser, out=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import logging

    logging.disable(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench_step_"))
    rows = []
    try:
        data = prepare_data(work)
        combos = [(backbone, objective) for backbone in args.backbones for objective in args.objectives]
        plains, trainers = {c: [] for c in combos}, {c: [] for c in combos}
        # Repeats outermost, so each objective's runs sit between MLM's: this machine's speed drifts by
        # 10-20% within minutes, and ratios are taken within one repeat.
        for r in range(args.repeats):
            for combo in combos:
                backbone, objective = combo
                plains[combo].append(run_plain(objective, backbone, args.shape, data, args))
                trainers[combo].append(run_trainer(objective, backbone, args.shape, data, work / f"r{r}", args))
                print(json.dumps({"repeat": r, "objective": objective, "backbone": backbone,
                                  "plain": plains[combo][-1]["samples_per_s"],
                                  "trainer": trainers[combo][-1]["samples_per_s"]}), flush=True)
        for combo in combos:
            backbone, objective = combo
            ps, ts = plains[combo], trainers[combo]
            plain = {**ps[0], **{k: statistics.median(p[k] for p in ps) for k in ("samples_per_s", "mfu")}}
            trainer = {k: statistics.median(t[k] for t in ts) if ts[0][k] is not None else None
                       for k in ("samples_per_s", "mfu")}
            row = {"objective": objective, "backbone": backbone, "shape": args.shape, "precision": plain["precision"],
                   "trainable_params": plain["params"], "plain_samples_per_s": round(plain["samples_per_s"], 2),
                   "trainer_samples_per_s": round(trainer["samples_per_s"], 2),
                   # Paired: each trainer run against the plain run just before it, then the median.
                   "trainer_vs_plain": round(statistics.median(
                       t["samples_per_s"] / p["samples_per_s"] for p, t in zip(ps, ts)), 3),
                   "plain_mfu": round(plain["mfu"], 4),
                   "trainer_mfu": None if trainer["mfu"] is None else round(trainer["mfu"], 4),
                   "repeats": args.repeats,
                   "ratio_per_repeat": [round(t["samples_per_s"] / p["samples_per_s"], 3) for p, t in zip(ps, ts)]}
            mlm = trainers.get((backbone, "mlm"))
            if mlm and ts[0]["mfu"] and mlm[0]["mfu"]:
                # Within each repeat, then the median: the objective against the MLM run beside it.
                per = [t["mfu"] / m["mfu"] for t, m in zip(ts, mlm)]
                row["trainer_mfu_vs_mlm"] = round(statistics.median(per), 3)
                row["trainer_mfu_vs_mlm_per_repeat"] = [round(x, 3) for x in per]
            if args.profile:
                row["profile_self_cpu_share"] = profile_step(objective, backbone, args.shape, data, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nshape {args.shape} {SHAPES[args.shape]}, micro-batch {args.batch} x 128, {args.threads} threads, one process")
    print(f"{'objective':9} {'backbone':10} {'prec':5} {'plain/s':>8} {'trainer/s':>9} {'ratio':>6} {'MFU plain':>9} "
          f"{'MFU trainer':>11} {'vs MLM':>6}")
    for r in rows:
        print(f"{r['objective']:9} {r['backbone']:10} {r['precision']:5} {r['plain_samples_per_s']:>8} "
              f"{r['trainer_samples_per_s']:>9} {r['trainer_vs_plain']:>6} {r['plain_mfu']:>9.1%} "
              f"{(r['trainer_mfu'] or 0):>11.1%} {r.get('trainer_mfu_vs_mlm', ''):>6}")
    out = Path(args.out or REPO / "benchmarks" / "results" / f"step_efficiency_{args.shape}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "cpu_count": os.cpu_count(), "args": vars(args),
                               "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
