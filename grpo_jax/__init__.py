"""grpo_jax: GRPO-family RL for language models in JAX, centred on GSPO."""

from grpo_jax import host_memory

__version__ = "0.1.0"

host_memory.keep_freed_memory()  # before jax starts its threads: see host_memory
