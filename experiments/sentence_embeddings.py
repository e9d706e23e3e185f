"""Issue 18: DeCLUTR, COCO-LM's SCL, TaCL and MLM on the sentence-embedding evaluation, all continued from one teacher.

    python -m evaluation.senteval_data --out runs/senteval --corpora runs/corpora
    python -m experiments.reproduce_tacl --train-teacher bert --teacher-steps 1800 --steps 400 --lr 5e-4 --seeds 1 2 \\
        --data runs/equal_compute/data --out runs/results/tacl_bert --skip-finetune     # the teacher, TaCL and MLM-only
    python -m experiments.sentence_embeddings                                           # DeCLUTR and COCO-LM, then the table

Every student continues the same MLM teacher (RESULTS.md's TaCL section: BERT with relative positions,
hidden 128, 2 layers, 1,800 steps from scratch on (b)'s corpora) for the same 400 steps at lr 5e-4 and
batch 32, two seeds each, as reproduce_tacl.py trains TaCL and MLM-only: DeCLUTR on the same corpora
cut per document (spans never cross documents) with the teacher's tokenizer, COCO-LM with its paper's
masking and a 1/4-width generator. The teacher and every student are then evaluated with
`python -m pretrain evaluate sentence-embeddings` on runs/senteval (5-fold outer CV, C picked by 3-fold
inner CV; at most 2,000 rows per task). Results: experiments/results/sentence_embeddings.{json,md}.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.arguments import add_shared
from benchmarks.repro_common import REPO, export, log, mean_std, prepare, random_init, setup_logging, train, write_json

STEPS = 400
# Each student's objective on top of the continual-training settings reproduce_tacl.py uses.
STUDENTS = {
    "DeCLUTR": ["objective.name=declutr", "masking.strategy=bert", "masking.mask_prob=0.15",
                "objective.declutr.spans.min_span_tokens=16", "objective.declutr.spans.max_span_tokens=126"],
    "COCO-LM": ["objective.name=coco_lm", "masking.strategy=coco", "masking.count=exact", "masking.crop_ratio=0.9",
                "objective.coco_lm.generator_layers=1", "objective.coco_lm.generator_width=0.25"],
}


def document_data(corpora: Path, teacher: Path, out: Path) -> Path:
    """(b)'s corpora cut per document (paragraphs) in the teacher's vocabulary, for DeCLUTR's spans."""
    return prepare({"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                                 "text_documents": "paragraph"}],
                    "tokenizer": {"pretrained": str(teacher)}, "seq_len": 128, "packing": "document",
                    "val_fraction": 0.02}, out)


def train_students(args: argparse.Namespace, teacher: Path, out: Path) -> dict[str, Path]:
    """DeCLUTR and COCO-LM students of the teacher (resumed if cut short); their exports by name."""
    documents = document_data(Path(args.corpora).resolve(), teacher, out / "documents")
    exports = {}
    for name, extra in STUDENTS.items():
        data = documents if name == "DeCLUTR" else Path(args.data).resolve()
        for seed in args.seeds:
            tag = f"{name.lower().replace('-', '_')}_seed{seed}"
            # model=pretrained: the teacher folder's family, shape and dropout, not the demo config's model group's.
            common = [f"model.init_from={teacher}", "model=pretrained", f"data.path={data}",
                      f"optimizer.lr={args.lr}",
                      "train.global_batch_size=32", "train.micro_batch_size=16", f"train.seed={seed}",
                      f"data.shuffle_seed={seed}", f"schedule.warmup_steps={STEPS // 10}", f"train.save_every={STEPS}",
                      f"train.eval_every={STEPS}", "train.eval_batches=8", "train.log_every=20", *extra]
            run_dir = train("pretrain/configs/demo_mlm.yaml", common, out / f"train_{tag}", STEPS)
            exports[f"{name}, seed {seed}"] = export(run_dir, STEPS, out / f"export_{tag}")
    return exports


def main() -> None:
    """Train the missing students, evaluate every model, write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, corpora="runs/corpora")
    parser.add_argument("--tacl", default="runs/results/tacl_bert", help="reproduce_tacl.py's output (teacher, TaCL, MLM-only)")
    parser.add_argument("--data", default="runs/equal_compute/data", help="the teacher's shards (COCO-LM trains on them)")
    parser.add_argument("--suite", default="runs/senteval")
    add_shared(parser, out="runs/results/sentence_embeddings", seeds=[1, 2], lr=5e-4)
    parser.add_argument("--max-examples", type=int, default=2000)
    args = parser.parse_args()
    setup_logging()
    tacl, out = Path(args.tacl).resolve(), Path(args.out).resolve()
    teacher = tacl / "teacher_bert"
    models = {"random init": random_init(teacher, out / "random_init", seed=1)}
    models["MLM teacher"] = teacher
    for seed in args.seeds:
        models[f"MLM-only, seed {seed}"] = tacl / f"export_mlm_seed{seed}"
        models[f"TaCL, seed {seed}"] = tacl / f"export_tacl_seed{seed}"
    models.update(train_students(args, teacher, out))
    from evaluation.sentence_embeddings import evaluate_suite

    results = {}
    for name, path in models.items():
        cache = out / "eval" / name.replace(", ", "_").replace(" ", "_")
        if not cache.with_suffix(".json").is_file():
            evaluate_suite([str(path)], args.suite, out=cache, folds=5, inner_folds=3, c_grid=(0.1, 1.0, 10.0),
                           max_examples=args.max_examples, max_length=128, batch_size=64, seed=0)
        report = json.loads(cache.with_suffix(".json").read_text())
        results[name] = report["results"][str(path)]
        log.info("%s: evaluated", name)
    tasks = report["tasks"]
    table = summary_table(results, tasks)
    print(table)
    write_json(REPO / "experiments" / "results" / "sentence_embeddings.json",
               {"models": {n: str(p) for n, p in models.items()}, "tasks": tasks, "protocol": report["options"],
                "results": results})
    (REPO / "experiments" / "results" / "sentence_embeddings.md").write_text(table)


def _value(task: dict, scores: dict) -> float:
    return scores["spearman"] if task["kind"] == "sts" else 100 * scores["accuracy"]


def summary_table(results: dict[str, dict], tasks: list[dict]) -> str:
    """Markdown: per objective (mean ± std over seeds) and feature, each task's accuracy (STS: Spearman) × 100."""
    groups: dict[str, list[str]] = {}
    for name in results:
        groups.setdefault(name.split(", seed")[0], []).append(name)
    lines = ["| model | feature | " + " | ".join(t["name"] for t in tasks) + " | mean (classification) |",
             "|" + "---|" * (len(tasks) + 3)]
    for group, names in groups.items():
        for feature in ("mean", "cls"):
            cells, classification = [], []
            for task in tasks:
                values = [_value(task, results[n][task["name"]][feature]) for n in names]
                m, s = mean_std(values)
                cells.append(f"{m:.1f} ± {s:.1f}" if len(values) > 1 else f"{m:.1f}")
                if task["kind"] != "sts":
                    classification.append(values)
            per_seed = [sum(v[i] for v in classification) / len(classification) for i in range(len(names))]
            m, s = mean_std(per_seed)
            lines.append(f"| {group} | {feature} | " + " | ".join(cells)
                         + f" | {m:.1f}" + (f" ± {s:.1f}" if len(names) > 1 else "") + " |")
    first = next(iter(results.values()))
    lines.append("| majority class | | " + " | ".join(
        "" if t["kind"] == "sts" else f"{100 * first[t['name']]['mean']['majority_class']:.1f}" for t in tasks) + " | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
