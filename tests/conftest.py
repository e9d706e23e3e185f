"""Shared fixtures: a small real-text corpus, a prepared dataset, and a torchrun launcher."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "model.architecture=bert",  # the demo config is ModernBERT; these tests name BERT classes (ModernBERT: test_backbones)
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.max_position_embeddings=64",
]


def kjv_chapters(n: int) -> list[str]:
    """The first n chapters of the bundled corpus (real English text)."""
    with gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8") as fh:
        return fh.read().split("\n\n")[:n]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """A plain-text corpus of 60 documents separated by blank lines."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(kjv_chapters(60)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, corpus_file) -> Path:
    """The corpus prepared with a 400-token unigram tokenizer into 64-token sequences."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    out = tmp_path_factory.mktemp("prepared") / "data"
    cfg = load_config(
        PrepareConfig,
        None,
        [f"output_dir={out}", "sources=[{kind: text, path: '" + str(corpus_file) + "'}]",
         "tokenizer.vocab_size=400", "tokenizer.character_coverage=1.0", "seq_len=64", "val_fraction=0.1"],
    )
    return prepare(cfg)


def run_cli(module: str, args: list[str], nproc: int = 1, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m module args` (under torchrun when nproc > 1) from the repo root."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", module, *args]
    else:
        cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


@contextlib.contextmanager
def restored_environ():
    """Undo what in-process library code (DeepSpeed set-up) writes to os.environ: later launches must not inherit it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def free_port() -> int:
    """A TCP port nobody listens on right now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(args: list[str], n: int, log_dir: Path) -> list[subprocess.Popen]:
    """Start n ranks of `python -m pretrain args` as separate processes with the env srun or torchrun would give them."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(n):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
        out = open(log_dir / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.STDOUT))
    return procs


def wait_for_step(run: Path, step: int, procs, timeout: float = 120) -> None:
    """Block until the run's metrics.jsonl reaches `step` (failing if a rank exits first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run / "metrics.jsonl"
        if path.is_file() and any(json.loads(line)["step"] >= step for line in path.read_text().splitlines() if line.strip()):
            return
        assert all(p.poll() is None for p in procs), "a rank exited early"
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached")
