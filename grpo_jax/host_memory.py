"""On CPU, keep freed host memory in the process, so XLA:CPU reuses its per-call temporary buffer.

XLA:CPU allocates each program's temporaries as one block per call (for a train update, typically
well above glibc's mmap threshold). glibc serves a block that large with mmap from a thread's arena
and unmaps it on free, so every call page-faults the whole buffer in again: system CPU time on every
call, in proportion to the buffer's pages, a noticeable share of an RL step (measured by
bench/host_memory.py). With one arena, no mmap and no trimming, a freed block stays in the heap and
the next call reuses it.

The price is compile time: XLA's compiler threads then share one arena's lock, so compiles run
slower (also measured by bench/host_memory.py), which the persistent compilation cache pays once per
shape. TPU and GPU keep their buffers on the device and would pay only that price, so it applies
only where JAX can run on nothing but the CPU. Every entry point calls it first
(`distributed.initialize`): each thread binds to an arena at its first malloc, so it must come
before jax starts its threads. `GRPO_JAX_KEEP_FREED_MEMORY=0` leaves glibc's defaults.
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h


def cpu_only() -> bool:
    """True when JAX can pick no backend but the CPU: JAX_PLATFORMS is "cpu", or no TPU or GPU plugin
    is installed (what jax's own discovery looks for; the backends are not started to ask)."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms == "cpu"
    return not (importlib.util.find_spec("libtpu") or importlib.util.find_spec("jax_plugins")
                or importlib.metadata.entry_points(group="jax_plugins"))


def keep_freed_memory() -> bool:
    """Sets glibc's malloc to one arena, no mmap, no trimming; True if it did (Linux with glibc, CPU
    only, not turned off)."""
    if os.environ.get("GRPO_JAX_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if not cpu_only():
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other libcs: nothing to tune
        return False
    # the trim threshold is a size_t set from an int: -1 is SIZE_MAX, never trim
    return all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
