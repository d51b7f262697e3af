"""XLA_FLAGS for the test session (tests/conftest.py) and the processes tests launch.

Tests run tiny shapes, so compiling dominates them, and these codegen settings change no operation's
semantics: XLA:CPU's LLVM at -O0 compiles a train step in ~60% of the time (4.8 s -> 3.0 s); at -O0 the
classic elemental emitters, in one LLVM module, compile three test train steps in 3.9 s instead of 15.4 s.
(At -O2, which runs use, the fusion emitters compile faster: 29 s against 55 s.) jaxlib 0.11 has only the
fusion emitters: its XLA exits on the flag ("Unknown flag in XLA_FLAGS", seen on the GPU machine), so the
flag goes only to older ones. A module of its own, without side effects: scripts that tests launch import
test modules, which must not set the launching test's flags again.
"""

import importlib.metadata

jaxlib_version = tuple(int(n) for n in importlib.metadata.version("jaxlib").split(".")[:2])
emitters = " --xla_cpu_use_fusion_emitters=false" if jaxlib_version < (0, 11) else ""
CODEGEN_FLAGS = "--xla_backend_optimization_level=0" + emitters + " --xla_cpu_parallel_codegen_split_count=1"


def xla_flags(devices: int) -> str:
    """`devices` simulated CPU devices with the session's codegen settings (a process launched at XLA's
    default -O2 compiles each of its programs several times slower)."""
    return f"--xla_force_host_platform_device_count={devices} {CODEGEN_FLAGS}"
