"""benchmarks/slow_bucket.py: a command runs against a real moto S3 server whose uploads crawl at the link's speed."""
import sys

from conftest import run_python

# 100 KB into the `ckpt` bucket through S3_ENDPOINT_URL, as a training run's checkpoint upload goes; its seconds,
# then an exit code of its own.
UPLOAD = """import os, time, boto3
client = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
t0 = time.perf_counter()
client.put_object(Bucket="ckpt", Key="run/blob", Body=os.urandom(100_000))
assert client.head_object(Bucket="ckpt", Key="run/blob")["ContentLength"] == 100_000
print(f"uploaded in {time.perf_counter() - t0:.2f} s")
raise SystemExit(3)
"""


def test_the_command_uploads_at_the_link_s_speed_and_its_exit_code_is_the_benchmark_s():
    proc = run_python(["-m", "benchmarks.slow_bucket", "--bytes-per-s", "50000", "--", sys.executable, "-c", UPLOAD])
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    seconds = float(proc.stdout.split("uploaded in ")[1].split()[0])
    assert 1.8 < seconds < 30, proc.stdout  # 100 KB at 50 KB/s: 2 s, not the local server's milliseconds
    assert "slow_bucket: exit 3," in proc.stdout and "uploads at 50000 B/s" in proc.stdout
