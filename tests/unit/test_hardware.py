"""The machine facts a run relies on: `precision: auto` and the measured, cached peak that MFU divides by."""
import json

import pytest
import torch

from pretrain.engine import hardware


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("flags, want", [({"avx2", "amx_bf16", "amx_tile"}, "bf16"), ({"avx512f", "avx512_bf16"}, "bf16"),
                                         ({"avx2", "fma"}, "fp32"), (set(), "fp32")])
def test_auto_precision_follows_the_cpu_flags(cpu_only, monkeypatch, flags, want):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    precision, why = hardware.resolve_precision("auto")
    assert precision == want
    assert why.startswith("auto: ") and ("amx_bf16" in why or "avx512_bf16" in why)
    for explicit in ("fp32", "bf16", "fp16"):  # an explicit choice is kept whatever the hardware
        assert hardware.resolve_precision(explicit) == (explicit, "set in the config")


def test_cpu_flags_are_read_from_proc_cpuinfo():
    text = open("/proc/cpuinfo").read()
    line = next(line for line in text.splitlines() if line.startswith("flags"))
    assert hardware.cpu_flags() == set(line.split(":", 1)[1].split())
    assert ("sse2" in hardware.cpu_flags()) == ("sse2" in line.split())


def test_peak_is_measured_in_the_training_dtype(cpu_only, monkeypatch):
    seen = []
    matmul = torch.matmul

    def recording(a, b):
        seen.append((a.dtype, b.dtype, tuple(a.shape)))
        return matmul(a, b)

    monkeypatch.setattr(torch, "matmul", recording)
    tflops = hardware.measure_matmul_tflops("bf16", size=128, min_seconds=0.0)
    assert 0 < tflops < 1000
    assert len(seen) >= 4 and set(seen) == {(torch.bfloat16, torch.bfloat16, (128, 128))}


def test_peak_is_measured_once_per_machine_and_cached(cpu_only, monkeypatch, tmp_path):
    cache = tmp_path / "peak.json"
    calls = []
    monkeypatch.setattr(hardware, "measure_matmul_tflops", lambda precision: calls.append(precision) or 0.123)
    assert hardware.device_peak_tflops("fp32", cache)[0] == 0.123
    peak, source = hardware.device_peak_tflops("fp32", cache)
    assert (peak, calls) == (0.123, ["fp32"]) and "cached" in source
    assert list(json.loads(cache.read_text()).values()) == [0.123]
    hardware.device_peak_tflops("bf16", cache)  # another dtype is another peak
    assert calls == ["fp32", "bf16"] and len(json.loads(cache.read_text())) == 2
    cache.write_text("{not json")  # a damaged cache is measured again, not an error
    assert hardware.device_peak_tflops("fp32", cache)[0] == 0.123 and calls[-1] == "fp32"
    assert json.loads(cache.read_text())  # and rewritten whole
    # A later, better measurement (benchmarks/peak.py on an idle machine) raises the peak; a worse one does not lower it.
    assert hardware.record_peak("fp32", 0.2, cache) == 0.2 and hardware.record_peak("fp32", 0.1, cache) == 0.2
    assert hardware.device_peak_tflops("fp32", cache)[0] == 0.2


def test_known_gpus_use_their_data_sheet(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "measure_matmul_tflops", lambda precision: pytest.fail("a known GPU is not measured"))
    for name, want in [("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA H100 PCIe", 756.0),
                       ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA A10G", 70.0)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda n=name: n)
        assert hardware.device_peak_tflops("bf16", tmp_path / "peak.json")[0] == want, name
    assert hardware.datasheet_peak_tflops("fp32") == 31.2  # the A10G's fp32


def test_a_peak_given_in_the_config_is_the_one_mfu_uses_and_the_log_says_so(cpu_only, monkeypatch):
    monkeypatch.setattr(hardware, "measure_matmul_tflops", lambda precision: pytest.fail("measured despite the config"))
    got = hardware.resolve_hardware("fp32", peak_tflops=123.0)
    assert got.peak_tflops == 123.0 and got.notes[1] == "MFU against 123 TFLOP/s per device (train.peak_tflops)"
