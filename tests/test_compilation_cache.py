"""Runs cache their compiled programs on disk when train.compilation_cache_dir is set; "" (the default) is off."""

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


def test_runs_cache_compiled_programs_where_asked(tmp_path):
    assert TrainConfig().compilation_cache_dir == ""  # off by default
    on = override(Config(model_path="x"), [f"train.compilation_cache_dir={tmp_path / 'xla'}"])
    assert on.train.compilation_cache_dir == str(tmp_path / "xla")
    for path in ("", str(tmp_path / "xla")):
        subprocess.run([sys.executable, "-c", COMPILE, path], check=True, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert {p.parent.name for p in tmp_path.rglob("*-cache")} == {"xla"}  # the programs landed there
