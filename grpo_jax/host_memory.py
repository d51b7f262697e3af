"""Keep freed host memory in the process, so XLA:CPU's per-call temporary buffer is reused.

XLA:CPU allocates each program's temporaries as one block per call (the issue-17 update: 1.6 GB).
glibc serves a block that large with mmap from a thread's arena and unmaps it on free, so every call
page-faults the whole buffer in again: ~400k faults, 0.4-0.5 s of a 3 s update on 2 cores
(bench/README.md, "Host memory"). With one arena, no mmap and no trimming, a freed block stays in the
heap and the next call reuses it. It must run before jax starts its threads (each thread binds to an
arena at its first malloc): `grpo_jax/__init__.py` calls it on import. On TPU and GPU hosts it only
changes how the host heap grows. `GRPO_JAX_KEEP_FREED_MEMORY=0` leaves glibc's defaults.
"""

import ctypes
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """Sets glibc's malloc to one arena, no mmap, no trimming; True if it did (Linux, glibc)."""
    if os.environ.get("GRPO_JAX_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other libcs: nothing to tune
        return False
    # the trim threshold is a size_t set from an int: -1 is SIZE_MAX, never trim
    return all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
