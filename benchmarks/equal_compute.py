"""Issue 17, item 1: MLM, ELECTRA, COCO-LM and TACO from scratch at equal training FLOPs, two seeds.

    python benchmarks/corpora.py --out runs/corpora
    python benchmarks/equal_compute.py train --corpora runs/corpora        # pre-train every (objective, seed)
    python benchmarks/equal_compute.py probe --corpora runs/corpora        # linear probes + fine-tuning
    python benchmarks/equal_compute.py report                              # tables and the plot

Every objective gets the training FLOPs MLM spends in `--mlm-steps` steps, as its own
`flops_per_token` counts them (model/flops.py: matmuls of every pass of every network, the
generator's sampling forward included), so an objective whose step costs more gets fewer steps.
Each run saves and validates at 1/4, 1/2, 3/4 and all of its budget; every such checkpoint is
exported. The settings are each objective's from issue 14's recipe (benchmarks/recipe_sweep.py,
group `scratch`): ModernBERT, hidden 128, 2 layers, no dropout, batch 32 × 128 tokens; MLM with 30%
masking and lr 2e-3; ELECTRA and COCO-LM with their papers' masking and a 1/4-width generator;
TACO with 15% masking and lr 1e-3.

One JSON per run lands in benchmarks/results/equal_compute/ as soon as the run ends (commit it then):
the set can be continued later from what is committed, and a run cut short resumes from its
checkpoints (the trainer's own resume) when the command is given again.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recipe_sweep import BASE, GROUPS  # noqa: E402
from repro_common import REPO, export, log, scratch_data, setup_logging, train, validation_losses, write_json  # noqa: E402

OBJECTIVES = {"MLM": GROUPS["scratch"]["mlm"], "ELECTRA": GROUPS["scratch"]["electra-g1/4"],
              "COCO-LM": GROUPS["scratch"]["coco-lm-g1/4"], "TACO": GROUPS["scratch"]["taco"]}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
RESULTS = REPO / "benchmarks" / "results" / "equal_compute"


def overrides(name: str) -> list[str]:
    """The objective's full override list on top of the sweep's base config (BASE[1] is its YAML)."""
    return [*BASE[2:], *OBJECTIVES[name]]


def flops_per_step(name: str, data: Path) -> tuple[float, int]:
    """Training FLOPs of one optimizer step of the objective (its own count) and the tokens in that step."""
    from core.config_io import load_config
    from model.encoder import model_config
    from model.objectives import build_objective
    from pretrain.config import RunConfig

    manifest = json.loads((data / "manifest.json").read_text())
    cfg = load_config(RunConfig, REPO / BASE[1], overrides(name))
    objective = build_objective(cfg.objective, model_config(cfg.model, manifest["tokenizer"], manifest["seq_len"]),
                                cfg.model.init_from)
    tokens = cfg.train.global_batch_size * manifest["seq_len"]  # packing "full": every position is a token
    return objective.flops_per_token(manifest["seq_len"], cfg.masking.mask_prob) * tokens, tokens


def plan(names: list[str], data: Path, mlm_steps: int) -> dict[str, dict]:
    """Steps per objective so that each spends MLM's FLOPs of `mlm_steps` steps (a multiple of 4: saves at quarters)."""
    budget = flops_per_step("MLM", data)[0] * mlm_steps
    out = {}
    for name in names:
        per_step, tokens = flops_per_step(name, data)
        steps = max(4, round(budget / per_step / 4) * 4)
        out[name] = {"flops_per_step": per_step, "tokens_per_step": tokens, "steps": steps, "budget_flops": budget,
                     "flops": per_step * steps, "checkpoints": [int(f * steps) for f in FRACTIONS]}
    return out


def run_name(name: str, seed: int) -> str:
    """File-system name of one (objective, seed) run."""
    return f"{name.lower().replace('-', '_')}_seed{seed}"


def train_all(args: argparse.Namespace, data: Path, out: Path) -> None:
    """Pre-train (or resume) every run, export its checkpoints and write its JSON as soon as it ends."""
    runs = plan(args.objectives, data, args.mlm_steps)
    for seed in args.seeds:
        for name in args.objectives:
            record_path = RESULTS / f"{run_name(name, seed)}.json"
            if record_path.is_file():
                log.info("%s seed %d: recorded in %s", name, seed, record_path)
                continue
            p = runs[name]
            quarter = p["steps"] // 4
            run_dir = out / "train" / run_name(name, seed)
            start = time.time()
            train(BASE[1], [*overrides(name), f"data.path={data}", f"train.seed={seed}", f"train.save_every={quarter}",
                            f"train.eval_every={quarter}", "train.eval_batches=16", "train.keep_last=1000",
                            "train.log_every=25", f"schedule.warmup_steps={max(10, p['steps'] // 16)}"],
                  run_dir, p["steps"])
            wall = time.time() - start
            exports = {step: str(export(run_dir, step, out / "exports" / f"{run_name(name, seed)}_step{step}"))
                       for step in p["checkpoints"]}
            val = validation_losses(run_dir)
            write_json(record_path, {
                "objective": name, "seed": seed, "overrides": overrides(name), **p, "wall_s": wall,
                "checkpoints": [{"step": s, "fraction_of_budget": s * p["flops_per_step"] / p["budget_flops"],
                                 "flops": s * p["flops_per_step"], "validation": val.get(s, {}), "export": exports[s]}
                                for s in p["checkpoints"]]})
            log.info("%s seed %d: %d steps in %.0f s, wrote %s", name, seed, p["steps"], wall, record_path)


def main() -> None:
    """Dispatch the stage."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["plan", "train"])
    parser.add_argument("--corpora", default="runs/corpora", help="output of benchmarks/corpora.py")
    parser.add_argument("--out", default="runs/equal_compute")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--mlm-steps", type=int, default=1000, help="the budget: MLM's training FLOPs in this many steps")
    args = parser.parse_args()
    setup_logging()
    out = Path(args.out).resolve()
    data = scratch_data(Path(args.corpora).resolve(), out / "data")
    if args.stage == "plan":
        print(json.dumps(plan(args.objectives, data, args.mlm_steps), indent=1))
    else:
        train_all(args, data, out)


if __name__ == "__main__":
    main()
