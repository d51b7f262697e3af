"""Runs cache their compiled programs on disk by default (train.compilation_cache_dir); "" turns it off."""

import jax
import jax.numpy as jnp

from grpo_jax import run
from grpo_jax.config import Config, TrainConfig, override


def _compile_something(scale: float) -> None:
    jax.jit(lambda x: x * scale + 1.0)(jnp.ones(5)).block_until_ready()


def test_runs_cache_compiled_programs_unless_turned_off(tmp_path):
    assert TrainConfig().compilation_cache_dir == "~/.cache/grpo_jax/xla"  # on by default
    off = override(Config(model_path="x"), ["train.compilation_cache_dir="])
    assert off.train.compilation_cache_dir == ""
    before = jax.config.jax_compilation_cache_dir
    try:
        run.use_compilation_cache("")
        assert jax.config.jax_compilation_cache_dir == before  # off: untouched
        run.use_compilation_cache(str(tmp_path / "first"))  # a cache already in use (an earlier run) ...
        _compile_something(2.0)
        run.use_compilation_cache(str(tmp_path / "second"))
        _compile_something(3.0)
        assert any(p.name.endswith("-cache") for p in (tmp_path / "second").iterdir())  # ... gives way
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
