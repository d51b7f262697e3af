"""Runs cache their compiled programs on disk by default (train.compilation_cache_dir); "" turns it off."""

import subprocess
import sys

from grpo_jax.config import Config, TrainConfig, override

# A fresh process: JAX opens its cache once per process, and the suite's earlier runs have opened it.
COMPILE = """
import sys, jax, jax.numpy as jnp
from grpo_jax import run
run.use_compilation_cache(sys.argv[1])
jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(5)).block_until_ready()
"""


def test_runs_cache_compiled_programs_unless_turned_off(tmp_path):
    assert TrainConfig().compilation_cache_dir == "~/.cache/grpo_jax/xla"  # on by default
    off = override(Config(model_path="x"), ["train.compilation_cache_dir="])
    assert off.train.compilation_cache_dir == ""
    for path in ("", str(tmp_path / "xla")):
        subprocess.run([sys.executable, "-c", COMPILE, path], check=True, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert {p.parent.name for p in tmp_path.rglob("*-cache")} == {"xla"}  # the programs landed there
