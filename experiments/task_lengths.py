"""Reference completion lengths of the column-addition task (grpo_jax/data/reasoning.py), per setting
of its difficulty knob: the spread that sequence-level and token-level algorithms weigh differently.

    python experiments/task_lengths.py [--results-dir DIR] [--examples 2000]

Lengths are char tokens of the written solution plus eos (what the warm start trains on and a perfect
policy samples), over the first `--examples` training examples of seed 0. Settings: the task of
experiments/configs/long_addition.py with max_digits set to 8, 12, its own and 22, and the task's
defaults. Writes experiments/results/task_lengths/{lengths.json, lengths.md} and prints the table.
"""

import argparse
import dataclasses
import json
import pathlib

import numpy as np
from configs.long_addition import get_config  # experiments/configs/long_addition.py

from grpo_jax import data

HERE = pathlib.Path(__file__).parent
QUANTILES = (5, 25, 50, 75, 95)


def settings() -> dict[str, data.ColumnAdditionConfig]:
    task = get_config().task
    knob = {m: dataclasses.replace(task, max_digits=m) for m in sorted({8, 12, task.max_digits, 22})}
    return {**{("long_addition (the config)" if m == task.max_digits else f"long_addition, max_digits={m}"): t
               for m, t in knob.items()},
            "task defaults": data.ColumnAdditionConfig()}


def lengths(task: data.ColumnAdditionConfig, examples: int) -> dict:
    train = data.ColumnAddition(task, "train", examples, seed=0)
    n = np.array([len(train[i]["solution"]) + 1 for i in range(examples)])
    q = dict(zip((f"p{k}" for k in QUANTILES), np.percentile(n, QUANTILES).tolist()))
    return {"min_digits": task.min_digits, "max_digits": task.max_digits, "examples": examples, "min": int(n.min()),
            **q, "max": int(n.max()), "mean": round(float(n.mean()), 1), "p95/p5": round(q["p95"] / q["p5"], 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=pathlib.Path, default=HERE / "results" / "task_lengths")
    parser.add_argument("--examples", type=int, default=2000)
    args = parser.parse_args()
    rows = {name: lengths(task, args.examples) for name, task in settings().items()}
    columns = ["min_digits", "max_digits", "min", *(f"p{k}" for k in QUANTILES), "max", "mean", "p95/p5"]
    table = "\n".join([
        f"Reference completion lengths (char tokens with eos) of column_addition, {args.examples} training examples each.",
        "", "| setting | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|",
        *(f"| {name} | " + " | ".join(f"{r[c]:g}" for c in columns) + " |" for name, r in rows.items()),
    ])
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "lengths.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.results_dir / "lengths.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
