"""RESULTS.md (b): MLM vs ELECTRA vs COCO-LM vs TACO from scratch, same small model and token budget.

    python -m benchmarks.corpora --out runs/corpora
    python -m benchmarks.reproduce_from_scratch --corpora runs/corpora --out runs/results/scratch

1. Shards of WordNet 3.0 glosses + the KJV with an 8k unigram sentencepiece vocabulary trained here.
2. For each objective and pre-training seed, a 2-rank ZeRO-2 run of the same main model (the demo's
   BERT: hidden 128, 2 layers, FFN 512), the same data order, batch, steps (so the same tokens), lr
   and schedule; a checkpoint every `--eval-every` steps and the trainer's validation losses there.
3. Every checkpoint is exported and fine-tuned on BBC news topics (5 classes; the same fixed
   train/eval split for all) with several fine-tuning seeds; a randomly initialised model of the same
   shape is the step-0 point.

Writes `OUT/results.json` and `OUT/downstream_vs_steps.png`, and prints the tables RESULTS.md quotes,
including at which fraction of the MLM baseline's steps each objective first reaches its final accuracy.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.arguments import add_shared
from benchmarks.repro_common import (
    export,
    finetune_cached,
    fresh_bert,
    log,
    mean_std,
    scratch_data,
    setup_logging,
    split_csv,
    train,
    validation_losses,
    write_json,
)

CONFIGS = {"MLM": "pretrain/configs/demo_mlm.yaml", "ELECTRA": "pretrain/configs/electra.yaml",
           "COCO-LM": "pretrain/configs/coco_lm.yaml", "TACO": "pretrain/configs/taco.yaml"}
# The validation loss each objective reports that is an MLM loss: the main model's own for MLM and
# TACO; ELECTRA's and COCO-LM's main models have no MLM head, so their generator's.
MLM_KEY = {"MLM": "mlm_loss", "ELECTRA": "generator_mlm_loss", "COCO-LM": "generator_mlm_loss", "TACO": "mlm_loss"}


def random_init(like: Path, out: Path, seed: int) -> Path:
    """A randomly initialised BertModel shaped like the export `like`, with its tokenizer (the step-0 point)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(like)
    config.architectures = ["BertModel"]
    return fresh_bert(config, like, out, seed)


def plot(curves: dict, losses: dict, baseline: tuple[float, float], path: Path) -> None:
    """Downstream accuracy (mean ± std over every seed) and validation MLM loss against pre-training steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from core.atomic_files import save_figure_atomic

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for name, points in curves.items():
        steps = [0, *sorted(points)]
        means = [baseline[0], *(points[s][0] for s in sorted(points))]
        stds = [baseline[1], *(points[s][1] for s in sorted(points))]
        ax.errorbar(steps, means, yerr=stds, marker="o", capsize=3, label=name)
    ax.set_xlabel("pre-training steps (global batch 32 × 128 tokens)")
    ax.set_ylabel("BBC news topic accuracy")
    ax.set_title("Downstream accuracy (step 0: random init)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for name, points in losses.items():
        if points:
            bx.plot(sorted(points), [points[s] for s in sorted(points)], marker="o",
                    label=f"{name} ({MLM_KEY[name].replace('_', ' ')})")
    bx.set_xlabel("pre-training steps")
    bx.set_ylabel("validation MLM loss")
    bx.set_title("Validation MLM loss (ELECTRA, COCO-LM: generator)")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    save_figure_atomic(fig, path)
    plt.close(fig)


def main() -> None:
    """Run (or resume) every pre-training and fine-tuning, then print and plot the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, choices={"objectives": list(CONFIGS)}, corpora="runs/corpora", out="runs/results/scratch",
               objectives=list(CONFIGS), steps=1000)
    parser.add_argument("--eval-every", type=int, default=250)
    add_shared(parser, lr=1e-3)
    parser.add_argument("--pretrain-seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--ft-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ft-train", type=int, default=1200)
    parser.add_argument("--ft-eval", type=int, default=600)
    parser.add_argument("--ft-epochs", type=float, default=4.0)
    parser.add_argument("--ft-lr", type=float, default=3e-4)
    args = parser.parse_args()
    setup_logging()
    if args.eval_every < 1 or args.steps % args.eval_every:
        parser.error(f"--steps {args.steps} must be a multiple of --eval-every {args.eval_every}")
    corpora, out = Path(args.corpora).resolve(), Path(args.out).resolve()

    data = scratch_data(corpora, out / "data")
    checkpoints = list(range(args.eval_every, args.steps + 1, args.eval_every))
    train_csv, eval_csv = split_csv(corpora / "bbc_news.csv", out / "bbc", args.ft_train, args.ft_eval)
    ft_kwargs = {"recipe_name": "taco", "overrides": {"lr": args.ft_lr, "epochs": args.ft_epochs, "max_length": 128},
                 "validation_file": str(eval_csv)}

    # Pre-train everything first, then fine-tune: an interrupted reproduction resumes each part.
    run_dirs = {}
    for seed in args.pretrain_seeds:
        for name in args.objectives:
            run_dirs[name, seed] = train(CONFIGS[name], [f"data.path={data}", f"optimizer.lr={args.lr}", f"train.seed={seed}",
                                                        f"train.save_every={args.eval_every}",
                                                        f"train.eval_every={args.eval_every}", "train.eval_batches=8",
                                                        # every grid checkpoint is exported, and a preemption
                                                        # save must not push the first one out
                                                        "train.keep_last=1000", "schedule.warmup_steps=60"],
                                         out / f"train_{name.lower()}_seed{seed}", args.steps)

    accuracy: dict = {}  # (objective, pre-training seed, step) -> [accuracy per fine-tuning seed]
    for (name, seed), run_dir in run_dirs.items():
        for step in checkpoints:
            model = export(run_dir, step, out / "exports" / f"{name.lower()}_seed{seed}_step{step}")
            result = finetune_cached(model, train_csv, args.ft_seeds,
                                     out / "finetune" / f"{name.lower()}_seed{seed}_step{step}.json", **ft_kwargs)
            accuracy[name, seed, step] = [r["metrics"]["accuracy"] for r in result["seeds"]]
    # The step-0 point: a BERT-shaped export (ELECTRA's is an ElectraConfig) with fresh weights.
    like = next((n for n in args.objectives if n != "ELECTRA"), None)
    baseline_acc, majority = [], None
    for seed in args.pretrain_seeds if like else []:
        rand = random_init(out / "exports" / f"{like.lower()}_seed{args.pretrain_seeds[0]}_step{checkpoints[0]}",
                           out / "exports" / f"random_init_seed{seed}", seed)
        result = finetune_cached(rand, train_csv, args.ft_seeds, out / "finetune" / f"random_init_seed{seed}.json", **ft_kwargs)
        baseline_acc += [r["metrics"]["accuracy"] for r in result["seeds"]]
        majority = result["majority_baseline"]

    curves, losses, rows = {}, {}, []
    for name in args.objectives:
        curves[name] = {s: mean_std([a for seed in args.pretrain_seeds for a in accuracy[name, seed, s]]) for s in checkpoints}
        per_seed_losses = [validation_losses(run_dirs[name, seed]) for seed in args.pretrain_seeds]
        losses[name] = {s: statistics.fmean(v[s][MLM_KEY[name]] for v in per_seed_losses)
                        for s in checkpoints if all(s in v and MLM_KEY[name] in v[s] for v in per_seed_losses)}
        for s in checkpoints:
            rows.append({"objective": name, "step": s, "accuracy_mean": curves[name][s][0], "accuracy_std": curves[name][s][1],
                         "accuracy": {str(seed): accuracy[name, seed, s] for seed in args.pretrain_seeds},
                         "validation": {str(seed): v.get(s, {}) for seed, v in zip(args.pretrain_seeds, per_seed_losses)}})
    baseline = mean_std(baseline_acc) if baseline_acc else (float("nan"), 0.0)
    plot(curves, losses, baseline, out / "downstream_vs_steps.png")

    target_name = "MLM" if "MLM" in curves else args.objectives[0]
    target = curves[target_name][args.steps][0]
    reach = {}
    for name in args.objectives:
        hit = next((s for s in checkpoints if curves[name][s][0] >= target), None)
        reach[name] = None if hit is None else hit / args.steps
    write_json(out / "results.json", {"args": vars(args), "rows": rows, "random_init_accuracy": baseline_acc,
                                      "majority_baseline": majority, "target": {"objective": target_name, "accuracy": target},
                                      "fraction_of_steps_to_reach_target": reach})

    print(f"\nFrom scratch, {args.steps} steps × 32 × 128 tokens; BBC news accuracy, mean ± std over "
          f"{len(args.pretrain_seeds)} pre-training × {len(args.ft_seeds)} fine-tuning seeds")
    print("| steps | " + " | ".join(args.objectives) + " |")
    print("|---|" + "---|" * len(args.objectives))
    print("| 0 (random init) | " + " | ".join(f"{baseline[0]:.4f} ± {baseline[1]:.4f}" for _ in args.objectives) + " |")
    for s in checkpoints:
        print(f"| {s} | " + " | ".join(f"{curves[n][s][0]:.4f} ± {curves[n][s][1]:.4f}" for n in args.objectives) + " |")
    print("\nValidation MLM loss (ELECTRA and COCO-LM: their generator's)")
    print("| steps | " + " | ".join(args.objectives) + " |")
    print("|---|" + "---|" * len(args.objectives))
    for s in checkpoints:
        print(f"| {s} | " + " | ".join(f"{losses[n][s]:.3f}" if s in losses[n] else "" for n in args.objectives) + " |")
    print(f"\nmajority class: {majority}")
    print(f"{target_name} at {args.steps} steps: {target:.4f}. First checkpoint at or above it, as a fraction of {args.steps} steps:")
    for name, frac in reach.items():
        print(f"  {name}: {'not reached' if frac is None else f'{frac:.3f}'}")
    log.info("wrote %s", out / "results.json")


if __name__ == "__main__":
    main()
