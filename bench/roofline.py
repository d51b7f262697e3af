"""FLOP counts of the decoder's work and this machine's matmul peak: the yardstick of every bench table.

FLOPs are those the programs execute in their matmuls (2 per multiply-add): full (not causal-halved)
attention over the context, log-probs only on completion tokens, training = forward + backward = 3x
the forward. Elementwise work is not counted. The peak is a float32 2048^3 matmul, measured in the
same process as the rows it divides (the cores are shared: it moves with the load).
"""

import os
import time

import jax
import jax.numpy as jnp

from grpo_jax.config import ModelConfig


def matmul_peak(repeats: int = 10) -> float:
    """GFLOP/s of a float32 [2048, 2048] @ [2048, 2048] matmul, the fastest of `repeats` after a warm-up:
    a moment of interference only slows a repeat, and the median of 5 once read 98 GFLOP/s in an hour of
    160-210 (2026-11-27; earlier rows used that median)."""
    a = jnp.ones((2048, 2048), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    jax.block_until_ready(mm(a))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(mm(a))
        times.append(time.perf_counter() - t0)
    return 2 * 2048**3 / min(times) / 1e9


def layer_flops_per_token(cfg: ModelConfig, context: int) -> float:
    """Matmul FLOPs of one token through every layer, attending to `context` keys."""
    d, hd = cfg.hidden_size, cfg.head_dim
    proj = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)  # q, o and k, v
    mlp = 3 * d * cfg.intermediate_size
    return cfg.num_layers * (2 * (proj + mlp) + 4 * context * cfg.num_heads * hd)


def logits_flops(cfg: ModelConfig) -> float:
    return 2 * cfg.hidden_size * cfg.vocab_size


def train_flops(cfg: ModelConfig, rows: int, seq: int, new: int) -> float:
    """Forward + backward (3x the forward) over rows x seq tokens, log-probs of the last `new` of each."""
    return 3 * rows * (seq * layer_flops_per_token(cfg, seq) + new * logits_flops(cfg))


def grouped_train_flops(cfg: ModelConfig, prompts: int, group: int, prompt_len: int, new: int) -> float:
    """`train_flops` under Prefix Grouper (train.prefix_grouper): each prompt once over its own keys,
    then the new - 1 fed completion tokens of every row over the prompt_len + new - 1 cache slots."""
    cache = prompt_len + new - 1
    return 3 * (prompts * prompt_len * layer_flops_per_token(cfg, prompt_len)
                + prompts * group * ((new - 1) * layer_flops_per_token(cfg, cache) + new * logits_flops(cfg)))


def forward_flops(cfg: ModelConfig, rows: int, seq: int, new: int) -> float:
    return rows * (seq * layer_flops_per_token(cfg, seq) + new * logits_flops(cfg))


def decode_flops(cfg: ModelConfig, prompts: int, group: int, prompt_len: int, new: int) -> float:
    """Prefill of each distinct prompt once, then `new` tokens for prompts x group rows (the cache
    holds prompt_len + new - 1 slots, all attended: the sampler's static cache)."""
    cache = prompt_len + new - 1
    prefill = prompts * (prompt_len * layer_flops_per_token(cfg, prompt_len) + logits_flops(cfg))
    return prefill + prompts * group * (new - 1) * (layer_flops_per_token(cfg, cache) + logits_flops(cfg))


def row(name: str, seconds: float, flops: float, peak: float, **extra) -> dict:
    """One roofline row: time, GFLOP, achieved GFLOP/s, fraction of the peak, and the time at the peak."""
    return dict(name=name, seconds=seconds, gflop=flops / 1e9, gflops=flops / seconds / 1e9,
                peak_frac=flops / seconds / 1e9 / peak, limit_s=flops / 1e9 / peak, **extra)


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()
