"""Sampler throughput: `grpo_jax.sampling.generate` vs `transformers` `generate` (PyTorch, CPU).

Same random Qwen3-style weights (~22M parameters) on both sides, plain temperature-1 sampling from the
full distribution, no early stop (every row produces max_new_tokens). Prefill time is that of a
1-new-token call; decode throughput is (rows * (new - 1)) / (full time - prefill time); each time is
the fastest of 3 interleaved runs. A second table shows the prefill cost against the group size G at
a fixed number of distinct prompts.

    python -m bench.sampler            # writes bench/results/sampler.json
"""

import argparse
import json
import os
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

from bench.common import RESULTS
from grpo_jax import models
from grpo_jax.config import SamplingConfig
from grpo_jax.sampling import generate, pad_prompts

MODEL = dict(vocab_size=32768, hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
             num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, max_position_embeddings=1024)
PROMPT_LEN, NEW, BATCHES, REPEATS = 64, 128, (16, 64), 3
GROUP_PROMPTS, GROUPS = 8, (1, 2, 4, 8)
OUT = RESULTS / "sampler.json"


def prompt_lists(n, seed=0):
    """n prompts of 32..64 tokens (left padding is exercised)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, MODEL["vocab_size"], rng.integers(PROMPT_LEN // 2, PROMPT_LEN + 1)).tolist()
            for _ in range(n)]


def best_times(runs):
    """Fastest of REPEATS timed calls of each run after a warm-up (compilation) call. The runs are
    interleaved so that load from other processes on a shared machine hits them alike."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def ours(cfg, params, prompts, new, group=1):
    scfg = SamplingConfig(max_prompt_len=PROMPT_LEN, max_new_tokens=new, group_size=group)
    padded = pad_prompts(prompts, scfg)
    keys = iter(range(10**6))
    return lambda: jax.block_until_ready(generate(cfg, params, padded, jax.random.key(next(keys)), scfg))


def theirs(model, prompts, new):
    ids = torch.tensor([[0] * (PROMPT_LEN - len(p)) + p for p in prompts])
    mask = (ids != 0).long()

    def run():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    return run


def rates(prompts, prefill_s, full_s):
    rows = len(prompts)
    return dict(prefill_s=prefill_s, total_s=full_s, prefill_tok_s=sum(map(len, prompts)) / prefill_s,
                decode_tok_s=rows * (NEW - 1) / (full_s - prefill_s), total_tok_s=rows * NEW / full_s)


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**MODEL, eos_token_id=None)).eval()
    n_params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        cfg, params = models.load_hf(tmp)
    results = dict(model=dict(MODEL, parameters=n_params), prompt_len=f"{PROMPT_LEN // 2}..{PROMPT_LEN}",
                   new_tokens=NEW, devices=str(jax.devices()[0].platform), torch_threads=torch.get_num_threads(),
                   load_average_start=os.getloadavg(), throughput=[], prefill_vs_group=[])
    for batch in BATCHES:
        prompts = prompt_lists(batch)
        t = best_times({("grpo_jax", 1): ours(cfg, params, prompts, 1), ("grpo_jax", NEW): ours(cfg, params, prompts, NEW),
                        ("transformers", 1): theirs(model, prompts, 1), ("transformers", NEW): theirs(model, prompts, NEW)})
        for name in ("grpo_jax", "transformers"):
            results["throughput"].append(dict(sampler=name, batch=batch, **rates(prompts, t[name, 1], t[name, NEW])))
            print(results["throughput"][-1], flush=True)
    prompts = prompt_lists(GROUP_PROMPTS, seed=1)
    for group in GROUPS:  # shared: P prompts x G samples; per row: the same P*G rows as distinct prompts
        t = best_times({"shared": ours(cfg, params, prompts, 1, group),
                        "per_row": ours(cfg, params, [p for p in prompts for _ in range(group)], 1)})
        results["prefill_vs_group"].append(dict(prompts=GROUP_PROMPTS, group=group, rows=GROUP_PROMPTS * group,
                                                shared_prefill_s=t["shared"], prefill_per_row_s=t["per_row"]))
        print(results["prefill_vs_group"][-1], flush=True)

    print(f"\nQwen3-style, {n_params / 1e6:.1f}M parameters, prompts {results['prompt_len']} tokens, {NEW} new")
    print(f"{'sampler':<14}{'batch':>6}{'prefill tok/s':>15}{'decode tok/s':>14}{'total tok/s':>13}{'total s':>9}")
    for r in results["throughput"]:
        print(f"{r['sampler']:<14}{r['batch']:>6}{r['prefill_tok_s']:>15.0f}{r['decode_tok_s']:>14.0f}"
              f"{r['total_tok_s']:>13.0f}{r['total_s']:>9.2f}")
    for batch in BATCHES:
        a, b = (next(r for r in results["throughput"] if r["sampler"] == s and r["batch"] == batch)
                for s in ("grpo_jax", "transformers"))
        print(f"batch {batch}: decode speed-up x{a['decode_tok_s'] / b['decode_tok_s']:.2f}, "
              f"total x{a['total_tok_s'] / b['total_tok_s']:.2f}")
    print(f"\nprefill (1 new token) of {GROUP_PROMPTS} distinct prompts, G samples each")
    print(f"{'G':>3}{'rows':>6}{'shared prefill s':>18}{'prefill per row s':>19}")
    for r in results["prefill_vs_group"]:
        print(f"{r['group']:>3}{r['rows']:>6}{r['shared_prefill_s']:>18.3f}{r['prefill_per_row_s']:>19.3f}")
    results["load_average_end"] = os.getloadavg()  # (1, 5, 15 min): the cores are shared
    print(f"load average {results['load_average_start']} -> {results['load_average_end']}")
    OUT.write_text(json.dumps(results, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
