"""What this machine offers a training run: native bf16 or not, and the dense matmul peak MFU is measured against.

A CPU with AMX or AVX512-BF16 runs bf16 matmuls several times faster than fp32, as a GPU's tensor
cores do; one without them emulates bf16 and runs it several times *slower* (BENCHMARKS.md, "MFU on any
device, bf16 only where it is native"). So `train.precision: auto` picks bf16 only where the hardware has it.

MFU needs the device's peak. Known GPUs use their data sheets' dense peaks; any other device (every
CPU) is measured once: the best of a few large square matmuls in the training dtype, with the
threads this process trains with, cached per machine in ~/.cache/contrastive-pretrain/peak_tflops.json.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from core.atomic_files import write_text_atomic

# Dense bf16/fp16 and fp32 (non-tensor-core) TFLOP/s from the vendors' data sheets.
GPU_PEAKS = {"H100 PCIe": (756.0, 51.0), "H100": (989.0, 67.0), "H200": (989.0, 67.0), "A100": (312.0, 19.5),
             "L40S": (362.0, 91.6), "L40": (181.0, 90.5), "L4": (121.0, 30.3), "A10G": (70.0, 31.2),
             "A10": (125.0, 31.2), "V100": (125.0, 15.7)}
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_flags() -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    """The CPU's model name, or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def native_bf16() -> tuple[bool, str]:
    """Whether bf16 matmuls run natively here, and why (the GPU's support, or the CPU flags found)."""
    if torch.cuda.is_available():
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, f"{torch.cuda.get_device_name()} {'supports' if ok else 'lacks'} bf16"
    found = sorted(set(CPU_BF16_FLAGS) & cpu_flags())
    if found:
        return True, f"the CPU has {', '.join(found)}"
    return False, f"the CPU has none of {', '.join(CPU_BF16_FLAGS)} (bf16 would be emulated, several times slower than fp32)"


def resolve_precision(requested: str) -> tuple[str, str]:
    """(precision to train in, why): `auto` becomes bf16 where the hardware has it and fp32 elsewhere."""
    if requested != "auto":
        return requested, "set in the config"
    ok, why = native_bf16()
    return ("bf16" if ok else "fp32"), f"auto: {why}"


def datasheet_peak_tflops(precision: str) -> float:
    """Dense peak TFLOP/s of a known GPU for this precision (0 for an unknown GPU or a CPU)."""
    if not torch.cuda.is_available():
        return 0.0
    name = torch.cuda.get_device_name()
    for key in sorted(GPU_PEAKS, key=len, reverse=True):  # "L40S" before "L40" before "L4"
        if key in name:
            half, fp32 = GPU_PEAKS[key]
            return half if precision in ("bf16", "fp16") else fp32
    return 0.0


def measure_matmul_tflops(precision: str, size: Optional[int] = None, min_seconds: float = 0.2,
                          device: Optional[torch.device] = None) -> float:
    """Best TFLOP/s of size×size matmuls in this precision on this device, with this process's threads."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = size or (8192 if device.type == "cuda" else 1024)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device=device, dtype=DTYPES[precision]) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.matmul(a, b)  # the first call pays for kernel selection and page faults
    sync()
    best, spent, reps = float("inf"), 0.0, 0
    while reps < 3 or spent < min_seconds:
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        elapsed = time.perf_counter() - start
        best, spent, reps = min(best, elapsed), spent + elapsed, reps + 1
    return 2 * size**3 / best / 1e12


def _cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "contrastive-pretrain" / "peak_tflops.json"


def _machine_key(precision: str) -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    threads = "" if torch.cuda.is_available() else f"|threads={torch.get_num_threads()}"
    return f"{platform.node()}|{device}|{precision}{threads}|torch={torch.__version__}"


def _read_cache(cache: Path) -> dict[str, float]:
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measured again, never an error
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and v > 0} if isinstance(data, dict) else {}


def record_peak(precision: str, tflops: float, cache: Optional[Path] = None) -> float:
    """Merge a measurement into the machine's cache (the best one seen is kept) and return the cached peak."""
    cache = cache or _cache_path()
    entries = _read_cache(cache)
    key = _machine_key(precision)
    # A measurement taken while other work shared the cores reads low; the best one is the peak.
    entries[key] = max(tflops, entries.get(key, 0.0))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps(entries, indent=1) + "\n")
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return entries[key]


def device_peak_tflops(precision: str, cache: Optional[Path] = None) -> tuple[float, str]:
    """(dense peak TFLOP/s of this device in this precision, where it came from): data sheet, cache or measurement."""
    known = datasheet_peak_tflops(precision)
    if known:
        return known, f"data sheet of {torch.cuda.get_device_name()}"
    cache = cache or _cache_path()
    cached = _read_cache(cache).get(_machine_key(precision))
    if cached:
        return cached, f"measured {precision} matmul, cached in {cache}"
    peak = record_peak(precision, measure_matmul_tflops(precision), cache)
    threads = torch.get_num_threads()
    return peak, f"measured {precision} matmul, {threads} thread{'s' if threads > 1 else ''}"


@dataclass(frozen=True)
class Hardware:
    """What a run resolved about its device: the precision it trains in, the peak its MFU is measured against, and the
    lines that say where each came from (for the log)."""

    precision: str
    peak_tflops: float
    notes: tuple[str, ...]


def resolve_hardware(precision: str, peak_tflops: float = 0.0) -> Hardware:
    """`precision` (`auto` resolved for this device) and the device's peak TFLOP/s in it (`peak_tflops` when set)."""
    precision, why = resolve_precision(precision)
    source = "train.peak_tflops"
    if not peak_tflops:
        peak_tflops, source = device_peak_tflops(precision)
    return Hardware(precision, peak_tflops, (f"precision {precision} ({why})",
                                             f"MFU against {peak_tflops:.3g} TFLOP/s per device ({source})"))
