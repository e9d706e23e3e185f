"""Where a GPU profile's host waited for the device: each synchronizing CUDA call in a torch.profiler chrome trace,
with the host ops that led to it.

    python -m benchmarks.host_waits TRACE.json [--context 12]

A step whose host waits for the device's queue throws away the lead the host had: the GPU runs dry while the host
does the Python work up to the next launch. A wait made inside an op (an `aten::` op's own stream sync: `.item()`,
`nonzero`, a copy from pageable host memory such as `torch.tensor(data, device=...)` or indexing by a Python list)
is one a step's code made without asking; a wait outside any op is an explicit `torch.cuda.synchronize()`, the
profiler's own among them. `gpu_throughput.py --profile` records the first kind per step beside each point.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

# CUDA runtime and driver calls that block the host until the device (or a stream of it) has finished its work.
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
                        "cuMemcpyHtoD_v2"})
HOST_OPS = ("cpu_op", "user_annotation")


def _host_ops(events: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """The trace's host ops by thread, in start order."""
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") in HOST_OPS and "dur" in e:
            by_thread.setdefault(e.get("tid"), []).append(e)
    for ops in by_thread.values():
        ops.sort(key=lambda e: e["ts"])
    return by_thread


def _outermost(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ops (in start order) that no earlier op encloses: what Python called, not what those calls ran inside."""
    out, end = [], float("-inf")
    for op in ops:
        if op["ts"] >= end:
            out.append(op)
            end = op["ts"] + op["dur"]
    return out


def waits(events: list[dict[str, Any]], context: int = 12) -> list[dict[str, Any]]:
    """Every synchronizing call in a chrome trace's events, in time order: its name, ms, the host ops that enclose
    it (outermost first; none for an explicit synchronize) and the names of the last `context` outermost host ops
    that ended before it on its thread."""
    by_thread = _host_ops(events)
    outermost = {tid: _outermost(ops) for tid, ops in by_thread.items()}
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in SYNC_CALLS]
    out = []
    for call in sorted(calls, key=lambda e: e["ts"]):
        start, end, tid = call["ts"], call["ts"] + call.get("dur", 0), call.get("tid")
        enclosing = [o["name"] for o in by_thread.get(tid, []) if o["ts"] <= start and o["ts"] + o["dur"] >= end]
        ended = [o["name"] for o in outermost.get(tid, []) if o["ts"] + o["dur"] <= start]
        out.append({"call": call["name"], "ms": call.get("dur", 0) / 1e3, "in": enclosing,
                    "before": ended[-context:] if context else []})
    return out


def pageable_copies(events: list[dict[str, Any]]) -> int:
    """How many of the trace's device copies went from or to pageable host memory (each one a wait for the stream)."""
    return sum(1 for e in events if e.get("cat") == "gpu_memcpy" and "Pageable" in e.get("name", ""))


def summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per step: the waits made inside an op, the ms they blocked the host, the pageable copies; and the
    op chains they were made in, most frequent first."""
    made = [w for w in waits(events, context=0) if w["in"]]
    steps = max(steps, 1)
    return {"per_step": len(made) / steps, "ms_per_step": sum(w["ms"] for w in made) / steps,
            "pageable_copies_per_step": pageable_copies(events) / steps,
            "in": [{"ops": ops, "count": n} for ops, n in Counter(" > ".join(w["in"]) for w in made).most_common(5)]}


def read_events(trace: Path) -> list[dict[str, Any]]:
    """The events of a chrome trace written by torch.profiler's export_chrome_trace."""
    return json.loads(trace.read_text())["traceEvents"]


def main(argv: list[str] | None = None) -> int:
    """Print every wait of a trace with the host ops before it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a chrome trace from torch.profiler (export_chrome_trace)")
    parser.add_argument("--context", type=int, default=12, help="host ops to print before each wait")
    args = parser.parse_args(argv)
    events = read_events(args.trace)
    found = waits(events, args.context)
    for w in found:
        print(f"{w['call']} {w['ms']:.2f} ms in {' > '.join(w['in']) or '(no op: an explicit synchronize)'}")
        for name in w["before"]:
            print(f"    after {name}")
    print(f"{len(found)} wait(s), {sum(1 for w in found if w['in'])} made inside an op; "
          f"{pageable_copies(events)} copies from or to pageable memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
