"""Prefix Grouper (train.prefix_grouper): the train update with each group's prompt encoded once,
against encoding it in every row, as the shared prompt grows.

    python -m bench.prefix_grouper [--prompt-lens 16 128 512 1024] [--reps 3]   # ~10 min on 2 idle cores

The RL-step workload's model (Qwen3, d 256, 4 layers, vocab 4096, 4 query / 2 kv heads of 64, FFN 3d,
tied, float32, random init); 2 prompts x 8 samples, 64 new tokens, GSPO, one micro-batch. Per prompt length:
the on-policy update (fwd + bwd + AdamW) per row and grouped, medians of --reps interleaved runs after a
warm-up, with each layout's own FLOPs (bench/roofline.py), GFLOP/s, fraction of the measured matmul
peak, and the compiled update's temporary memory (memory_analysis, compiled, not run), also under
model.remat=full. The two layouts' losses are checked equal before timing. Writes
bench/results/prefix_grouper.json.
"""

import argparse
import dataclasses
import datetime
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench import roofline
from bench.common import RESULTS, compare_updates, temp_bytes
from grpo_jax import algorithms, models
from grpo_jax import train_step as ts
from grpo_jax.config import Config, OptimConfig, SamplingConfig, TrainConfig

OUT = RESULTS / "prefix_grouper.json"
MODEL = models.ModelConfig(model_type="qwen3", vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4,
                           num_heads=4, num_kv_heads=2, head_dim=64, tie_word_embeddings=True)
PROMPTS, GROUP, NEW = 2, 8, 64


def measure(prompt_len: int, reps: int, peak: float) -> dict:
    rows = PROMPTS * GROUP
    base = Config(model=MODEL, sampling=SamplingConfig(max_prompt_len=prompt_len, max_new_tokens=NEW, group_size=GROUP),
                  algorithm=algorithms.AlgorithmConfig.from_preset("gspo"), optim=OptimConfig(learning_rate=1e-5),
                  train=TrainConfig(prompts_per_step=PROMPTS))
    params = models.init(MODEL, jax.random.key(0))
    rng = np.random.default_rng(0)
    prompt_ids = np.repeat(rng.integers(3, MODEL.vocab_size, (PROMPTS, prompt_len)), GROUP, axis=0)
    tokens, positions, segments = ts.sequences(jnp.asarray(prompt_ids, jnp.int32), jnp.full((rows,), prompt_len, jnp.int32),
                                               jnp.asarray(rng.integers(3, MODEL.vocab_size, (rows, NEW)), jnp.int32))
    mask = jnp.ones((rows, NEW), jnp.float32)
    batch = ts.Batch(tokens, positions, segments, mask, None, mask * 0, jnp.asarray(rng.normal(size=rows), jnp.float32))
    layouts = {name: (dataclasses.replace(base, train=dataclasses.replace(base.train, prefix_grouper=grouper)), batch)
               for name, grouper in (("per row", False), ("grouped", True))}
    t, memory = compare_updates(layouts, params, reps)
    remat_memory = {}
    for name, (cfg, _) in layouts.items():  # the same update with model.remat=full, compiled only
        remat = dataclasses.replace(cfg, model=dataclasses.replace(MODEL, remat="full"))
        optimizer = ts.make_optimizer(cfg.optim, 100)
        state = jax.eval_shape(lambda p: ts.init_state(p, optimizer), params)
        remat_memory[name] = temp_bytes(jax.jit(functools.partial(ts.train_step, remat, optimizer)), state, batch)
    flops = {"per row": roofline.train_flops(MODEL, rows, prompt_len + NEW - 1, NEW),
             "grouped": roofline.grouped_train_flops(MODEL, PROMPTS, GROUP, prompt_len, NEW)}
    return dict(prompt_len=prompt_len, load=roofline.load(), speedup=t["per row"] / t["grouped"],
                memory_ratio=memory["grouped"] / memory["per row"],
                **{name: roofline.row(name, t[name], flops[name], peak, temp_mib=memory[name] / 2**20,
                                      remat_temp_mib=remat_memory[name] / 2**20) for name in t})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[16, 128, 512, 1024])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    peak = roofline.matmul_peak()
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="python -m bench.prefix_grouper " + " ".join(sys.argv[1:]), matmul_peak_gflops=peak,
                   shape=dict(prompts=PROMPTS, group=GROUP, new=NEW, model=dataclasses.asdict(MODEL)),
                   load_start=roofline.load(), rows=[])
    print(f"matmul peak {peak:.0f} GFLOP/s; {results['load_start']}")
    print(f"{'prompt':>7s}{'per row s':>10s}{'of peak':>8s}{'grouped s':>10s}{'of peak':>8s}{'speedup':>8s}"
          f"{'FLOP ratio':>11s}{'temp MiB':>15s}{'remat=full MiB':>17s}")
    for prompt_len in args.prompt_lens:
        r = measure(prompt_len, args.reps, peak)
        results["rows"].append(r)
        OUT.write_text(json.dumps(results, indent=2) + "\n")
        a, b = r["per row"], r["grouped"]
        print(f"{prompt_len:>7d}{a['seconds']:>10.3f}{a['peak_frac']:>8.2f}{b['seconds']:>10.3f}{b['peak_frac']:>8.2f}"
              f"{r['speedup']:>8.2f}{a['gflop'] / b['gflop']:>11.2f}{a['temp_mib']:>8.0f} -> {b['temp_mib']:<6.0f}"
              f"{a['remat_temp_mib']:>8.0f} -> {b['remat_temp_mib']:<6.0f}",
              flush=True)
    results["load_end"] = roofline.load()
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['load_start']} -> {results['load_end']}; wrote {OUT}")


if __name__ == "__main__":
    main()
