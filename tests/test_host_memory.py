"""grpo_jax.host_memory: after an entry point's set-up, a large block freed and allocated again is
reused, not page-faulted in anew (on CPU only).

Each case runs in a fresh interpreter (malloc's settings are per process, and must be set before
threads start): it prepares the process as every entry point does (`distributed.initialize` with no
launch flags), then allocates, fills and frees a 256 MiB block twice with the C library's malloc, and
reports the minor page faults of the second round.
"""

import os
import subprocess
import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("glibc's malloc settings are Linux-only", allow_module_level=True)

BLOCK = 256 << 20
ROUND_TRIP = f"""
import argparse, ctypes, resource
from grpo_jax import distributed
parser = argparse.ArgumentParser()
distributed.add_arguments(parser)
distributed.initialize(parser, parser.parse_args([]))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def fill_and_free():
    p = libc.malloc({BLOCK})
    ctypes.memset(p, 1, {BLOCK})
    libc.free(p)

fill_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
fill_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def second_round_faults(keep: str, platforms: str = "cpu") -> int:
    env = os.environ | {"GRPO_JAX_KEEP_FREED_MEMORY": keep, "JAX_PLATFORMS": platforms}
    out = subprocess.run([sys.executable, "-c", ROUND_TRIP], env=env, check=True, capture_output=True, text=True)
    return int(out.stdout)


def test_a_freed_block_is_reused_without_page_faults():
    pages = BLOCK // os.sysconf("SC_PAGE_SIZE")
    assert second_round_faults("1") < pages // 100  # the heap kept the block
    assert second_round_faults("0") > pages // 2  # glibc's default: unmapped on free, faulted in again


def test_accelerators_keep_glibc_defaults():
    """Where JAX may run on a TPU or GPU the setting would only slow compiling: left off."""
    pages = BLOCK // os.sysconf("SC_PAGE_SIZE")
    assert second_round_faults("1", platforms="cuda,cpu") > pages // 2
