"""Shared test setup: 8 simulated CPU devices, float32 matmuls, every jaxtyping annotation checked, a
`slow` marker."""

import gc
import os

from xla_flags import xla_flags  # tests/xla_flags.py

# Must happen before jax is imported anywhere in the test session (and reaches the processes tests
# launch): tests/xla_flags.py says why these codegen settings.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(8)).strip()
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
# No persistent compilation cache, here or in the processes tests launch: programs loaded from it on
# several CPU devices of one process abort in XLA:CPU's collectives (grpo_jax.run.use_compilation_cache),
# which the suite's 8 simulated devices hit (seen as test_trainer.py and test_async.py aborting under -n 2
# with a shared cache, every run passing without one), and runs must not write into the user's ~/.cache.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

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



def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs a real pretrained model or minutes of CPU")
    if config.option.durations is None:  # the slowest tests end every report, CI's included (--durations=N)
        config.option.durations = 15
