"""benchmarks/upload_beside_steps.py through benchmarks/slow_bucket.py, as BENCHMARKS.md runs it: the loop's windows
alone and beside a real upload alternate, and each upload lands whole in the bucket at the link's speed."""
import json
import sys

from conftest import run_python


def test_windows_alone_and_beside_an_upload_alternate_and_each_upload_is_whole(tmp_path):
    out = tmp_path / "beside.json"
    proc = run_python(["-m", "benchmarks.slow_bucket", "--bytes-per-s", "2000000", "--", sys.executable, "-m",
                       "benchmarks.upload_beside_steps", "--remote", "s3://ckpt/beside", "--mb", "4", "--pairs", "2",
                       "--window-s", "1", "--work", str(tmp_path / "work"), "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["pairs"]) == 2 and result["machine"]["cpu"]
    for pair in result["pairs"]:
        assert pair["files"] == 5  # four parts and the marker
        assert pair["idle_steps_per_s"] > 0 and pair["beside_steps_per_s"] > 0
        # 4 MiB through a 2 MB/s link: 2 s and the client's start, so the upload went through the relay, not straight
        # to the server (hundreds of MB/s).
        assert 0.2 < pair["upload_mb_per_s"] < 2.2, pair
    assert "beside an upload: " in proc.stdout and "of the steps a second alone (median of 2" in proc.stdout
