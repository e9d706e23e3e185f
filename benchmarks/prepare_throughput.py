"""Data preparation throughput: ours (`prepare`) vs transformers' run_mlm.py recipe (datasets.map + group_texts).

Same corpus (the bundled KJV, repeated), same tokenizer (a fixed sentencepiece unigram, 8k), same
sequence length and the same number of processes. Both read the raw text with `datasets` and end
with packed sequences on disk (MDS shards for us, Arrow cache files for the baseline).

    python benchmarks/prepare_throughput.py [--repeat 4] [--workers 1 2] [--out benchmarks/results/prepare_throughput.json]
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
                                             "tokenizer.vocab_size=8000", "tokenizer.max_training_documents=2000", "val_fraction=0"])
    return prepare(cfg) / "tokenizer"


def run_ours(workdir: Path, corpus: Path, tok_dir: Path, workers: int, seq_len: int) -> dict:
    """Time `prepare` with a pretrained tokenizer (reading, tokenizing, packing, writing shards)."""
    from core.config_io import load_config
    from data_pipeline.config import PrepareConfig
    from data_pipeline.prepare import prepare

    out = workdir / f"ours_w{workers}"
    cfg = load_config(PrepareConfig, None, [
        f"output_dir={out}", f"sources=[{{kind: text, path: '{corpus}'}}]", f"tokenizer.pretrained={tok_dir}",
        f"seq_len={seq_len}", "val_fraction=0", f"num_workers={workers}"])
    start = time.perf_counter()
    prepare(cfg)
    elapsed = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    return {"seconds": elapsed, "tokens": manifest["splits"]["train"]["tokens"], "sequences": manifest["splits"]["train"]["sequences"]}


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
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "prepare_throughput.json"))
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import logging

    logging.disable(logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    try:
        corpus, size = make_corpus(workdir, args.repeat)
        tok_dir = make_tokenizer(workdir, corpus)
        rows = []
        for workers in args.workers:
            ours = run_ours(workdir, corpus, tok_dir, workers, args.seq_len)
            base = run_baseline(workdir, corpus, tok_dir, workers, args.seq_len)
            for name, r in (("ours (prepare)", ours), ("HF datasets.map + group_texts", base)):
                rows.append({"pipeline": name, "workers": workers, "seconds": round(r["seconds"], 2),
                             "MB_per_s": round(size / 1e6 / r["seconds"], 2), "tokens_per_s": round(r["tokens"] / r["seconds"]),
                             "sequences": r["sequences"]})
            rows[-2]["speedup"] = round(base["seconds"] / ours["seconds"], 2)
        print(f"corpus: {size / 1e6:.1f} MB of text, seq_len {args.seq_len}, {os.cpu_count()} CPU cores")
        print(f"{'pipeline':32} {'workers':>7} {'seconds':>8} {'MB/s':>6} {'tokens/s':>10} {'speedup':>8}")
        for r in rows:
            print(f"{r['pipeline']:32} {r['workers']:>7} {r['seconds']:>8} {r['MB_per_s']:>6} {r['tokens_per_s']:>10,} {r.get('speedup', ''):>8}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"corpus_mb": size / 1e6, "seq_len": args.seq_len, "cpu_count": os.cpu_count(),
                                              "machine": platform.platform(), "rows": rows}, indent=2) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
