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
bench/results/sweep.json as they finish (a partial run keeps what it measured); with --only, the rows
measured replace those of the same name in it, each row with its own date and matmul peak.

Long-tail rows ("tail ..."): greedy decoding only, each row forced to a length drawn from
bench/long_tail.py's lognormal (median new / 8, capped at new) by its processors, stopping there
(not ignore_eos), by grpo_jax at `decode_slots` all rows (0) or `slots`, and by transformers; both
checked to produce exactly those lengths. FLOPs count the useful tokens only (each fed token
attending to its prompt and the completion so far).
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

from bench import long_tail, roofline
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
    "tail new=512": dict(new=512, tail=True), "tail new=512 slots=32": dict(new=512, tail=True, slots=32),
}


def hf_config(s):
    return transformers.Qwen3Config(
        vocab_size=s["vocab"], hidden_size=s["d"], intermediate_size=3 * s["d"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv"], head_dim=s["head_dim"], tie_word_embeddings=True,
        max_position_embeddings=1024, eos_token_id=long_tail.STOP if s.get("tail") else None, pad_token_id=0)


def tail_decode_flops(cfg, prompts: int, prompt_len: int, lengths) -> float:
    """`roofline.decode_flops` for rows of the given completion lengths, counting the useful tokens only:
    token t of a row (fed for t = 0 .. L - 2) attends to prompt_len + t + 1 keys."""
    prefill = prompts * (prompt_len * roofline.layer_flops_per_token(cfg, prompt_len) + roofline.logits_flops(cfg))
    per_token = lambda context: roofline.layer_flops_per_token(cfg, context) + roofline.logits_flops(cfg)  # noqa: E731
    return prefill + sum((n - 1) * per_token(prompt_len + n / 2) for n in map(int, lengths))


def programs(s: dict, **run_fields) -> tuple:
    """(model config, transformers model, {name: run}) for shape `s`: the on-policy train update,
    the forward of its tokens, greedy decoding by grpo_jax and by transformers. Each run blocks."""
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(hf_config(s)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        mcfg, params = models.load_hf(tmp, **run_fields)
    rows = s["prompts"] * s["group"]
    if s.get("tail"):
        return mcfg, model, tail_decodes(s, mcfg, params, model)
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


def tail_lengths(s: dict):
    return long_tail.tail_lengths(s["prompts"] * s["group"], s["new"], seed=s["new"])


def tail_decodes(s: dict, mcfg, params, model) -> dict:
    """Greedy decoding of every row to its long-tailed length (`tail_lengths`), by grpo_jax on `s["slots"]`
    decode slots (0: all rows) and by transformers; each call checks the lengths."""
    lengths = tail_lengths(s)
    greedy = SamplingConfig(max_prompt_len=s["prompt_len"], max_new_tokens=s["new"], group_size=1, greedy=True,
                            decode_slots=s.get("slots", 0))
    prompt_ids = np.random.default_rng(0).integers(3, s["vocab"], (len(lengths), s["prompt_len"]))
    prompts = sampling.pad_prompts(prompt_ids.tolist(), greedy)
    stop_ids = sampling.check_prompts(mcfg, prompts, greedy)
    force = long_tail.force_lengths(lengths, long_tail.STOP)

    def check(name, got):
        if not np.array_equal(got, lengths):
            raise AssertionError(f"{name}: completion lengths differ from the forced ones at rows "
                                 f"{np.flatnonzero(got != lengths)[:10].tolist()}")

    def ours():
        out = sampling.rollout(mcfg, greedy, stop_ids, None, params, prompts, jax.random.key(0), processor=force)
        check("grpo_jax", np.asarray(out.lengths))

    ids = torch.tensor(prompt_ids)
    processors = transformers.LogitsProcessorList([long_tail.hf_processor(lengths, long_tail.STOP, s["prompt_len"])])

    def theirs():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=s["new"],
                                 do_sample=False, eos_token_id=long_tail.STOP, pad_token_id=0,
                                 logits_processor=processors)
        check("transformers", long_tail.hf_lengths(out.numpy(), s["prompt_len"], long_tail.STOP))

    return {"grpo_jax greedy": ours, "transformers greedy": theirs}


def measure(name: str, s: dict, reps: int, peak: float) -> dict:
    mcfg, model, runs = programs(s)
    rows, seq = s["prompts"] * s["group"], s["prompt_len"] + s["new"]
    t = median_times(runs, reps)
    if s.get("tail"):
        lengths = tail_lengths(s)
        f_dec = tail_decode_flops(mcfg, rows, s["prompt_len"], lengths)
        return dict(
            row=name, shape=s, parameters=sum(p.numel() for p in model.parameters()), load=roofline.load(),
            useful_tokens=int(lengths.sum()), max_length=int(lengths.max()),
            decode_ours=roofline.row("grpo_jax greedy", t["grpo_jax greedy"], f_dec, peak),
            decode_theirs=roofline.row("transformers greedy", t["transformers greedy"], f_dec, peak),
            decode_speedup=t["transformers greedy"] / t["grpo_jax greedy"],
        )
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
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = dict(date=date, command="python -m bench.sweep " + " ".join(sys.argv[1:]), matmul_peak_gflops=peak,
                   load_start=roofline.load(), rows=[])
    rows = {}  # with --only, the file's other rows stay, each with its own date and peak
    if set(args.only) != set(ROWS) and OUT.exists():
        before = json.loads(OUT.read_text())
        rows = {r["row"]: dict(r, date=r.get("date", before.get("date")),
                               matmul_peak_gflops=r.get("matmul_peak_gflops", before.get("matmul_peak_gflops")))
                for r in before["rows"]}
    print(f"matmul peak {peak:.0f} GFLOP/s; {results['load_start']}")
    print(f"{'row':22s}{'train s':>9s}{'of peak':>8s}{'fwd s':>8s}{'train/fwd':>10s}{'decode s':>9s}{'of peak':>8s}"
          f"{'hf s':>8s}{'x hf':>7s}")
    for name in args.only:
        r = measure(name, {**BASE, **ROWS[name]}, args.reps, peak)
        r = rows[name] = dict(r, date=date, matmul_peak_gflops=peak)
        results["rows"] = list(rows.values())
        OUT.write_text(json.dumps(results, indent=2) + "\n")
        train = (f"{r['train']['seconds']:>9.2f}{r['train']['peak_frac']:>8.2f}{r['forward']['seconds']:>8.2f}"
                 f"{r['train_over_forward']:>10.2f}" if "train" in r else f"{'-':>9s}{'-':>8s}{'-':>8s}{'-':>10s}")
        print(f"{name:22s}{train}{r['decode_ours']['seconds']:>9.2f}{r['decode_ours']['peak_frac']:>8.2f}"
              f"{r['decode_theirs']['seconds']:>8.2f}{r['decode_speedup']:>7.2f}", flush=True)
    results["load_end"] = roofline.load()
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['load_start']} -> {results['load_end']}; wrote {OUT}")


if __name__ == "__main__":
    main()
