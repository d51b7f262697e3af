"""Quickstart: a tiny Qwen3-style model learns arithmetic, first supervised (briefly), then with GSPO.

    pip install -e . && python experiments/quickstart.py [--results-dir DIR] [--seed N]

(with the launch flags of grpo_jax/distributed.py to run over several processes).

The supervised warm start (experiments/warm_start.py) stops early, as soon as greedy held-out
accuracy reaches 20%, so that the model knows the answer format but not yet the arithmetic; GSPO
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
import numpy as np

from grpo_jax import distributed, run
from grpo_jax.train import load_config
from warm_start import warm_start  # experiments/warm_start.py (a script's folder is on sys.path)

HERE = pathlib.Path(__file__).parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=pathlib.Path, default=HERE / "results" / "quickstart")
    parser.add_argument("--seed", type=int, help="model init, data order and held-out draw (default: the config's)")
    distributed.add_arguments(parser)
    args = parser.parse_args()
    distributed.initialize(parser, args)
    results = args.results_dir
    start = time.perf_counter()
    cfg = load_config(HERE / "configs" / "quickstart.py")
    if args.seed is not None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=args.seed))
    distributed.remove(cfg.train.out_dir)  # a fresh run, never a resume
    params, sft_log = warm_start(cfg)
    warm_seconds = time.perf_counter() - start
    out = run.train(cfg, params)
    if jax.process_index() != 0:  # process 0 writes the results
        return
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
