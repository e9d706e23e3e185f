"""The MLM head's vocabulary projection and loss, forward + backward, whole or fused in chunks (`train.vocab_loss_chunk`).

    python -m benchmarks.vocabulary_loss                              # BERT-base's head at 256 × 128: 4,864 rows × 30,522
    python -m benchmarks.vocabulary_loss --device cuda --compile --chunks 0 1024 4096
    python -m benchmarks.vocabulary_loss --chunks 1024 --out /tmp/x.json     # one setting per process (a CPU's peak)

Each setting runs the library's own `sparse_mlm` (model/objectives/mlm.py: the loss and the accuracy the trainer logs)
over random hidden vectors and targets, with the projection's weight and bias as trainable float32 masters and the
hidden rows needing a gradient, as in the trainer; bf16 autocast where `--precision bf16` (the default on a GPU).
Chunk 0 is the plain path: the [rows, vocabulary] logits at once. Reported: ms per forward + backward (median of
`--steps` after `--warmup`), and the peak memory: on a GPU the allocator's peak during the setting, on a CPU the
process's peak resident memory so far (so only the first setting of a process reads alone: give one per process).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from typing import Optional

import torch

from benchmarks.arguments import add_shared, parse_checked, results_file
from benchmarks.machine import machine
from core.atomic_files import write_text_atomic


def one_setting(chunk: int, args: argparse.Namespace, device: torch.device) -> dict:
    """Time `args.steps` forward + backward passes of the head's projection and loss at this chunk (0: whole)."""
    from model.objectives.mlm import sparse_mlm
    from model.vocabulary_loss import VocabularyHead

    torch.manual_seed(0)  # the same weights, rows and targets for every setting
    gen = torch.Generator().manual_seed(0)
    projection = torch.nn.Linear(args.hidden, args.vocab).to(device)
    head = VocabularyHead(lambda rows: rows, projection)
    hidden = (torch.randn(1, args.rows, args.hidden, generator=gen) * 0.5).to(device).requires_grad_()
    labels = torch.randint(0, args.vocab, (1, args.rows), generator=gen).to(device)
    index = torch.arange(args.rows, device=device)  # every row predicted: the flat index sparse_mlm reads
    step = torch.compile(sparse_mlm, dynamic=False) if args.compile else sparse_mlm
    bf16 = args.precision == "bf16"
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times, loss = [], None
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = step(hidden, labels, head, index, chunk)
        loss.backward()
        hidden.grad = projection.weight.grad = projection.bias.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else None
    return {"chunk": chunk, "ms": statistics.median(times) * 1e3, "ms_min": min(times) * 1e3,
            "ms_max": max(times) * 1e3, "loss": float(loss.detach()),
            "gpu_peak_mib": peak, "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shared(parser, steps=10, warmup=2, out=results_file("vocabulary_loss"))
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 4096], help="rows per pass (0: whole)")
    parser.add_argument("--rows", type=int, default=4864, help="predicted rows: 256 × 128 × 15%% by default")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: bf16 on a GPU, else fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss (static shapes)")
    return parser


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with parsed arguments that the parser alone cannot see ("" for nothing)."""
    if min(args.chunks) < 0 or args.steps < 1 or args.warmup < 0:
        return "--chunks must be >= 0, --steps >= 1 and --warmup >= 0"
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    """Run each chunk setting in turn; print a row each and write them with the environment."""
    args = parse_checked(build_parser(), check_args, argv)
    args.precision = args.precision or ("bf16" if torch.device(args.device).type == "cuda" else "fp32")
    device = torch.device(args.device)
    rows = []
    for chunk in args.chunks:
        rows.append(one_setting(chunk, args, device))
        print(json.dumps(rows[-1]), flush=True)
    env = {**machine(), "threads": torch.get_num_threads()}
    write_text_atomic(args.out, json.dumps({"env": env, "args": vars(args), "settings": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
