"""Loader throughput (StreamingDataLoader + collate + masking) against what training consumes.

    python -m benchmarks.loader_throughput --data runs/demo/data --run runs/demo/train [--batches 400]

The loader side reads `--batches` micro-batches of one rank, with 0 and 2 loader workers, masked
with BERT masking in the loader's collate as training does (in the workers when there are any). The training side reads samples/s and the fraction of
step time spent waiting for data from a finished run's metrics.jsonl (`make demo` writes one).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING
from benchmarks.arguments import add_shared, results_file
from pretrain.run_dir import RunDir

if TYPE_CHECKING:  # annotations only: streaming is imported when the loader is built
    from streaming import StreamingDataLoader

REPO = Path(__file__).resolve().parents[1]


def masked_loader(data: str, batch: int, workers: int) -> StreamingDataLoader:
    """One rank's training loader over `data`, BERT-masked in its collate as training does."""
    from data_pipeline.batches import MaskingCollate
    from data_pipeline.loader import LoaderConfig, build_loader
    from data_pipeline.masking import MaskingConfig, build_masking
    from data_pipeline.shards import read_manifest

    tok = read_manifest(data)["tokenizer"]
    masking = build_masking(MaskingConfig(), tok["vocab_size"], tok["mask_id"], tok["special_ids"])
    collate = MaskingCollate(masking, tok["pad_id"], seed=0)
    return build_loader(LoaderConfig(path=data, num_workers=workers), "train", batch, collate_fn=collate)


def loader_rate(data: str, batch: int, workers: int, batches: int) -> dict:
    """Sequences and tokens per second through loader + masking, for one rank."""
    loader = masked_loader(data, batch, workers)
    seqs = tokens = n = 0
    start = None
    while n < batches:
        for b in loader:
            if start is None:  # the first batch pays worker start-up (and a zstd shard's decompression)
                start = time.perf_counter()
                continue
            seqs += b["input_ids"].shape[0]
            tokens += int(b["attention_mask"].sum())
            n += 1
            if n >= batches:
                break
    elapsed = time.perf_counter() - start
    return {"workers": workers, "batch": batch, "sequences_per_s": round(seqs / elapsed), "tokens_per_s": round(tokens / elapsed)}


def pass_restart(data: str, batch: int, workers: int, passes: int, step_s: float) -> dict:
    """The wait for the first batch of each new pass over the data (the trainer starts a new iterator there, and the
    loader forks its workers again) against the median wait inside a pass, with `step_s` of sleep standing for a
    training step so that the workers run ahead as they do in training."""
    import statistics

    loader = masked_loader(data, batch, workers)
    first, inside, ending = [], [], 0.0
    for p in range(passes + 1):
        it, waits = iter(loader), []
        while True:
            start = time.perf_counter()
            got = next(it, None)  # the end of a pass shuts its workers down: that wait belongs to the restart
            waits.append(1000 * (time.perf_counter() - start))
            if got is None:
                break
            time.sleep(step_s)
        if p:  # the very first batch also pays the dataset's opening: not a restart
            first.append(ending + waits[0])
        ending = waits.pop()
        inside.extend(waits[1:])
    return {"workers": workers, "batch": batch, "step_s": step_s, "batches_per_pass": len(waits),
            "restart_ms": [round(w, 1) for w in first], "inside_pass_median_ms": round(statistics.median(inside), 2)}


def training_rate(run: Path) -> dict:
    """Mean samples/s and data-wait fraction over a run's logged steps (after the first window)."""
    rows = RunDir(run).metric_rows()
    rows = [r for r in rows if r["split"] == "train" and "samples_per_s" in r][1:]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    return {"samples_per_s": round(mean("samples_per_s"), 1), "tokens_per_s": round(mean("tokens_per_s")),
            "data_wait_fraction": round(mean("data_wait_fraction"), 4)}


def main() -> None:
    """Print a table and write JSON."""
    parser = argparse.ArgumentParser()
    add_shared(parser, data=str(REPO / "runs/demo/data"))
    parser.add_argument("--run", default=str(REPO / "runs/demo/train"))
    add_shared(parser, batch=16)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--pass-restarts", type=int, default=0, metavar="N",
                        help="also time the first batch of N new passes over the data (2 workers), as training sees it")
    parser.add_argument("--step-ms", type=float, default=100.0, help="the training step --pass-restarts stands in for")
    add_shared(parser, out=results_file("loader_throughput"))
    args = parser.parse_args()
    loaders = [loader_rate(args.data, args.batch, w, args.batches) for w in (0, 2)]
    training = training_rate(Path(args.run)) if RunDir(args.run).metrics.is_file() else None
    print(f"{'loader workers':>14} {'batch':>6} {'sequences/s':>12} {'tokens/s':>10}")
    for r in loaders:
        print(f"{r['workers']:>14} {r['batch']:>6} {r['sequences_per_s']:>12,} {r['tokens_per_s']:>10,}")
    if training:
        print(f"training consumed {training['samples_per_s']} samples/s ({training['tokens_per_s']:,} tokens/s) over all ranks; "
              f"data wait {100 * training['data_wait_fraction']:.2f}% of step time")
    restarts = pass_restart(args.data, args.batch, 2, args.pass_restarts, args.step_ms / 1000) if args.pass_restarts else None
    if restarts:
        print(f"a new pass's first batch waited {', '.join(f'{w:.0f}' for w in restarts['restart_ms'])} ms (2 workers, "
              f"{restarts['batches_per_pass']} batches a pass, a {args.step_ms:.0f} ms step); inside a pass "
              f"{restarts['inside_pass_median_ms']:.1f} ms (median)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "cpu_count": os.cpu_count(), "loader": loaders,
                                          "training": training, "pass_restarts": restarts}, indent=2) + "\n")


if __name__ == "__main__":
    main()
