"""Issue 17, item 1: MLM, ELECTRA, COCO-LM and TACO from scratch at equal training FLOPs, two seeds.

    python -m benchmarks.corpora --out runs/corpora
    python -m experiments.equal_compute train --corpora runs/corpora        # pre-train every (objective, seed)
    python -m experiments.equal_compute probe --corpora runs/corpora        # linear probes + fine-tuning
    python -m experiments.equal_compute report                              # tables and the plot

Every objective gets the training FLOPs MLM spends in `--mlm-steps` steps, as its own
`flops_per_token` counts them (model/flops.py: matmuls of every pass of every network, the
generator's sampling forward included), so an objective whose step costs more gets fewer steps.
Each run saves and validates at 1/4, 1/2, 3/4 and all of its budget; every such checkpoint is
exported. The settings are each objective's from issue 14's recipe (experiments/recipe_sweep.py,
group `scratch`): ModernBERT, hidden 128, 2 layers, no dropout, batch 32 × 128 tokens; MLM with 30%
masking and lr 2e-3; ELECTRA and COCO-LM with their papers' masking and a 1/4-width generator;
TACO with 15% masking and lr 1e-3.

A larger budget is a second set beside the first, on the same shards, with its own results folder:

    python -m experiments.equal_compute train --tag 3x --mlm-steps 3000 --data runs/equal_compute/data

One JSON per run lands in experiments/results/equal_compute[_TAG]/ as soon as the run ends (commit it then):
the set can be continued later from what is committed, and a run cut short resumes from its
checkpoints (the trainer's own resume) when the command is given again.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.arguments import add_shared
from experiments.recipe_sweep import BASE, GROUPS
from data_pipeline.dataset_dir import DatasetDir
from pretrain.run_dir import RunDir
from benchmarks.repro_common import (
    REPO,
    export,
    finetune_cached,
    log,
    mean_std,
    random_init,
    scratch_data,
    setup_logging,
    split_csv,
    train,
    validation_losses,
    write_json,
)

OBJECTIVES = {"MLM": GROUPS["scratch"]["mlm"], "ELECTRA": GROUPS["scratch"]["electra-g1/4"],
              "COCO-LM": GROUPS["scratch"]["coco-lm-g1/4"], "TACO": GROUPS["scratch"]["taco"],
              # Issue 18: the papers' masking (15%) on MLM's backbone and learning rate. ALBERT: E = 64 and one layer
              # shared by both (fewer parameters at the same FLOPs); MLM with n-gram masking (no SOP on full packing).
              "SpanBERT": GROUPS["scratch"]["mlm"][:-2] + ["objective.name=spanbert", "masking.strategy=span",
                                                           "optimizer.lr=2e-3"],
              "ALBERT": ["model.architecture=albert", "model.embedding_size=64", "model.num_hidden_groups=1",
                         "model.dropout=0", "model.attention_dropout=0", "masking.strategy=ngram", "masking.max_span=3",
                         "optimizer.lr=2e-3"],
              # XLNet: permutation LM predicting 1/6 of the tokens (whole-word n-grams up to 5), at the base lr.
              "XLNet": ["model.architecture=xlnet", "model.dropout=0", "objective.name=xlnet", "masking.strategy=plm",
                        "masking.mask_prob=0.1667", "masking.max_span=5"],
              # ELECTRA's two-stage training: a full-width generator alone for half the FLOPs, then RTD from it.
              "ELECTRA-2stage": GROUPS["scratch"]["electra-g1/4"] + ["objective.electra.generator_width=1.0"]}
# Objectives whose main model is a masked LM (its validation MLM loss is the headline).
MASKED_LM = ("MLM", "TACO", "SpanBERT", "ALBERT")
# Two-stage objectives: the first stage gets this share of the FLOP budget (objective.electra.two_stage_generator_steps).
TWO_STAGE = {"ELECTRA-2stage": 0.5}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def results_dir(tag: str) -> Path:
    """Where a budget's per-run JSONs live: `equal_compute/` for the first budget, `equal_compute_<tag>/` for others."""
    return REPO / "experiments" / "results" / ("equal_compute" + (f"_{tag}" if tag else ""))


def overrides(name: str) -> list[str]:
    """The objective's full override list on top of the sweep's base config (BASE[1] is its YAML)."""
    return [*BASE[2:], *OBJECTIVES[name]]


def flops_per_step(name: str, data: Path, stage: int = 1) -> tuple[float, int]:
    """Training FLOPs of one optimizer step of the objective (its own count; a two-stage objective's in `stage`) and
    the tokens in that step."""
    from core.config_io import load_config
    from model.encoder import model_config
    from model.objectives import build_objective
    from pretrain.config import RunConfig

    manifest = json.loads(DatasetDir(data).manifest.read_text())
    # A two-stage objective is built as one (its switch after step 1), so each stage's own cost is counted.
    two_stage = ["objective.electra.two_stage_generator_steps=1"] if name in TWO_STAGE else []
    cfg = load_config(RunConfig, REPO / BASE[1], [*overrides(name), *two_stage])
    objective = build_objective(cfg.objective, model_config(cfg.model, manifest["tokenizer"], manifest["seq_len"]),
                                cfg.model.init_from, cfg.masking.mask_prob)
    tokens = cfg.train.global_batch_size * manifest["seq_len"]  # packing "full": every position is a token
    if stage == 2:
        objective.begin_step(2)  # past the switch
    return objective.flops_per_token(manifest["seq_len"]) * tokens, tokens


def plan(names: list[str], data: Path, mlm_steps: int) -> dict[str, dict]:
    """Steps per objective so that each spends MLM's FLOPs of `mlm_steps` steps (a multiple of 4: saves at quarters)."""
    budget = flops_per_step("MLM", data)[0] * mlm_steps
    out = {}
    for name in names:
        if name in TWO_STAGE:
            out[name] = two_stage_plan(name, data, budget)
            continue
        per_step, tokens = flops_per_step(name, data)
        steps = max(4, round(budget / per_step / 4) * 4)
        out[name] = {"flops_per_step": per_step, "tokens_per_step": tokens, "steps": steps, "budget_flops": budget,
                     "flops": per_step * steps, "checkpoints": [int(f * steps) for f in FRACTIONS], "extra": []}
    return out


def two_stage_plan(name: str, data: Path, budget: float) -> dict:
    """Stage 1 spends TWO_STAGE[name] of the budget at its step cost, stage 2 the rest at its own; `flops_per_step` is
    the mean, so a checkpoint's FLOPs (step × mean) are exact at the end and approximate before it."""
    first, tokens = flops_per_step(name, data, stage=1)
    second, _ = flops_per_step(name, data, stage=2)
    n1 = max(1, round(TWO_STAGE[name] * budget / first))
    n2 = max(1, round((1 - TWO_STAGE[name]) * budget / second))
    steps = max(4, round((n1 + n2) / 4) * 4)
    n2 = steps - n1
    flops = n1 * first + n2 * second
    return {"flops_per_step": flops / steps, "tokens_per_step": tokens, "steps": steps, "budget_flops": budget,
            "flops": flops, "checkpoints": [int(f * steps) for f in FRACTIONS], "stage_one_steps": n1,
            "stage_flops_per_step": [first, second], "extra": [f"objective.electra.two_stage_generator_steps={n1}"]}


def run_name(name: str, seed: int) -> str:
    """File-system name of one (objective, seed) run."""
    return f"{name.lower().replace('-', '_')}_seed{seed}"


def train_all(args: argparse.Namespace, data: Path, out: Path) -> None:
    """Pre-train (or resume) every run, export its checkpoints and write its JSON as soon as it ends."""
    runs = plan(args.objectives, data, args.mlm_steps)
    for seed in args.seeds:
        for name in args.objectives:
            record_path = results_dir(args.tag) / f"{run_name(name, seed)}.json"
            if record_path.is_file():
                log.info("%s seed %d: recorded in %s", name, seed, record_path)
                continue
            p = runs[name]
            quarter = p["steps"] // 4
            run_dir = out / "train" / run_name(name, seed)
            start = time.time()
            train(BASE[1], [*overrides(name), *p.get("extra", []), f"data.path={data}", f"train.seed={seed}", f"train.save_every={quarter}",
                            f"train.eval_every={quarter}", "train.eval_batches=16", "train.keep_last=1000",
                            "train.log_every=25", f"schedule.warmup_steps={max(10, p['steps'] // 16)}"],
                  run_dir, p["steps"])
            wall = time.time() - start
            exports = {step: str(export(run_dir, step, out / "exports" / f"{run_name(name, seed)}_step{step}"))
                       for step in p["checkpoints"]}
            val = validation_losses(run_dir)
            import yaml  # the precision `auto` resolved to on this machine, as the run recorded it

            precision = yaml.safe_load(RunDir(run_dir).config.read_text())["train"]["precision"]
            write_json(record_path, {
                "objective": name, "seed": seed, "overrides": overrides(name), **p, "wall_s": wall, "precision": precision,
                "checkpoints": [{"step": s, "fraction_of_budget": s * p["flops_per_step"] / p["budget_flops"],
                                 "flops": s * p["flops_per_step"], "validation": val.get(s, {}), "export": exports[s]}
                                for s in p["checkpoints"]]})
            log.info("%s seed %d: %d steps in %.0f s, wrote %s", name, seed, p["steps"], wall, record_path)


def probe_tasks(corpora: Path, out: Path) -> dict[str, dict]:
    """The linear-probe tasks: BBC topics and tweet sentiment (fixed splits), WordNet supersenses in context (token level)."""
    bbc = split_csv(corpora / "bbc_news.csv", out / "tasks", 1200, 600)
    tweets = split_csv(corpora / "tweets.csv", out / "tasks", 3000, 1000)
    return {
        "bbc": {"task": f"csv:{bbc[0]}", "data": {"validation_file": str(bbc[1])}},
        "tweets": {"task": f"csv:{tweets[0]}", "data": {"validation_file": str(tweets[1])}},
        "supersense": {"task": f"json:{corpora / 'supersense_train.jsonl'}",
                       "data": {"validation_file": str(corpora / "supersense_eval.jsonl"), "token_task": True,
                                "text_column": "tokens", "label_column": "tags", "ignore_tag": "-"}},
        "wordpos": {"task": f"json:{corpora / 'wordpos_train.jsonl'}",
                    "data": {"validation_file": str(corpora / "wordpos_eval.jsonl"), "token_task": True,
                             "text_column": "tokens", "label_column": "tags", "ignore_tag": "-"}},
    }


def probe_one(model: Path, name: str, task: dict, out: Path) -> dict:
    """Linear-probe accuracies of one export on one task ({feature: accuracy}), cached in `out`."""
    if not out.is_file():
        from evaluation.linear_probe import linear_probe
        from evaluation.tasks import LocalTaskOptions

        linear_probe(str(model), task["task"], LocalTaskOptions(**task["data"]), out=str(out))
    result = json.loads(out.read_text())
    return {"accuracy": {f: r["accuracy"] for f, r in result["probes"].items()},
            "f1_macro": {f: r["f1_macro"] for f, r in result["probes"].items()},
            "majority": result["majority_baseline"]["accuracy"]}


def finetune_bbc(model: Path, task: dict, seeds: list[int], out: Path) -> list[float]:
    """BBC accuracies of one export over fine-tuning seeds (RESULTS (b)'s settings), cached in `out`."""
    result = finetune_cached(model, Path(task["task"][4:]), seeds, out, recipe_name="taco",
                             overrides={"lr": 3e-4, "epochs": 4.0, "max_length": 128},
                             validation_file=task["data"]["validation_file"])
    return [r["metrics"]["accuracy"] for r in result["seeds"]]


def probe_all(args: argparse.Namespace, out: Path) -> None:
    """Probes of every recorded run's checkpoints (the final ones first), then BBC fine-tuning of the final ones.

    Each result is written into the run's JSON as soon as it exists, so a cut-short probe stage loses nothing."""
    tasks = probe_tasks(Path(args.corpora).resolve(), out)
    results = results_dir(args.tag)
    records = [r for r in sorted(results.glob("*_seed*.json"))
               if json.loads(r.read_text())["objective"] in args.objectives]
    mlm = [r for r in records if r.name.startswith("mlm_")]
    if mlm and not (results / "random_init.json").is_file():
        like = Path(json.loads(mlm[0].read_text())["checkpoints"][-1]["export"])
        baseline, tuned = {}, []
        for seed in args.seeds:
            model = random_init(like, out / "exports" / f"random_init_seed{seed}", seed)
            baseline[str(seed)] = {t: probe_one(model, t, task, out / "probes" / f"random_init_seed{seed}_{t}.json")
                                   for t, task in tasks.items()}
            if args.finetune_seeds:  # the step-0 point of fine-tuning too: what pre-training must beat
                tuned += finetune_bbc(model, tasks["bbc"], args.finetune_seeds, out / "finetune" / f"random_init_seed{seed}_bbc.json")
        write_json(results / "random_init.json", {"like": str(like), "probes": baseline,
                                                  **({"finetune": {"bbc": {"accuracy": tuned}}} if tuned else {})})
    order = [3, 1, 0, 2]  # final, half, quarter, three quarters: the curve's ends first
    for index in order:
        for path in records:
            record = json.loads(path.read_text())
            point = record["checkpoints"][index]
            if set(point.get("probes", {})) == set(tasks):
                continue  # probed in an earlier session (its exports may be gone since)
            model = Path(point["export"])
            stem = f"{path.stem}_step{point['step']}"
            point["probes"] = {t: probe_one(model, t, task, out / "probes" / f"{stem}_{t}.json") for t, task in tasks.items()}
            write_json(path, record)
            log.info("%s step %d: %s", path.stem, point["step"],
                     {t: round(v["accuracy"].get("mean", v["accuracy"].get("word", 0)), 4) for t, v in point["probes"].items()})
        if args.finetune_seeds:
            for path in records:
                record = json.loads(path.read_text())
                if (index != 3 and record["objective"] not in args.finetune_all) or "finetune" in record["checkpoints"][index]:
                    continue
                point = record["checkpoints"][index]
                point["finetune"] = {"bbc": {"accuracy": finetune_bbc(
                    Path(point["export"]), tasks["bbc"], args.finetune_seeds,
                    out / "finetune" / f"{path.stem}_step{point['step']}_bbc.json")}}
                write_json(path, record)


# Each objective's own diagnostic of its main model (issue 9), and what counts as past the plateau (issue 14's goals).
DIAGNOSTIC = {"MLM": ("mlm_loss_below_unigram", 1.5), "TACO": ("mlm_loss_below_unigram", 1.5),
              "SpanBERT": ("sbo_accuracy", 0.0), "ALBERT": ("mlm_loss_below_unigram", 1.5),
              "XLNet": ("plm_loss_below_unigram", 1.5), "ELECTRA-2stage": ("rtd_auc", 0.8),
              "ELECTRA": ("rtd_auc", 0.8), "COCO-LM": ("copy_auc", 0.8)}
PRIOR = {"ELECTRA": "rtd_loss_below_prior", "COCO-LM": "copy_loss_below_prior", "ELECTRA-2stage": "rtd_loss_below_prior"}
PROBES = (("bbc", "mean"), ("tweets", "mean"), ("supersense", "word"), ("wordpos", "word"))


def _acc(point: dict, task: str, feature: str) -> float | None:
    """A checkpoint's (or the random-init point's) probe accuracy, None where that probe has not run yet."""
    probes = point.get("probes", point)
    return probes.get(task, {}).get("accuracy", {}).get(feature)


def _fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return ""
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def report(args: argparse.Namespace) -> None:
    """Tables (markdown, printed) and the plot of every recorded run: diagnostics, probes and fine-tuning against FLOPs."""
    results = results_dir(args.tag)
    records: dict[str, list[dict]] = {}
    for path in sorted(results.glob("*_seed*.json")):
        r = json.loads(path.read_text())
        records.setdefault(r["objective"], []).append(r)
    names = [n for n in OBJECTIVES if n in records]
    base = json.loads((results / "random_init.json").read_text()) if (results / "random_init.json").is_file() else None
    print("| objective | seeds | steps | training TFLOP | wall s | MLM loss below unigram | own diagnostic | below prior |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        finals = [r["checkpoints"][-1]["validation"] for r in records[n]]
        mlm_key = ("plm_loss_below_unigram" if n == "XLNet" else "mlm_loss_below_unigram" if n in MASKED_LM
                   else "generator_mlm_loss_below_unigram")
        key, goal = DIAGNOSTIC[n]
        own = "" if key == mlm_key else f"{key} {_fmt([f[key] for f in finals if key in f])}"
        if n == "TACO":
            own = f"tc_retrieval_accuracy {_fmt([f['tc_retrieval_accuracy'] for f in finals])}"
        print(f"| {n} | {len(records[n])} | {records[n][0]['steps']} | {records[n][0]['flops'] / 1e12:.2f} | "
              f"{_fmt([r['wall_s'] for r in records[n]], 0)} | {_fmt([f[mlm_key] for f in finals if mlm_key in f])}"
              f"{' (generator)' if mlm_key.startswith('generator') else ''} | {own} | "
              f"{_fmt([f[PRIOR[n]] for f in finals if PRIOR.get(n) in f])} |")
    for task, feature in PROBES:
        print(f"\nLinear probe, {task} ({feature} features): accuracy by fraction of the FLOP budget (mean ± std over seeds)")
        print("| objective | 0 (random init) | 1/4 | 1/2 | 3/4 | 1 |")
        print("|---|---|---|---|---|---|")
        zero = _fmt([a for b in base["probes"].values() if (a := _acc(b, task, feature)) is not None]) if base else ""
        for n in names:
            cells = [_fmt([a for r in records[n] if (a := _acc(r["checkpoints"][i], task, feature)) is not None])
                     for i in range(4)]
            print(f"| {n} | {zero} | " + " | ".join(cells) + " |")
    print("\nBBC fine-tuning (3 fine-tuning seeds per pre-training seed; mean ± std over all of them)")
    print("| objective | 0 (random init) | 1/4 | 1/2 | 3/4 | 1 |")
    print("|---|---|---|---|---|---|")
    zero = _fmt((base or {}).get("finetune", {}).get("bbc", {}).get("accuracy", []))
    for n in names:
        cells = [zero, *(_fmt([a for r in records[n] for a in r["checkpoints"][i].get("finetune", {}).get("bbc", {}).get("accuracy", [])])
                         for i in range(4))]
        print(f"| {n} | " + " | ".join(cells) + " |")
    ft_reach = finetune_reach(records)
    print("BBC fine-tuning: fraction of MLM's FLOPs to reach MLM's final accuracy: " + ", ".join(
        f"{n} {'not reached' if v is None else ('≤ ' if bound else '') + f'{v:.2f}'}" for n, (v, bound) in ft_reach.items()))
    reach = fractions_to_reach_mlm(records, base)
    print("\nFraction of MLM's FLOPs at which each objective's probe first reaches MLM's final probe accuracy "
          "(linear interpolation between checkpoints; None: not reached within the budget)")
    for (task, feature), per in reach.items():
        print(f"- {task}: " + ", ".join(f"{n} {'not reached' if v is None else f'{v:.2f}'}" for n, v in per.items()))
    write_json(results / "summary.json", {"fraction_of_mlm_flops_to_reach_mlm_final": {
        **{f"probe_{t}": v for (t, _), v in reach.items()},
        "finetune_bbc": {n: {"fraction": v, "upper_bound": b} for n, (v, b) in ft_reach.items()}}})
    plot(records, base, REPO / "docs" / "results" / f"{results.name}.png")


def _curve(runs: list[dict], task: str, feature: str) -> list[tuple[float, float]]:
    """(fraction of the budget, mean probe accuracy over seeds) at each probed checkpoint."""
    out = []
    for i in range(4):
        accs = [a for r in runs if (a := _acc(r["checkpoints"][i], task, feature)) is not None]
        if len(accs) == len(runs):
            out.append((runs[0]["checkpoints"][i]["fraction_of_budget"], mean_std(accs)[0]))
    return out


def fractions_to_reach_mlm(records: dict[str, list[dict]], base: dict | None) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per probe task: the FLOP fraction where each objective's mean curve (from the random-init point `base`, at 0)
    first reaches MLM's final mean, interpolating linearly between checkpoints; None if it never does."""
    out = {}
    for task, feature in PROBES:
        mlm = _curve(records.get("MLM", []), task, feature)
        if not mlm or mlm[-1][0] < 0.99:
            continue
        target = mlm[-1][1]
        zero = [a for b in (base or {}).get("probes", {}).values() if (a := _acc(b, task, feature)) is not None]
        start = [(0.0, mean_std(zero)[0])] if zero else []
        out[task, feature] = {n: first_crossing(start + _curve(runs, task, feature), target) for n, runs in records.items()}
    return out


def first_crossing(points: list[tuple[float, float]], target: float) -> float | None:
    """The first x where the piecewise-linear curve through `points` reaches `target` (None if it never does)."""
    if points and points[0][1] >= target:
        return points[0][0]
    for (f0, a0), (f1, a1) in zip(points, points[1:]):
        if a1 >= target:
            return f0 + (target - a0) / (a1 - a0) * (f1 - f0)
    return None


def finetune_reach(records: dict[str, list[dict]]) -> dict[str, tuple[float | None, bool]]:
    """Per objective: the FLOP fraction where its mean BBC fine-tuning accuracy reaches MLM's final one, and whether
    that is only an upper bound (reached already at its first fine-tuned checkpoint; there is no random-init point)."""
    def curve(runs: list[dict]) -> list[tuple[float, float]]:
        out = []
        for i in range(4):
            accs = [a for r in runs for a in r["checkpoints"][i].get("finetune", {}).get("bbc", {}).get("accuracy", [])]
            if accs and all("finetune" in r["checkpoints"][i] for r in runs):
                out.append((runs[0]["checkpoints"][i]["fraction_of_budget"], mean_std(accs)[0]))
        return out

    mlm = curve(records.get("MLM", []))
    if not mlm or mlm[-1][0] < 0.99:
        return {}
    out = {}
    for n, runs in records.items():
        points = curve(runs)
        hit = first_crossing(points, mlm[-1][1])
        out[n] = (hit, bool(points) and hit == points[0][0] and n != "MLM")
    return out


def plot(records: dict[str, list[dict]], base: dict | None, path: Path) -> None:
    """Probe accuracies and the validation MLM loss against training FLOPs, mean ± std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from core.atomic_files import save_figure_atomic

    fig, axes = plt.subplots(1, len(PROBES) + 1, figsize=(5 * len(PROBES) + 5, 4.2))
    for ax, (task, feature) in zip(axes, PROBES):
        for n, runs in records.items():
            xs, ms, ss = [], [], []
            zero = [a for b in (base or {}).get("probes", {}).values() if (a := _acc(b, task, feature)) is not None]
            if zero:
                m, s = mean_std(zero)
                xs, ms, ss = [0.0], [m], [s]
            for i in range(4):
                accs = [a for r in runs if (a := _acc(r["checkpoints"][i], task, feature)) is not None]
                if accs:
                    xs.append(runs[0]["checkpoints"][i]["flops"] / 1e12)
                    m, s = mean_std(accs)
                    ms.append(m)
                    ss.append(s)
            ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, label=n)
        ax.set_title(f"linear probe: {task} ({feature})")
        ax.set_xlabel("training TFLOP (top: steps of MLM)")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    ax = axes[-1]
    for n, runs in records.items():
        key = "plm_loss" if n == "XLNet" else "mlm_loss" if n in MASKED_LM else "generator_mlm_loss"
        xs = [c["flops"] / 1e12 for c in runs[0]["checkpoints"]]
        vals = [[r["checkpoints"][i]["validation"].get(key) for r in runs] for i in range(4)]
        ax.plot(xs, [mean_std(v)[0] if None not in v else float("nan") for v in vals], marker="o",
                label=n + (" (generator)" if key.startswith("generator") else ""))
    ax.set_title("validation MLM loss (nats)")
    ax.set_xlabel("training TFLOP")
    ax.grid(alpha=0.3)
    mlm = records.get("MLM")
    if mlm:  # the step axis beside the FLOP axis: MLM's steps at the same compute
        per_step = mlm[0]["flops_per_step"] / 1e12
        for a in axes:
            top = a.secondary_xaxis("top", functions=(lambda x, p=per_step: x / p, lambda s, p=per_step: s * p))
            top.set_xlabel("MLM steps")
    for a in axes:
        a.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure_atomic(fig, path)
    plt.close(fig)


def main() -> None:
    """Dispatch the stage."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["plan", "train", "probe", "report"])
    add_shared(parser, corpora="runs/corpora")
    parser.add_argument("--tag", default="", help="a budget's name: results in experiments/results/equal_compute_TAG/, "
                        "runs in runs/equal_compute_TAG/ (default: the first budget's, untagged)")
    parser.add_argument("--out", default=None, help="runs, exports and probes (default: runs/equal_compute[_TAG])")
    parser.add_argument("--data", default=None, help="shards (default: OUT/data; give another budget's to share them)")
    add_shared(parser, choices={"objectives": list(OBJECTIVES)}, objectives=list(OBJECTIVES), seeds=[1, 2])
    parser.add_argument("--finetune-seeds", type=int, nargs="*", default=[1, 2, 3],
                        help="fine-tuning seeds for BBC at each run's final checkpoint (none: skip)")
    parser.add_argument("--finetune-all", nargs="*", default=[], choices=list(OBJECTIVES),
                        help="objectives whose every checkpoint is fine-tuned (the others: the final one only)")
    parser.add_argument("--mlm-steps", type=int, default=1000, help="the budget: MLM's training FLOPs in this many steps")
    args = parser.parse_args()
    setup_logging()
    if args.stage == "report":
        return report(args)
    out = Path(args.out or "runs/equal_compute" + (f"_{args.tag}" if args.tag else "")).resolve()
    data = scratch_data(Path(args.corpora).resolve(), Path(args.data).resolve() if args.data else out / "data")
    if args.stage == "plan":
        print(json.dumps(plan(args.objectives, data, args.mlm_steps), indent=1))
    elif args.stage == "train":
        train_all(args, data, out)
    else:
        probe_all(args, out)


if __name__ == "__main__":
    main()
