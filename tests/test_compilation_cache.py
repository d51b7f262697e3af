"""Runs cache their compiled programs on disk: in ~/.cache/grpo_jax/xla by default, where
train.compilation_cache_dir says, nowhere for "", and in the directory given to JAX when there is one."""

import subprocess
import sys

from grpo_jax.config import Config, TrainConfig, override

# A fresh process each: JAX opens its cache once per process, and this one's is the suite's
# (tests/conftest.py). The environment is built from scratch: no JAX_COMPILATION_CACHE_DIR unless given.
COMPILE = """
import sys, jax, jax.numpy as jnp
from grpo_jax import run
print("using", repr(run.use_compilation_cache(sys.argv[1])))
jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(5)).block_until_ready()
"""


def compile_once(path: str, home, **env) -> str:
    out = subprocess.run([sys.executable, "-c", COMPILE, path], check=True, capture_output=True, text=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "", "HOME": str(home), **env})
    return out.stdout


def caches(root) -> set[str]:
    """The directories under `root` that received a compiled program (JAX writes NAME-cache files)."""
    return {str(p.parent.relative_to(root)) for p in root.rglob("*-cache")}


def test_runs_cache_every_program_in_the_user_cache_by_default(tmp_path):
    default = TrainConfig().compilation_cache_dir
    assert default == "~/.cache/grpo_jax/xla"
    assert f"using '{tmp_path}/.cache/grpo_jax/xla'" in compile_once(default, tmp_path)
    assert caches(tmp_path) == {".cache/grpo_jax/xla"}  # "~" expanded; even a program compiled in ~10 ms


def test_several_cpu_devices_in_one_process_run_without_the_field_s_cache(tmp_path):
    """Warm-cache runs on 2 simulated CPU devices aborted in XLA:CPU's collective rendezvous (8 of 12 in
    a drill; none of ~200 with the cache off): there the field's cache stays off."""
    out = compile_once("~/.cache/grpo_jax/xla", tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert "compilation cache: off on 2 CPU devices in one process" in out and "using ''" in out
    assert caches(tmp_path) == set()


def test_an_empty_directory_turns_the_cache_off(tmp_path):
    assert override(Config(model_path="x"), ["train.compilation_cache_dir="]).train.compilation_cache_dir == ""
    assert "using ''" in compile_once("", tmp_path)
    assert caches(tmp_path) == set()


def test_a_directory_given_to_jax_wins_over_the_field(tmp_path):
    on = override(Config(model_path="x"), [f"train.compilation_cache_dir={tmp_path / 'field'}"])
    out = compile_once(on.train.compilation_cache_dir, tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "env"),
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # the user's thresholds stay theirs
    assert f"compilation cache: {tmp_path / 'env'} (given to JAX), not train.compilation_cache_dir=" in out
    assert f"using '{tmp_path / 'env'}'" in out
    assert caches(tmp_path) == {"env"}
