"""Quickstart: a tiny Qwen3-style model learns arithmetic, first supervised (briefly), then with GSPO.

    pip install -e . && python experiments/quickstart.py [--results-dir DIR] [--seed N]

The supervised warm start stops early, as soon as greedy held-out accuracy reaches
WARM_START_ACCURACY, so that the model knows the answer format but not yet the arithmetic; GSPO
(experiments/configs/quickstart.py) then trains on the exact-match reward alone. Prints a
before/after table and writes experiments/results/quickstart/{summary.json, curves.png} (or into
--results-dir); the run itself (metrics.jsonl, TensorBoard events, checkpoints) goes to runs/quickstart.
"""

import argparse
import dataclasses
import json
import pathlib
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import data, run, sampling, trainer
from grpo_jax import train_step as ts
from grpo_jax.train import load_config

HERE = pathlib.Path(__file__).parent

WARM_START_ACCURACY = 0.2  # stop supervised training once greedy held-out accuracy reaches this
SFT_BATCH, SFT_LR, SFT_EVAL_EVERY, SFT_MAX_STEPS = 64, 3e-3, 25, 2000


def sft_batches(cfg, tok):
    """Endless (tokens, positions, segment_ids, mask) batches of prompt + answer + eos."""
    batches = data.batches(trainer.build_task(cfg).train, batch_size=SFT_BATCH, seed=cfg.train.seed + 1)
    new = cfg.sampling.max_new_tokens
    for i in range(len(batches)):
        examples = batches[i]
        prompts = sampling.pad_prompts([tok.encode(ex["prompt"]) for ex in examples], cfg.sampling)
        answers = [tok.encode(ex["answer"], add_bos=False) + [tok.eos_id] for ex in examples]
        completions = np.array([a + [0] * (new - len(a)) for a in answers], np.int32)
        mask = (completions > 0).astype(np.float32)
        yield (*ts.sequences(prompts.tokens, prompts.lengths, jnp.asarray(completions)), jnp.asarray(mask))


def warm_start(cfg, t: trainer.Trainer) -> tuple[object, list[dict]]:
    """Cross-entropy on the answer tokens until greedy held-out accuracy >= WARM_START_ACCURACY."""
    optimizer = optax.adamw(SFT_LR)
    params = t.state.params
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, tokens, positions, segment_ids, mask):
        def loss(p):
            logp, _ = ts.completion_logprobs(cfg.model, 1.0, p, tokens, positions, segment_ids, mask, False)
            return -(logp * mask).sum() / mask.sum()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    log = []
    for i, batch in enumerate(sft_batches(cfg, t.task.tokenizer), 1):
        params, opt_state, loss = step(params, opt_state, *batch)
        if i % SFT_EVAL_EVERY == 0 or i == SFT_MAX_STEPS:
            t.state = dataclasses.replace(t.state, params=params)
            acc = t.evaluate()["eval/accuracy_greedy"]
            log.append({"sft_step": i, "loss": float(loss), "accuracy_greedy": acc})
            print(f"warm start step {i}: loss {float(loss):.3f}, held-out greedy accuracy {acc:.1%}")
            if acc >= WARM_START_ACCURACY or i == SFT_MAX_STEPS:
                return params, log


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=pathlib.Path, default=HERE / "results" / "quickstart")
    parser.add_argument("--seed", type=int, help="model init, data order and held-out draw (default: the config's)")
    args = parser.parse_args()
    results = args.results_dir
    start = time.perf_counter()
    cfg = load_config(HERE / "configs" / "quickstart.py")
    if args.seed is not None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=args.seed))
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)  # a fresh run, never a resume
    params, sft_log = warm_start(cfg, trainer.Trainer(cfg))
    warm_seconds = time.perf_counter() - start
    out = run.train(cfg, params)
    rows = [json.loads(line) for line in (pathlib.Path(cfg.train.out_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "clip_frac_low" in r]
    clip = lambda r: r["clip_frac_low"] + r["clip_frac_high"]  # noqa: E731
    before, after = out["first_eval"], out["last_eval"]
    summary = {
        "accuracy_before": before["eval/accuracy_greedy"],
        "accuracy_after": after["eval/accuracy_greedy"],
        "sampled_accuracy_before": before["eval/accuracy_sampled"],
        "sampled_accuracy_after": after["eval/accuracy_sampled"],
        "mean_reward_before": before["eval/reward_sampled"],
        "mean_reward_after": after["eval/reward_sampled"],
        "completion_length_before": before["eval/length_sampled"],
        "completion_length_after": after["eval/length_sampled"],
        "clip_fraction_mean": float(np.mean([clip(r) for r in steps])),  # over every RL step
        "warm_start_steps": sft_log[-1]["sft_step"],
        "warm_start_seconds": warm_seconds,
        "rl_steps": cfg.train.steps,
        "rl_seconds": out["wall_seconds"],
        "wall_seconds": time.perf_counter() - start,
        "held_out_prompts": cfg.train.eval_prompts,
        "seed": cfg.train.seed,
        "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.copy(pathlib.Path(cfg.train.out_dir) / "curves.png", results / "curves.png")
    print(f"\n{'':28s}{'before (warm start)':>20s}{'after GSPO':>14s}")
    for name, key in (
        ("held-out accuracy (greedy)", "accuracy"), ("held-out accuracy (sampled)", "sampled_accuracy"),
        ("mean reward (sampled)", "mean_reward"), ("completion length", "completion_length"),
    ):
        print(f"{name:28s}{summary[key + '_before']:>20.3f}{summary[key + '_after']:>14.3f}")
    print(f"{'clip fraction (mean over the GSPO steps)':48s}{summary['clip_fraction_mean']:>14.4f}")
    print(f"\nwall time {summary['wall_seconds']:.0f} s (warm start {warm_seconds:.0f} s); "
          f"wrote {results / 'summary.json'} and {results / 'curves.png'}")


if __name__ == "__main__":
    main()
