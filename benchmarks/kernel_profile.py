"""Device time per kernel over a few training steps, grouped by kind: where one step spends what another does not.

    prof = start_profile()          # torch.profiler over CPU and, where there is one, the GPU
    ... the steps ...
    times = kernel_times(stop_profile(prof), steps)    # ms per step by kernel name
    print(kind_table({"trainer": by_kind(times), "bare": by_kind(other)}))

Two compiled steps name their fused kernels differently (inductor numbers them per graph), so a comparison by name
says little; by kind (matmul, attention, fused elementwise, optimizer, copies, ...) it shows which part of the step
costs more. On a CPU the ops' self time stands in for kernels (oneDNN and ATen run on the host).
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.profiler import profile

# The first pattern that matches a kernel's name gives its kind; the order matters: a fused Adam is a multi-tensor
# kernel, a flash kernel (and cuDNN's helpers of its backward) is attention, and the compiler's pointwise and
# reduction kernels are named after every op they fused (a `bmm` among them does not make one a matmul; its matmul
# templates, `triton_tem_`, are matmuls). A GPU profile's annotation ranges are not kernels (`kernel_times`).
KINDS: tuple[tuple[str, str], ...] = (
    ("attention", r"fmha|flash|attention|cudnn_generated|cudnn::fusion|sdpa|_efficient_attention|mha"),
    ("optimizer", r"adam|lamb(?!da)|multi_tensor|foreach"),
    ("normalization", r"layer_norm|layernorm|rms_norm"),
    ("fused by the compiler", r"^triton_(poi|per|red)_|^cpp_fused|CompiledFxGraph"),
    ("matmul", r"^triton_tem_|gemm|cutlass|xmma|nvjet|sm\d+_|ampere_|hopper|matmul|\bmm\b|addmm|linear|cublas|brgemm|bmm"),
    ("cross-entropy", r"log_softmax|nll_loss|cross_entropy|softmax"),
    ("copy / fill", r"memcpy|memset|copy_|fill_|cat|to_copy|contiguous|clone"),
    ("gather / scatter / index", r"gather|scatter|index|embedding|topk|sort"),
    ("reduction", r"reduce|sum|norm|mean|max|min"),
    ("elementwise", r"elementwise|vectorized|unrolled|add|mul|div|gelu|tanh|where|dropout|bernoulli|clamp|sqrt|pow"),
)
_KIND_RE = tuple((kind, re.compile(pattern, re.IGNORECASE)) for kind, pattern in KINDS)


def kind_of(name: str) -> str:
    """The kind of a kernel (or CPU op) by its name; "other" when no pattern matches."""
    return next((kind for kind, pattern in _KIND_RE if pattern.search(name)), "other")


def start_profile() -> "profile":
    """A started torch.profiler over CPU and the GPU where there is one."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities)
    prof.start()
    return prof


def stop_profile(prof: "profile") -> "profile":
    """Stop `prof` once the device's queued work is done; `prof`."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.stop()
    return prof


def gpu_kernels(prof: "profile") -> list:
    """The profile's GPU kernel events. A GPU profile also holds annotation ranges (`Optimizer.step#AdamW.step` spans
    the optimizer's kernels): they are left out, as torch's own tables leave them, or the kernels under them would
    count twice."""
    from torch.autograd import DeviceType

    return [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]


def gpu_busy_us(prof: "profile") -> float:
    """µs during which at least one GPU kernel ran (the union of the kernels' intervals)."""
    busy, cursor = 0.0, None
    for start, end in sorted((e.time_range.start, e.time_range.end) for e in gpu_kernels(prof)):
        if cursor is None or start > cursor:
            busy += max(0.0, end - start)
            cursor = end
        elif end > cursor:
            busy += end - cursor
            cursor = end
    return busy


def kernel_times(prof: "profile", steps: int) -> dict[str, float]:
    """ms per step by name: GPU kernels' time where the profile has any, else CPU ops' self time; largest first."""
    from torch.autograd import DeviceType

    totals: dict[str, float] = defaultdict(float)
    kernels = gpu_kernels(prof)
    for e in kernels or [e for e in prof.events() if e.device_type == DeviceType.CPU]:
        totals[e.name] += e.time_range.elapsed_us() if kernels else e.self_cpu_time_total
    return dict(sorted(((k, v / 1e3 / max(steps, 1)) for k, v in totals.items()), key=lambda kv: -kv[1]))


def by_kind(times: dict[str, float]) -> dict[str, float]:
    """ms per step summed by kind."""
    out: dict[str, float] = defaultdict(float)
    for name, ms in times.items():
        out[kind_of(name)] += ms
    return dict(out)


def kind_table(kinds: dict[str, dict[str, float]]) -> str:
    """A markdown table of ms per step by kind (`by_kind` of each side), one column per side, with the first side
    minus the second."""
    labels = list(kinds)
    names = sorted({k for table in kinds.values() for k in table}, key=lambda k: -max(t.get(k, 0.0) for t in kinds.values()))
    heads = labels + ([f"{labels[0]} - {labels[1]}"] if len(labels) == 2 else [])
    lines = ["| kind (ms per step) | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for name in [*names, "total"]:
        cells = [sum(kinds[label].values()) if name == "total" else kinds[label].get(name, 0.0) for label in labels]
        if len(labels) == 2:
            cells.append(cells[0] - cells[1])
        lines.append(f"| {'**total**' if name == 'total' else name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def top_kernels(times: dict[str, float], count: int = 15) -> list[dict[str, Any]]:
    """The `count` kernels that take longest per step, with their kind (names cut to 120 characters)."""
    return [{"name": name[:120], "kind": kind_of(name), "ms": ms} for name, ms in list(times.items())[:count]]
