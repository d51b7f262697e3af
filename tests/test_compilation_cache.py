"""Runs cache their compiled programs on disk by default (train.compilation_cache_dir); "" turns it off."""

import jax
import jax.numpy as jnp

from grpo_jax import run
from grpo_jax.config import Config, TrainConfig, override


def test_runs_cache_compiled_programs_unless_turned_off(tmp_path):
    assert Config(model_path="x").train.compilation_cache_dir  # on by default
    off = override(Config(model_path="x"), ["train.compilation_cache_dir="])
    assert off.train.compilation_cache_dir == ""
    before = jax.config.jax_compilation_cache_dir
    try:
        run.use_compilation_cache("")
        assert jax.config.jax_compilation_cache_dir == before  # off: untouched
        run.use_compilation_cache(str(tmp_path / "xla"))
        jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(5)).block_until_ready()
        assert any(p.name.endswith("-cache") for p in (tmp_path / "xla").iterdir())
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert TrainConfig().compilation_cache_dir == "~/.cache/grpo_jax/xla"
