"""The harness of the reproductions: arms x seeds of RL runs, claims with verdicts, a table and plots.

A study is one script, experiments/NAME.py: its config as code, its claims declared before any run
(experiments/protocol.py: the rule, the test and the noise floor every study shares) and its analysis.

    CLAIMS = (protocol.Claim("GSPO trains more efficiently than GRPO", source="arXiv 2507.18071, Figure 1",
                             paper="...", halves=(protocol.Difference("reward", reward, "gspo", "grpo"),)),)

    def get_study(quick: bool) -> study.Study:
        base = Config(model=..., task=..., sampling=..., optim=..., train=...)  # dense or MoE, any task
        return study.Study(
            name="NAME", seeds=tuple(range(8)), warm_start=WarmStart(accuracy=0.2),
            arms={  # an arm is a whole Config: any preset, variant, model, batch or optimizer change
                "grpo": override(base, ["algorithm.preset=grpo", "algorithm.beta=0"]),
                "gspo": override(base, ["algorithm.preset=gspo"]),
                "gspo_token": override(base, ["algorithm.preset=gspo_token"]),
            },
            null_pair=("gspo", "gspo_token"), learning_rates=(3e-4, 1e-3, 3e-3),
            table={"final held-out accuracy": lambda run: run.last("eval/accuracy_greedy")},
            plots=(study.Plot("curves", ("reward/mean", "eval/accuracy_greedy")),),
        )

    claims = protocol.judging(CLAIMS, ("gspo", "gspo_token"))  # claims(results): each verdict

    if __name__ == "__main__":
        study.main(get_study, claims)

`main` parses `--quick` (get_study(True): at most 15 minutes on 2 CPU cores), `--results-dir DIR`,
`--seeds`, `--arms`, `--resume`, `--rejudge` and the launch flags of several processes
(grpo_jax/distributed.py), then `run` does the study:
- with `Study.learning_rates`, the selection first: every arm (but the null pair's second) at every
  rate on `Study.selection_seeds`, runs/NAME/selection/ARM@RATE/seedS; each arm's rate is chosen by
  `Study.select` (the null pair's second takes its first's);
- per seed (or once, with `Study.warm_start_seed`), a supervised warm start (experiments/warm_start.py;
  `Study.warm_start`: one for every arm, one per arm, or None for the random init) for each distinct
  (warm start, model, task, tokenizer, template, prompt and completion lengths, held-out size): the arms
  of a seed that share them start from the same params;
- every arm x seed through `grpo_jax.run.train` with train.seed = the seed (model init, data order,
  held-out draw, sampling: the same for every arm) and train.out_dir = runs/NAME/ARM/seedS, deleted
  first: a fresh run, never a resume of another. With `--resume` (a study that was stopped) it is kept:
  a complete run is read back, a stopped one continues from its last checkpoint (the start, if it has
  none), and run.train refuses one whose config the study has since changed; the warm starts are redone
  (they are deterministic);
- every run's metrics rows go to results_dir/curves.json.gz (4 significant digits), and everything after
  is computed from that file alone: each row gains the compute axes "updates" (optimizer updates so
  far) and "tokens" (completion tokens sampled so far, every generation round included) and the
  metrics `Study.derive` computes from a row; the rates are chosen, `claims(results)` states the
  verdicts, each run is checked for collapse (protocol.collapse);
- results_dir/summary.json: the protocol's settings and any deviation from it, the claims (each with
  its rule and per-seed inputs), the `Study.table` (label -> number per run, as mean, std and per
  seed), collapses, the rate selection, the arms' configs (the first in full, the others as the fields
  they change), seeds, warm starts, the git commit, the machine, its load average (on a shared machine
  wall times are inflated) and the wall time; table.md (the claims, the rates, the collapses, then the
  table: a column per arm, or a row per arm when the arms outnumber its labels; ended by the markdown
  of `Study.report`, if any); a PNG per `Plot` (thin lines: seeds; thick: their mean).

`--rejudge` runs nothing: it recomputes all of that from curves.json.gz and says whether it agrees with
summary.json.
"""

import argparse
import dataclasses
import gzip
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np

from grpo_jax import distributed, sharding
from grpo_jax import run as run_lib
from grpo_jax.config import Config, flatten, override, with_defaults
from grpo_jax.logging import read_rows
import protocol
from warm_start import WarmStart, warm_start

HERE = pathlib.Path(__file__).parent
VERDICTS = protocol.VERDICTS  # not_run: the runs it needs were not made
NULL_RESAMPLE = 1_000_003  # the null pair's second arm samples with train.rollout_seed = seed + this


@dataclasses.dataclass(frozen=True)
class Plot:
    """One PNG, `file`.png: a panel per metric key of `panels`, one colour per arm (of `arms`; empty:
    all), against `x` ("updates", "tokens" or "step"), on a log scale if `logy` (linear below 1e-4).
    Per-step metrics are smoothed by a moving average over `smooth` of the steps; evaluations are not."""

    file: str
    panels: tuple[str, ...]
    x: str = "updates"
    arms: tuple[str, ...] = ()
    smooth: float = 0.04
    logy: bool = False


@dataclasses.dataclass(frozen=True)
class Study:
    """A study: its arms (name -> Config), seeds, warm start(s), table, plots and derived metrics, and the
    protocol's settings (experiments/protocol.py): the null-control pair and the learning-rate selection."""

    name: str
    arms: Mapping[str, Config]
    seeds: tuple[int, ...] = (0, 1, 2)  # the evaluation seeds
    warm_start: WarmStart | Mapping[str, WarmStart] | None = WarmStart()  # one for all arms, or per arm
    # None: every seed warm-starts its own params (its own init and data order). A seed: one warm start,
    # trained with that seed, that every run starts from (the selection's too), as a paper's seeds share
    # one base model: the seeds then vary only the RL run, and a study pays for one warm start, not one per seed.
    warm_start_seed: int | None = None
    # label -> number per run; the harness ends every table with each run's wall time (WALL_SECONDS)
    table: Mapping[str, Callable[["Run"], float]] = dataclasses.field(default_factory=dict)
    plots: tuple[Plot, ...] = ()
    derive: Mapping[str, Callable[[dict], float | None]] = dataclasses.field(default_factory=dict)  # row metrics
    # Analysis beyond the table and plots (fits, a toy model): (results, results_dir) -> markdown that
    # ends table.md; it may write its own figures into results_dir.
    report: Callable[["Results", pathlib.Path], str] | None = None
    # Two arms with one objective (GSPO and GSPO-token at sequence-level advantages): their paired spread
    # is the noise floor of every comparative claim. The second takes the first's learning rate and
    # draws its own rollouts (train.rollout_seed = seed + NULL_RESAMPLE): the two compute the same
    # numbers, so without it their spread would be zero, not the noise of sampling.
    null_pair: tuple[str, str] | None = None
    # Learning rates tried per arm on `selection_seeds` (separate from `seeds`); each arm then runs the
    # evaluation seeds at the rate with the highest mean of `select` over them (the first such, on ties).
    # Empty: every arm keeps its config's rate.
    learning_rates: tuple[float, ...] = ()
    selection_seeds: tuple[int, ...] = (100, 101)
    select: Callable[["Run"], float] = lambda run: run.mean("reward/mean")
    select_rule: str = "the highest training reward averaged over the run (the area under the curve per update)"
    # Arms that take another arm's chosen rate times a factor instead of choosing one: a setting declared
    # beforehand relative to it (e.g. {"grpo_hot": ("grpo", 3.0)}).
    rate_from: Mapping[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    quick: bool = False

    def __post_init__(self):
        if not self.arms or not self.seeds:
            raise ValueError(f"Study {self.name!r} needs at least one arm and one seed")
        for arm, cfg in self.arms.items():
            if not isinstance(cfg, Config):
                raise ValueError(f"Study {self.name!r}: arm {arm!r} is a {type(cfg).__name__}, not a Config")
        if isinstance(self.warm_start, Mapping) and set(self.warm_start) != set(self.arms):
            raise ValueError(f"Study {self.name!r}: warm_start names arms {sorted(self.warm_start)}; give one "
                             f"WarmStart for each of {sorted(self.arms)}, or one for all")
        if self.null_pair and not set(self.null_pair) <= set(self.arms):
            raise ValueError(f"Study {self.name!r}: null_pair={self.null_pair} names arms it does not have "
                             f"({sorted(self.arms)})")
        for arm, (source, _) in self.rate_from.items():
            if arm not in self.arms or source not in self.arms or source in self.rate_from:
                raise ValueError(f"Study {self.name!r}: rate_from[{arm!r}] = {source!r}: both must be arms, and "
                                 f"{source!r} must choose its own rate")
        if self.learning_rates and set(self.selection_seeds) & set(self.seeds):
            raise ValueError(f"Study {self.name!r}: selection_seeds {self.selection_seeds} overlap the evaluation "
                             f"seeds {self.seeds}; choose learning rates on other seeds")

    def only(self, arms) -> "Study":
        """This study with only `arms` (its plots of other arms dropped, its warm starts of them too, and
        its null pair if either is dropped: comparative claims then cannot be reproduced)."""
        keep = set(arms)
        return dataclasses.replace(
            self, arms={a: c for a, c in self.arms.items() if a in keep},
            plots=tuple(p for p in self.plots if not p.arms or set(p.arms) <= keep),
            warm_start={a: w for a, w in self.warm_start.items() if a in keep}
            if isinstance(self.warm_start, Mapping) else self.warm_start,
            null_pair=self.null_pair if self.null_pair and set(self.null_pair) <= keep else None,
            rate_from={a: (b, f) for a, (b, f) in self.rate_from.items() if a in keep and b in keep})

    def warm_start_of(self, arm: str) -> WarmStart | None:
        return self.warm_start[arm] if isinstance(self.warm_start, Mapping) else self.warm_start

    def protocol_errors(self) -> list[str]:
        """What a full study lacks for the protocol's comparative claims (experiments/protocol.py)."""
        errors = []
        if len(self.seeds) < protocol.MIN_SEEDS:
            errors.append(f"{len(self.seeds)} evaluation seeds (at least {protocol.MIN_SEEDS})")
        if not self.null_pair:
            errors.append("no null_pair (two arms with one objective: their spread is the noise floor)")
        if len(self.learning_rates) < protocol.MIN_RATES:
            errors.append(f"{len(self.learning_rates)} learning rates swept per arm (at least {protocol.MIN_RATES})")
        return errors


def sized(quick: bool, learning_rates: tuple[float, ...]) -> dict:
    """A study's seeds and rate sweep: the protocol's (MIN_SEEDS seeds, `learning_rates` swept), or
    --quick's (2 seeds at each arm's config rate); `Study(**sized(quick, rates), ...)`."""
    return {"seeds": (0, 1) if quick else tuple(range(protocol.MIN_SEEDS)),
            "learning_rates": () if quick else tuple(learning_rates)}


@dataclasses.dataclass
class Run:
    """One arm at one seed: its config and its logged rows (with "updates" and "tokens")."""

    arm: str
    seed: int
    config: Config
    rows: list[dict]
    resumed: bool = False  # continued or read back from an earlier process (--resume)
    memo: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # analyses computed once per run

    @property
    def wall_seconds(self) -> float:
        """The run's wall time, start-up included, summed over the processes that ran it (time/run_s)."""
        return self.rows[-1]["time/run_s"]

    def series(self, key: str, x: str = "updates") -> tuple[np.ndarray, np.ndarray]:
        """(x, value) over the rows that logged `key`."""
        pts = [(r[x], r[key]) for r in self.rows if key in r]
        return tuple(np.asarray(v, float) for v in zip(*pts)) if pts else (np.zeros(0), np.zeros(0))

    def last(self, key: str) -> float:
        """The last logged value of `key` (nan if never logged)."""
        values = self.series(key)[1]
        return float(values[-1]) if values.size else float("nan")

    def mean(self, key: str, start: float = 0.0, stop: float = 1.0) -> float:
        """Mean of `key` over the steps in (start, stop] of the run, as fractions of train.steps (so
        start=0 leaves out the evaluation before the first step)."""
        steps = self.config.train.steps
        values = [r[key] for r in self.rows if key in r and start * steps < r["step"] <= stop * steps]
        return float(np.mean(values)) if values else float("nan")


def reward(run: Run) -> float:
    """Training reward averaged over the run: the area under the reward curve per update."""
    return run.mean("reward/mean")


def final_accuracy(run: Run, bucket: str = "") -> float:
    """Held-out greedy accuracy over the last 20% of the run (on one length bucket's problems, if named)."""
    return run.mean("eval/accuracy_greedy" + (f"@{bucket}" if bucket else ""), 0.8)


# The completion-length distribution a long-completion study's table states: the per-step quantiles the
# trainer logs (completion/length_*), each averaged over the run.
LENGTH_DISTRIBUTION = {f"completion length, {q} (mean over the run)": (lambda r, q=q: r.mean(f"completion/length_{q}"))
                       for q in ("mean", "p10", "p50", "p90")}


def warm_accuracy(run: Run) -> float:
    """Held-out greedy accuracy before the first RL step: the warm start's, on this seed's held-out set."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    return float(acc[0]) if steps.size and steps[0] == 0 else math.nan


def held_out_gain(run: Run) -> float:
    """Held-out greedy accuracy over the last 20% of the run minus the warm start's."""
    return final_accuracy(run) - warm_accuracy(run)


class Results(dict):
    """arm -> its runs, one per seed (in seed order)."""

    def values(self, arm: str, fn: Callable[[Run], float]) -> np.ndarray:
        return np.asarray([fn(r) for r in self[arm]], float)


def clip_frac_tokens(row: dict) -> float | None:
    """A `Study.derive` metric: the fraction of tokens clipped on either side (a clipped sequence counts
    all its tokens: the GSPO paper's unit), None in rows without clipping metrics (evaluations)."""
    return row["clip_frac_low_tokens"] + row["clip_frac_high_tokens"] if "clip_frac_low_tokens" in row else None


def spread(values, digits: int = 3) -> str:
    """"mean ± std (n seeds: min to max)" of per-seed values."""
    v = np.asarray(values, float)
    f = f"{{:.{digits}g}}"
    return (f"{f.format(v.mean())} ± {f.format(v.std(ddof=1) if v.size > 1 else 0.0)} "
            f"({v.size} seeds: {f.format(v.min())} to {f.format(v.max())})")


def claim(claim: str, *, source: str, paper: str, measured: str, verdict: str, **details) -> dict:
    """One entry of summary.json's claims list; `details` (e.g. what was tried) are kept beside."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r}: use one of {VERDICTS}")
    return {"claim": claim, "source": source, "paper": paper, "measured": measured, "verdict": verdict, **details}


# -- running -------------------------------------------------------------------------------------


def warm_start_key(ws: WarmStart, cfg: Config) -> tuple:
    """What a warm start depends on besides the seed: arms equal in these share one."""
    s = cfg.sampling
    return (ws, cfg.model, cfg.model_path, cfg.task, cfg.tokenizer, cfg.template, s.max_prompt_len,
            s.max_new_tokens, cfg.train.eval_prompts)


def with_seed(cfg: Config, seed: int, out_dir: pathlib.Path) -> Config:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed, out_dir=str(out_dir)))


def with_axes(rows: list[dict], cfg: Config, derive: Mapping) -> list[dict]:
    """The rows with "updates", "tokens" (cumulative completion tokens sampled) and the `derive`d
    metrics (where their function returns a number) added."""
    per_step = cfg.algorithm.num_iterations * cfg.train.minibatches
    drawn = cfg.train.prompts_per_step * cfg.sampling.group_size
    tokens = 0.0
    for r in rows:
        if r["step"] > 0:
            tokens += r["completion/length_mean"] * drawn * r["groups/gen_rounds"]
        r["updates"], r["tokens"] = r["step"] * per_step, tokens
        r.update({k: v for k, v in ((k, fn(r)) for k, fn in derive.items()) if v is not None})
    return rows


def with_rate(cfg: Config, lr: float) -> Config:
    return override(cfg, [f"optim.learning_rate={lr}"])


def train_all(study: Study, arms: Mapping[str, Config], seeds, runs_dir: pathlib.Path, resume: bool,
              warm_log: dict, loads: list, shared_warm: dict) -> dict:
    """Runs every arm at every seed (a fresh run, or with `resume` the one in runs_dir continued or read
    back); returns {arm: {seed: {"rows": its metrics rows to 4 significant digits, "resumed",
    "wall_seconds"}}}. Per seed, arms with an equal warm start (`warm_start_key`) share it; with
    `resume`, a seed whose every run has a checkpoint skips it (its log is read back). With
    `Study.warm_start_seed` the warm starts live in `shared_warm` (key -> params, log entry) for every seed."""
    out = {arm: {} for arm in arms}
    for seed in seeds:
        dirs = {arm: runs_dir / arm / f"seed{seed}" for arm in arms}
        log_file = runs_dir / f"warm_starts_seed{seed}.json"
        skip_warm = resume and log_file.exists() and all(map(has_checkpoint, dirs.values()))
        if skip_warm:
            warm_log[str(seed)] = json.loads(log_file.read_text())
        warm = {} if study.warm_start_seed is None else shared_warm
        for arm, cfg in arms.items():
            cfg = with_seed(cfg, seed, dirs[arm])
            if study.null_pair and arm == study.null_pair[1]:  # the null control draws its own rollouts
                cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rollout_seed=seed + NULL_RESAMPLE))
            ws, params = study.warm_start_of(arm.split("@")[0]), None
            if ws is not None and not skip_warm:
                key = warm_start_key(ws, cfg)
                if key not in warm:
                    t0 = time.perf_counter()
                    seeded = cfg if study.warm_start_seed is None else with_seed(cfg, study.warm_start_seed, dirs[arm])
                    params, log = warm_start(seeded, ws)
                    entry = {"config": {**dataclasses.asdict(ws), "target": ws.target.__name__}, "arms": [],
                             "steps": log[-1]["sft_step"], "accuracy_greedy": log[-1]["accuracy_greedy"],
                             "seconds": round(time.perf_counter() - t0, 1)}
                    warm[key] = sharding.gather(params), entry  # on the host: each run's train state is donated
                    warm_log.setdefault(str(seed), []).append(entry)
                params, entry = warm[key]
                if arm not in entry["arms"]:
                    entry["arms"].append(arm)
            if not resume:
                distributed.remove(dirs[arm])
            if jax.process_index() == 0:
                print(f"== {study.name}: arm {arm}, seed {seed} -> {dirs[arm]}", flush=True)
            result = run_lib.train(cfg, params)
            if skip_warm and ws is not None and result["resumed_from"] is None:
                raise RuntimeError(f"{dirs[arm]} started afresh without its warm start (its checkpoints were unusable): "
                                   "rerun the study without --resume")
            drop_compiled_programs_near_the_map_limit()
            loads.append(list(os.getloadavg()))
            rows = [rounded(r) for r in read_rows(dirs[arm] / "metrics.jsonl")]
            out[arm][str(seed)] = {"rows": rows, "resumed": result["resumed_from"] is not None,
                                   "wall_seconds": round(rows[-1]["time/run_s"], 1)}
        if warm and jax.process_index() == 0:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log_file.write_text(json.dumps(warm_log.get(str(seed), [])))
    return out


def has_checkpoint(out_dir: pathlib.Path) -> bool:
    """Whether a run directory holds a saved step (orbax writes it under a temporary name, then renames it)."""
    ckpts = out_dir / "checkpoints"
    return ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())


def rounded(row: dict) -> dict:
    """A metrics row with every float to 4 significant digits: what curves.json.gz stores, and so what
    every verdict is computed from, at the first judgement and at a rejudgement alike."""
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}


def trials(study: Study) -> dict[str, Config]:
    """The learning-rate selection's runs: "ARM@RATE" -> config (not the null pair's second arm)."""
    return {f"{arm}@{lr:g}": with_rate(study.arms[arm], lr) for arm in trials_arms(study) for lr in study.learning_rates}


def select_rates(study: Study, selection: dict) -> dict:
    """Per arm: each rate's `select` value per selection seed and their mean, and the chosen rate."""
    runs, chosen = results_of(study, trials(study), selection), {}
    for arm in trials_arms(study):
        per_rate = {f"{lr:g}": {"per_seed": runs.values(f"{arm}@{lr:g}", study.select).tolist()}
                    for lr in study.learning_rates}
        for v in per_rate.values():
            v["mean"] = float(np.mean(v["per_seed"]))
        best = max(study.learning_rates, key=lambda lr: (rate_value(per_rate[f"{lr:g}"]["mean"]),
                                                         -study.learning_rates.index(lr)))
        chosen[arm] = {"per_rate": per_rate, "chosen": best}
    for arm, (source, factor) in followers(study).items():
        chosen[arm] = {"chosen": chosen[source]["chosen"] * factor, "note": f"{factor:g} x the rate chosen for {source}"}
    return {arm: chosen[arm] for arm in study.arms}


def rate_value(mean: float | None) -> float:
    """A rate's mean `select` value as the choice ranks it: a diverged rate (nan, or None once stored) last."""
    return -np.inf if mean is None or np.isnan(mean) else float(mean)


def followers(study: Study) -> dict[str, tuple[str, float]]:
    """The arms that take another's chosen rate (times a factor): `rate_from`'s and the null pair's second."""
    return {**study.rate_from, **({study.null_pair[1]: (study.null_pair[0], 1.0)} if study.null_pair else {})}


def trials_arms(study: Study) -> list[str]:
    """The arms that choose their own learning rate."""
    return [arm for arm in study.arms if arm not in followers(study)]


def evaluated_arms(study: Study, selection: dict | None) -> dict[str, Config]:
    """The arms as the evaluation seeds run them: at their chosen rate when rates are swept."""
    if not study.learning_rates:
        return dict(study.arms)
    return {arm: with_rate(cfg, selection[arm]["chosen"]) for arm, cfg in study.arms.items()}


def results_of(study: Study, arms: Mapping[str, Config], stored: dict) -> "Results":
    """The Results of stored runs ({arm: {seed: {"rows", "resumed", ...}}}), with their axes and derived metrics."""
    results = Results()
    for arm, cfg in arms.items():
        if arm in stored:
            results[arm] = [Run(arm, int(seed), with_seed(cfg, int(seed), pathlib.Path(".")),
                                with_axes([dict(r) for r in v["rows"]], cfg, study.derive), v["resumed"])
                            for seed, v in sorted(stored[arm].items(), key=lambda kv: int(kv[0]))]
    return results


def run(study: Study, claims: Callable[[Results], list[dict]], results_dir: pathlib.Path,
        runs_dir: pathlib.Path, resume: bool = False) -> dict:
    """Runs the learning-rate selection (if the study sweeps rates), then every arm x seed (with
    `resume`, keeping the runs already in `runs_dir`); writes curves.json.gz, then judges from it alone
    and writes summary.json, table.md and the plots; returns the summary."""
    start, loads, git = time.perf_counter(), [list(os.getloadavg())], git_state()  # the code that runs
    warm_log, shared_warm, stored = {}, {}, {"selection": {}, "runs": {}}
    if study.learning_rates:
        stored["selection"] = train_all(study, trials(study), study.selection_seeds, runs_dir / "selection",
                                        resume, warm_log, loads, shared_warm)
    selection = select_rates(study, stored["selection"]) if study.learning_rates else None
    stored["runs"] = train_all(study, evaluated_arms(study, selection), study.seeds, runs_dir, resume, warm_log,
                               loads, shared_warm)
    if jax.process_index() != 0:  # process 0 writes the results
        return {}
    results_dir.mkdir(parents=True, exist_ok=True)
    write_curves(results_dir / CURVES, stored)
    stored = read_curves(results_dir / CURVES)
    summary = write(study, claims, stored, results_dir, time.perf_counter() - start, loads, warm_log, git)
    print(f"\nwrote {results_dir}/{CURVES}, summary.json, table.md and {len(study.plots)} plot(s)")
    print((results_dir / "table.md").read_text())
    return summary


# -- the stored curves ---------------------------------------------------------------------------

CURVES = "curves.json.gz"


def write_curves(path: pathlib.Path, stored: dict) -> None:
    """Every run's metrics rows, one array per key (None where a row lacks it) beside one "step" array:
    {"runs"|"selection": {arm: {seed: {"resumed", "wall_seconds", "columns": {key: [...]}}}}}."""
    def columns(rows):
        keys = dict.fromkeys(k for r in rows for k in r)
        return {k: [r.get(k) for r in rows] for k in keys}

    data = {part: {arm: {seed: {"resumed": v["resumed"], "wall_seconds": v["wall_seconds"], "columns": columns(v["rows"])}
                         for seed, v in seeds.items()} for arm, seeds in runs.items()} for part, runs in stored.items()}
    with gzip.open(path, "wt") as f:
        json.dump(finite(data), f, separators=(",", ":"), allow_nan=False)


def read_curves(path: pathlib.Path) -> dict:
    """curves.json.gz as train_all returns runs: {part: {arm: {seed: {"rows", "resumed", "wall_seconds"}}}}."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)

    def rows(columns):
        n = len(columns["step"])
        return [{k: v[i] for k, v in columns.items() if v[i] is not None} for i in range(n)]

    return {part: {arm: {seed: {"rows": rows(v["columns"]), "resumed": v["resumed"], "wall_seconds": v["wall_seconds"]}
                         for seed, v in seeds.items()} for arm, seeds in runs.items()} for part, runs in data.items()}


MAPS, MAP_LIMIT = pathlib.Path("/proc/self/maps"), pathlib.Path("/proc/sys/vm/max_map_count")


def drop_compiled_programs_near_the_map_limit() -> None:
    """Drops JAX's compiled programs once the process holds half the kernel's memory-mapping limit.

    A run's programs hold ~800 mappings, and a study of ~80 runs in one process reached the limit
    (vm.max_map_count, 65530; XLA: "LLVM compilation error: Cannot allocate memory", then a segfault).
    Below it, later runs reuse the samplers, evaluators and small programs already compiled. Where
    /proc is missing (not Linux) they are dropped after every run.
    """
    if not (MAPS.exists() and MAP_LIMIT.exists()) or len(MAPS.read_bytes().splitlines()) > int(MAP_LIMIT.read_text()) // 2:
        jax.clear_caches()


# -- writing -------------------------------------------------------------------------------------


def git_state() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if pathlib.Path("/proc/cpuinfo").exists() else platform.processor()
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}", "python": sys.version.split()[0],
            "jax": jax.__version__}


def configs(study: Study) -> dict:
    """The declared arms' configs: the first in full ("config"), the others as the fields they change."""
    drop = ("train.seed", "train.out_dir")
    base = {k: v for k, v in flatten(next(iter(study.arms.values()))).items() if k not in drop}
    return {"config": base, "arms": {arm: {k: v for k, v in flatten(cfg).items() if base.get(k) != v and k not in drop}
                                     for arm, cfg in study.arms.items()}}


WALL_SECONDS = {"wall seconds per run (shared machine)": lambda run: run.wall_seconds}  # every study's last row


def analyse(study: Study, claims: Callable[["Results"], list[dict]], stored: dict) -> tuple[dict, "Results"]:
    """Everything judged from the stored runs (`read_curves`), the same at the first judgement and at
    --rejudge: the learning-rate selection, the claims, the table and each run's collapse check."""
    selection = select_rates(study, stored["selection"]) if study.learning_rates else None
    results = results_of(study, evaluated_arms(study, selection), stored["runs"])
    judged = claims(results)
    for c in judged:
        claim(**c)  # validates
    analysis = {
        "claims": judged,
        "table": {arm: {label: study_values(results, arm, fn) for label, fn in {**study.table, **WALL_SECONDS}.items()}
                  for arm in results},
        "collapse": {arm: {str(r.seed): protocol.collapse(r) for r in runs} for arm, runs in results.items()},
        "learning_rate_selection": selection,
    }
    return json.loads(json.dumps(finite(analysis), allow_nan=False)), results


def write(study: Study, claims: Callable[["Results"], list[dict]], stored: dict, results_dir: pathlib.Path,
          wall: float, loads: list, warm_log: dict, git: dict) -> dict:
    analysis, results = analyse(study, claims, stored)
    summary = {
        "study": study.name,
        "quick": study.quick,
        "protocol": {"alpha": protocol.ALPHA, "bootstrap_resamples": protocol.BOOTSTRAP, "null_pair": study.null_pair,
                     "learning_rates": list(study.learning_rates),
                     "selection_seeds": list(study.selection_seeds) if study.learning_rates else [],
                     "selection_rule": study.select_rule if study.learning_rates else None,
                     "deviations": study.protocol_errors(),
                     "rules": protocol.__doc__.split("\n\n")[1]},
        **analysis,
        "seeds": list(study.seeds),
        **configs(study),
        "warm_start_seed": study.warm_start_seed,  # None: one warm start per seed
        "warm_starts": warm_log,  # per seed that trained one: each warm start, its config and the arms that start from it
        "runs": {part: {arm: {seed: {k: v[k] for k in ("wall_seconds", "resumed")} for seed, v in runs.items()}
                        for arm, runs in stored[part].items()} for part in stored},
        "git": git,
        "machine": machine(),
        "load_average_1_5_15min": {"start": loads[0], "max_1min_after_a_run": max(l[0] for l in loads[1:]),
                                   "end": loads[-1]},
        "note": "wall times were measured on a machine shared with other jobs (see the load averages); "
                "compare arms by updates and tokens",
        "wall_seconds": round(wall, 1),
    }
    summary = finite(summary)
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    report = study.report(results, results_dir) if study.report else ""
    (results_dir / "table.md").write_text(table_md(study, summary) + report)
    for p in study.plots:
        plot(results, p, results_dir / f"{p.file}.png")
    return summary


def rejudge(study: Study, claims: Callable[["Results"], list[dict]], results_dir: pathlib.Path) -> list[str]:
    """Judges the study again from results_dir's curves.json.gz alone; returns the fields of summary.json
    (claims, table, collapse, learning_rate_selection) whose stored value differs (none: it agrees).
    Refuses when the study's configs are no longer those the results were written with."""
    summary = json.loads((results_dir / "summary.json").read_text())
    study = dataclasses.replace(study.only(summary["arms"]), seeds=tuple(summary["seeds"]))
    now = json.loads(json.dumps(configs(study)))
    changed = []
    for arm, diff in now["arms"].items():
        arm_now = {**now["config"], **diff}
        stored = with_defaults({**summary["config"], **summary["arms"].get(arm, {})}, arm_now)
        changed += [f"{arm}: {k}" for k, v in arm_now.items() if stored.get(k) != v]
    if changed:
        raise ValueError(f"{results_dir}: the study's configs changed since these results were written ({changed}); "
                         "rerun the study, or check out the commit in summary.json's git.commit")
    analysis, _ = analyse(study, claims, read_curves(results_dir / CURVES))
    return [k for k, v in analysis.items() if not agrees(summary[k], v)]


def agrees(stored, now) -> bool:
    """Equal, floats to 1e-9 relative: a rejudgement on another CPU or numpy sums in another order, which
    moves the last bits of a mean (never a verdict, which the strings and booleans carry exactly)."""
    if isinstance(stored, dict) and isinstance(now, dict):
        return stored.keys() == now.keys() and all(agrees(stored[k], now[k]) for k in stored)
    if isinstance(stored, list) and isinstance(now, list):
        return len(stored) == len(now) and all(map(agrees, stored, now))
    if isinstance(stored, float) and isinstance(now, float):
        return math.isclose(stored, now, rel_tol=1e-9, abs_tol=1e-15)
    return stored == now


def finite(obj):
    """`obj` with every nan or inf (a metric a run never logged) as None: JSON has no nan."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return None if isinstance(obj, float) and not np.isfinite(obj) else obj


def study_values(results: Results, arm: str, fn) -> dict:
    v = results.values(arm, fn)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "per_seed": v.tolist()}


def claims_md(claims: list[dict]) -> list[str]:
    """The claims as markdown table rows, each with the rule its verdict follows."""
    return ["| claim | source | paper | rule | measured | verdict |", "|---|---|---|---|---|---|",
            *(f"| {c['claim']} | {c['source']} | {c['paper']} | {c.get('rule', '')} | {c['measured']} | {c['verdict']} |"
              for c in claims)]


def table_rows(summary: dict) -> list[str]:
    """summary.json's table as markdown, mean ± std per arm: a column per arm, or a row per arm when
    the arms outnumber the labels (the longer side runs down the page)."""
    def cell(c):
        return "n/a" if c["mean"] is None else f"{c['mean']:.4g} ± {c['std']:.2g}"

    table = summary["table"]
    arms, labels = list(table), list(next(iter(table.values())))
    if len(arms) > len(labels):
        return ["| arm | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|",
                *(f"| {arm} | " + " | ".join(cell(table[arm][label]) for label in labels) + " |" for arm in arms)]
    return ["| | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|",
            *(f"| {label} | " + " | ".join(cell(table[arm][label]) for arm in arms) + " |" for label in labels)]


def number(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def sweep_edge(choice: dict) -> str | None:
    """"lowest" or "highest" when an arm's own choice (`select_rates`) is that end of the sweep and
    strictly ahead of every other rate: the best rate may then lie outside the sweep. None otherwise
    (a rate inside, a tie, or a rate taken from another arm)."""
    means = {float(lr): rate_value(v["mean"]) for lr, v in choice.get("per_rate", {}).items()}
    ends = {min(means, default=None): "lowest", max(means, default=None): "highest"}
    ahead = all(v < means[choice["chosen"]] for lr, v in means.items() if lr != choice["chosen"])
    return ends.get(choice["chosen"]) if means and ahead else None


def table_md(study: Study, summary: dict) -> str:
    n = len(study.seeds)
    lines = [f"# {study.name}{' (quick)' if study.quick else ''}", "", *claims_md(summary["claims"])]
    if summary["learning_rate_selection"]:
        lines += ["", f"Learning rate per arm, chosen on seeds {list(study.selection_seeds)} by {study.select_rule} "
                  "(mean over those seeds per rate):", "", "| arm | " + " | ".join(f"{lr:g}" for lr in study.learning_rates)
                  + " | chosen |", "|---" * (len(study.learning_rates) + 2) + "|"]
        selection = summary["learning_rate_selection"]
        edges = {arm: sweep_edge(s) for arm, s in selection.items()}
        lines += [f"| {arm} | " + " | ".join(number(s["per_rate"][f"{lr:g}"]["mean"]) if "per_rate" in s else "-"
                                           for lr in study.learning_rates) + f" | {s['chosen']:g}"
                  + (f" ({edges[arm]} swept)" if edges[arm] else "") + " |" for arm, s in selection.items()]
        if any(edges.values()):
            lines += ["", "A rate chosen at the sweep's edge may be beaten by one outside it: that arm's comparison "
                      "is at the best rate swept, not necessarily its best rate."]
    collapsed = {arm: [seed for seed, c in runs.items() if c["collapsed"]] for arm, runs in summary["collapse"].items()}
    lines += ["", "Collapsed runs (held-out greedy accuracy over the last 20% more than two standard errors below the "
              "warm start's, or the smoothed training reward below half its peak): "
              + ", ".join(f"{arm} {len(seeds)} of {len(summary['collapse'][arm])}" + (f" (seeds {', '.join(seeds)})" if seeds else "")
                          for arm, seeds in collapsed.items()) + "."]
    if summary["protocol"]["deviations"]:
        lines += ["", "**Not under the full protocol** (experiments/protocol.py): "
                  + "; ".join(summary["protocol"]["deviations"]) + "."]
    if summary["table"]:
        lines += ["", f"Mean ± std over {n} seed(s) {list(study.seeds)}:", "", *table_rows(summary)]
    load, git = summary["load_average_1_5_15min"], summary["git"]
    resumed = sum(r["resumed"] for part in summary["runs"].values() for runs in part.values() for r in runs.values())
    lines += ["", f"Wall time {summary['wall_seconds']:.0f} s on {summary['machine']['cpu_count']} cores "
              f"({summary['machine']['cpu']}), load average {load['start'][0]:.1f} at the start, up to "
              f"{load['max_1min_after_a_run']:.1f} (a shared machine: wall times are inflated). "
              f"Commit {git['commit'][:10]}" + (" (with local changes)." if git["dirty"] else ".")
              + (f" {resumed} run(s) were continued or read back from an earlier process (--resume): the wall "
                 "time is this process's; each run's own sums its processes." if resumed else ""), ""]
    return "\n".join(lines)


def plot(results: Results, p: Plot, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(p.panels), figsize=(3.8 * len(p.panels), 3.2), squeeze=False)
    for ax, key in zip(axes[0], p.panels):
        for color, arm in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], p.arms or results):
            series = [r.series(key, p.x) for r in results[arm]]
            series = [(x, y) for x, y in series if x.size]
            if not series:
                continue
            frac = 0.0 if key.startswith("eval/") else p.smooth  # evaluations are few: unsmoothed
            n = min(len(x) for x, _ in series)
            for x, y in series:
                ax.plot(protocol.smoothed(x, frac), protocol.smoothed(y, frac), color=color, lw=0.6, alpha=0.35)
            mx, my = np.mean([x[:n] for x, _ in series], 0), np.mean([y[:n] for _, y in series], 0)
            ax.plot(protocol.smoothed(mx, frac), protocol.smoothed(my, frac), color=color, lw=2, label=f"{arm} ({len(series)})",
                    marker="o" if key.startswith("eval/") else None, ms=3)
        ax.set_title(key, fontsize=9)
        if p.logy:
            ax.set_yscale("symlog", linthresh=1e-4)  # symlog: a fraction may be exactly 0
        ax.set_xlabel(p.x)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the command line ----------------------------------------------------------------------------


def main(get_study: Callable[[bool], Study], claims: Callable[[Results], list[dict]], argv=None) -> dict:
    """`python experiments/NAME.py [--quick] [--results-dir DIR] [--seeds 0 1 2] [--arms A B]`, and the
    launch flags of several processes (grpo_jax/distributed.py: `--distributed`, or `--coordinator
    HOST:PORT --num-processes N --process-id I`); process 0 writes the results."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--quick", action="store_true", help="the reduced study (at most 10 minutes on 2 CPU cores)")
    parser.add_argument("--results-dir", type=pathlib.Path,
                        help="where summary.json, table.md and the plots go (default: experiments/results/NAME, "
                             "or its quick/ subfolder with --quick)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the study's seeds")
    parser.add_argument("--arms", nargs="+", help="run only these of the study's arms (the table lists the arms run)")
    parser.add_argument("--resume", action="store_true",
                        help="continue a stopped study: keep its runs (runs/NAME), read the complete ones back and "
                             "continue the others from their last checkpoint")
    parser.add_argument("--rejudge", action="store_true",
                        help="run nothing: judge again from the results directory's curves.json.gz alone and say "
                             "whether every verdict, table entry and learning-rate choice agrees with summary.json "
                             "(exit status 1 if not)")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    study = dataclasses.replace(get_study(args.quick), quick=args.quick)
    results_dir = args.results_dir or HERE / "results" / study.name / ("quick" if args.quick else "")
    if args.rejudge:
        differs = rejudge(study, claims, results_dir)
        print(f"{results_dir}: " + (f"differs from summary.json in {differs}" if differs else
                                    "every verdict, table entry and choice agrees with summary.json"))
        sys.exit(1 if differs else 0)
    distributed.initialize(parser, args)
    if args.seeds:
        study = dataclasses.replace(study, seeds=tuple(args.seeds))
    if args.arms:
        unknown = sorted(set(args.arms) - set(study.arms))
        if unknown:
            parser.error(f"--arms {unknown}: this study's arms are {sorted(study.arms)}")
        study = study.only(args.arms)
    name = study.name + ("_quick" if args.quick else "")
    return run(study, claims, results_dir, pathlib.Path("runs") / name, args.resume)
