"""The training process's heap: memory a step frees is kept for the next step instead of going back to the OS, and
the objects of its start-up are kept out of the garbage collector's way.

glibc's malloc returns the top of its heap to the operating system whenever more than its trim threshold lies
free there, and serves large blocks with mmap. A training step frees its activations at the end and allocates
them again at the next one, so each step would take its memory back from the kernel as fresh, zero-filled pages
(page faults). Keeping freed memory removes most of them (BENCHMARKS.md, "Host overhead of a step").

The cost: a heap does not shrink after a peak (an evaluation, a checkpoint) until more than the trim threshold
lies free at its top, and each of glibc's arenas keeps its own; blocks from 32 MiB up still go to mmap and back.
Processes forked after the call (loader workers on Linux) inherit the setting; spawned ones do not.

Only glibc has these knobs. A user's own allocator choice stands: any MALLOC_* variable, a glibc.malloc tunable,
or a preloaded allocator (jemalloc, tcmalloc). `train.keep_freed_host_memory: false` leaves glibc's defaults.

Python's cyclic garbage collector traverses every tracked object at each full collection, and a full collection
comes each time the long-lived objects have grown by a quarter. Importing torch, transformers and DeepSpeed and
building the model creates most of a training process's objects, so the collector traverses a growing heap several
times before the first step (BENCHMARKS.md, "Process start-up"). `python -m pretrain train` pauses the collector at its
start. Explicit `gc.collect()` calls run even then: DeepSpeed's ZeRO-3 set-up makes one, which would traverse every
object of the imports (BENCHMARKS.md), so the imports' objects are frozen (`gc.freeze`, as CPython's
documentation does before a fork) before the engine is built. Once the trainer is built every object there is frozen
and the collector resumes: later collections skip the frozen objects, and in loader workers forked
after it the collector does not write to their pages (reference counting still does). Frozen objects are still
freed by reference counting. The price: cycles among them are never collected. That is the start-up's own garbage
(small objects left by imports, no tensors), and any frozen cycle that dies later; a full collection at that point
would find it but costs more than it frees. Other subcommands and in-process callers keep the collector as it is.
"""
from __future__ import annotations

import gc
import os
from typing import Optional

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30


def users_allocator_setting() -> Optional[str]:
    """What in the environment already chooses the allocator's behaviour, or None."""
    names = sorted(name for name, value in os.environ.items() if name.startswith("MALLOC_") and value)
    if names:
        return ", ".join(names)
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if "alloc" in os.environ.get("LD_PRELOAD", ""):
        return "LD_PRELOAD"
    return None


def keep_freed_memory() -> Optional[str]:
    """Have glibc's malloc keep what the process frees (see the module); a line saying what was done, or None."""
    import ctypes  # here, not at the top: a training process imports this module before pausing its collector
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    users = users_allocator_setting()
    if users:
        return f"host allocator: left as the environment sets it ({users})"
    libc = ctypes.CDLL(None)  # the running process's own symbols: its libc's mallopt, with no library search
    mmap_set = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    trim_set = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not (mmap_set and trim_set):
        return (f"host allocator: glibc refused part of the setting (mmap threshold {'set' if mmap_set else 'refused'}, "
                f"trim threshold {'set' if trim_set else 'refused'})")
    return (f"host allocator: glibc keeps freed memory for reuse (no trim below {TRIM_THRESHOLD >> 30} GiB, mmap from "
            f"{MMAP_THRESHOLD >> 20} MiB); train.keep_freed_host_memory=false leaves glibc's defaults")


_collector_paused = False


def pause_garbage_collector() -> None:
    """Switch the cyclic garbage collector off for a training process's start-up (see the module)."""
    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True


def freeze_imports() -> bool:
    """Freeze what the start-up has made so far (its imports) while the collector is paused, so that a library's
    explicit full collection during the build (DeepSpeed's ZeRO-3 set-up runs one) skips those objects. Only where
    `pause_garbage_collector` switched the collector off."""
    if not _collector_paused:
        return False
    gc.freeze()
    return True


def resume_garbage_collector() -> bool:
    """After the start-up: its objects frozen out of later collections, the collector on again. Only where
    `pause_garbage_collector` switched it off (an in-process caller's collector is left alone)."""
    global _collector_paused
    if not _collector_paused:
        return False
    gc.freeze()
    gc.enable()
    _collector_paused = False
    return True
