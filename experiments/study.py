"""The harness of the reproductions: arms x seeds of RL runs, claims with verdicts, a table and plots.

A study is one script, experiments/NAME.py: its config as code and its analysis.

    def get_study(quick: bool) -> study.Study:
        base = Config(model=..., task=..., sampling=..., optim=..., train=...)  # dense or MoE, any task
        return study.Study(
            name="NAME", seeds=(0, 1, 2), warm_start=WarmStart(accuracy=0.2),
            arms={  # an arm is a whole Config: any preset, variant, model, batch or optimizer change
                "grpo": override(base, ["algorithm.preset=grpo", "algorithm.beta=0"]),
                "gspo": override(base, ["algorithm.preset=gspo"]),
            },
            table={"final held-out accuracy": lambda run: run.last("eval/accuracy_greedy")},
            plots=(study.Plot("curves", ("reward/mean", "eval/accuracy_greedy")),),
        )

    def claims(results: study.Results) -> list[dict]:  # one study.claim(...) per claim
        return [study.claim("...", source="arXiv ..., Figure 1", paper="...",
                            measured=study.spread(results.values("gspo", lambda r: r.mean("reward/mean"))),
                            verdict="reproduced")]

    if __name__ == "__main__":
        study.main(get_study, claims)

`main` parses `--quick` (get_study(True): at most 10 minutes on 2 CPU cores), `--results-dir DIR`,
`--seeds`, `--arms`, `--resume` and the launch flags of several processes (grpo_jax/distributed.py),
then `run` does the study:
- per seed, a supervised warm start (experiments/warm_start.py; `Study.warm_start`: one for every
  arm, one per arm, or None for the random init) for each distinct (warm start, model, task,
  tokenizer, template, prompt and completion lengths, held-out size): the arms of a seed that share
  them start from the same params;
- every arm x seed through `grpo_jax.run.train` with train.seed = the seed (model init, data order,
  held-out draw, sampling: the same for every arm) and train.out_dir = runs/NAME/ARM/seedS, deleted
  first: a fresh run, never a resume of another. With `--resume` (a study that was stopped) it is kept:
  a complete run is read back, a stopped one continues from its last checkpoint (the start, if it has
  none), and run.train refuses one whose config the study has since changed; the warm starts are redone
  (they are deterministic);
- each run's rows (its metrics.jsonl; `Run.series`, `Run.mean`, `Run.last` read them) gain the compute
  axes "updates" (optimizer updates so far) and "tokens" (completion tokens sampled so far, every
  generation round included), and the metrics `Study.derive` computes from a row;
- `claims(results)` states the verdicts; then results_dir/summary.json: the claims, the `Study.table`
  (label -> number per run, as mean, std and per seed), the arms' configs (the first in full, the
  others as the fields they change), seeds, warm starts, each run's curves of `Study.curves` (at most
  CURVE_POINTS points each), the git commit, the machine, its load average before, after each run and
  at the end (on a shared machine wall times are inflated) and the wall time; table.md (the claims, then
  the table: a column per arm, or a row per arm when the arms outnumber its labels; ended by the
  markdown of `Study.report`, if any); a PNG per `Plot` (thin lines: seeds; thick: their mean).
"""

import argparse
import dataclasses
import json
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
from grpo_jax.config import Config, flatten
from grpo_jax.logging import read_rows
from warm_start import WarmStart, warm_start

HERE = pathlib.Path(__file__).parent
VERDICTS = ("reproduced", "partial", "not_reproduced", "not_run")  # not_run: the runs it needs were not made
CURVE_POINTS = 200
DEFAULT_CURVES = (
    "reward/mean", "accuracy", "eval/accuracy_greedy", "eval/accuracy_sampled", "completion/length_mean",
    "clip_frac_low", "clip_frac_high", "clip_frac_low_tokens", "clip_frac_high_tokens", "entropy_mean",
)


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
    """A study: its arms (name -> Config), seeds, warm start(s), table, plots and derived metrics."""

    name: str
    arms: Mapping[str, Config]
    seeds: tuple[int, ...] = (0, 1, 2)
    warm_start: WarmStart | Mapping[str, WarmStart] | None = WarmStart()  # one for all arms, or per arm
    table: Mapping[str, Callable[["Run"], float]] = dataclasses.field(default_factory=dict)  # label -> number
    plots: tuple[Plot, ...] = ()
    derive: Mapping[str, Callable[[dict], float | None]] = dataclasses.field(default_factory=dict)  # row metrics
    curves: tuple[str, ...] = DEFAULT_CURVES  # kept per run in summary.json (with every plotted key)
    # Analysis beyond the table and plots (fits, a toy model): (results, results_dir) -> markdown that
    # ends table.md; it may write its own figures into results_dir.
    report: Callable[["Results", pathlib.Path], str] | None = None
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

    def only(self, arms) -> "Study":
        """This study with only `arms` (its plots of other arms dropped, its warm starts of them too)."""
        keep = set(arms)
        return dataclasses.replace(
            self, arms={a: c for a, c in self.arms.items() if a in keep},
            plots=tuple(p for p in self.plots if not p.arms or set(p.arms) <= keep),
            warm_start={a: w for a, w in self.warm_start.items() if a in keep}
            if isinstance(self.warm_start, Mapping) else self.warm_start)

    def warm_start_of(self, arm: str) -> WarmStart | None:
        return self.warm_start[arm] if isinstance(self.warm_start, Mapping) else self.warm_start


@dataclasses.dataclass
class Run:
    """One arm at one seed: its config and its logged rows (with "updates" and "tokens")."""

    arm: str
    seed: int
    config: Config
    rows: list[dict]
    resumed: bool = False  # continued or read back from an earlier process (--resume)

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


def run(study: Study, claims: Callable[[Results], list[dict]], results_dir: pathlib.Path,
        runs_dir: pathlib.Path, resume: bool = False) -> dict:
    """Runs every arm x seed (with `resume`, keeping the runs already in `runs_dir`), then writes
    summary.json, table.md and the plots; returns the summary."""
    start, loads, git = time.perf_counter(), [list(os.getloadavg())], git_state()  # the code that runs
    results, warm_log = Results({arm: [] for arm in study.arms}), {}
    for seed in study.seeds:
        warm = {}
        for arm, cfg in study.arms.items():
            out_dir = runs_dir / arm / f"seed{seed}"
            cfg = with_seed(cfg, seed, out_dir)
            ws, params = study.warm_start_of(arm), None
            if ws is not None:
                key = warm_start_key(ws, cfg)
                if key not in warm:
                    t0 = time.perf_counter()
                    params, log = warm_start(cfg, ws)
                    entry = {"config": {**dataclasses.asdict(ws), "target": ws.target.__name__}, "arms": [],
                             "steps": log[-1]["sft_step"], "accuracy_greedy": log[-1]["accuracy_greedy"],
                             "seconds": round(time.perf_counter() - t0, 1)}
                    warm[key] = sharding.gather(params), entry  # on the host: each run's train state is donated
                    warm_log.setdefault(str(seed), []).append(entry)
                params, entry = warm[key]
                entry["arms"].append(arm)
            if not resume:
                distributed.remove(out_dir)
            if jax.process_index() == 0:
                print(f"== {study.name}: arm {arm}, seed {seed} -> {out_dir}", flush=True)
            out = run_lib.train(cfg, params)
            drop_compiled_programs_near_the_map_limit()
            loads.append(list(os.getloadavg()))
            rows = with_axes(read_rows(out_dir / "metrics.jsonl"), cfg, study.derive)
            results[arm].append(Run(arm, seed, cfg, rows, out["resumed_from"] is not None))
    if jax.process_index() != 0:  # process 0 writes the results
        return {}
    summary = write(study, results, claims(results), results_dir, time.perf_counter() - start, loads, warm_log, git)
    print(f"\nwrote {results_dir}/summary.json, table.md and {len(study.plots)} plot(s)")
    print((results_dir / "table.md").read_text())
    return summary


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


def _points(xs, ys) -> list:
    step = max(1, int(np.ceil(len(xs) / CURVE_POINTS)))
    keep = sorted(set(range(0, len(xs), step)) | {len(xs) - 1})
    return [[float(xs[i]), float(f"{ys[i]:.5g}")] for i in keep]


def write(study: Study, results: Results, claims: list[dict], results_dir: pathlib.Path, wall: float,
          loads: list, warm_log: dict, git: dict) -> dict:
    results_dir.mkdir(parents=True, exist_ok=True)
    for c in claims:
        claim(**c)  # validates
    base = flatten(next(iter(study.arms.values())))
    drop = ("train.seed", "train.out_dir")
    curves = ("updates", "tokens", *study.curves, *study.derive, *(k for p in study.plots for k in p.panels))
    curves = tuple(dict.fromkeys(curves))
    table = {arm: {label: study_values(results, arm, fn) for label, fn in study.table.items()} for arm in study.arms}
    summary = {
        "study": study.name,
        "quick": study.quick,
        "claims": claims,
        "table": table,
        "seeds": list(study.seeds),
        "config": {k: v for k, v in base.items() if k not in drop},
        "arms": {arm: {k: v for k, v in flatten(cfg).items() if base.get(k) != v and k not in drop}
                 for arm, cfg in study.arms.items()},
        "warm_starts": warm_log,  # per seed: each warm start, its config and the arms that start from it
        "runs": {arm: {str(r.seed): {"wall_seconds": round(r.wall_seconds, 1), "resumed": r.resumed, "curves": {
            k: _points(*r.series(k, "step")) for k in curves if r.series(k)[0].size}} for r in runs}
            for arm, runs in results.items()},
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
    """The claims as markdown table rows."""
    return ["| claim | source | paper | measured | verdict |", "|---|---|---|---|---|",
            *(f"| {c['claim']} | {c['source']} | {c['paper']} | {c['measured']} | {c['verdict']} |" for c in claims)]


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


def table_md(study: Study, summary: dict) -> str:
    n = len(study.seeds)
    lines = [f"# {study.name}{' (quick)' if study.quick else ''}", "", *claims_md(summary["claims"])]
    if study.table:
        lines += ["", f"Mean ± std over {n} seed(s) {list(study.seeds)}:", "", *table_rows(summary)]
    load, git = summary["load_average_1_5_15min"], summary["git"]
    resumed = sum(r["resumed"] for runs in summary["runs"].values() for r in runs.values())
    lines += ["", f"Wall time {summary['wall_seconds']:.0f} s on {summary['machine']['cpu_count']} cores "
              f"({summary['machine']['cpu']}), load average {load['start'][0]:.1f} at the start, up to "
              f"{load['max_1min_after_a_run']:.1f} (a shared machine: wall times are inflated). "
              f"Commit {git['commit'][:10]}" + (" (with local changes)." if git["dirty"] else ".")
              + (f" {resumed} run(s) were continued or read back from an earlier process (--resume): the wall "
                 "time is this process's; each run's own sums its processes." if resumed else ""), ""]
    return "\n".join(lines)


def _smooth(y: np.ndarray, frac: float) -> np.ndarray:
    w = max(1, int(round(frac * len(y))))
    return np.convolve(y, np.ones(w) / w, mode="valid") if w > 1 and len(y) > w else y


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
                ax.plot(_smooth(x, frac), _smooth(y, frac), color=color, lw=0.6, alpha=0.35)
            mx, my = np.mean([x[:n] for x, _ in series], 0), np.mean([y[:n] for _, y in series], 0)
            ax.plot(_smooth(mx, frac), _smooth(my, frac), color=color, lw=2, label=f"{arm} ({len(series)})",
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
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    distributed.initialize(parser, args)
    study = dataclasses.replace(get_study(args.quick), quick=args.quick)
    if args.seeds:
        study = dataclasses.replace(study, seeds=tuple(args.seeds))
    if args.arms:
        unknown = sorted(set(args.arms) - set(study.arms))
        if unknown:
            parser.error(f"--arms {unknown}: this study's arms are {sorted(study.arms)}")
        study = study.only(args.arms)
    name = study.name + ("_quick" if args.quick else "")
    results_dir = args.results_dir or HERE / "results" / study.name / ("quick" if args.quick else "")
    return run(study, claims, results_dir, pathlib.Path("runs") / name, args.resume)
