"""Shared test setup: 8 simulated CPU devices, float32 matmuls, a `slow` marker."""

import os

# Must happen before jax is imported anywhere in the test session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs a real pretrained model or minutes of CPU")
