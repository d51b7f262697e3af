"""The host loop's RL step with freed host memory kept (grpo_jax.host_memory) and with glibc's defaults.

    python -m bench.host_memory [--config experiments/configs/quickstart.py] [--rounds 2] [--steps 6]

Fresh processes alternate between GRPO_JAX_KEEP_FREED_MEMORY=1 (the default) and =0, `rounds` of each
(the setting is per process and fixed before jax starts its threads); each runs `steps` steps of the
host loop on the RL-step workload (bench/workload.py), without the persistent compilation cache (a
Trainer alone opens none; run.train does), so the first step compiles every program (the setting's
price: XLA's compiler threads share one arena). Per step: wall, generate and train seconds, user and
system CPU seconds and minor page faults (getrusage). Medians over steps 2..N of every process of a
setting, and the median first step. Writes bench/results/host_memory[_<config>].json.
"""

import argparse
import datetime
import json
import os
import pathlib
import resource
import statistics
import sys
import time

from bench.common import RESULTS, measured_process

FIELDS = ("step_s", "generate_s", "train_s", "user_s", "system_s", "page_faults")


def child(config: str | None, steps: int) -> dict:
    from grpo_jax import host_memory

    host_memory.keep_freed_memory()  # GRPO_JAX_KEEP_FREED_MEMORY=0 turns it off
    from bench import workload
    from grpo_jax import trainer

    t = trainer.Trainer(workload.config(config))
    rows = []
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        metrics, _ = t.train_step()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append(dict(zip(FIELDS, (time.perf_counter() - t0, metrics["time/generate_s"], metrics["time/train_s"],
                                      r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime,
                                      r1.ru_minflt - r0.ru_minflt))))
    return {"steps": rows, "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an experiments config file (default: the RL-step workload)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.config, args.steps)))
        return
    runs = {"1": [], "0": []}
    child_args = ["--child", "--steps", str(args.steps)] + (["--config", args.config] if args.config else [])
    for r in range(args.rounds):
        for keep in runs:
            env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {
                "GRPO_JAX_KEEP_FREED_MEMORY": keep}
            runs[keep].append(measured_process("bench.host_memory", child_args, env, f"keep={keep}"))
            print(f"round {r + 1}, keep {keep}: step {statistics.median(s['step_s'] for s in runs[keep][-1]['steps'][1:]):.2f} s",
                  flush=True)
    summary = {keep: {f: statistics.median(s[f] for run in rs for s in run["steps"][1:]) for f in FIELDS}
               | {"first_step_s": statistics.median(run["steps"][0]["step_s"] for run in rs),
                  "max_rss_gib": max(run["max_rss_gib"] for run in rs)} for keep, rs in runs.items()}
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.host_memory " + " ".join(sys.argv[1:]), "config": args.config,
        "load_end": os.getloadavg(), "summary": summary, "runs": runs,
    }
    path = RESULTS / ("host_memory" + (f"_{pathlib.Path(args.config).stem}" if args.config else "") + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'freed memory':16s}" + "".join(f"{f:>13s}" for f in FIELDS) + f"{'first step s':>13s}{'max RSS GiB':>13s}")
    for keep, name in (("1", "kept (default)"), ("0", "returned")):
        s = summary[keep]
        print(f"{name:16s}" + "".join(f"{s[f]:>13.2f}" for f in FIELDS[:-1]) + f"{s['page_faults']:>13.0f}"
              + f"{s['first_step_s']:>13.2f}{s['max_rss_gib']:>13.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
