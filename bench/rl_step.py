"""One RL step of the host loop (`grpo_jax.trainer`) on the RL-step workload, against the compute limit.

    python -m bench.rl_step [--config experiments/configs/quickstart.py] [--steps 6] [--set KEY=VALUE ...]

Default: the RL-step workload (bench/workload.py: a random 4.2M-parameter Qwen3 in float32 loaded from
a local HF directory, as TRL and Tunix load it; 16 prompts of 9 tokens x 8 completions of 64 new
tokens, GSPO, one AdamW update per rollout batch: on-policy); `--config` runs an experiments config
instead. `--set` overrides the config as a run's does. Step 1 compiles; times are
medians of steps 2..N; FLOPs and the fraction of the measured matmul peak as in bench/roofline.py.
Writes bench/results/rl_step[_<config>][_<overrides>].json.
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import re
import statistics
import sys
import time

import jax

from bench import roofline, workload
from bench.common import RESULTS
from grpo_jax import host_memory, trainer
from grpo_jax.config import override


def main():
    host_memory.keep_freed_memory()  # as every entry point does (distributed.initialize)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an experiments config file (default: the RL-step workload)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides as a run's --set takes them, e.g. model_options.layer_loop=scan")
    args = parser.parse_args()
    t = trainer.Trainer(override(workload.config(args.config), args.set))
    cfg = t.cfg  # with the model loaded from model_path
    load_start = roofline.load()
    peak = roofline.matmul_peak()

    steps = []  # (step s, generate s, train s, mean completion length)
    for i in range(args.steps):
        t0 = time.perf_counter()
        metrics, _ = t.train_step()
        steps.append((time.perf_counter() - t0, metrics["time/generate_s"], metrics["time/train_s"],
                      metrics["completion/length_mean"]))
        print(f"step {i + 1}: {steps[-1][0]:.2f} s", flush=True)

    s, rows = cfg.sampling, cfg.train.prompts_per_step * cfg.sampling.group_size
    new = statistics.mean(x[3] for x in steps[1:])  # mean completion length drawn
    flops_train = roofline.train_flops(cfg.model, rows, s.max_prompt_len + s.max_new_tokens - 1, s.max_new_tokens)
    flops_gen = roofline.decode_flops(cfg.model, cfg.train.prompts_per_step, s.group_size, s.max_prompt_len, round(new))
    med = lambda k: statistics.median(x[k] for x in steps[1:])  # noqa: E731
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.rl_step " + " ".join(sys.argv[1:]), "config": args.config, "overrides": args.set,
        "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "sampling": dataclasses.asdict(s) | {"rows": rows},
        "matmul_peak_gflops": peak, "load_start": load_start, "load_end": roofline.load(),
        "mean_completion_len": new,
        "host_loop": {"first_step_s": steps[0][0], "generate_s": med(1), "train_s": med(2), "step_s": med(0)},
        "roofline": [roofline.row("generate", med(1), flops_gen, peak),
                     roofline.row("train", med(2), flops_train, peak),
                     roofline.row("step", med(0), flops_gen + flops_train, peak)],
        "steps": steps,
    }
    parts = [pathlib.Path(args.config).stem] if args.config else []
    name = re.sub(r"[^\w.=-]", "_", "_".join(["rl_step", *parts, *args.set]))  # a value may hold a path
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    h = result["host_loop"]
    print(f"\n{rows} completions/step; matmul peak {peak:.0f} GFLOP/s; {load_start} -> {result['load_end']}")
    print(f"{'first step s':>14s}{'generate s':>12s}{'train s':>10s}{'step s':>10s}")
    print(f"{h['first_step_s']:>14.2f}{h['generate_s']:>12.2f}{h['train_s']:>10.2f}{h['step_s']:>10.2f}")
    print(f"\n{'roofline':10s}{'s':>8s}{'GFLOP':>9s}{'GFLOP/s':>9s}{'of peak':>9s}{'at peak s':>10s}")
    for r in result["roofline"]:
        print(f"{r['name']:10s}{r['seconds']:>8.2f}{r['gflop']:>9.1f}{r['gflops']:>9.1f}{r['peak_frac']:>9.2f}{r['limit_s']:>10.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
