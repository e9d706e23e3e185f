"""Read a prepared split with the project's loader on every rank, optionally resuming, and record sample ids.

Usage (under torchrun or alone):
  python tests/helpers/loader_walk.py --data DIR --batch B --batches K --out DIR [--state-in FILE] [--state-out FILE]
K < 0 reads to the end of the epoch. Each rank writes OUT/rank<N>.json: a list of per-batch sample-id lists,
and OUT/masks<N>.json: each sample's masked positions ({sample id: positions}), masked by the training collate.
"""
import argparse
import json
import os
from pathlib import Path

from data_pipeline.batches import MaskingCollate
from data_pipeline.loader import LoaderConfig, build_loader
from data_pipeline.masking import MaskingConfig, build_masking


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
    # Ids 0-4 are the special tokens of the test dataset (tokens are drawn from 5-99).
    masking = build_masking(MaskingConfig(mask_prob=0.3), vocab_size=100, mask_id=4, special_ids=[0, 1, 2, 3, 4])
    loader = build_loader(cfg, "train", args.batch, collate_fn=MaskingCollate(masking, pad_id=0, seed=11))
    if args.state_in:
        loader.load_state_dict(json.loads(Path(args.state_in).read_text()))
    seen, masks = [], {}
    for batch in loader:
        seen.append(batch["sample_id"].tolist())
        for sid, labels in zip(batch["sample_id"].tolist(), batch["labels"]):
            masks[sid] = (labels != -100).nonzero().squeeze(1).tolist()
        if len(seen) == args.batches:
            break
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(seen))
    (Path(args.out) / f"masks{rank}.json").write_text(json.dumps(masks))
    if args.state_out and rank == 0:
        Path(args.state_out).write_text(json.dumps(loader.state_dict()))


if __name__ == "__main__":
    main()
