"""Soak drill: stop a tiny run at random points, resume it, and check it ends exactly where an
uninterrupted run ends.

    python scripts/soak_drill.py [--kills 30] [--seconds 3600] [--seed N] [--workdir DIR] [--set key=value ...]

One reference run, then one run stopped at random moments and restarted (the same command) until
`--kills` stops are made or `--seconds` are spent, then run to its end. The stops cycle through
SIGKILL of the trainer alone (a crash: no handler runs) and SIGINT or SIGTERM to its whole process
group (Ctrl-C, a scheduler's preemption), once or twice in quick succession (the second abandons the
step in flight); most land at a random time within the steps (sampling,
updates, evaluation, logging, saving), some during start-up. Checked after every stop: no process of
the run outlives it (reward workers included), an interrupt exits with 130 / 143, and every
checkpoint left behind restores (a save cut short before its checksums is whole: the next start
checksums it). At the end: the final train state (params, optimizer state, counters, random key,
data position) equals the reference's bit for bit; metrics.jsonl and TensorBoard hold every step
once, with the reference's values; a rerun says "run complete", changes nothing, and draws curves.png
again if it was lost. Prints a table
and exits 1 on any failure. The run is `--config` (default: the quickstart's, shrunk to a
one-layer model and 6 steps) with `--set` overrides; compilations are cached in the work dir.
"""

import argparse
import collections
import json
import os
import pathlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = (
    "train.steps=6", "train.prompts_per_step=2", "train.eval_prompts=4", "train.eval_every=3",
    "train.checkpoint_every=2", "train.keep_checkpoints=2", "reward.num_workers=1", "model.num_layers=1",
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "model.num_kv_heads=1",
    "sampling.group_size=4", "sampling.max_new_tokens=3",
)
STOPS = ("SIGKILL", "SIGINT", "SIGTERM", "SIGINT twice", "SIGTERM twice")
EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGINT twice": 130, "SIGTERM twice": 143}
TIMING = ("time/", "throughput/", "reward/time_s")  # wall-clock metrics: differ between any two runs


class Run:
    """One training process in its own session (process group), logging to `out/../NAME.log`."""

    def __init__(self, args, out: pathlib.Path, env: dict):
        self.out, self.started = out, time.monotonic()
        self.log_path = out.parent / f"{out.name}.log"
        self.log = open(self.log_path, "a")
        self.offset = self.log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_jax.train", "--config", str(args.config),
             *(a for s in (*TINY, *args.set, f"train.out_dir={out}") for a in ("--set", s))],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def rows(self) -> int:
        path = self.out / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self.log.close()
        return rc

    def output(self) -> str:
        return self.log_path.read_bytes()[self.offset:].decode(errors="replace")

    def survivors(self) -> list[int]:
        """Processes of this run's session still alive (the session id is the trainer's pid)."""
        alive = []
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.proc.pid and fields[0] != "Z":  # session id; zombies are gone
                alive.append(int(stat.parent.name))
        return alive


def event_scalars(directory: pathlib.Path) -> dict:
    """{(tag, step): [values]} of every TensorBoard scalar in `directory`; raises on a truncated record."""
    from grpo_jax.logging import read_events

    out = collections.defaultdict(list)
    for event in read_events(directory):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                out[(value.tag, event.step)].append(value.simple_value)
    return out


def final_state(out: pathlib.Path):
    """(state leaves as numpy, meta without the config) of the newest checkpoint in `out`."""
    import jax
    import numpy as np

    from grpo_jax.checkpoint import Checkpointer

    ckpt = Checkpointer(out / "checkpoints", 1, 1)
    step = ckpt.all_steps()[-1]
    state, meta = ckpt.restore(None, step)
    ckpt.close()
    meta.pop("config")
    return [np.asarray(x) for x in jax.tree.leaves(state)], meta


def check_leftovers(out: pathlib.Path) -> tuple[int, list[str]]:
    """Every checkpoint left behind is intact (or not yet checksummed) and restorable."""
    from grpo_jax.checkpoint import NO_CHECKSUMS, Checkpointer

    ckpt, failures, n = Checkpointer(out / "checkpoints", 1, 10**6), [], 0
    for step in ckpt.all_steps():
        problem = ckpt.problem(step)
        n += 1
        if problem not in (None, NO_CHECKSUMS):
            failures.append(f"leftover checkpoint {step}: {problem}")
            continue
        try:
            ckpt.restore(None, step)
        except Exception as e:  # noqa: BLE001 (any failure to restore is the finding)
            failures.append(f"leftover checkpoint {step} does not restore: {type(e).__name__}: {e}")
    ckpt.close()
    return n, failures


def compare(reference: pathlib.Path, drilled: pathlib.Path) -> list[str]:
    import numpy as np

    failures = []
    (ref_leaves, ref_meta), (leaves, meta) = final_state(reference), final_state(drilled)
    if meta != ref_meta:
        failures.append(f"final meta {meta} != reference {ref_meta}")
    if len(leaves) != len(ref_leaves) or not all(np.array_equal(a, b) for a, b in zip(leaves, ref_leaves)):
        failures.append("final train state differs from the uninterrupted run's")
    rows = [json.loads(line) for line in (drilled / "metrics.jsonl").read_text().splitlines()]
    ref_rows = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    if [r["step"] for r in rows] != [r["step"] for r in ref_rows]:
        failures.append(f"metrics.jsonl steps {[r['step'] for r in rows]} != {[r['step'] for r in ref_rows]}")
    for row, ref in zip(rows, ref_rows):
        keep = lambda r: {k: v for k, v in r.items() if not k.startswith(TIMING)}  # noqa: E731
        if keep(row) != keep(ref):
            diff = sorted(k for k in keep(row).keys() | keep(ref).keys() if keep(row).get(k) != keep(ref).get(k))
            failures.append(f"metrics.jsonl step {row['step']} differs from the reference in {diff}")
    scalars = event_scalars(drilled / "tensorboard")
    expected = {(k, r["step"]): v for r in rows for k, v in r.items() if k != "step"}
    if set(scalars) != set(expected):
        failures.append(f"TensorBoard holds {len(scalars)} (tag, step) pairs, metrics.jsonl {len(expected)}")
    twice = [key for key, values in scalars.items() if len(values) > 1]
    if twice:
        failures.append(f"TensorBoard holds {len(twice)} (tag, step) pairs more than once, e.g. {twice[0]}")
    if any(np.float32(expected[key]) != np.float32(values[0]) for key, values in scalars.items() if key in expected):
        failures.append("TensorBoard values differ from metrics.jsonl")
    return failures


def is_complete(out: pathlib.Path, steps: int) -> bool:
    from grpo_jax.checkpoint import Checkpointer

    ckpt = Checkpointer(out / "checkpoints", 1, 10**6)
    complete = steps in ckpt.all_steps() and ckpt.problem(steps) is None
    ckpt.close()
    return complete


def check_run(work: pathlib.Path, n: int, chain: list[str], failures: list[str]) -> bool:
    """Compares the finished drilled run with the reference; a failing one is kept as failed_run_N."""
    problems = compare(work / "reference", work / "drilled")
    failures += [f"run {n} (stops: {'; '.join(chain)}): {p}" for p in problems]
    if problems:
        (work / "drilled").rename(work / f"failed_run_{n}")
    else:
        shutil.rmtree(work / "drilled")
    return not problems


def drill(args) -> dict:
    rng = random.Random(args.seed)
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="soak_drill_")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "reference", ignore_errors=True)
    shutil.rmtree(work / "drilled", ignore_errors=True)
    for log in work.glob("*.log"):
        log.unlink()
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "JAX_ENABLE_COMPILATION_CACHE": "true", "JAX_COMPILATION_CACHE_DIR": str(work / "jax_cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    failures, stops, leftovers = [], collections.Counter(), 0
    start = time.monotonic()
    reference = Run(args, work / "reference", env)
    row_times = []
    while reference.proc.poll() is None:  # when each row appears: the step time, the start-up time
        n = reference.rows()
        row_times += [time.monotonic()] * (n - len(row_times))
        time.sleep(0.05)
    if reference.wait() != 0:
        raise SystemExit(f"the reference run failed; see {work / 'reference.log'}")
    steps = json.loads((work / "reference" / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    startup = row_times[0] - reference.started
    step_s = statistics.median(b - a for a, b in zip(row_times, row_times[1:]))  # a step once compiled
    print(f"reference: {time.monotonic() - start:.0f} s (first row after {startup:.1f} s, {step_s:.2f} s a step); "
          f"seed {args.seed}, work dir {work}", flush=True)

    kinds, runs, exact, chain = [], 0, 0, []
    while sum(stops.values()) < args.kills and time.monotonic() - start < args.seconds:
        kinds = kinds or rng.sample(STOPS, len(STOPS))
        kind = kinds.pop()
        run = Run(args, work / "drilled", env)
        rows_before = run.rows()
        during_steps = rng.random() < 0.8
        if during_steps:  # once the run is stepping: a random moment within the next two steps
            while run.rows() <= rows_before and run.proc.poll() is None:
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 2 * step_s))
        else:
            time.sleep(rng.uniform(0, startup))
        signalled, phase = run.proc.poll() is None, "steps" if during_steps else "start-up"
        if signalled:
            if kind == "SIGKILL":
                os.kill(run.proc.pid, signal.SIGKILL)
            else:
                os.killpg(run.proc.pid, getattr(signal, kind.split()[0]))
                if kind.endswith("twice"):  # impatient: the second abandons the step in flight, unsaved
                    time.sleep(rng.uniform(0.05, 0.5))
                    if run.proc.poll() is None:
                        os.killpg(run.proc.pid, getattr(signal, kind.split()[0]))
            stops[(kind, phase)] += 1
        rc = run.wait()
        finished = is_complete(work / "drilled", steps)  # a signal may land as it exits
        if signalled and kind in EXIT and during_steps and not finished and rc != EXIT[kind]:
            failures.append(f"{kind} during the steps: exit code {rc}, not {EXIT[kind]} (see drilled.log)")
        deadline = time.monotonic() + 10
        while run.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
        if run.survivors():
            failures.append(f"{kind}: processes {run.survivors()} outlived the trainer")
            for pid in run.survivors():
                os.kill(pid, signal.SIGKILL)
        n, problems = check_leftovers(work / "drilled")
        leftovers += n
        failures += problems
        chain.append(f"{kind} during {phase} (exit {rc}, {run.rows()} rows)" if signalled else "no stop")
        print(f"stop {sum(stops.values())}: {chain[-1]}", flush=True)
        if finished:  # this run is over: check it, then drill a fresh one
            runs, exact, chain = runs + 1, exact + check_run(work, runs + 1, chain, failures), []

    final = Run(args, work / "drilled", env)
    if final.wait() != 0:
        failures.append("the resumed run failed to finish (see drilled.log)")
    else:
        before = (work / "drilled" / "metrics.jsonl").read_text()
        (work / "drilled" / "curves.png").unlink(missing_ok=True)  # as a kill while the run closed leaves it
        again = Run(args, work / "drilled", env)
        if again.wait() != 0 or "run complete" not in again.output():
            failures.append("rerunning the finished run did not say 'run complete'")
        if not (work / "drilled" / "curves.png").exists():
            failures.append("rerunning the finished run did not draw the curves a kill while closing lost")
        if (work / "drilled" / "metrics.jsonl").read_text() != before:
            failures.append("rerunning the finished run changed metrics.jsonl")
        runs, exact = runs + 1, exact + check_run(work, runs + 1, chain + ["no stop"], failures)
    summary = {
        "seed": args.seed, "stops": {f"{k} during {p}": n for (k, p), n in sorted(stops.items())},
        "kills": sum(stops.values()), "runs": runs, "runs_exact": exact,
        "leftover_checkpoints_checked": leftovers, "exact": not failures,
        "failures": failures, "seconds": round(time.monotonic() - start, 1),
    }
    print(f"\n{'stop':32s}{'count':>6s}")
    for name, n in summary["stops"].items():
        print(f"{name:32s}{n:>6d}")
    print(f"{summary['kills']} stops over {runs} runs, {exact} of {runs} exact, {leftovers} leftover checkpoints "
          f"checked, {summary['seconds']:.0f} s: " + ("final states, logs and TensorBoard exact" if not failures
                                                         else "FAILED:\n  " + "\n  ".join(failures)))
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="stops to make (default 30)")
    parser.add_argument("--seconds", type=float, default=3600, help="time budget of the stops (default 3600)")
    parser.add_argument("--seed", type=int, default=random.randrange(2**31), help="picks the stops (default: random)")
    parser.add_argument("--workdir", help="runs, logs and the compilation cache (default: a new temp dir)")
    parser.add_argument("--config", default=ROOT / "experiments" / "configs" / "quickstart.py")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="on top of the tiny defaults")
    parser.add_argument("--json", help="also write the summary here")
    args = parser.parse_args(argv)
    summary = drill(args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
