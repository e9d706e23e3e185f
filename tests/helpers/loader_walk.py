"""Read a prepared split with the project's loader on every rank, optionally resuming, and record sample ids.

Usage (under torchrun or alone):
  python tests/helpers/loader_walk.py --data DIR --batch B --batches K --out DIR [--state-in FILE] [--state-out FILE]
K < 0 reads to the end of the epoch. Each rank writes OUT/rank<N>.json: a list of per-batch sample-id lists.
"""
import argparse
import json
import os
from pathlib import Path

from data_pipeline.loader import LoaderConfig, build_loader


def main() -> None:
    """Walk the loader and save what each rank saw (and rank 0's resumable state)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--state-in")
    parser.add_argument("--state-out")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    cfg = LoaderConfig(path=args.data, shuffle=True, shuffle_seed=7, num_canonical_nodes=2)
    loader = build_loader(cfg, "train", args.batch)
    if args.state_in:
        loader.load_state_dict(json.loads(Path(args.state_in).read_text()))
    seen = []
    for batch in loader:
        seen.append(batch["sample_id"].tolist())
        if len(seen) == args.batches:
            break
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(seen))
    if args.state_out and rank == 0:
        Path(args.state_out).write_text(json.dumps(loader.state_dict()))


if __name__ == "__main__":
    main()
