"""The device's dense matmul peak per dtype: what the trainer's MFU divides by (pretrain/engine/hardware.py).

    python -m benchmarks.peak                 # 1 thread (a rank's share when ranks = cores) and all threads
    python -m benchmarks.peak --sizes 512 1024 2048 --json benchmarks/results/peak.json

The trainer measures the peak once per machine, dtype and thread count, at the size the table marks,
and caches it (~/.cache/contrastive-pretrain/peak_tflops.json). A measurement taken while other work
shared the cores reads low: run this on an idle machine and the cache keeps the best figure seen.
It also prints other sizes beside it, and what `train.precision: auto` picks.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    """Print (and optionally save) the measured matmul TFLOP/s per dtype, size and thread count."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="square matmul sizes (default: the trainer's)")
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1 and all cores")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from pretrain.engine import hardware

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else hardware.cpu_name()
    native, why = hardware.native_bf16()
    precision, _ = hardware.resolve_precision("auto")
    print(f"device: {device}\nnative bf16: {native} ({why}); train.precision=auto picks {precision}")
    default_size = 8192 if gpu else 1024
    sizes = args.sizes or [default_size]
    threads = [0] if gpu else (args.threads or sorted({1, os.cpu_count() or 1}))
    rows = []
    print("\n| dtype | threads | size | TFLOP/s |\n|---|---|---|---|")
    for dtype in args.dtypes:
        for n in threads:
            if n:
                torch.set_num_threads(n)
            for size in sizes:
                tflops = hardware.measure_matmul_tflops(dtype, size=size)
                rows.append({"dtype": dtype, "threads": n or None, "size": size, "tflops": tflops,
                             "trainer_size": size == default_size})
                mark = " (the trainer's size)" if size == default_size and len(sizes) > 1 else ""
                print(f"| {dtype} | {n or 'GPU'} | {size}{mark} | {tflops:.4f} |")
                if size == default_size and not hardware.datasheet_peak_tflops(dtype):
                    hardware.record_peak(dtype, tflops)  # cached per thread count; the best measurement is kept
    if gpu:
        for dtype in args.dtypes:
            print(f"data sheet {dtype}: {hardware.datasheet_peak_tflops(dtype) or 'unknown'} TFLOP/s")
    if args.json:
        from core.atomic_files import write_text_atomic

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps({"device": device, "native_bf16": native, "auto_precision": precision,
                                                       "cpu_flags_bf16": sorted(set(hardware.CPU_BF16_FLAGS) & hardware.cpu_flags()),
                                                       "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
