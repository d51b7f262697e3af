"""The first RL step of a fresh process (compiling) on the RL-step workload, cold and warm.

    python -m bench.first_step [--config experiments/configs/quickstart.py]

Three fresh processes, one after the other, each building `trainer.Trainer` and running two steps of
the host loop: without the persistent compilation cache (`train.compilation_cache_dir=""`), with an
empty cache directory (cold: a new user's first run, every program compiled and written), and again
with that directory (warm: a rerun, a resume, or any run of the same shapes). compile s = first step
- second step. Programs are counted from JAX's compile log (`jax_log_compiles`) up to the end of the
first step: each program XLA compiled or loaded from the cache (hits), and the seconds that took.
Writes bench/results/first_step[_<config>].json.
"""

import argparse
import datetime
import json
import logging
import os
import pathlib
import re
import sys
import tempfile
import time

from bench.common import RESULTS, measured_process


class CompileLog(logging.Handler):
    """Counts the programs XLA compiled or loaded from the persistent cache (hits), and their seconds."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.programs, self.seconds, self.hits = 0, 0.0, 0

    def emit(self, record):
        message = record.getMessage()
        if m := re.match(r"Finished XLA compilation of .* in ([\d.e-]+) sec", message):
            self.programs += 1
            self.seconds += float(m.group(1))
        elif message.startswith("Persistent compilation cache hit"):
            self.hits += 1


def child(config: str | None, cache_dir: str) -> dict:
    """One fresh process: Trainer() and two steps, timed."""
    start = time.perf_counter()
    from grpo_jax import host_memory

    host_memory.keep_freed_memory()  # as every entry point does (distributed.initialize)
    import jax

    log = CompileLog()
    jax.config.update("jax_log_compiles", True)
    for name in ("jax._src.dispatch", "jax._src.compiler", "jax._src.compilation_cache"):
        logger = logging.getLogger(name)
        logger.addHandler(log)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    from bench import workload
    from grpo_jax import run, trainer

    cfg = workload.config(config)
    used = run.use_compilation_cache(cache_dir)
    t0 = time.perf_counter()
    t = trainer.Trainer(cfg)
    t1 = time.perf_counter()
    t.train_step()
    t2 = time.perf_counter()
    programs = {"programs": log.programs, "xla_s": log.seconds, "cache_hits": log.hits}
    t.train_step()
    t3 = time.perf_counter()
    return {"cache_dir": used, "import_s": t0 - start, "init_s": t1 - t0, "first_step_s": t2 - t1,
            "second_step_s": t3 - t2, "compile_s": (t2 - t1) - (t3 - t2), "to_first_step_end_s": t2 - start,
            "programs_to_first_step_end": programs}


def load() -> str:
    return pathlib.Path("/proc/loadavg").read_text().split()[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="an experiments config file (default: the RL-step workload)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the cache directory of one measured process
    args = parser.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.config, args.child)))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE") and k != "JAX_COMPILATION_CACHE_DIR"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="first_step_xla_") as cache:
        for name, cache_dir in (("no cache", ""), ("cache cold (empty)", cache), ("cache warm (rerun)", cache)):
            before = load()
            config = ["--config", args.config] if args.config else []
            result = measured_process("bench.first_step", [*config, "--child", cache_dir], env, name)
            rows.append({"run": name, **result, "load_before": before, "load_after": load()})
            print(f"{name}: first step {result['first_step_s']:.1f} s (load {before} -> {rows[-1]['load_after']})",
                  flush=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.first_step " + " ".join(sys.argv[1:]), "config": args.config, "rows": rows,
    }
    path = RESULTS / ("first_step" + (f"_{pathlib.Path(args.config).stem}" if args.config else "") + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'run':20s}{'init s':>8s}{'first s':>9s}{'second s':>10s}{'compile s':>11s}{'programs':>10s}"
          f"{'XLA s':>7s}{'hits':>6s}{'load':>12s}")
    for r in rows:
        p = r["programs_to_first_step_end"]
        print(f"{r['run']:20s}{r['init_s']:>8.1f}{r['first_step_s']:>9.1f}{r['second_step_s']:>10.1f}{r['compile_s']:>11.1f}"
              f"{p['programs']:>10d}{p['xla_s']:>7.1f}{p['cache_hits']:>6d}"
              f"{r['load_before'] + '-' + r['load_after']:>12s}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
