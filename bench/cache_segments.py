"""Decoding with the KV cache grown by segments (`SamplingConfig.cache_segments`) against the whole
cache allocated up front, on the RL-step workload's model (bench/sweep.py's base: Qwen3, d 256, 4 layers,
vocab 4096), greedy, every row to max_new_tokens (ignore_eos), 9-token prompts.

Per (rows, new tokens, segments): the sampler's compile time (lower + compile, no persistent cache)
and the median of --reps generate calls after a warm-up, the segment settings interleaved.

    python -m bench.cache_segments        # writes bench/results/cache_segments.json (~6 min idle)
"""

import argparse
import dataclasses
import json
import os
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

from bench.common import RESULTS, median_times
from bench.sweep import BASE, hf_config
from grpo_jax import models, sampling
from grpo_jax.config import SamplingConfig

OUT = RESULTS / "cache_segments.json"


def measure(cfg, params, rows: int, new: int, segments: tuple[int, ...], reps: int) -> list[dict]:
    base = SamplingConfig(max_prompt_len=BASE["prompt_len"], max_new_tokens=new, group_size=1, greedy=True,
                          ignore_eos=True)
    prompts = sampling.pad_prompts(np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, 9)).tolist(), base)
    runs, out = {}, []
    for n in segments:
        scfg = dataclasses.replace(base, cache_segments=n)
        start = time.perf_counter()
        compiled = sampling.rollout.lower(cfg, scfg, (), None, params, prompts, jax.random.key(0)).compile()
        out.append(dict(rows=rows, new=new, cache_segments=n, segment_ends=sampling.segment_ends(scfg),
                        compile_s=time.perf_counter() - start))
        runs[n] = lambda compiled=compiled: jax.block_until_ready(compiled(params, prompts, jax.random.key(0)))
    times = median_times(runs, reps)  # a warm-up call each, then interleaved
    for row in out:
        row["generate_s"] = times[row["cache_segments"]]
        row["ms_per_token_step"] = 1e3 * row["generate_s"] / new
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--news", type=int, nargs="+", default=[64, 128, 512])
    parser.add_argument("--segments", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.Qwen3ForCausalLM(hf_config(dict(BASE, new=max(args.news)))).save_pretrained(tmp)
        cfg, params = models.load_hf(tmp)
    results = dict(model=BASE, load_average_start=os.getloadavg(), rows=[])
    print(f"{'rows':>5}{'new':>5}{'segments':>10}{'ends':>24}{'compile s':>11}{'generate s':>12}{'ms/step':>9}{'speed-up':>10}")
    for rows in args.rows:
        for new in args.news:
            measured = measure(cfg, params, rows, new, tuple(args.segments), args.reps)
            for r in measured:
                r["speedup_vs_whole"] = measured[0]["generate_s"] / r["generate_s"]
                print(f"{r['rows']:>5}{r['new']:>5}{r['cache_segments']:>10}{str(r['segment_ends']):>24}"
                      f"{r['compile_s']:>11.2f}{r['generate_s']:>12.3f}{r['ms_per_token_step']:>9.2f}"
                      f"{r['speedup_vs_whole']:>9.2f}x", flush=True)
            results["rows"].extend(measured)
    results["load_average_end"] = os.getloadavg()
    OUT.write_text(json.dumps(results, indent=2))
    print(f"load average {results['load_average_start']} -> {results['load_average_end']}; wrote {OUT}")


if __name__ == "__main__":
    main()
