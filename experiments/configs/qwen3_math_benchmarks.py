"""The benchmarks of experiments/configs/qwen3_math.py (MATH500, AIME 2024, GSM8K) for `python -m
grpo_jax.evaluate --benchmarks`; its docstring shows the command."""

from .qwen3_math import benchmarks


def get_config():
    return benchmarks()
