"""The layer scan against unrolled layers (`ModelConfig.layer_loop`) in training: the on-policy
train update and the forward of its tokens, both built in one process and timed interleaved.

    python -m bench.scan_layers [--rows base layers=16] [--reps 9]     # ~10 min on 2 idle cores

Rows are bench/sweep.py's shapes. First call = compile + one run; the unrolled programs are built
first, so one-time costs of the process (tracing caches, thread pools) fall on them, not on the
scan. Each row measured replaces its earlier result in bench/results/scan_layers.json, dated.
"""

import argparse
import datetime
import json
import sys
import time

from bench import roofline, sweep
from bench.common import RESULTS, median_times
from grpo_jax import host_memory

OUT = RESULTS / "scan_layers.json"
MODES = ("unrolled", "scan")  # ModelConfig.layer_loop values


def measure(name: str, reps: int) -> dict:
    s = {**sweep.BASE, **sweep.ROWS[name]}
    runs, first = {}, {}
    for mode in MODES:
        _, _, programs = sweep.programs(s, layer_loop=mode)
        for kind in ("train", "forward"):
            t0 = time.perf_counter()
            programs[kind]()
            first[f"{kind} {mode}"] = time.perf_counter() - t0
            runs[f"{kind} {mode}"] = programs[kind]
    t = median_times(runs, reps)
    return dict(row=name, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="python -m bench.scan_layers " + " ".join(sys.argv[1:]), shape=s, load=roofline.load(),
                first_call_s=first, seconds=t,
                train_speedup=t["train scan"] / t["train unrolled"],
                forward_speedup=t["forward scan"] / t["forward unrolled"])


def main():
    host_memory.keep_freed_memory()  # as every entry point does (distributed.initialize)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=["base", "layers=16"], help=f"rows among {list(sweep.ROWS)}")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    rows = {r["row"]: r for r in json.loads(OUT.read_text())["rows"]} if OUT.exists() else {}
    print(f"{roofline.load()}")
    print(f"{'row':10s}{'mode':>10s}{'train s':>9s}{'fwd s':>8s}{'train/fwd':>10s}{'1st train s':>12s}{'1st fwd s':>10s}")
    for name in args.rows:
        r = rows[name] = measure(name, args.reps)
        for mode in MODES:
            t, f = r["seconds"][f"train {mode}"], r["seconds"][f"forward {mode}"]
            print(f"{name:10s}{mode:>10s}{t:>9.3f}{f:>8.3f}{t / f:>10.2f}{r['first_call_s'][f'train {mode}']:>12.1f}"
                  f"{r['first_call_s'][f'forward {mode}']:>10.1f}", flush=True)
        print(f"{'':10s} unrolled: train {r['train_speedup']:.2f}x, forward {r['forward_speedup']:.2f}x the scan's speed")
        OUT.write_text(json.dumps({"rows": list(rows.values())}, indent=2) + "\n")  # each row with its own date
    print(f"{roofline.load()}; wrote {OUT}")


if __name__ == "__main__":
    main()
