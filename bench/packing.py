"""Packing (train.packing): the train update over rows packed end to end against the padded rows, for
completions whose lengths vary.

    python -m bench.packing [--news 64 256] [--prompts 4] [--reps 3] [--moe]   # ~5 min on 2 busy cores

The RL-step workload's model (Qwen3, d 256, 4 layers, vocab 4096, 4 query / 2 kv heads of 64, FFN 3d,
tied, float32, random init; with --moe every layer a Qwen3-MoE block of 8 experts of FFN 192, top 2,
run by the default dense reference, results in packing_moe.json); --prompts x 8 samples of 9-token
prompts, GSPO, one micro-batch, one device. Synthetic rollouts per max_new_tokens and length distribution: "uniform" draws each completion's length uniformly in
[1, new], "skewed" from an exponential of mean new / 8 (most stop early, few run long), clipped to [1, new].
Per case: the on-policy update (fwd + bwd + AdamW; MoE: given l^old) padded and packed, medians of --reps interleaved runs after
a warm-up, the compiled update's temporary memory (memory_analysis, compiled, not run), the packed layout's
row fraction (packed rows / rows: what the decoder computes of the padded layout) and fill (real tokens /
packed tokens), the rows first-fit decreasing needs before the bucket rounds them up, and the host plan's
time. The two layouts' first losses are checked equal before timing. Writes bench/results/packing.json.
"""

import argparse
import dataclasses
import datetime
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench import roofline
from bench.common import RESULTS, compare_updates
from bench.prefix_grouper import MODEL
from grpo_jax import algorithms, models, packing, sharding
from grpo_jax import train_step as ts
from grpo_jax.config import Config, OptimConfig, SamplingConfig, TrainConfig

GROUP, PROMPT_LEN = 8, 9
MOE = dataclasses.replace(MODEL, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192)


def completion_lengths(dist: str, rows: int, new: int, rng) -> np.ndarray:
    drawn = rng.integers(1, new + 1, rows) if dist == "uniform" else np.ceil(rng.exponential(new / 8, rows))
    return np.clip(drawn, 1, new).astype(np.int32)


def measure(model: models.ModelConfig, new: int, dist: str, prompts: int, reps: int) -> dict:
    rows, width = prompts * GROUP, PROMPT_LEN + new - 1
    base = Config(model=model, sampling=SamplingConfig(max_prompt_len=PROMPT_LEN, max_new_tokens=new, group_size=GROUP),
                  algorithm=algorithms.AlgorithmConfig.from_preset("gspo"), optim=OptimConfig(learning_rate=1e-5),
                  train=TrainConfig(prompts_per_step=prompts))
    params = models.init(model, jax.random.key(0))
    rng = np.random.default_rng(0)
    lengths = completion_lengths(dist, rows, new, rng)
    prompt_ids = np.repeat(rng.integers(3, model.vocab_size, (prompts, PROMPT_LEN)), GROUP, axis=0)
    mask = (np.arange(new) < lengths[:, None]).astype(np.float32)
    completions = np.where(mask > 0, rng.integers(3, model.vocab_size, (rows, new)), 0)
    tokens, positions, segments = ts.sequences(jnp.asarray(prompt_ids, jnp.int32), jnp.full((rows,), PROMPT_LEN, jnp.int32),
                                               jnp.asarray(completions, jnp.int32))
    batch = ts.Batch(tokens, positions, segments, jnp.asarray(mask), None, jnp.zeros((rows, new), jnp.float32),
                     jnp.asarray(rng.normal(size=rows), jnp.float32))
    if any(model.moe_layers):  # an MoE update reads l^old from the pass that records routes (train_step.on_policy)
        batch = dataclasses.replace(batch, old_logp=ts.completion_logprobs(model, 1.0, params, tokens, positions,
                                                                           segments, batch.mask)[0])
    mesh = sharding.make_mesh(base.mesh)
    shards = int(np.prod([mesh.shape[a] for a in sharding.RULES["batch"]]))
    t0 = time.perf_counter()
    plan = packing.plan(np.full(rows, PROMPT_LEN), lengths, width, shards, 1)
    plan_ms = (time.perf_counter() - t0) * 1e3
    needed = max(packing.first_fit_decreasing(share, width)[2] for share in plan.length.reshape(shards, -1))
    packed_rows = plan.packed_rows
    layout = jax.jit(packing.pack, static_argnums=(3, 8))(tokens, positions, segments, new,
                                                         *map(jnp.asarray, plan.arrays()), packed_rows)
    layouts = {name: (dataclasses.replace(base, train=dataclasses.replace(base.train, packing=on)),
                      dataclasses.replace(batch, packing=layout if on else None))
               for name, on in (("padded", False), ("packed", True))}
    t, memory = compare_updates(layouts, params, reps)
    return dict(new=new, dist=dist, rows=rows, length_mean=float(lengths.mean()), load=roofline.load(),
                padded_s=t["padded"], packed_s=t["packed"], speedup=t["padded"] / t["packed"],
                packed_rows=packed_rows, ffd_rows=needed * shards, rows_frac=packed_rows / rows,
                token_frac=float(plan.length.sum()) / (rows * width),
                fill=float(plan.length.sum()) / (packed_rows * width), plan_ms=plan_ms,
                padded_temp_mib=memory["padded"] / 2**20, packed_temp_mib=memory["packed"] / 2**20)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--news", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--dists", nargs="+", default=["uniform", "skewed"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--moe", action="store_true", help="the Qwen3-MoE variant of the model")
    args = parser.parse_args()
    model, out = (MOE, RESULTS / "packing_moe.json") if args.moe else (MODEL, RESULTS / "packing.json")
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="python -m bench.packing " + " ".join(sys.argv[1:]), devices=jax.device_count(),
                   shape=dict(prompts=args.prompts, group=GROUP, prompt_len=PROMPT_LEN, model=dataclasses.asdict(model)),
                   load_start=roofline.load(), rows=[])
    print(results["load_start"])
    print(f"{'new':>4s}{'lengths':>9s}{'mean':>6s}{'padded s':>9s}{'packed s':>9s}{'speedup':>8s}{'rows':>10s}"
          f"{'(FFD)':>6s}{'real/padded':>12s}{'fill':>6s}{'temp MiB':>16s}{'plan ms':>8s}")
    for new in args.news:
        for dist in args.dists:
            r = measure(model, new, dist, args.prompts, args.reps)
            results["rows"].append(r)
            out.write_text(json.dumps(results, indent=2) + "\n")
            print(f"{new:>4d}{dist:>9s}{r['length_mean']:>6.1f}{r['padded_s']:>9.3f}{r['packed_s']:>9.3f}"
                  f"{r['speedup']:>7.2f}x{r['packed_rows']:>5d}/{r['rows']:<4d}{r['ffd_rows']:>6d}"
                  f"{r['token_frac']:>12.2f}{r['fill']:>6.2f}{r['padded_temp_mib']:>8.0f} -> {r['packed_temp_mib']:<5.0f}"
                  f"{r['plan_ms']:>8.1f}", flush=True)
    results["load_end"] = roofline.load()
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['load_start']} -> {results['load_end']}; wrote {out}")


if __name__ == "__main__":
    main()
