"""Shared test setup: 8 simulated CPU devices, float32 matmuls, every jaxtyping annotation checked, a
`slow` marker."""

import gc
import importlib.metadata
import os
import shutil
import tempfile

# Must happen before jax is imported anywhere in the test session (and reaches the processes tests
# launch). Tests run tiny shapes, so compiling dominates them, and these codegen settings change no
# operation's semantics: XLA:CPU's LLVM at -O0 compiles a train step in ~60% of the time (4.8 s -> 3.0
# s); at -O0 the classic elemental emitters, in one LLVM module, compile three test train steps in 3.9 s
# instead of 15.4 s. (At -O2, which runs use, the fusion emitters compile faster: 29 s against 55 s.)
# jaxlib 0.11 has only the fusion emitters: its XLA exits on the flag ("Unknown flag in XLA_FLAGS", seen on
# the GPU machine), so the flag goes only to older ones.
jaxlib_version = tuple(int(n) for n in importlib.metadata.version("jaxlib").split(".")[:2])
emitters = " --xla_cpu_use_fusion_emitters=false" if jaxlib_version < (0, 11) else ""
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    + emitters + " --xla_cpu_parallel_codegen_split_count=1"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Entry points keep freed host memory on CPU (grpo_jax.host_memory): faster steps, slower compiles, and
# the tests are all compiling. Off for the session and the processes it launches; tests/test_host_memory.py
# turns it on in its own.
os.environ["GRPO_JAX_KEEP_FREED_MEMORY"] = "0"
# The layout TPUs and GPUs run: layer_loop="auto" scans the layers, carries the KV cache stacked through
# the scan and gathers each layer's weights inside it, where on CPU it would unroll them
# (grpo_jax.models.decoder.layers_unrolled). The tests of the CPU layout ask for it by
# layer_loop="unrolled", or leave this variable out with monkeypatch.
os.environ["GRPO_JAX_LAYOUT"] = "accelerator"
# One persistent compilation cache for the session, in a temporary directory: runs never write into the
# user's ~/.cache (a directory given to JAX wins over train.compilation_cache_dir: grpo_jax.run), and
# programs that several tests compile alike load instead. Made by the controller; the xdist workers and
# the processes tests launch inherit it. Every program is cached: tests/test_trainer.py (-n 2) took 135 s
# without a cache and 112 s with this one starting empty, back to back on quiet cores (294 s and 237 s
# under load 3-5; caching only programs of >= 1 s, JAX's default, 289 s).
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="grpo_jax_tests_xla_")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402
import jaxtyping  # noqa: E402
import pytest  # noqa: E402

import grpo_jax.typecheck  # noqa: E402  (the checker the hook names; it holds no annotated function)

jax.config.update("jax_default_matmul_precision", "highest")
# Every jaxtyping annotation of the library is checked at call time (shapes by axis name, dtypes), so a
# wrong annotation or a misshapen argument fails the tests. Installed before any test imports grpo_jax.
jaxtyping.install_import_hook(["grpo_jax", "kernels"], "grpo_jax.typecheck.TYPECHECKER")


@pytest.fixture
def unchecked():
    """The jaxtyping checks off while a test runs: for tests of a function's own input validation, which
    the import hook's checks would pre-empt (as they do not outside the tests)."""
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture(autouse=True, scope="module")
def compiled_programs_dropped_after_each_module():
    """Each compiled XLA:CPU program keeps memory mappings until JAX's caches drop it (~800 for a
    trainer run's programs). Kept for the whole suite they reached the kernel's limit (vm.max_map_count,
    65530) near test 690, and LLVM segfaulted compiling the next program; dropped after every module,
    the count stays at one module's worth."""
    yield
    jax.clear_caches()
    gc.collect()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller, after its workers: the session's cache
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs a real pretrained model or minutes of CPU")
    if config.option.durations is None:  # the slowest tests end every report, CI's included (--durations=N)
        config.option.durations = 15
