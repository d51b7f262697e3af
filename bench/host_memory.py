"""The host loop's RL step with freed host memory kept (grpo_jax.host_memory) and with glibc's defaults.

    python bench/host_memory.py [--workload issue17|quickstart] [--rounds 2] [--steps 6]

Fresh processes alternate between GRPO_JAX_KEEP_FREED_MEMORY=1 (the default) and =0, `rounds` of each
(the setting is per process and fixed before jax starts its threads); each runs `steps` steps of the
host loop, without the persistent compilation cache (a Trainer alone opens none; run.train does), so
the first step compiles every program (the setting's price: XLA's compiler threads share one arena).
Per step: wall, generate and train seconds, user and system CPU seconds and minor page faults (getrusage). Medians over steps 2..N of every
process of a setting, and the median first step. Writes bench/results/host_memory_<workload>.json.
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

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from first_step import measured_process  # noqa: E402
FIELDS = ("step_s", "generate_s", "train_s", "user_s", "system_s", "page_faults")


def child(workload: str, steps: int) -> dict:
    from rl_step import get_config

    from grpo_jax import host_memory, trainer

    host_memory.keep_freed_memory()  # GRPO_JAX_KEEP_FREED_MEMORY=0 turns it off
    t = trainer.Trainer(get_config(workload))
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=("issue17", "quickstart"), default="issue17")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.workload, args.steps)))
        return
    runs = {"1": [], "0": []}
    for r in range(args.rounds):
        for keep in runs:
            env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {
                "GRPO_JAX_KEEP_FREED_MEMORY": keep, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            runs[keep].append(measured_process([__file__, "--child", "--workload", args.workload, "--steps",
                                                str(args.steps)], env, f"keep={keep}"))
            print(f"round {r + 1}, keep {keep}: step {statistics.median(s['step_s'] for s in runs[keep][-1]['steps'][1:]):.2f} s",
                  flush=True)
    summary = {keep: {f: statistics.median(s[f] for run in rs for s in run["steps"][1:]) for f in FIELDS}
               | {"first_step_s": statistics.median(run["steps"][0]["step_s"] for run in rs),
                  "max_rss_gib": max(run["max_rss_gib"] for run in rs)} for keep, rs in runs.items()}
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"python bench/host_memory.py --workload {args.workload} --rounds {args.rounds} --steps {args.steps}",
        "load_end": os.getloadavg(), "summary": summary, "runs": runs,
    }
    path = ROOT / "bench" / "results" / f"host_memory_{args.workload}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'freed memory':16s}" + "".join(f"{f:>13s}" for f in FIELDS) + f"{'first step s':>13s}{'max RSS GiB':>13s}")
    for keep, name in (("1", "kept (default)"), ("0", "returned")):
        s = summary[keep]
        print(f"{name:16s}" + "".join(f"{s[f]:>13.2f}" for f in FIELDS[:-1]) + f"{s['page_faults']:>13.0f}"
              + f"{s['first_step_s']:>13.2f}{s['max_rss_gib']:>13.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
