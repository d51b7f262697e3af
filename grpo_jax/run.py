"""The run driver: resume, signals, logs and checkpoint cadence around the `Trainer`'s steps.

A run can stop at any moment and continue exactly, because only states at step boundaries are
ever saved:

- SIGINT (Ctrl-C) and SIGTERM (preemption) finish the step in flight, save it and stop
  (KeyboardInterrupt, or SystemExit(143) for SIGTERM); a second signal abandons the step, unsaved.
  Over several processes, a signal to any one stops them all at the same step boundary.
- An exception inside a step saves nothing (the state is half-updated; the last checkpoint is the
  consistent one), as a kill would.
- A resume takes the newest intact checkpoint (`Checkpointer.latest_intact`: checksummed, with a
  fallback), refuses a config that differs from the checkpoint's in a field that changes the
  trajectory (`config.RESUMABLE` lists the fields that may change) and drops the log rows past it.
- A run whose checkpoint is at `train.steps` is complete: rerunning it says so and stops.
- `train.max_skipped_steps` steps' worth of consecutive skipped (non-finite) updates stop the run,
  unsaved, with the cause and the step; so do as many steps in a row that applied no update or whose
  every reward call failed: such a run learns nothing, and never ends as if it had.
"""

import json
import pathlib
import signal
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax import checkpoint, evaluate, sharding, trainer
from grpo_jax import train_step as ts
from grpo_jax import logging as run_logging
from grpo_jax.config import RESUMABLE, Config, flatten, resume_changes


class Stop(KeyboardInterrupt):
    """The run stopped on a signal, having said what it saved (the CLI exits 130 without a word more)."""


class Interrupts:
    """While active (main thread only), SIGINT and SIGTERM set `signum` instead of stopping the process:
    the run saves at the next step boundary, then `stop` raises. A second signal stops at once, unsaved:
    its exception may land in a callback that swallows exceptions (XLA's gc callback does), so
    `unless_abandoned` raises it again before anything is saved."""

    def __enter__(self):
        self.signum, self.abandoned = None, ""
        main = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.signum, self.abandoned = signum, f"second {name}: abandoned the step in flight, unsaved"
            print(f"\n{self.abandoned}", flush=True)
            self.stop()
        self.signum = signum
        print(f"\n{name}: finishing this step, then saving and stopping (again to stop at once, unsaved)", flush=True)

    def unless_abandoned(self):
        if self.abandoned:
            self.stop()

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def requested(self) -> bool:
        """Must the run stop at this step boundary? Over several processes, all stop (and save together)
        when any was signalled, as by the highest signal number received; a collective there."""
        if jax.process_count() > 1:
            self.signum = int(multihost_utils.process_allgather(np.int32(self.signum or 0)).max()) or None
        return self.signum is not None

    def stop(self):
        raise Stop(self.abandoned) if self.signum == signal.SIGINT else SystemExit(128 + self.signum)


class SkipWatch:
    """Counts consecutive skipped updates across steps; `observe` says why the run must stop, or None.

    Each update reports `skipped_updates` (0 or 1) and the check that failed (`train_step.SKIP_CAUSES`:
    non-finite loss, gradient, or updated parameters); an empty update (no counted token) is neither."""

    CAUSES = {"nonfinite_loss": "loss", "nonfinite_grad": "gradient", "nonfinite_params": "parameters"}

    def __init__(self, limit: int):
        self.limit, self.streak, self.cause = limit, 0, None

    def observe(self, step: int, updates: list[dict]) -> str | None:
        for u in updates:
            if u["skipped_updates"]:
                self.streak += 1
                self.cause = next(self.CAUSES[name] for name in ts.SKIP_CAUSES if u[name])
            elif not u["empty_updates"]:
                self.streak = 0
        if self.streak < self.limit:
            return None
        return (f"step {step}: the last {self.streak} updates were all skipped (non-finite {self.cause}); "
                "stopping, unsaved. The updates diverged: resume from the last checkpoint with a lower "
                f"{' or '.join(DIVERGED_MAY_CHANGE)} (after this stop, a resume may change them)")


# A run stopped by SkipWatch leaves this file in its out_dir: the next resume may change the fields of
# DIVERGED_MAY_CHANGE (the way out of a divergence), and the file goes once a checkpoint is saved.
DIVERGED = "diverged.json"
DIVERGED_MAY_CHANGE = ("optim.learning_rate", "optim.max_grad_norm")


class IdleWatch:
    """Counts the steps in a row that cannot have taught the policy anything: no update was applied
    (every update empty or skipped), or every reward call failed (their scores are not rewards, whatever
    `reward.on_failure` does with them). `observe` says why the run must stop, or None."""

    def __init__(self, limit: int):
        self.limit, self.streak = limit, 0

    def observe(self, step: int, metrics: dict, updates: list[dict]) -> str | None:
        rewards_failed = metrics.get("reward/failed_frac", 0.0) == 1.0
        applied = any(not (u["skipped_updates"] or u["empty_updates"]) for u in updates)
        self.streak = self.streak + 1 if rewards_failed or not applied else 0
        if self.streak < self.limit:
            return None
        if rewards_failed:
            why = ("every reward call failed (the warnings above give each reward's first error); fix the reward "
                   "functions")
        elif not metrics.get("groups/kept", 1):
            why = ("no group was kept for an update (their reward calls failed, so reward.on_failure='drop_group' "
                   "dropped them, or dynamic sampling found no group whose rewards differ)")
        else:
            why = ("every completion's tokens were masked (e.g. algorithm.mask_truncated with every completion "
                   "truncated: raise sampling.max_new_tokens)")
        return (f"step {step}: the last {self.streak} steps applied no update that could teach the policy: {why}; "
                f"stopping, unsaved (train.max_skipped_steps={self.limit}), then resume from the last checkpoint")


def _evals(row: dict | None) -> dict | None:
    return {k: v for k, v in (row or {}).items() if k.startswith("eval/")} or None


def use_compilation_cache(path: str) -> str:
    """Turns on JAX's persistent compilation cache in `path` ("~" expanded) for every program, however
    quick to compile (the small host-side ones add up on the first step); "" leaves it off. Returns the
    directory in use ("": none).

    A directory already given to JAX (JAX_COMPILATION_CACHE_DIR, jax.config, or an earlier run in this
    process) wins: JAX opens the cache at the first compilation and keeps that directory for the whole
    process, and the environment variable is how a user (or scripts/soak_drill.py) chooses it for
    every process at once, so `path` is then not used (process 0 prints a line saying so).

    Not on several CPU devices of one process (simulated ones): there, runs with a warm cache were seen
    to abort in XLA:CPU's collective rendezvous (the devices waiting at different all-reduces), and
    never with the cache off, so `path` is not used (with a line saying so); a directory given to JAX
    is, as the user's own choice."""
    given = jax.config.jax_compilation_cache_dir
    if given:
        if path and pathlib.Path(path).expanduser() != pathlib.Path(given) and jax.process_index() == 0:
            print(f"compilation cache: {given} (given to JAX), not train.compilation_cache_dir={path}")
        return given
    if path and jax.default_backend() == "cpu" and jax.local_device_count() > 1:
        if jax.process_index() == 0:
            print(f"compilation cache: off on {jax.local_device_count()} CPU devices in one process (warm-cache "
                  "runs there can abort in a collective), not train.compilation_cache_dir=" + path)
        return ""
    if path:
        jax.config.update("jax_compilation_cache_dir", str(pathlib.Path(path).expanduser()))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return jax.config.jax_compilation_cache_dir or ""


def train(cfg: Config, params=None, **data) -> dict:
    """Runs (or resumes) a whole RL run; returns the first and last evaluation (None without a held-out
    set or `train.eval_benchmarks`), the wall time, the checkpointed step it resumed from (None: a fresh run) and the final params. `data`: examples, held_out and rewards passed in code
    (`trainer.Trainer`). Compiled programs are cached in `train.compilation_cache_dir` (on by default;
    use_compilation_cache)."""
    start = time.perf_counter()
    use_compilation_cache(cfg.train.compilation_cache_dir)
    benchmarks = load_benchmarks(cfg)
    t = trainer.Trainer(cfg, params, **data)
    cfg, tr = t.cfg, t.cfg.train
    out = pathlib.Path(tr.out_dir)
    ckpt = checkpoint.Checkpointer(out / "checkpoints", tr.checkpoint_every, tr.keep_checkpoints)
    try:
        resume = ckpt.latest_intact()
        if resume is not None:
            diverged = (out / DIVERGED).exists()
            check_resume(ckpt.read_meta(resume)["config"], cfg, ckpt.directory, DIVERGED_MAY_CHANGE if diverged else ())
            t.restore(ckpt, resume)
        if t.step < tr.steps:
            logger = run_logging.MetricsLogger(out, tr.steps, resume, start, tr.report_to, flatten(cfg))
            first, last = _run(t, ckpt, logger, benchmarks)
        else:
            print(f"run complete: {ckpt.directory} holds step {t.step} of train.steps={tr.steps}; nothing to do")
            history = run_logging.read_rows(out / "metrics.jsonl")
            if history and not (out / "curves.png").exists() and jax.process_index() == 0:  # killed while closing
                run_logging.plot_curves(history, out / "curves.png")
            rows = {r["step"]: r for r in history}
            first, last = _evals(rows.get(0)), _evals(rows.get(t.step))
    finally:
        ckpt.close()
    if tr.export_hf:
        checkpoint.export_hf(cfg.model, t.export_params(), out / "hf", tokenizer_dir=t.source_path)
    return {"first_eval": first, "last_eval": last, "wall_seconds": time.perf_counter() - start,
            "resumed_from": resume, "params": t.state.params}  # the trained params (under LoRA: the adapters)


def check_resume(saved: dict, cfg: Config, directory: pathlib.Path, also: tuple[str, ...] = ()) -> None:
    """Refuses to continue the checkpointed run of `saved` (its flattened config) under a `cfg` that
    would make it a different run; the fields `also` may change too."""
    changes = resume_changes(saved, flatten(cfg), also)
    if changes:
        raise ValueError(
            f"{directory} holds a run whose config differs from this one (checkpoint -> now):\n  "
            + "\n  ".join(changes)
            + "\nResume with the checkpoint's values, or start a new run in another train.out_dir. May change "
            "on resume: train.steps (constant learning rate only), " + ", ".join(f.rstrip(".") for f in RESUMABLE)
        )


def load_benchmarks(cfg: Config) -> tuple | None:
    """`train.eval_benchmarks`: (its EvalConfig, its problem sets checked and encoded), before any weight
    loads or anything compiles (`evaluate.load_problems`); None without one."""
    path = cfg.train.eval_benchmarks
    if not path:
        return None
    from grpo_jax.train import load_config

    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"train.eval_benchmarks={path}: no such file; give a file whose get_config() returns "
                                "a grpo_jax.evaluate.EvalConfig, or ''")
    trainer.check(cfg)
    bench = load_config(path, evaluate.EvalConfig)
    return bench, evaluate.load_problems(bench, bench.benchmarks, trainer.model_config(cfg), trainer.load_tokenizer(cfg),
                                         sharding.make_mesh(cfg.mesh))


def evaluate_benchmarks(t: trainer.Trainer, benchmarks: tuple) -> dict[str, float]:
    """The rates of `load_benchmarks`' sets under the policy now: eval/NAME/avg@n, pass@k, maj@k, and eval/mean/..."""
    bench, sets = benchmarks
    per = {name: b["metrics"] for name, b in evaluate.run_benchmarks(
        bench, sets, t.cfg.model, t.policy_params, t.task.tokenizer, t.mesh).items()}
    rows = {**per, "mean": evaluate.mean_row(per)}
    return {f"eval/{name}/{k}": v for name, m in rows.items() for k, v in m.items() if "@" in k}


def _run(t: trainer.Trainer, ckpt: checkpoint.Checkpointer, logger: run_logging.MetricsLogger,
         benchmarks: tuple | None = None) -> tuple:
    """The steps from `t.step` to the end; returns (first, last) evaluations (the held-out set's and
    `benchmarks`'). Saves only between steps."""
    tr = t.cfg.train
    first = _evals(logger.history[0]) if logger.history else None
    last = None
    updates_per_step = t.cfg.algorithm.num_iterations * tr.minibatches
    skips, idle = SkipWatch(tr.max_skipped_steps * updates_per_step), IdleWatch(tr.max_skipped_steps)
    held_out = t.task.held_out is not None

    def evaluation() -> tuple[dict, list | None]:
        out, examples = t.evaluate_examples() if held_out else ({}, None)
        return {**out, **(evaluate_benchmarks(t, benchmarks) if benchmarks else {})}, examples

    with Interrupts() as interrupts:
        try:
            if t.step == 0 and not logger.history and (held_out or benchmarks):
                first = evaluation()[0]
                logger.log(0, first)
            while t.step < tr.steps and not interrupts.requested():
                metrics, updates = t.train_step()
                if (held_out or benchmarks) and (t.step == tr.steps or (tr.eval_every and t.step % tr.eval_every == 0)):
                    last, examples = evaluation()
                    metrics.update(last)
                    if t.step == tr.steps and held_out:
                        logger.write_held_out(t.step, examples)
                if tr.log_completions_every and t.step % tr.log_completions_every == 0:
                    logger.log_completions(t.step, t.completion_records())
                logger.log(t.step, metrics, t.rollout_histograms())
                diverged = skips.observe(t.step, updates)
                if diverged and jax.process_index() == 0:
                    (pathlib.Path(tr.out_dir) / DIVERGED).write_text(json.dumps({"step": t.step, "why": diverged}))
                stop = diverged or idle.observe(t.step, metrics, updates)
                if stop:
                    raise RuntimeError(stop)
                interrupts.unless_abandoned()
                if t.save(ckpt) and jax.process_index() == 0:
                    (pathlib.Path(tr.out_dir) / DIVERGED).unlink(missing_ok=True)
            interrupts.unless_abandoned()
            t.save(ckpt, force=True)  # the last step, or an interrupted one: both at a step boundary
        finally:
            logger.close()
        if interrupts.signum is not None:
            logger.message(f"stopped after step {t.step}, saved in {ckpt.directory}; rerun the same command to resume")
            interrupts.stop()
    return first, last
