"""Roofline sweep around the RL-step workload's shape: train update, l^old-style forward and greedy decoding
(against `transformers` generate on the same weights), each axis varied with the others at the base.

    python -m bench.sweep [--only NAME ...] [--reps 2]     # ~30-40 min on 2 idle cores

Base: Qwen3, d 256, 4 layers, vocab 4096, 4 query / 2 kv heads of 64, FFN 3d, tied, float32; 16
prompts x 8 samples, 9-token prompts, 64 new tokens. Axes: d (64, 1024), layers (2, 16), vocab (32k,
152k), head_dim (16, 128; heads * head_dim = d), GQA (kv heads 4 = MHA, 1 = 4:1), batch (2 x 8,
32 x 8), new tokens (16, 512). Per row: the on-policy train update (fwd + bwd + AdamW, one
micro-batch), the forward of the same tokens (completion_logprobs: what l^old costs), their ratio,
greedy decoding of every row to max_new_tokens (ignore_eos) by grpo_jax and by transformers (torch
threads = 2), with FLOPs, GFLOP/s and the fraction of the measured matmul peak (bench/roofline.py).
Times are medians of --reps interleaved runs after a warm-up. Rows are appended to
bench/results/sweep.json as they finish (a partial run keeps what it measured).
"""

import argparse
import datetime
import json
import sys
import tempfile

import jax
import numpy as np
import torch
import transformers

from bench import roofline
from bench.common import RESULTS, median_times, update_runs
from grpo_jax import host_memory, models, sampling
from grpo_jax.config import SamplingConfig

OUT = RESULTS / "sweep.json"
BASE = dict(d=256, layers=4, vocab=4096, head_dim=64, heads=4, kv=2, prompts=16, group=8, prompt_len=9, new=64)
ROWS = {
    "base": {},
    "d=64": dict(d=64, heads=1, kv=1), "d=1024": dict(d=1024, heads=16, kv=8),
    "layers=2": dict(layers=2), "layers=16": dict(layers=16),
    "vocab=32k": dict(vocab=32768), "vocab=152k": dict(vocab=151936),
    "head_dim=16": dict(head_dim=16, heads=16, kv=8), "head_dim=128": dict(head_dim=128, heads=2, kv=1),
    "gqa=1 (mha)": dict(kv=4), "gqa=4": dict(kv=1),
    "batch=16": dict(prompts=2), "batch=256": dict(prompts=32),
    "new=16": dict(new=16), "new=512": dict(new=512),
}


def hf_config(s):
    return transformers.Qwen3Config(
        vocab_size=s["vocab"], hidden_size=s["d"], intermediate_size=3 * s["d"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv"], head_dim=s["head_dim"], tie_word_embeddings=True,
        max_position_embeddings=1024, eos_token_id=None, pad_token_id=0)


def programs(s: dict, **run_fields) -> tuple:
    """(model config, transformers model, {name: run}) for shape `s`: the on-policy train update,
    the forward of its tokens, greedy decoding by grpo_jax and by transformers. Each run blocks."""
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(hf_config(s)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        mcfg, params = models.load_hf(tmp, **run_fields)
    rows = s["prompts"] * s["group"]
    train, forward = update_runs(mcfg, params, s["prompts"], s["group"], s["prompt_len"], s["new"])
    rng = np.random.default_rng(0)
    greedy = SamplingConfig(max_prompt_len=s["prompt_len"], max_new_tokens=s["new"], group_size=1, greedy=True,
                            ignore_eos=True)
    prompt_ids = rng.integers(3, s["vocab"], (rows, s["prompt_len"]))
    prompts = sampling.pad_prompts(prompt_ids.tolist(), greedy)

    def ours():
        jax.block_until_ready(sampling.generate(mcfg, params, prompts, jax.random.key(0), greedy))

    ids = torch.tensor(prompt_ids)

    def theirs():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=s["new"],
                           min_new_tokens=s["new"], do_sample=False, pad_token_id=0)

    return mcfg, model, {"train": train, "forward": forward, "grpo_jax greedy": ours, "transformers greedy": theirs}


def measure(name: str, s: dict, reps: int, peak: float) -> dict:
    mcfg, model, runs = programs(s)
    rows, seq = s["prompts"] * s["group"], s["prompt_len"] + s["new"]
    t = median_times(runs, reps)
    f_train = roofline.train_flops(mcfg, rows, seq - 1, s["new"])
    f_fwd = roofline.forward_flops(mcfg, rows, seq - 1, s["new"])
    f_dec = roofline.decode_flops(mcfg, rows, 1, s["prompt_len"], s["new"])
    return dict(
        row=name, shape=s, parameters=sum(p.numel() for p in model.parameters()), load=roofline.load(),
        train=roofline.row("train update", t["train"], f_train, peak),
        forward=roofline.row("forward", t["forward"], f_fwd, peak),
        train_over_forward=t["train"] / t["forward"],
        decode_ours=roofline.row("grpo_jax greedy", t["grpo_jax greedy"], f_dec, peak),
        decode_theirs=roofline.row("transformers greedy", t["transformers greedy"], f_dec, peak),
        decode_speedup=t["transformers greedy"] / t["grpo_jax greedy"],
    )


def main():
    host_memory.keep_freed_memory()  # as every entry point does (distributed.initialize); transformers too
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(ROWS), help=f"rows among {list(ROWS)}")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    peak = roofline.matmul_peak()
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="python -m bench.sweep " + " ".join(sys.argv[1:]), matmul_peak_gflops=peak,
                   load_start=roofline.load(), rows=[])
    print(f"matmul peak {peak:.0f} GFLOP/s; {results['load_start']}")
    print(f"{'row':14s}{'train s':>9s}{'of peak':>8s}{'fwd s':>8s}{'train/fwd':>10s}{'decode s':>9s}{'of peak':>8s}"
          f"{'hf s':>8s}{'x hf':>7s}")
    for name in args.only:
        r = measure(name, {**BASE, **ROWS[name]}, args.reps, peak)
        results["rows"].append(r)
        OUT.write_text(json.dumps(results, indent=2) + "\n")
        print(f"{name:14s}{r['train']['seconds']:>9.2f}{r['train']['peak_frac']:>8.2f}{r['forward']['seconds']:>8.2f}"
              f"{r['train_over_forward']:>10.2f}{r['decode_ours']['seconds']:>9.2f}{r['decode_ours']['peak_frac']:>8.2f}"
              f"{r['decode_theirs']['seconds']:>8.2f}{r['decode_speedup']:>7.2f}", flush=True)
    results["load_end"] = roofline.load()
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['load_start']} -> {results['load_end']}; wrote {OUT}")


if __name__ == "__main__":
    main()
