"""Sampler program size and compile time against depth: `sampling.rollout` lowered and compiled (abstract
inputs) for a tiny Qwen3-style model at 2, 8, 16 and 32 layers, 128 new tokens, under both layer loops.
Unrolled (the default on CPU: one cache buffer per layer) both grow with depth; scanned (the default on
TPU and GPU: a cache stacked over layers) neither does.

    python -m bench.decode_depth        # writes bench/results/decode_depth.json (~1 min)
"""

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp

from bench.common import RESULTS
from grpo_jax import models, sampling
from grpo_jax.config import SamplingConfig

OUT = RESULTS / "decode_depth.json"
MODEL = models.ModelConfig(model_type="qwen3", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=1)
SAMPLING = SamplingConfig(max_prompt_len=8, max_new_tokens=128, group_size=2)
DEPTHS, LOOPS = (2, 8, 16, 32), ("unrolled", "scan")


def measure(layer_loop: str, layers: int) -> dict:
    cfg = dataclasses.replace(MODEL, num_layers=layers, layer_loop=layer_loop)
    params = jax.eval_shape(lambda key: models.init(cfg, key), jax.random.key(0))
    prompts = sampling.Prompts(jax.ShapeDtypeStruct((4, 8), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32))
    start = time.perf_counter()
    lowered = sampling.rollout.lower(cfg, SAMPLING, (1,), None, params, prompts, jax.random.key(0))
    lowered_s = time.perf_counter() - start
    compiled = lowered.compile()
    return dict(layer_loop=layer_loop, layers=layers, lowered_lines=len(lowered.as_text().splitlines()),
                compiled_lines=len(compiled.as_text().splitlines()), lower_s=lowered_s,
                compile_s=time.perf_counter() - start - lowered_s)


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    results = dict(load_average_start=os.getloadavg(), depths=[measure(loop, n) for loop in LOOPS for n in DEPTHS])
    results["load_average_end"] = os.getloadavg()
    print(f"{'loop':>9}{'layers':>7}{'lowered lines':>15}{'compiled lines':>16}{'lower s':>9}{'compile s':>11}")
    for r in results["depths"]:
        print(f"{r['layer_loop']:>9}{r['layers']:>7}{r['lowered_lines']:>15}{r['compiled_lines']:>16}{r['lower_s']:>9.2f}{r['compile_s']:>11.2f}")
    print(f"load average {results['load_average_start']} -> {results['load_average_end']}")
    OUT.write_text(json.dumps(results, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
