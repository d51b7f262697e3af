"""grpo_jax: GRPO-family RL for language models in JAX, centred on GSPO."""

__version__ = "0.1.0"
