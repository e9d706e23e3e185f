"""A bucket on this machine behind a slow link: what checkpoint uploads cost a run.

    python -m benchmarks.slow_bucket --bytes-per-s 100000 -- \\
        python -m pretrain train --config pretrain/configs/demo_mlm.yaml ... train.checkpoint_remote=s3://ckpt/run

starts moto's S3 server with the buckets `corpus` and `ckpt`, and a TCP relay in front of it whose uploads crawl at
--bytes-per-s (a node's link to a distant bucket), runs the command with S3_ENDPOINT_URL and test credentials
pointing at the relay, prints its exit code and wall seconds, and exits with its code. Real HTTP, real boto3, real
moto, only slower; the object-storage tests use the same relay.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import threading
import time
from typing import Optional

BUCKETS = ("corpus", "ckpt")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}


class SlowLink:
    """A TCP relay to `target_port` on this machine whose client-to-server bytes pass at `bytes_per_s` (uploads crawl,
    answers do not)."""

    def __init__(self, target_port: int, bytes_per_s: float) -> None:
        self.target, self.delay = target_port, 4096 / bytes_per_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, self.delay), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, 0.0), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while chunk := src.recv(4096):
                if delay:
                    time.sleep(delay * len(chunk) / 4096)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop accepting connections (those open end with their peers)."""
        self.listener.close()


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command against the slow bucket; its exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes-per-s", type=float, default=100_000, help="the link's upload speed")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:  # a free port for moto
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    link = SlowLink(port, args.bytes_per_s)
    try:
        env = {**os.environ, **CREDENTIALS, "S3_ENDPOINT_URL": f"http://127.0.0.1:{link.port}"}
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        for bucket in BUCKETS:
            client.create_bucket(Bucket=bucket)
        t0 = time.perf_counter()
        code = subprocess.call(command, env=env)
        print(f"slow_bucket: exit {code}, {time.perf_counter() - t0:.1f} s wall, uploads at {args.bytes_per_s:g} B/s",
              flush=True)
    finally:
        link.close()
        server.stop()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
