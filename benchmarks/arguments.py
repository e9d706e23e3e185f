"""The arguments several benchmarks take, defined once (name, type, meaning); each script gives its own defaults.

    parser = argparse.ArgumentParser()
    add_shared(parser, steps=60, warmup=10, batch=4, precision="auto", out=results_file("host_overhead"))
    add_shared(parser, choices={"objectives": list(OBJECTIVES)}, objectives=list(OBJECTIVES))

An argument whose meaning is the script's own stays an `add_argument` in the script.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
PRECISIONS = ["auto", "fp32", "bf16", "fp16"]


def worker_count(value: str) -> "int | str":
    """`auto` (the trainer's default, resolved where it runs) or a count."""
    return value if value == "auto" else int(value)


SHARED: dict[str, dict[str, Any]] = {
    "corpora": {"help": "the folder `python -m benchmarks.corpora` wrote"},
    "data": {"help": "a prepared dataset folder (train/ and validation/ shards)"},
    "out": {"help": "where the results go"},
    "work": {"help": "a scratch folder for the runs"},
    "steps": {"type": int, "help": "optimizer steps per run"},
    "warmup": {"type": int, "help": "steps before the timing starts"},
    "batch": {"type": int, "help": "micro-batch size (sequences)"},
    "seq": {"type": int, "help": "sequence length (tokens)"},
    "threads": {"type": int, "help": "torch threads per process (0: the library default)"},
    "precision": {"choices": PRECISIONS, "help": "train.precision (auto: bf16 where the hardware has it)"},
    "seeds": {"type": int, "nargs": "+", "help": "one run per seed"},
    "lr": {"type": float, "help": "peak learning rate"},
    "objectives": {"nargs": "+", "help": "objectives to run"},
    "backbones": {"nargs": "+", "help": "backbones to run"},
    "set": {"nargs": "*", "metavar": "KEY=VALUE",
            "help": "more run-config overrides for the trainer's runs (e.g. train.fused_qkv=true model.dropout=0.1)"},
    "loader_workers": {"type": worker_count,
                       "help": "loader worker processes per rank (auto: what data.num_workers=auto picks)"},
}


def results_file(name: str) -> str:
    """benchmarks/results/NAME.json: where a benchmark writes its figures unless told otherwise."""
    return str(REPO / "benchmarks" / "results" / f"{name}.json")


def add_shared(parser: argparse.ArgumentParser, choices: Optional[dict[str, list]] = None, **defaults: Any) -> None:
    """Add the shared arguments named in `defaults`, each with the script's default; `choices` narrows one."""
    for name, default in defaults.items():
        spec = {**SHARED[name], "default": default}
        if choices and name in choices:
            spec["choices"] = choices[name]
        parser.add_argument("--" + name.replace("_", "-"), **spec)


def repo_pythonpath() -> str:
    """PYTHONPATH for a measured subprocess: the checkout first, then whatever the caller had (carried packages)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def parse_checked(parser: argparse.ArgumentParser, check: Callable[[argparse.Namespace], str],
                  argv: Optional[list[str]] = None) -> argparse.Namespace:
    """`argv` parsed, or the one-line usage error and exit 2 that argparse gives, where `check` finds fault with it
    (`check` is also what benchmarks/gpu_queue.py runs on its entries, before a GPU machine starts)."""
    args = parser.parse_args(argv)
    wrong = check(args)
    if wrong:
        parser.error(wrong)
    return args
