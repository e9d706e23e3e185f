"""Time from launch to the first step for corpora of two sizes: a launch must cost the same whatever the corpus size.

Each corpus is a prepared dataset (default: the demo's) whose train shard is copied (real copies, not links) under new
names to the size asked, with a merged index, a manifest and the verification record `prepare` writes. A launch is
`python -m pretrain train` on one rank with a fresh output folder, timed from the process start to its first
metrics row (step 1); the two sizes alternate, pair by pair. `--full-verify` deletes the record before every launch:
what every launch did before the record existed (hash every shard file). `--cold` evicts the shard files from the
page cache before every launch (posix_fadvise DONTNEED), as a node that has not read them yet.

    python -m benchmarks.launch_time --data runs/demo/data --sizes-gb 0.2 2 --pairs 3 [--full-verify] [--cold]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.arguments import REPO, add_shared, repo_pythonpath, results_file
from data_pipeline.dataset_dir import INDEX, DatasetDir
from data_pipeline.shard_record import RECORD, record_dataset
from pretrain.engine.hardware import cpu_name
from pretrain.run_dir import RunDir


def build_corpus(data: Path, out: Path, size_gb: float) -> dict:
    """`data` with its train shard copied until the train split holds `size_gb`; reused when already built."""
    done = out / "corpus.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(out, ignore_errors=True)
    src = DatasetDir(data)
    (shard,) = json.loads(src.index("train").read_text())["shards"][:1]
    files = {part: shard[part]["basename"] for part in ("raw_data", "zip_data") if shard.get(part)}
    per_copy = sum((src.split("train") / name).stat().st_size for name in files.values())
    copies = max(1, round(size_gb * 1e9 / per_copy))
    shutil.copytree(src.tokenizer, DatasetDir(out).tokenizer)
    shutil.copytree(src.split("validation"), DatasetDir(out).split("validation"))
    train = DatasetDir(out).split("train")
    (train / "shards").mkdir(parents=True)
    shards = []
    for i in range(copies):
        entry = json.loads(json.dumps(shard))
        for part, name in files.items():
            entry[part]["basename"] = f"shards/{i:06d}.{Path(name).name}"
            shutil.copyfile(src.split("train") / name, train / entry[part]["basename"])
        shards.append(entry)
    (train / INDEX).write_text(json.dumps({"version": 2, "shards": shards}))
    manifest = json.loads(src.manifest.read_text())
    manifest["splits"]["train"] = {k: v * copies for k, v in manifest["splits"]["train"].items()}
    record_dataset(out)  # as prepare leaves it
    DatasetDir(out).manifest.write_text(json.dumps(manifest, indent=2))
    info = {"copies": copies, "bytes": copies * per_copy, "samples": copies * shard["samples"]}
    done.write_text(json.dumps(info))
    return info


def evict(corpus: Path) -> None:
    """Drop the corpus's shard files from the page cache."""
    for path in DatasetDir(corpus).split("train").rglob("*.mds*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def launch(corpus: Path, run: Path, full_verify: bool, cold: bool) -> float:
    """Seconds from a one-rank launch's start to its first metrics row."""
    shutil.rmtree(run, ignore_errors=True)
    if full_verify:
        (DatasetDir(corpus).split("train") / RECORD).unlink(missing_ok=True)
    if cold:
        evict(corpus)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath()}
    args = ["train", "--config", "pretrain/configs/demo_mlm.yaml", f"data.path={corpus}", f"train.output_dir={run}",
            "train.max_steps=100", "train.log_every=1", "train.eval_every=0", "train.save_every=1000",
            "train.zero_stage=0", "train.precision=fp32"]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = RunDir(run).metrics
    try:
        while not (metrics.is_file() and metrics.read_text().strip()):
            if proc.poll() is not None:
                raise SystemExit(f"the launch on {corpus} ended before its first step: {proc.stderr.read()[-2000:]}")
            time.sleep(0.02)
        return time.perf_counter() - start
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    """Build the corpora, alternate their launches, print the medians and the ratio pair by pair."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, data="runs/demo/data", work="runs/launch_time", out=results_file("launch_time"))
    parser.add_argument("--sizes-gb", type=float, nargs=2, default=[0.2, 2.0], help="the two train-split sizes")
    parser.add_argument("--pairs", type=int, default=3, help="alternated launches of each size")
    parser.add_argument("--full-verify", action="store_true", help="hash every shard at every launch (as before)")
    parser.add_argument("--cold", action="store_true", help="evict the shards from the page cache before each launch")
    args = parser.parse_args()
    work = Path(args.work)
    corpora = {size: (work / f"corpus_{size:g}gb", build_corpus(Path(args.data), work / f"corpus_{size:g}gb", size))
               for size in args.sizes_gb}
    times: dict[float, list[float]] = {size: [] for size in args.sizes_gb}
    for pair in range(args.pairs + 1):  # the first pair warms up: not counted
        for size, (corpus, _) in corpora.items():
            seconds = launch(corpus, work / "run", args.full_verify, args.cold)
            if pair:
                times[size].append(seconds)
            print(f"pair {pair}{' (warm-up)' if not pair else ''}: {size:g} GB {seconds:.2f} s", flush=True)
    small, large = args.sizes_gb
    ratios = [b / a for a, b in zip(times[small], times[large])]
    result = {"machine": cpu_name(), "full_verify": args.full_verify, "cold": args.cold,
              "corpora": {f"{size:g}": info for size, (_, info) in corpora.items()}, "seconds": {f"{s:g}": t for s, t in times.items()},
              "median_s": {f"{s:g}": statistics.median(t) for s, t in times.items()},
              "large_over_small": ratios, "median_ratio": statistics.median(ratios)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"launch to first step: {small:g} GB {result['median_s'][f'{small:g}']:.2f} s, {large:g} GB "
          f"{result['median_s'][f'{large:g}']:.2f} s; large/small {result['median_ratio']:.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}), {'full verify' if args.full_verify else 'record'}"
          f"{', cold' if args.cold else ''}")


if __name__ == "__main__":
    main()
