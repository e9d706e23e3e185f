"""What makes a small encoder learn fastest per second of 2-core CPU (the cramming method), measured with the real trainer.

    python -m data_pipeline prepare --config data_pipeline/configs/demo.yaml output_dir=runs/sweep/data
    python -m experiments.recipe_sweep --group mlm --budget-s 240          # MLM: backbone, positions, lr, schedule, ...
    python -m experiments.recipe_sweep --group rtd --budget-s 600          # ELECTRA / COCO-LM: generator size, λ, lr
    python -m experiments.recipe_sweep --group scratch --corpora runs/corpora --budget-s 600   # RESULTS.md (b)'s corpora
    python -m experiments.recipe_sweep --plot-only                          # redraw from benchmarks/results/

Each point is one `torchrun --nproc_per_node 2 -m pretrain train` run on the bundled KJV data. A
short timing probe (`train.stop_after`) measures seconds per step, then the run gets as many steps
as fit in `--budget-s` of training time, so every schedule decays inside the same wall clock.
Validation (every picked token shown as [MASK], data_pipeline.masking.evaluation_masking) runs
at 8 points; the trainer logs its `train_seconds`, the MLM loss below the validation tokens'
unigram entropy and, for the RTD objectives, the detection AUC and loss below the prior. Writes
experiments/results/recipe_sweep_<group>.json and docs/results/recipe_sweep_<group>.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional
from benchmarks.arguments import add_shared
from model.objectives import masking_overrides
from pretrain.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
# The sweep's baseline, spelled out so that it does not move with the demo config it chose.
BASE = ["--config", "pretrain/configs/demo_mlm.yaml", "model.architecture=bert", "model.position_embedding=absolute",
        "model.dropout=0.1", "model.attention_dropout=0.1", "masking.mask_prob=0.15", "optimizer.lr=1e-3",
        "train.micro_batch_size=16", "train.global_batch_size=32", "train.log_every=25", "train.save_every=100000",
        "train.keep_last=1", "train.eval_batches=8"]

# BERT's relative positions: the arms that use them ran on transformers 4.57 (RESULTS.md) and are refused on 5.x.
RELKQ = ["model.position_embedding=relative_key_query"]
NODROP = ["model.dropout=0", "model.attention_dropout=0"]
# The papers' settings (pretrain/configs/electra.yaml, coco_lm.yaml) on the demo config's shape.
MODERN = ["model.architecture=modernbert"] + NODROP
ELECTRA = ["objective.name=electra", "masking.count=exact",
           "masking.mask_token_fraction=0.85", "masking.random_token_fraction=0", "optimizer.betas=[0.9,0.999]"]
COCO = ["objective.name=coco_lm", *masking_overrides("coco_lm"), "masking.count=exact",
        "objective.coco_lm.generator_layers=1"]

# name -> overrides on top of BASE (hidden 128, 2 layers, batch 32, seq 128, lr 1e-3, dropout 0.1, 15% masking, linear decay).
GROUPS = {
    "mlm": {
        "bert-relkq": ["model.position_embedding=relative_key_query"],
        "modernbert": ["model.architecture=modernbert"],
        "bert-relkq-bf16": ["model.position_embedding=relative_key_query", "train.precision=bf16"],
        "bert-relkq-lr2e-3": ["model.position_embedding=relative_key_query", "optimizer.lr=2e-3"],
        "bert-relkq-256x4-bf16": ["model.position_embedding=relative_key_query", "train.precision=bf16",
                                  "model.hidden_size=256", "model.num_heads=4", "model.intermediate_size=1024",
                                  "model.num_layers=4"],
        "bert-relkq-wsd": ["model.position_embedding=relative_key_query", "schedule.decay=wsd"],
        "bert-relkq-mask30": ["model.position_embedding=relative_key_query", "masking.mask_prob=0.3"],
        "bert-relkq-batch64": ["model.position_embedding=relative_key_query", "train.global_batch_size=64",
                               "train.micro_batch_size=32", "optimizer.lr=2e-3"],
        "modernbert-lr2e-3": ["model.architecture=modernbert", "optimizer.lr=2e-3"],
        "bert-abs": [],
        # No dropout (as cramming): on this CPU dropout's random masks cost ~15% of the step.
        "bert-relkq-nodrop": RELKQ + NODROP,
        "bert-relkq-nodrop-mask30": RELKQ + NODROP + ["masking.mask_prob=0.3"],
        "modernbert-nodrop-mask30": ["model.architecture=modernbert"] + NODROP + ["masking.mask_prob=0.3"],
        "bert-relkq-nodrop-mask30-repeat": RELKQ + NODROP + ["masking.mask_prob=0.3"],
        "modernbert-nodrop-mask30-lr2e-3": ["model.architecture=modernbert"] + NODROP + ["masking.mask_prob=0.3",
                                                                                        "optimizer.lr=2e-3"],
        # The demo's recipe on absolute BERT (model/bert_small.yaml: what NSP/SOP run on since transformers 5).
        "bert-abs-nodrop-mask30-lr2e-3": NODROP + ["masking.mask_prob=0.3", "optimizer.lr=2e-3"],
        "bert-abs-nodrop": NODROP,
    },
    "rtd": {
        # On the MLM sweep's winning backbone (ModernBERT, no dropout), with each paper's masking and β2.
        "electra-modernbert": ELECTRA + MODERN,
        "coco-modernbert": COCO + MODERN,
        "electra-bert-relkq": ELECTRA + RELKQ,
        "electra-modernbert-uniform": ELECTRA + MODERN + ["objective.electra.generator=uniform"],
        # The MLM sweep's learning rate.
        "coco-modernbert-lr2e-3": COCO + MODERN + ["optimizer.lr=2e-3"],
        "electra-modernbert-g1/2-lr2e-3": ELECTRA + MODERN + ["optimizer.lr=2e-3", "objective.electra.generator_width=0.5"],
        # COCO-LM with a narrower (weaker) generator: its full-width one is the strongest corrupter here.
        "coco-modernbert-g1/2": COCO + MODERN + ["objective.coco_lm.generator_width=0.5"],
        "coco-modernbert-g1/4": COCO + MODERN + ["objective.coco_lm.generator_width=0.25"],
        # The same with the longer budget the issue allows (run with --budget-s 900).
        "coco-modernbert-g1/4-900s": COCO + MODERN + ["objective.coco_lm.generator_width=0.25"],
    },
    # Issue 14's last check, on RESULTS.md (b)'s corpora (--corpora): each objective with the settings the two
    # groups above picked, given 600 s (COCO-LM 900 s: run it with --budget-s 900 --only coco-lm-g1/4).
    "scratch": {
        "mlm": MODERN + ["masking.mask_prob=0.3", "optimizer.lr=2e-3"],
        "electra-g1/4": ELECTRA + MODERN,
        "coco-lm-g1/4": COCO + MODERN + ["objective.coco_lm.generator_width=0.25"],
        "taco": MODERN + ["objective.name=taco"],
    },
}


def run_dir(out: Path, group: str, name: str) -> Path:
    return out / group / name.replace("/", "_")


def torchrun(args: list[str], log: Path) -> None:
    """One 2-rank training command, its output appended to `log`; a failure stops the sweep."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "pretrain", "train", *args]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as fh:
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=fh, stderr=subprocess.STDOUT)


def rows(path: Path, split: str) -> list[dict]:
    return RunDir(path).metric_rows(split)


def seconds_per_step(data: Path, out: Path, overrides: list[str], probe_steps: int) -> float:
    """Median training seconds per step over a short probe run (after its first logged interval)."""
    shutil.rmtree(out, ignore_errors=True)
    torchrun([*BASE, f"data.path={data}", f"train.output_dir={out}", *overrides, "train.max_steps=100000",
              f"train.stop_after={probe_steps}", "train.log_every=10", "train.eval_every=0"], out.with_suffix(".log"))
    import yaml

    batch = yaml.safe_load(RunDir(out).config.read_text())["train"]["global_batch_size"]
    per_step = sorted(batch / r["samples_per_s"] for r in rows(out, "train")[10:] if r.get("samples_per_s"))
    shutil.rmtree(out, ignore_errors=True)
    return per_step[len(per_step) // 2]


def sweep(group: str, data: Path, out: Path, budget_s: float, probe_steps: int, only: list[str]) -> dict:
    """Run (or reuse) every configuration of the group and collect its validation curve."""
    results_path = REPO / "experiments" / "results" / f"recipe_sweep_{group}.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, overrides in GROUPS[group].items():
        if only and name not in only:
            continue
        target = run_dir(out, group, name)
        if name in results and results[name].get("budget_s") == budget_s:
            print(f"{name}: done", flush=True)
            continue
        sps = seconds_per_step(data, target, overrides, probe_steps)
        steps = max(50, int(budget_s / sps))
        eval_every = max(10, steps // 8)
        print(f"{name}: {sps:.3f} s/step -> {steps} steps", flush=True)
        start = time.time()
        torchrun([*BASE, f"data.path={data}", f"train.output_dir={target}", *overrides, f"train.max_steps={steps}",
                  f"train.eval_every={eval_every}", f"schedule.warmup_steps={max(10, steps // 16)}"], target.with_suffix(".log"))
        curve = rows(target, "validation")
        results[name] = {"overrides": overrides, "budget_s": budget_s, "seconds_per_step": sps, "steps": steps,
                         "wall_s": time.time() - start, "curve": curve, "final": curve[-1]}
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1))
        shutil.rmtree(RunDir(target).checkpoints, ignore_errors=True)  # the curve is what the sweep keeps
        final = curve[-1]
        print(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items() if isinstance(v, float)), flush=True)
    return results


def _curve(ax, results: dict, key: str, exclude_generator: bool = True) -> Optional[float]:
    """One line per configuration that logged a validation field ending in `key`; returns the unigram entropy seen."""
    unigram = None
    for index, (name, res) in enumerate(results.items()):
        curve = res["curve"]
        field = next((k for k in curve[-1] if k.endswith(key) and not (exclude_generator and k.startswith("generator"))), None)
        if field is None:
            continue
        # One colour per configuration in every panel.
        ax.plot([r["train_seconds"] for r in curve], [r[field] for r in curve], marker="o", ms=3, color=f"C{index % 10}",
                label=f"{name} ({field})", ls="--" if field.startswith("scl") else "-")
        unigram = curve[-1].get("unigram_entropy", unigram)
    return unigram


def plot(group: str, results: dict) -> Path:
    """Validation MLM loss (or detection AUC) against training seconds, one line per configuration.

    The scratch group mixes objectives: MLM losses on the left (main models, and ELECTRA's / COCO-LM's
    generators), detection AUC and retrieval accuracy on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if group == "scratch":
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
        unigram = _curve(ax, results, "mlm_loss", exclude_generator=False)
        for key in ("auc", "retrieval_accuracy"):
            _curve(bx, results, key)
        bx.set_ylabel("validation ROC-AUC / retrieval accuracy")
        bx.set_xlabel("training seconds (2 ranks, 2 cores)")
        bx.legend(fontsize=7)
        bx.grid(alpha=0.3)
        key = "mlm_loss"
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        key = "mlm_loss" if group == "mlm" else "auc"
        unigram = _curve(ax, results, key)
    if key == "mlm_loss" and unigram:
        ax.axhline(unigram, color="grey", ls="--", label=f"unigram entropy {unigram:.2f}")
        ax.axhline(unigram - 1.5, color="grey", ls=":", label="1.5 nats below unigram")
    ax.set_xlabel("training seconds (2 ranks, 2 cores)")
    ax.set_ylabel("validation " + ("MLM loss (all picked tokens [MASK]), nats" if key == "mlm_loss" else "ROC-AUC"))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    from core.atomic_files import save_figure_atomic

    path = REPO / "docs" / "results" / f"recipe_sweep_{group}.png"
    save_figure_atomic(fig, path)
    plt.close(fig)
    return path


def main() -> None:
    """Sweep one group, print its table and draw its plot."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", choices=sorted(GROUPS), default="mlm")
    add_shared(parser, data="runs/sweep/data")
    parser.add_argument("--corpora", default=None,
                        help="output of benchmarks/corpora.py: train on RESULTS.md (b)'s shards (prepared once) instead of --data")
    add_shared(parser, out="runs/sweep")
    parser.add_argument("--budget-s", type=float, default=240.0, help="training seconds per configuration")
    parser.add_argument("--probe-steps", type=int, default=40)
    parser.add_argument("--only", nargs="*", default=[], help="run only these configurations")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.plot_only:
        results = json.loads((REPO / "experiments" / "results" / f"recipe_sweep_{args.group}.json").read_text())
    else:
        data = Path(args.data)
        if args.corpora:
            from benchmarks.repro_common import scratch_data

            data = scratch_data(Path(args.corpora).resolve(), Path(args.out).resolve() / "scratch_data")
        results = sweep(args.group, data, Path(args.out), args.budget_s, args.probe_steps, args.only)
    print("\n| configuration | s/step | steps | final validation |\n|---|---|---|---|")
    for name, res in results.items():
        final = res["final"]
        shown = {k: v for k, v in final.items() if k.endswith(("mlm_loss", "below_unigram", "_auc", "below_prior", "accuracy"))}
        print(f"| {name} | {res['seconds_per_step']:.3f} | {res['steps']} | "
              + ", ".join(f"{k} {v:.3f}" for k, v in shown.items()) + " |")
    print(plot(args.group, results))


if __name__ == "__main__":
    main()
