"""The training process's heap: memory a step frees is kept for the next step instead of going back to the OS.

glibc's malloc returns the top of its heap to the operating system whenever more than its trim threshold lies
free there, and serves large blocks with mmap. A training step frees its activations at the end and allocates
them again at the next one, so a step of the 12-layer proxy in BENCHMARKS.md ("Host overhead of a step") took
about 1,800 fresh pages from the kernel (page faults, each zero-filled): 3.8-5.6 ms of kernel time a step.
Keeping freed memory brings that to a few pages and the step 3-8% faster (5 alternated pairs). The cost is
that the process's resident size does not shrink after a peak (an evaluation, a checkpoint), up to the trim
threshold below; blocks from 32 MiB up still go to mmap and back.

Only glibc has these knobs. Where a user set glibc's own MALLOC_*_ variables or preloads another allocator
(jemalloc, tcmalloc), their choice stands.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Optional

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
)


def keep_freed_memory() -> Optional[str]:
    """Have glibc's malloc keep what the process frees (see the module); a line saying what was done, or None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if (any(os.environ.get(name) for name in USER_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
            or "alloc" in os.environ.get("LD_PRELOAD", "")):
        return "host allocator: left as set in the environment (MALLOC_*_, GLIBC_TUNABLES or LD_PRELOAD)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return None
    return (f"host allocator: glibc keeps freed memory for reuse (no trim below {TRIM_THRESHOLD >> 30} GiB, mmap from "
            f"{MMAP_THRESHOLD >> 20} MiB); set MALLOC_TRIM_THRESHOLD_ to choose otherwise")
