"""What a checkpoint upload in rank 0's background costs the training loop that shares its process.

Rank 0 uploads a scheduled checkpoint in a thread (pretrain/checkpointing/remote_checkpoints.py, `Upload`) while its
main thread trains on. On a GPU node the upload has cores of its own but not the interpreter's lock, which the loop
needs to launch every kernel. This measures a host-bound loop (an eager step of a tiny transformers BERT on the CPU:
forward, backward and an optimizer step, almost all of it Python and the dispatcher, as an eager GPU step's host
side is) in windows with the real `Upload` of a checkpoint-sized folder running beside it, alternated with windows
without one. Reported: steps a second in each, their ratio pair by pair, and the upload's MB/s.

Run it against a bucket (S3_ENDPOINT_URL and credentials), e.g. moto behind benchmarks/slow_bucket.py's relay:

    taskset -c 1 python -m benchmarks.slow_bucket --bytes-per-s 1e10 -- \\
        taskset -c 0 python -m benchmarks.upload_beside_steps --remote s3://ckpt/beside --mb 256
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

from benchmarks.arguments import add_shared, results_file
from benchmarks.machine import machine
from pretrain.checkpointing.checkpoint_dir import COMPLETE, CheckpointDir
from pretrain.checkpointing.remote_checkpoints import RemoteCheckpoints, Upload
from pretrain.run_dir import RunDir

TAG = "step_00000001"


def write_checkpoint(root: Path, mb: int, files: int) -> CheckpointDir:
    """A checkpoint tag of `files` files of random bytes, `mb` MiB in all, and its marker."""
    local = CheckpointDir(root)
    shutil.rmtree(root, ignore_errors=True)
    local.tag(TAG).mkdir(parents=True)
    for i in range(files):
        (local.tag(TAG) / f"part_{i}.pt").write_bytes(os.urandom(mb * 2**20 // files))
    (local.tag(TAG) / COMPLETE).write_text("{}\n")
    return local


def host_bound_step() -> Callable[[], None]:
    """One eager training step of a tiny BERT on the CPU, as a callable (its model and optimizer made once)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, 400, (2, 16))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def steps_per_s(step: Callable[[], None], seconds: float,
                until: Optional[Callable[[], bool]] = None) -> tuple[float, float]:
    """Steps a second over `seconds`, or until `until()` is true (whichever is first); and the seconds it took."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and not (until is not None and until()):
        step()
        n += 1
    elapsed = time.perf_counter() - t0
    return n / elapsed, elapsed


def measure(remote: str, local: CheckpointDir, mb: int, pairs: int, window_s: float) -> list[dict]:
    """`pairs` windows with an upload beside the loop, each after one without; their figures."""
    step = host_bound_step()
    steps_per_s(step, 2.0)  # warm-up: allocator, first-call paths
    rows, checkpoints = [], RemoteCheckpoints(remote, local)  # one for the run, as the trainer's
    for _ in range(pairs):
        idle, _ = steps_per_s(step, window_s)
        upload = Upload(checkpoints, TAG, keep_last=1, bound_s=3600)
        beside, seconds = steps_per_s(step, window_s, until=lambda: upload.done)
        if not upload.done:
            steps_per_s(step, 3600, until=lambda: upload.done)
        files, upload_s, _ = upload.wait()
        rows.append({"idle_steps_per_s": round(idle, 1), "beside_steps_per_s": round(beside, 1),
                     "ratio": round(beside / idle, 3), "window_s": round(seconds, 2),
                     "upload_mb_per_s": round(mb / upload_s, 1), "files": files})
        print(f"alone {idle:7.1f} steps/s | beside an upload {beside:7.1f} steps/s ({seconds:.1f} s) | ratio "
              f"{beside / idle:.3f} | upload {mb / upload_s:.1f} MB/s", flush=True)
    return rows


def main(argv: Optional[list[str]] = None) -> None:
    """Measure, print the median ratio, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared(parser, work="runs/upload_beside_steps", out=results_file("upload_beside_steps"))
    parser.add_argument("--remote", required=True, help="where the checkpoint goes (s3://BUCKET/PREFIX)")
    parser.add_argument("--mb", type=int, default=256, help="the checkpoint's size in MiB")
    parser.add_argument("--files", type=int, default=4, help="how many files it is split into")
    parser.add_argument("--pairs", type=int, default=6, help="windows alone and beside an upload, alternated")
    parser.add_argument("--window-s", type=float, default=5.0, help="the longest window (one beside an upload "
                        "ends with the upload)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    local = write_checkpoint(RunDir(Path(args.work).resolve()).checkpoints, args.mb, args.files)
    rows = measure(args.remote, local, args.mb, args.pairs, args.window_s)
    ratios = [r["ratio"] for r in rows]
    print(f"beside an upload: {statistics.median(ratios):.3f} of the steps a second alone (median of {len(rows)}, "
          f"{min(ratios):.3f}-{max(ratios):.3f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine(), "args": vars(args), "pairs": rows,
                                          "median_ratio": statistics.median(ratios)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
