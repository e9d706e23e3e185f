"""benchmarks/peak.py, as README's MFU section tells a user to run it: it prints the table, writes its JSON, and
leaves the figure at the trainer's size in the cache the trainer's MFU reads (the best one seen kept)."""
import json
import sys
from typing import Iterator

import pytest
import torch

from benchmarks import peak
from pretrain.engine import hardware


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The rank's share on a machine with as many ranks as cores (what `--threads 1` measures), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _peak(monkeypatch, capsys, *args: str) -> str:
    """`python -m benchmarks.peak ARGS` in this process: what it printed."""
    monkeypatch.setattr(sys, "argv", ["peak", *args])
    peak.main()
    return capsys.readouterr().out


def test_the_measured_peak_is_printed_saved_and_read_by_the_trainer(tmp_path, monkeypatch, capsys, one_thread):
    """On a CPU (a GPU's peak is its data sheet's, never cached), the figure at the trainer's size is the one cached."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = _peak(monkeypatch, capsys, "--sizes", "256", "1024", "--threads", "1", "--dtypes", "fp32",
                "--json", str(tmp_path / "peak.json"))
    report = json.loads((tmp_path / "peak.json").read_text())
    assert [(r["dtype"], r["threads"], r["size"], r["trainer_size"]) for r in report["rows"]] == \
        [("fp32", 1, 256, False), ("fp32", 1, 1024, True)]
    assert all(r["tflops"] > 0 for r in report["rows"])
    assert report["auto_precision"] in ("fp32", "bf16") and f"train.precision=auto picks {report['auto_precision']}" in out
    measured = report["rows"][1]["tflops"]
    assert f"| fp32 | 1 | 1024 (the trainer's size) | {measured:.4f} |" in out, out
    # Only the trainer's size goes into the cache, under this machine, dtype and thread count.
    cache = tmp_path / "cache" / "contrastive-pretrain" / "peak_tflops.json"
    entries = json.loads(cache.read_text())
    assert list(entries.values()) == [measured] and list(entries)[0].endswith(f"|fp32|threads=1|torch={torch.__version__}")
    # The trainer's MFU divides by it, without measuring again.
    assert hardware.device_peak_tflops("fp32") == (measured, f"measured fp32 matmul, cached in {cache}")
    # A later, lower reading (other work sharing the core) does not replace it.
    key = list(entries)[0]
    cache.write_text(json.dumps({key: measured * 1000}) + "\n")
    _peak(monkeypatch, capsys, "--sizes", "1024", "--threads", "1", "--dtypes", "fp32")
    assert json.loads(cache.read_text()) == {key: measured * 1000}
