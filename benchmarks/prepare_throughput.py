"""Data preparation throughput: ours (`prepare`) vs transformers' run_mlm.py recipe (datasets.map + group_texts).

Same corpus (the bundled KJV, repeated), same tokenizer (a fixed sentencepiece unigram, 8k), same
sequence length and the same number of processes. Both read the raw text with `datasets` and end
with packed sequences on disk (MDS shards for us, Arrow cache files for the baseline).

    python -m benchmarks.prepare_throughput [--repeat 4] [--workers 1 2] [--out benchmarks/results/prepare_throughput.json]
    python -m benchmarks.prepare_throughput --repeat 24 --workers 1 2 --no-baseline --cli   # scaling, 100 MB

`ours` is timed in this process after the imports (as a long-lived job would run it); `--cli` also
times `python -m data_pipeline prepare` end to end, start-up and the tokenizer's transformers
import included, as a user's command runs. Each worker count is checked to write the same shards.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import tempfile
import time
from itertools import chain
from pathlib import Path
from benchmarks.arguments import add_shared, results_file
from data_pipeline.dataset_dir import DatasetDir

REPO = Path(__file__).resolve().parents[1]


def make_corpus(workdir: Path, repeat: int) -> tuple[Path, int]:
    """The KJV repeated `repeat` times as one text file (documents separated by blank lines)."""
    text = gzip.open(REPO / "data" / "kjv.txt.gz", "rt", encoding="utf-8").read().strip()
    path = workdir / "corpus.txt"
    path.write_text("\n\n".join([text] * repeat) + "\n", encoding="utf-8")
    return path, path.stat().st_size


def make_tokenizer(workdir: Path, corpus: Path) -> Path:
    """Train the shared tokenizer once with our pipeline (not timed)."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    cfg = load_config(PrepareConfig, None, [f"output_dir={workdir / 'tok_run'}", f"sources=[{{kind: text, path: '{corpus}'}}]",
                                             "tokenizer.vocab_size=8000", "tokenizer.max_training_documents=2000", "val_fraction=0",
                                             "max_documents=2000"])
    return DatasetDir(prepare(cfg)).tokenizer


def run_ours(workdir: Path, corpus: Path, tok_dir: Path, workers: int, seq_len: int) -> dict:
    """Time `prepare` with a pretrained tokenizer (reading, tokenizing, packing, writing shards)."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    out = workdir / f"ours_w{workers}"
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={out}", f"sources=[{{kind: text, path: '{corpus}'}}]", f"tokenizer.pretrained={tok_dir}",
        f"seq_len={seq_len}", "val_fraction=0", f"num_workers={workers}", "compression=zstd"])  # as recorded
    start = time.perf_counter()
    prepare(cfg)
    elapsed = time.perf_counter() - start
    manifest = json.loads(DatasetDir(out).manifest.read_text())
    return {"seconds": elapsed, "tokens": manifest["splits"]["train"]["tokens"], "sequences": manifest["splits"]["train"]["sequences"]}


def run_cli(workdir: Path, corpus: Path, tok_dir: Path, workers: int, seq_len: int) -> dict:
    """Time the command line end to end (interpreter start-up and imports included)."""
    import subprocess
    import sys

    out = workdir / f"cli_w{workers}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "data_pipeline", "prepare", "--config", str(REPO / "data_pipeline/configs/demo.yaml"),
                    f"output_dir={out}", f"sources=[{{kind: text, path: '{corpus}'}}]", f"tokenizer.pretrained={tok_dir}",
                    f"seq_len={seq_len}", "val_fraction=0", f"num_workers={workers}", "compression=zstd"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    elapsed = time.perf_counter() - start
    manifest = json.loads(DatasetDir(out).manifest.read_text())
    return {"seconds": elapsed, "tokens": manifest["splits"]["train"]["tokens"], "sequences": manifest["splits"]["train"]["sequences"]}


def _shards(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "train").rglob("*")) if p.is_file()}


def run_baseline(workdir: Path, corpus: Path, tok_dir: Path, workers: int, seq_len: int) -> dict:
    """transformers examples/pytorch/language-modeling/run_mlm.py without --line_by_line."""
    import datasets
    from transformers import AutoTokenizer

    cache = workdir / f"hf_cache_w{workers}"
    start = time.perf_counter()
    raw = datasets.load_dataset("text", data_files={"train": str(corpus)}, sample_by="paragraph", cache_dir=str(cache))
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize_function, batched=True, num_proc=workers if workers > 1 else None, remove_columns=["text"])

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // seq_len) * seq_len
        return {k: [t[i: i + seq_len] for i in range(0, total_length, seq_len)] for k, t in concatenated.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=workers if workers > 1 else None)
    elapsed = time.perf_counter() - start
    n = len(grouped["train"])
    return {"seconds": elapsed, "tokens": n * seq_len, "sequences": n}


def main() -> None:
    """Run both pipelines for each worker count; print a table and write JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seq-len", type=int, default=128)
    add_shared(parser, out=results_file("prepare_throughput"))
    parser.add_argument("--no-baseline", action="store_true", help="skip the HF datasets.map baseline")
    parser.add_argument("--cli", action="store_true", help="also time the command line end to end")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import logging

    logging.disable(logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    try:
        corpus, size = make_corpus(workdir, args.repeat)
        tok_dir = make_tokenizer(workdir, corpus)
        rows = []
        pipelines = [("ours (prepare)", run_ours)] + ([("ours, CLI end to end", run_cli)] if args.cli else []) + \
            ([] if args.no_baseline else [("HF datasets.map + group_texts", run_baseline)])
        first: dict[str, float] = {}
        for workers in args.workers:
            results = {name: fn(workdir, corpus, tok_dir, workers, args.seq_len) for name, fn in pipelines}
            for name, r in results.items():
                first.setdefault(name, r["seconds"])
                row = {"pipeline": name, "workers": workers, "seconds": round(r["seconds"], 2),
                       "MB_per_s": round(size / 1e6 / r["seconds"], 2), "tokens_per_s": round(r["tokens"] / r["seconds"]),
                       "sequences": r["sequences"], "vs_first_worker_count": round(first[name] / r["seconds"], 2)}
                if name.startswith("ours (") and "HF datasets.map + group_texts" in results:
                    row["speedup_vs_hf"] = round(results["HF datasets.map + group_texts"]["seconds"] / r["seconds"], 2)
                rows.append(row)
            if workers != args.workers[0]:
                same = _shards(workdir / f"ours_w{workers}") == _shards(workdir / f"ours_w{args.workers[0]}")
                rows[-len(results)]["same_shards_as_first"] = same
        print(f"corpus: {size / 1e6:.1f} MB of text, seq_len {args.seq_len}, {os.cpu_count()} CPU cores")
        print(f"{'pipeline':32} {'workers':>7} {'seconds':>8} {'MB/s':>6} {'tokens/s':>10} {'scaling':>8} {'vs HF':>6}")
        for r in rows:
            print(f"{r['pipeline']:32} {r['workers']:>7} {r['seconds']:>8} {r['MB_per_s']:>6} {r['tokens_per_s']:>10,} "
                  f"{r['vs_first_worker_count']:>8} {r.get('speedup_vs_hf', ''):>6} {r.get('same_shards_as_first', '')}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"corpus_mb": size / 1e6, "seq_len": args.seq_len, "cpu_count": os.cpu_count(),
                                              "machine": platform.platform(), "rows": rows}, indent=2) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
