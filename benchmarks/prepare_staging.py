"""What `prepare` to a bucket keeps on its staging disk: the peak bytes of shard files under its TMPDIR, and the wall time.

One `python -m data_pipeline prepare` of a text file into a fresh prefix of an S3-compatible server: moto's, started
here, unless S3_ENDPOINT_URL names one (with its credentials in the environment). A thread samples the shard bytes
(`*.mds*`) under the staging TMPDIR every 2 ms. `--checkout` runs another checkout of this project (its PYTHONPATH
first), to compare two commits; alternate them with farm-bench:

    gunzip -c data/kjv.txt.gz > /tmp/kjv.txt   # a .gz file is one part: unpacked, it splits
    farm-bench -n 4 --vs 'python -m benchmarks.prepare_staging --text /tmp/kjv.txt --checkout /tmp/before' -- \
        python -m benchmarks.prepare_staging --text /tmp/kjv.txt
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

from benchmarks.arguments import REPO, results_file


def shard_bytes(folder: str) -> int:
    """Bytes of the MDS shard files under `folder` now (files that vanish meanwhile count 0)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            if ".mds" in name:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue
    return total


@contextlib.contextmanager
def peak_shard_bytes(folder: str | Path, every_s: float = 0.002) -> Iterator[list[int]]:
    """Sample `shard_bytes(folder)` every `every_s` in a thread while the block runs; yields a one-item list that
    holds the peak."""
    peak, running = [0], threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            peak[0] = max(peak[0], shard_bytes(folder))
            time.sleep(every_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield peak
    finally:
        running.clear()
        watcher.join()


def _server() -> tuple[dict[str, str], object]:
    """The S3 environment to use, and the moto server started for it (None when S3_ENDPOINT_URL is set)."""
    if os.environ.get("S3_ENDPOINT_URL"):
        return {}, None
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return {"S3_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}, server


def main() -> None:
    """Prepare once into a new prefix; print and record the staging peak and the wall time."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", required=True, help="a plain-text corpus (documents separated by blank lines)")
    parser.add_argument("--bucket", default="corpus", help="the bucket (created on moto)")
    parser.add_argument("--part-bytes", type=int, default=250_000, help="prepare's part_bytes")
    parser.add_argument("--workers", type=int, default=2, help="prepare's num_workers")
    parser.add_argument("--checkout", default=str(REPO), help="the checkout whose prepare runs")
    parser.add_argument("--out", default=results_file("prepare_staging"), help="a JSON line per run is appended here")
    args = parser.parse_args()
    extra, server = _server()
    env = {**os.environ, **extra, "PYTHONPATH": args.checkout, "OMP_NUM_THREADS": "1"}
    if server is not None:
        import boto3

        boto3.client("s3", endpoint_url=extra["S3_ENDPOINT_URL"], aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=args.bucket)
    staging = tempfile.mkdtemp(prefix="bench-staging-")
    start = time.perf_counter()
    with peak_shard_bytes(staging) as peak:
        proc = subprocess.run(
            [sys.executable, "-m", "data_pipeline", "prepare", "--config", f"{args.checkout}/data_pipeline/configs/demo.yaml",
             f"sources=[{{kind: text, path: '{Path(args.text).resolve()}', text_documents: paragraph}}]",
             f"output_dir=s3://{args.bucket}/{uuid.uuid4().hex}", f"part_bytes={args.part_bytes}",
             f"num_workers={args.workers}"],
            cwd=staging, env={**env, "TMPDIR": staging}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if server is not None:
        server.stop()
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed ({proc.returncode}): {proc.stderr[-2000:]}")
    row = {"checkout": args.checkout, "wall_s": round(wall, 2), "staging_peak_bytes": peak[0]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"prepare to a bucket: {wall:.1f} s, staging peak {peak[0] / 1e6:.2f} MB of shards ({args.checkout})")


if __name__ == "__main__":
    main()
