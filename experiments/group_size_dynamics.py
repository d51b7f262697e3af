"""Group size and the dynamics of GRPO: the inertial model of the mean-reward curve ("Predictable GRPO: A
Closed-Form Model of Training Dynamics", arXiv 2606.30789, the hub page of the GSPO paper in
shared/seeds/) and 2-GRPO ("It Takes Two: Your GRPO Is Secretly DPO", arXiv 2510.00977).

    python experiments/group_size_dynamics.py [--quick] [--results-dir DIR]          # the toy only
    python experiments/group_size_dynamics.py --lm [--quick] [--results-dir DIR] [--seeds 0 1 2]

The inertial model reduces GRPO to a damped oscillator in the mean reward: momentum supplies the inertia,
off-policy lag erodes the damping, the group size G enters only as a noise temperature. It claims (1) a
damped second-order law for the mean-reward curve whose overdamped limit is single-exponential
saturation, (2) a mean trajectory invariant in G, (3) a stationary fluctuation ~ 1/G, (4) a sharp
stability threshold in the refresh interval at an independently measured stiffness and (5) an
overdamped-to-oscillatory transition; the paper shows (1)-(3) on language models and (4)-(5) on a
softmax bandit only. 2-GRPO claims (6) that G=2 matches G=16 with 1/8 of the rollouts and over 70% less
training time.

Two testbeds, each with its own claims:
- The exactly solvable toy (experiments/softmax_bandit.py), always run (about a minute of CPU; the same
  with --quick): GRPO's exact expected gradient on a softmax policy over 8 answers (2 correct), from
  P(correct) = 0.1, with a KL term to the initial policy (beta = 0.5) so that the drift has a fixed point
  p* and a stiffness kappa, both measured from the gradient field; SGD (with and without heavy-ball
  momentum) and Adam in float64. The mean-field reduction is exact there (the dynamics stay in the logit
  gap), so (1)-(5) are checked without sampling noise; Monte Carlo runs of the same toy (sampled groups)
  give the fluctuations.
- Language-model runs, only with --lm (about 1.8 hours of CPU here; the committed table has them; without
  --lm their claims read not_run): the quickstart's tiny Qwen3-style model on two-operand arithmetic, warm-started to
  20% greedy held-out accuracy, GRPO (grpo preset, beta = 0, clip 0.2) on-policy with Adam at a constant
  learning rate after 10 warmup steps: G in {2, 4, 8, 16} at PROMPTS prompts per step (fixed prompts; G=2
  vs G=16 is 2-GRPO's 1/8 of the rollouts) and at ROLLOUTS rollouts per step (fixed rollouts), plus sweeps
  around the G=4 arm of the learning rate, Adam's b1 and the staleness (num_iterations x minibatches).
  Measured per run: both laws fitted to the training reward against optimizer updates (reward_curves.py),
  the residual variance around the damped fit over the second half (the fluctuation; also of the
  held-out greedy accuracy, which has no sampling noise), the mean training reward over the run, the
  held-out greedy accuracy of the last 20% of the run, rollouts and completion tokens sampled, wall time.

Outputs (experiments/results/group_size_dynamics/, quick/ with --quick): summary.json (the claims, each
with its measured numbers and the rule its verdict follows; the toy's numbers in the toy claims), table.md
and toy.png; with --lm also the study harness's table, per-arm curves and plots (study.py).
"""

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import time

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax.config import override

import reward_curves as rc
import softmax_bandit as sb
import study
from warm_start import WarmStart

INERTIAL = "arXiv 2606.30789 (Predictable GRPO)"
TWO_GRPO = "arXiv 2510.00977 (It Takes Two: 2-GRPO)"
GROUP_SIZES = (2, 4, 8, 16)
PROMPTS, ROLLOUTS = 32, 128  # the fixed-prompts and the fixed-rollouts scans
BASE_G = 4  # the arm both scans share (32 prompts x 4), around which the sweeps vary one knob
LEARNING_RATE = 5e-4
SWEEPS = {  # sweep -> {arm suffix: overrides}
    "lr": {f"lr{lr:g}": [f"optim.learning_rate={lr}"] for lr in (1e-3, 2e-3, 5e-3)},
    "b1": {f"b1_{b1:g}": [f"optim.b1={b1}"] for b1 in (0.0, 0.5, 0.99)},
    "stale": {f"it{it}_mb{mb}": [f"algorithm.num_iterations={it}", f"train.minibatches={mb}"]
              for it, mb in ((1, 4), (4, 1), (4, 4))},
}

# The toy: the same for --quick and the full study (about a minute).
TOY = sb.Bandit(answers=8, correct=2, p0=0.1)
TOY_BETA = 0.5
TOY_OPTIMIZERS = {"SGD lr 0.5": sb.Sgd(0.5), "Adam lr 0.02": sb.Adam(0.02)}


@dataclasses.dataclass(frozen=True)
class ToySize:
    """Rollout batches (or updates) of the toy's runs."""

    trajectory: int = 600  # exact trajectories by G
    fit: int = 300  # the transient the laws are fitted to
    bisection: int = 25  # halvings of the learning-rate bracket [1e-2, 1e3]
    threshold: int = 1000  # each run of the bisection and of the oscillation grid
    adam: int = 800  # each run of the Adam b1 grid
    refresh: int = 200  # each run of the refresh-interval grid
    monte_carlo: int = 4000  # each sampled run of the fluctuation (the first eighth is burn-in)


TOY_SIZE = ToySize()


def scan_arm(g: int, prompts: int) -> str:
    return f"g{g}_p{prompts}"


BASE_ARM = scan_arm(BASE_G, PROMPTS)
ENDS = (scan_arm(2, PROMPTS), scan_arm(16, PROMPTS))  # the arms every language-model claim needs
SCANS = {  # scan -> {G: arm}
    "fixed prompts": {g: scan_arm(g, PROMPTS) for g in GROUP_SIZES},
    "fixed rollouts": {g: scan_arm(g, ROLLOUTS // g) for g in GROUP_SIZES},
}


def sweep_arms(sweep: str) -> list[str]:
    return [f"{BASE_ARM}_{name}" for name in SWEEPS[sweep]]


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [
        "task.max_value=9", "algorithm.preset=grpo", "algorithm.beta=0", "train.minibatches=1", "optim.schedule=constant",
        f"optim.learning_rate={LEARNING_RATE}", "optim.warmup_steps=10", f"train.steps={150 if quick else 300}",
        "train.eval_prompts=256", "train.eval_every=10", "train.checkpoint_every=10000",
    ])

    def arm(g, prompts, *changes):
        return override(base, [f"sampling.group_size={g}", f"train.prompts_per_step={prompts}", *changes])

    if quick:  # the fixed-prompts scan at three group sizes; no sweeps (the toy covers them)
        arms = {scan_arm(g, PROMPTS): arm(g, PROMPTS) for g in (2, 4, 16)}
    else:
        arms = {name: arm(g, int(name.split("_p")[1])) for scan in SCANS.values() for g, name in scan.items()}
        arms |= {f"{BASE_ARM}_{name}": arm(BASE_G, PROMPTS, *changes)
                 for sweep in SWEEPS.values() for name, changes in sweep.items()}
    return study.Study(
        name="group_size_dynamics",
        arms=arms,
        seeds=(0, 1) if quick else (0, 1, 2),
        warm_start=WarmStart(accuracy=0.2, eval_every=5),
        table=TABLE,
        plots=plots(arms),
        report=report,
    )


def plots(arms) -> tuple[study.Plot, ...]:
    panels = ("reward/mean", "eval/accuracy_greedy")
    groups = {f"scan_{scan.replace(' ', '_')}": list(members.values()) for scan, members in SCANS.items()}
    groups |= {f"sweep_{sweep}": [BASE_ARM, *sweep_arms(sweep)] for sweep in SWEEPS}
    out = [study.Plot(file, panels, arms=tuple(a for a in members if a in arms))
           for file, members in groups.items() if sum(a in arms for a in members) > 1]
    pair = (scan_arm(2, PROMPTS), scan_arm(16, PROMPTS))
    out.append(study.Plot("two_grpo_vs_tokens", panels, x="tokens", arms=pair))
    return tuple(out)


# -- per run: fits and fluctuations ------------------------------------------------------------

MIN_POINTS = 8  # fewer points than this: no fit


def fits(run: study.Run) -> dict:
    """The run's fits (memoized: the table, the claims and the report read the same ones): both laws on
    the training reward against optimizer updates, the damped law on the held-out greedy accuracy."""
    if "fits" not in run.memo:
        x, y = run.series("reward/mean")
        ex, ey = run.series("eval/accuracy_greedy")
        run.memo["fits"] = {law: rc.fit(law, x, y) if x.size >= MIN_POINTS else None for law in rc.LAWS}
        run.memo["fits"]["held-out"] = rc.fit("damped", ex, ey) if ex.size >= MIN_POINTS else None
    return run.memo["fits"]


def fitted(run: study.Run, curve: str, attr: str) -> float:
    f = fits(run)[curve]
    if f is None:
        return math.nan
    return float(f.params[attr]) if attr in f.params else float(getattr(f, attr))


def fluctuation(run: study.Run, curve: str = "damped") -> float:
    """Variance of the residuals around the damped fit over the second half of the run."""
    f = fits(run)[curve]
    return float(f.residuals[len(f.residuals) // 2:].var()) if f is not None else math.nan


def rollouts(run: study.Run) -> float:
    cfg = run.config
    rounds = sum(r.get("groups/gen_rounds", 0) for r in run.rows if r["step"] > 0)
    return rounds * cfg.train.prompts_per_step * cfg.sampling.group_size


def final_accuracy(run: study.Run) -> float:
    return run.mean("eval/accuracy_greedy", 0.8)


def area(run: study.Run) -> float:  # mean training reward over the run: the area under the curve per update
    return run.mean("reward/mean")


TABLE = {
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "training reward, mean over the run": area,
    "fitted rate per update, single exponential": lambda r: fitted(r, "single_exponential", "rate"),
    "fitted rate per update, damped law": lambda r: fitted(r, "damped", "rate"),
    "fitted damping ratio zeta": lambda r: fitted(r, "damped", "zeta"),
    "fitted plateau, damped law": lambda r: fitted(r, "damped", "plateau"),
    "R^2, single exponential": lambda r: fitted(r, "single_exponential", "r2"),
    "R^2, damped law": lambda r: fitted(r, "damped", "r2"),
    "BIC damped - BIC single exponential": lambda r: fitted(r, "damped", "bic") - fitted(r, "single_exponential", "bic"),
    "training reward fluctuation (residual variance x 1e3)": lambda r: 1e3 * fluctuation(r),
    "held-out accuracy fluctuation (residual variance x 1e3)": lambda r: 1e3 * fluctuation(r, "held-out"),
    "rollouts sampled (thousands)": lambda r: rollouts(r) / 1e3,
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
    "wall seconds per run (shared machine)": lambda r: r.wall_seconds,
}


# -- the toy: exact dynamics and the inertial model's predictions ------------------------------


def toy_alg(g: int | None = 8, beta: float = TOY_BETA, n: int = 1) -> sb.Grpo:
    return sb.Grpo(group_size=g, beta=beta, updates_per_batch=n)


def displaced(opt, alg: sb.Grpo, steps: int, du: float = 1e-4) -> np.ndarray:
    """p - p* per rollout batch from the fixed point displaced by du in the logit gap (the linear regime)."""
    p_star = sb.fixed_point(TOY, alg)
    p, _ = sb.run(TOY, alg, opt, steps, p_start=TOY.prob(TOY.gap(TOY.logits(p_star)) + du))
    return p - p_star


def diverges(dev: np.ndarray) -> bool:
    """The displacement grew: non-finite, or larger over the last tenth than at the start."""
    return bool(not np.isfinite(dev[-1]) or np.abs(dev[-max(1, len(dev) // 10):]).max() > abs(dev[0]))


def crosses(dev: np.ndarray) -> bool:
    """p - p* changes sign (above float noise): the approach oscillates."""
    s = np.sign(dev[np.abs(dev) > 1e-13])
    return bool((s[1:] != s[:-1]).any())


def overshoot(p: np.ndarray, p_star: float) -> float:
    """How far p went past p*, as a fraction of the distance from the start."""
    return float((np.nanmax(p) - p_star) / (p_star - p[0]))


def toy_invariance(size: ToySize) -> dict:
    """Exact trajectories for each G (and G = infinity), without and with the KL term: deviation from
    the G = infinity curve, plateau, batches to 90% of the rise; and the finite-G factor of the drift."""
    out, curves = {}, {}
    for name, opt in TOY_OPTIMIZERS.items():
        for beta in (0.0, TOY_BETA):
            runs = {g: sb.run(TOY, toy_alg(g, beta), opt, size.trajectory)[0] for g in (*GROUP_SIZES, None)}
            reach = {g: int(np.argmax(p >= TOY.p0 + 0.9 * (p[-1] - TOY.p0))) for g, p in runs.items()}
            dev = [float(np.abs(runs[g] - runs[None]).max()) for g in GROUP_SIZES]
            key = f"{name}, beta {beta:g}"
            curves[key] = runs
            out[key] = {"max |p_G - p_inf|": dict(zip(map(str, GROUP_SIZES), dev)),
                        "deviation exponent in G (se)": rc.power_law(GROUP_SIZES, dev),
                        "final p": {str(g or "inf"): float(p[-1]) for g, p in runs.items()},
                        "batches to 90% of its rise": {str(g or "inf"): r for g, r in reach.items()}}
    factor = {str(g): {f"p={p:g}": sb.group_weight(p, toy_alg(g)) / math.sqrt(p * (1 - p)) for p in (0.1, 0.5, 0.9)}
              for g in GROUP_SIZES}
    return {"trajectories": out, "drift factor s_G(p) / sqrt(p(1-p))": factor, "curves": curves}


def toy_fits(size: ToySize) -> dict:
    """Both laws fitted to exact trajectories (G=8, the transient's first batches), with and
    without inertia, beside the true overshoot: the damped law's zeta < 1 need not mean oscillation."""
    p_star = sb.fixed_point(TOY, toy_alg())
    out = {}
    for name, opt in {"SGD lr 0.5, no momentum": sb.Sgd(0.5), "SGD lr 0.5, momentum 0.9": sb.Sgd(0.5, 0.9),
                      "Adam lr 0.02, b1 0": sb.Adam(0.02, b1=0.0), "Adam lr 0.02, b1 0.9": sb.Adam(0.02)}.items():
        p, _ = sb.run(TOY, toy_alg(), opt, size.fit)
        t = np.arange(p.size)
        single, damped = rc.fit("single_exponential", t, p), rc.fit("damped", t, p)
        out[name] = {"R^2 single": single.r2, "R^2 damped": damped.r2, "BIC damped - single": damped.bic - single.bic,
                     "zeta": damped.params["zeta"],
                     "rate single": single.rate, "rate damped": damped.rate,
                     "plateau damped": damped.params["plateau"], "p*": p_star, "overshoot": overshoot(p, p_star)}
    return out


def toy_lr_threshold(size: ToySize) -> dict:
    """SGD with heavy-ball momentum mu, on-policy, G=8: the learning rate past which the fixed point is
    unstable, predicted 2 (1 + mu) / kappa (kappa measured from the gradient field) vs found by bisection
    on the exact dynamics; and the oscillation onset (1 - sqrt(mu))^2 / kappa vs whether p - p* changes
    sign at 0.5, 0.8, 1.25 and 1.6 times it."""
    alg = toy_alg()
    kappa = sb.stiffness(TOY, alg)
    out = {"kappa": kappa, "p*": sb.fixed_point(TOY, alg)}
    for mu in (0.0, 0.5, 0.9):
        lo, hi = 1e-2, 1e3
        for _ in range(size.bisection):
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if diverges(displaced(sb.Sgd(mid, mu), alg, size.threshold)) else (mid, hi)
        predicted = sb.stability_limit(mu) / kappa
        onset = sb.oscillation_onset(mu) / kappa
        grid = {f"{r:g}": crosses(displaced(sb.Sgd(r * onset, mu), alg, size.threshold)) for r in (0.5, 0.8, 1.25, 1.6)}
        out[f"momentum {mu:g}"] = {"predicted lr*": predicted, "observed lr*": math.sqrt(lo * hi),
                                   "relative error": math.sqrt(lo * hi) / predicted - 1,
                                   "predicted onset lr": onset, "oscillates at x onset": grid,
                                   "onset agrees": all(v == (float(r) > 1) for r, v in grid.items())}
    return out


def toy_adam(size: ToySize) -> dict:
    """Adam at three learning rates and six b1 (G=8): does p overshoot p* (by > 1e-3 of the rise)? Predicted
    by heavy ball with momentum b1 and the gain lr_eff (1 - b1) kappa, lr_eff from Adam's second moment
    when p first comes within 10% of p* (`softmax_bandit.adam_lr`); and the damped law's fitted zeta."""
    alg = toy_alg()
    p_star, kappa = sb.fixed_point(TOY, alg), sb.stiffness(TOY, alg)
    cases = []
    for lr in (0.005, 0.02, 0.05):
        for b1 in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99):
            opt = sb.Adam(lr, b1=b1)
            p, states = sb.run(TOY, alg, opt, size.adam)
            arrive = int(np.argmax(np.abs(p - p_star) < 0.1 * (p_star - TOY.p0)))
            gain = sb.adam_lr(TOY, opt, states[arrive]) * (1 - b1) * kappa
            cases.append({"lr": lr, "b1": b1, "gain at arrival": gain, "onset": sb.oscillation_onset(b1),
                          "predicted oscillation": gain > sb.oscillation_onset(b1),
                          "overshoot": overshoot(p, p_star), "observed oscillation": overshoot(p, p_star) > 1e-3,
                          "fitted zeta": rc.fit("damped", np.arange(p.size), p).params["zeta"]})
    agree = sum(c["predicted oscillation"] == c["observed oscillation"] for c in cases)
    return {"cases": cases, "agreement": f"{agree}/{len(cases)}"}


def toy_refresh(size: ToySize) -> dict:
    """n SGD updates per rollout batch (the refresh interval), G=8: the displaced fixed point diverges or
    not, vs the exact linearization (gains a through the current policy and b through the stale one,
    `softmax_bandit.batch_multiplier`) and vs a pure-delay model (the whole drift stale: n lr kappa > 2)."""
    alg = toy_alg()
    a, b = sb.gains(TOY, alg)
    kappa = -(a + b)
    cells = []
    for gain in (0.25, 0.5, 0.9, 1.2, 1.5, 1.9):
        lr = gain / kappa
        for n in (1, 2, 3, 4, 8, 16):
            observed = diverges(displaced(sb.Sgd(lr), toy_alg(n=n), size.refresh))
            cells.append({"lr kappa": gain, "n": n, "observed unstable": observed,
                          "linearized unstable": abs(sb.batch_multiplier(lr, a, b, n)) > 1,
                          "delay model unstable": n * lr * kappa > 2})
    score = {m: f"{sum(c[m + ' unstable'] == c['observed unstable'] for c in cells)}/{len(cells)}"
             for m in ("linearized", "delay model")}
    p_star = sb.fixed_point(TOY, alg)
    adam = {str(n): overshoot(sb.run(TOY, toy_alg(n=n), sb.Adam(0.02), size.trajectory)[0], p_star) for n in (1, 2, 4, 8)}
    return {"a (current policy)": a, "b (stale policy)": b, "kappa": kappa,
            "stable for every n below lr kappa": 2 * kappa / abs(a), "cells": cells, "agreement": score,
            "Adam lr 0.02 overshoot by n": adam}


def toy_fluctuation(size: ToySize) -> dict:
    """Monte Carlo runs of the toy around p* (sampled groups; SGD lr 1 and Adam lr 0.01) at 16 groups per
    update (fixed prompts) and at 64 rollouts per update (fixed rollouts): the stationary variance of p
    against G, and SGD's first-order prediction (`softmax_bandit.sgd_stationary_variance`); plus the
    noise temperature itself, the variance of one group's step at a fixed p = 0.7."""
    out = {}
    for scan, groups in (("fixed prompts", lambda g: 16), ("fixed rollouts", lambda g: 64 // g)):
        for name, opt in (("SGD lr 1", sb.Sgd(1.0)), ("Adam lr 0.01", sb.Adam(0.01))):
            var = []
            for g in GROUP_SIZES:
                alg = toy_alg(g)
                p, _ = sb.run(TOY, alg, opt, size.monte_carlo, p_start=sb.fixed_point(TOY, alg),
                              rng=np.random.default_rng(g), groups=groups(g))
                var.append(float(p[size.monte_carlo // 8:].var()))
            out[f"{scan}, {name}"] = {"variance": dict(zip(map(str, GROUP_SIZES), var)),
                                      "exponent (se)": rc.power_law(GROUP_SIZES, var)}
        theory = [sb.sgd_stationary_variance(TOY, toy_alg(g), 1.0, groups(g)) for g in GROUP_SIZES]
        out[f"{scan}, SGD lr 1, first-order theory"] = {"variance": dict(zip(map(str, GROUP_SIZES), theory)),
                                                       "exponent (se)": rc.power_law(GROUP_SIZES, theory)}
    noise = [sb.drift_noise(0.7, TOY, toy_alg(g)) for g in GROUP_SIZES]
    out["noise temperature at p=0.7, one group"] = {"variance": dict(zip(map(str, GROUP_SIZES), noise)),
                                                   "exponent (se)": rc.power_law(GROUP_SIZES, noise)}
    return out


def toy() -> dict:
    """Every toy result at TOY_SIZE (computed once: the claims and the report read the same)."""
    return _toy(TOY_SIZE)


@functools.cache
def _toy(size: ToySize) -> dict:
    return {"invariance": toy_invariance(size), "fits": toy_fits(size), "lr threshold": toy_lr_threshold(size),
            "adam": toy_adam(size), "refresh": toy_refresh(size), "fluctuation": toy_fluctuation(size)}


# -- the claims --------------------------------------------------------------------------------


def scans(results: study.Results) -> dict:
    """scan -> {G: arm} for the arms this study ran (at least two group sizes)."""
    out = {scan: {g: a for g, a in members.items() if a in results} for scan, members in SCANS.items()}
    return {scan: members for scan, members in out.items() if len(members) > 1}


def across_g(results: study.Results, members: dict, fn) -> tuple[np.ndarray, np.ndarray]:
    """(group sizes, values [seeds, G]) of fn over the scan's arms."""
    gs = np.asarray(sorted(members), float)
    return gs, np.stack([results.values(members[int(g)], fn) for g in gs], axis=1)


def per_seed_exponents(gs, values) -> np.ndarray:
    """The power-law exponent in G of each seed's values (nan where a value is not positive)."""
    return np.asarray([rc.power_law(gs, v)[0] if np.all(v > 0) else math.nan for v in values])


def interval(x: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) over seeds."""
    x = x[np.isfinite(x)]
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.inf


def fmt(mean_se: tuple[float, float]) -> str:
    return f"{mean_se[0]:.3g} ± {mean_se[1]:.2g} (se)"


def initial_accuracy(run: study.Run) -> float:
    return float(run.series("eval/accuracy_greedy")[1][0])


def collapsed(run: study.Run) -> bool:
    """The run ended below where it started: held-out accuracy of its last 20% < step 0's - 0.05."""
    return final_accuracy(run) < initial_accuracy(run) - 0.05


def overshoots(run: study.Run) -> bool:
    """The damped fit rises above its plateau by more than the residual std: an oscillation beyond noise."""
    f = fits(run)["damped"]
    if f is None or f.params["zeta"] >= 1:
        return False
    zeta = f.params["zeta"]
    peak = abs(f.params["plateau"] - f.params["start"]) * math.exp(-math.pi * zeta / math.sqrt(1 - zeta * zeta))
    return peak > f.rms


# The claims come in pairs: the toy (always run) and the language model (only with --lm). A language-model
# claim without its runs reads not_run; its rule is stated all the same.
LM_NOT_RUN = ("not run: the language-model runs (16 arms x 3 seeds of 300 steps) need hours of CPU; run them "
              "with --lm")


def lm_claim(results: study.Results | None, needs: list[str], measure, *, claim: str, source: str, paper: str,
             rule: str) -> dict:
    """A language-model claim: `measure(results)` -> (measured, verdict, details) when every arm it `needs`
    ran, else not_run."""
    if results is None or not all(a in results for a in needs):
        missing = LM_NOT_RUN if results is None else f"not run: the arms {[a for a in needs if a not in results]}"
        return study.claim(claim, source=source, paper=paper, measured=missing, verdict="not_run", rule=rule)
    measured, verdict, details = measure(results)
    return study.claim(claim, source=source, paper=paper, measured=measured, verdict=verdict, rule=rule, **details)


LAWS = "The mean-reward curve follows a damped second-order law whose overdamped limit is single-exponential saturation"


def claim_toy_laws(t: dict) -> dict:
    f = t["fits"]
    fit_ok = all(v["R^2 damped"] >= 0.91 and v["BIC damped - single"] < 0 for v in f.values())
    reads = {k: (v["zeta"] < 1) == (v["overshoot"] > 1e-3) for k, v in f.items()}
    return study.claim(
        f"{LAWS} (toy, exact)",
        source=f"{INERTIAL}, abstract",
        paper="the inertial law subsumes single-exponential saturation as its overdamped limit and adds the slow "
              "start; its damping ratio zeta < 1 means an oscillatory (underdamped) approach",
        measured=f"exact P(correct) curves, G=8, {TOY_SIZE.fit} batches: " + "; ".join(
            f"{k}: R^2 damped {v['R^2 damped']:.3f} vs single {v['R^2 single']:.3f} (BIC {v['BIC damped - single']:+.0f}), "
            f"fitted zeta {v['zeta']:.2f}, true overshoot of p* {max(v['overshoot'], 0):.2g}" for k, v in f.items())
            + f"; zeta < 1 matches an overshoot in {sum(reads.values())}/{len(reads)}: without momentum the slow "
            "start comes from the drift's p(1-p) factor, which the damped law reads as zeta < 1",
        verdict="reproduced" if fit_ok and all(reads.values()) else "partial" if fit_ok else "not_reproduced",
        rule="the damped law fits every exact trajectory with R^2 >= 0.91 and a lower BIC than the single "
             "exponential, and its fitted zeta < 1 exactly where the trajectory overshoots p* by more than 1e-3 "
             "of its rise: reproduced; the fits good but zeta misreading the regime: partial; else not_reproduced",
        fits=f,
    )


def claim_lm_laws(results: study.Results | None) -> dict:
    def measure(results):
        arms = sorted({a for members in scans(results).values() for a in members.values()})
        runs = [r for a in arms for r in results[a]]
        r2 = {law: np.asarray([fitted(r, law, "r2") for r in runs]) for law in rc.LAWS}
        zeta = np.asarray([fitted(r, "damped", "zeta") for r in runs])
        prefer = int(np.nansum([fitted(r, "damped", "bic") < fitted(r, "single_exponential", "bic") for r in runs]))
        mean_r2 = {}
        for a in arms:
            xs, ys = zip(*(r.series("reward/mean") for r in results[a]))
            n = min(map(len, xs))
            if n >= MIN_POINTS:
                mean_r2[a] = {law: rc.fit(law, xs[0][:n], np.mean([v[:n] for v in ys], 0)).r2 for law in rc.LAWS}
        good = [a for a, v in mean_r2.items() if v["damped"] >= 0.91]
        measured = (f"{len(runs)} runs of the G scans (training reward per step vs updates): R^2 damped "
                    f"{study.spread(r2['damped'])}, single exponential {study.spread(r2['single_exponential'])}; BIC "
                    f"prefers the damped law in {prefer}/{len(runs)} runs; fitted zeta {study.spread(zeta)}; seed-mean "
                    "curves R^2 damped/single: " + (", ".join(f"{a} {v['damped']:.2f}/{v['single_exponential']:.2f}"
                                                             for a, v in mean_r2.items()) or "too short to fit"))
        verdict = ("reproduced" if mean_r2 and len(good) == len(mean_r2) else "partial" if good
                   else "not_reproduced")
        return measured, verdict, {"seed_mean_r2": mean_r2}

    return lm_claim(
        results, ENDS, measure,
        claim=f"{LAWS} (language model)",
        source=f"{INERTIAL}, abstract",
        paper="the closed-form trajectory fits training reward to R^2 >= 0.91 across three models and two group sizes",
        rule="the damped law fits every scan arm's seed-mean training-reward curve with R^2 >= 0.91: reproduced; "
             "some arms: partial; none: not_reproduced",
    )


INVARIANCE = "The deterministic (mean) trajectory is invariant in the group size G"


def claim_toy_invariance(t: dict) -> dict:
    inv = t["invariance"]
    traj, factor = inv["trajectories"], inv["drift factor s_G(p) / sqrt(p(1-p))"]
    worst = {k: max(v["max |p_G - p_inf|"].values()) for k, v in traj.items()}
    invariant = [k for k, w in worst.items() if w <= 0.05]
    return study.claim(
        f"{INVARIANCE} (toy, exact)",
        source=f"{INERTIAL}, abstract",
        paper="group-size invariance of the deterministic trajectory (to leading order: G enters as a noise temperature)",
        measured=("GRPO's exact expected step is s_G(p)/sqrt(p(1-p)) times the G=inf one, at p=0.5 "
                  + ", ".join(f"G={g} {v['p=0.5']:.2f}" for g, v in factor.items())
                  + "; max_t |p_G - p_inf| for G=2,4,8,16: " + "; ".join(
                      f"{k}: " + ", ".join(f"{d:.3g}" for d in v["max |p_G - p_inf|"].values())
                      + f" (exponent in G {v['deviation exponent in G (se)'][0]:.2f} ± "
                      f"{v['deviation exponent in G (se)'][1]:.2f})" for k, v in traj.items())
                  + "; batches to 90% of the rise (G=2,4,8,16,inf): " + "; ".join(
                      f"{k}: {list(v['batches to 90% of its rise'].values())}" for k, v in traj.items())
                  + "; plateau p with KL (Adam): " + ", ".join(
                      f"G={g} {p:.3f}" for g, p in traj[f"Adam lr 0.02, beta {TOY_BETA:g}"]["final p"].items())),
        verdict=("reproduced" if len(invariant) == len(worst) else "partial" if invariant else "not_reproduced"),
        rule="a setting (SGD lr 0.5 or Adam lr 0.02, beta 0 or 0.5) is invariant if every G in {2, 4, 8, 16} stays "
             "within 0.05 of the G = inf trajectory of P(correct) (from 0.1); every setting: reproduced; some: "
             "partial; none: not_reproduced",
        invariant_settings=invariant,
        invariance={k: v for k, v in inv.items() if k != "curves"},
    )


def claim_lm_invariance(results: study.Results | None) -> dict:
    def measure(results):
        parts, calls = [], {}
        for scan, members in scans(results).items():
            gs, area_ = across_g(results, members, area)
            _, acc = across_g(results, members, final_accuracy)
            slopes = np.asarray([np.polyfit(np.log2(gs), v, 1)[0] for v in area_])
            effect = interval(slopes * math.log2(gs.max() / gs.min()))  # the change from the smallest to the largest G
            lo, hi = effect[0] - 2 * effect[1], effect[0] + 2 * effect[1]
            calls[scan] = ("invariant" if -0.05 < lo and hi < 0.05 else
                           "not invariant" if (lo > 0 or hi < 0) and abs(effect[0]) > 0.05 else "inconclusive")
            rates = {int(g): study.spread(results.values(members[int(g)], lambda r: fitted(r, "damped", "rate")))
                     for g in gs}
            parts.append(f"{scan}: mean training reward by G " + ", ".join(
                f"{int(g)}: {study.spread(area_[:, i])}" for i, g in enumerate(gs))
                + f"; change from G={int(gs.min())} to {int(gs.max())} {fmt(effect)} -> {calls[scan]}; final held-out "
                "accuracy " + ", ".join(f"{int(g)}: {acc[:, i].mean():.3f}" for i, g in enumerate(gs))
                + "; fitted damped rate per update " + ", ".join(f"{g}: {v}" for g, v in rates.items()))
        c = list(calls.values())
        verdict = ("reproduced" if all(x == "invariant" for x in c) else
                   "not_reproduced" if all(x == "not invariant" for x in c) else "partial")
        return "; ".join(parts), verdict, {"calls": calls}

    return lm_claim(
        results, ENDS, measure,
        claim=f"{INVARIANCE} (language model)",
        source=f"{INERTIAL}, abstract",
        paper="the mean trajectory is group-size invariant to leading order, on the reward curve and on transfer",
        rule="per scan, the change of the mean training reward from the smallest to the largest G (slope in log2 G "
             "per seed x the span, mean ± 2 se over seeds): within ±0.05 -> invariant; beyond 0.05 and excluding 0 "
             "-> not invariant; else inconclusive. Every scan invariant: reproduced; every scan not invariant: "
             "not_reproduced; else partial",
    )


FLUCTUATION = "The stationary fluctuation of the reward shrinks like 1/G"


def claim_toy_fluctuation(t: dict) -> dict:
    fl = t["fluctuation"]
    cases = [k for k in fl if k.startswith("fixed prompts") and "theory" not in k]
    near = [k for k in cases if abs(fl[k]["exponent (se)"][0] + 1) <= 2 * fl[k]["exponent (se)"][1]]
    return study.claim(
        f"{FLUCTUATION} (toy, Monte Carlo)",
        source=f"{INERTIAL}, abstract",
        paper="a 1/G stationary fluctuation around the G-invariant trajectory",
        measured=(f"stationary Var(p) around p* of sampled runs ({TOY_SIZE.monte_carlo} updates, the first eighth "
                  "burn-in), exponent in G (G=2-16, ± se): " + "; ".join(
                      f"{k} {v['exponent (se)'][0]:.2f} ± {v['exponent (se)'][1]:.2f}" for k, v in fl.items())
                  + ". The variance of one group's step itself (the noise temperature) falls faster than 1/G: "
                  "at small G the group std also shrinks the step"),
        verdict="reproduced" if len(near) == len(cases) else "partial" if near else "not_reproduced",
        rule="the exponent in G of Var(p) at a fixed number of groups per update (SGD and Adam) within 2 se of -1: "
             "both: reproduced; one: partial; neither: not_reproduced",
        fluctuation=fl,
    )


def claim_lm_fluctuation(results: study.Results | None) -> dict:
    def measure(results):
        parts, held_fixed_prompts = [], None
        for scan, members in scans(results).items():
            gs, reward_var = across_g(results, members, fluctuation)
            _, held_var = across_g(results, members, lambda r: fluctuation(r, "held-out"))
            _, level = across_g(results, members, lambda r: fitted(r, "damped", "plateau"))
            prompts = np.asarray([results[members[int(g)]][0].config.train.prompts_per_step for g in gs])
            sampling = np.clip(level, 0.01, 0.99) * (1 - np.clip(level, 0.01, 0.99)) / (prompts * gs)
            e_reward, e_held = interval(per_seed_exponents(gs, reward_var)), interval(per_seed_exponents(gs, held_var))
            if scan == "fixed prompts":
                held_fixed_prompts = e_held
            parts.append(f"{scan}: training-reward residual variance x1e3 by G " + ", ".join(
                f"{int(g)}: {1e3 * reward_var[:, i].mean():.3g}" for i, g in enumerate(gs))
                + f" (exponent {fmt(e_reward)}; binomial sampling noise of the batch mean alone would give "
                f"{fmt(interval(per_seed_exponents(gs, sampling)))}); held-out greedy accuracy (no sampling noise) "
                "residual variance x1e3 " + ", ".join(f"{int(g)}: {1e3 * held_var[:, i].mean():.3g}"
                                                      for i, g in enumerate(gs)) + f" (exponent {fmt(e_held)})")
        e = held_fixed_prompts
        ok = e is not None and all(map(math.isfinite, e))
        negative = ok and e[0] + 2 * e[1] < 0
        consistent = negative and abs(e[0] + 1) <= 2 * e[1]
        return "; ".join(parts), "reproduced" if consistent else "partial" if negative else "not_reproduced", {}

    return lm_claim(
        results, ENDS, measure,
        claim=f"{FLUCTUATION} (language model)",
        source=f"{INERTIAL}, abstract",
        paper="a 1/G stationary fluctuation around the G-invariant trajectory",
        rule="the exponent in G of the held-out accuracy's residual variance at fixed prompts (the policy's own "
             "fluctuation; mean ± 2 se over seeds) contains -1 and excludes 0: reproduced; negative but not -1: "
             "partial; else not_reproduced. The training reward's exponent is not used: its sampling noise alone "
             "scales as 1/(prompts x G)",
    )


def sweep_text(results: study.Results | None, sweep: str) -> str:
    rows = []
    for a in [BASE_ARM, *sweep_arms(sweep)]:
        if results is not None and a in results:
            rows.append(f"{a.removeprefix(BASE_ARM + '_') if a != BASE_ARM else 'base'}: mean reward "
                        f"{results.values(a, area).mean():.3f}, final held-out {results.values(a, final_accuracy).mean():.3f}, "
                        f"zeta {results.values(a, lambda r: fitted(r, 'damped', 'zeta')).mean():.2f}, "
                        f"collapsed {sum(map(collapsed, results[a]))}/{len(results[a])}, "
                        f"oscillating fit {sum(map(overshoots, results[a]))}/{len(results[a])}")
    return "; ".join(rows) if len(rows) > 1 else "not run"


def claim_thresholds(t: dict, results: study.Results | None) -> dict:
    lr = t["lr threshold"]
    rows = [(k, v) for k, v in lr.items() if k.startswith("momentum")]
    exact = all(abs(v["relative error"]) < 0.01 for _, v in rows)
    ref = t["refresh"]
    lin, delay = (int(ref["agreement"][m].split("/")[0]) / len(ref["cells"]) for m in ("linearized", "delay model"))
    measured = (f"toy (exact, SGD, G=8, kappa = {lr['kappa']:.4f} measured from the gradient field): lr* "
                + "; ".join(f"{k}: predicted 2(1+mu)/kappa = {v['predicted lr*']:.4g}, found {v['observed lr*']:.4g}"
                            for k, v in rows)
                + f". Refresh interval n (SGD updates per rollout batch, lr kappa 0.25-1.9, n 1-16): the exact "
                f"linearization (gains a = {ref['a (current policy)']:.3f} through the current policy, b = "
                f"{ref['b (stale policy)']:.3f} through the stale one) predicts {ref['agreement']['linearized']} cells, "
                f"the stiffness alone (delay model n lr kappa < 2) {ref['agreement']['delay model']}: the importance "
                f"ratio keeps the current-policy restoring force, so every n is stable below lr kappa = "
                f"{ref['stable for every n below lr kappa']:.2f}. Language model (--lm): learning-rate sweep "
                f"{sweep_text(results, 'lr')}; staleness sweep {sweep_text(results, 'stale')}")
    return study.claim(
        "Sharp stability thresholds (learning rate, refresh interval) sit at the independently measured stiffness",
        source=f"{INERTIAL}, abstract (softmax-bandit reduction)",
        paper="a softmax-bandit reduction locates the refresh-interval stability threshold at the independently "
              "measured stiffness",
        measured=measured,
        verdict="reproduced" if exact and delay >= 0.9 else "partial" if exact and lin >= 0.9 else "not_reproduced",
        rule="toy: the learning-rate threshold at 2(1+mu)/kappa within 1% for every momentum, and the refresh "
             "threshold predicted by the stiffness alone (delay model) in >= 90% of cells: reproduced; the "
             "learning-rate threshold exact but the refresh threshold needing the split stiffness (a, b): partial; "
             "else not_reproduced. The language-model sweeps (Adam: no stiffness to compare with) are reported, "
             "not scored: the paper leaves a deep-network demonstration to future work",
        lr_threshold=lr,
        refresh=ref,
    )


def claim_transition(t: dict, results: study.Results | None) -> dict:
    lr, adam = t["lr threshold"], t["adam"]
    heavy = all(v["onset agrees"] for k, v in lr.items() if k.startswith("momentum"))
    agree, total = map(int, adam["agreement"].split("/"))
    at = {c["b1"]: (c["fitted zeta"], c["overshoot"]) for c in adam["cases"] if c["lr"] == 0.02}
    measured = ("toy (exact): SGD + heavy ball turns oscillatory at lr kappa = (1 - sqrt(mu))^2 "
                f"({'as predicted' if heavy else 'NOT as predicted'} at 0.5, 0.8, 1.25, 1.6 x onset, mu 0/0.5/0.9); "
                f"Adam (lr 0.005/0.02/0.05 x b1 0-0.99): overshoot predicted by heavy ball with mu = b1 and the "
                f"measured Adam gain in {adam['agreement']} cases; at lr 0.02 (fitted zeta, overshoot) by b1: "
                + ", ".join(f"{b1:g}: ({z:.2f}, {max(o, 0):.2g})" for b1, (z, o) in at.items())
                + "; off-policy lag: Adam lr 0.02's overshoot by updates per rollout batch n " + ", ".join(
                    f"n={n}: {max(o, 0):.2g}" for n, o in t["refresh"]["Adam lr 0.02 overshoot by n"].items())
                + " (lag does not erode Adam's damping here; with SGD, n >= 2 destabilizes at lr kappa >= 1.2: "
                "the refresh grid of the stability claim)"
                + f". Language model (--lm): b1 sweep {sweep_text(results, 'b1')}; staleness {sweep_text(results, 'stale')}")
    return study.claim(
        "An overdamped-to-oscillatory transition where momentum (the inertia) meets the measured stiffness",
        source=f"{INERTIAL}, abstract (softmax-bandit reduction)",
        paper="the softmax-bandit reduction reproduces the predicted overdamped-to-oscillatory transition",
        measured=measured,
        verdict="reproduced" if heavy and agree == total else "partial" if heavy or agree >= 0.9 * total
        else "not_reproduced",
        rule="toy: the heavy-ball onset (1 - sqrt(mu))^2 / kappa as predicted at every momentum and Adam's "
             "overshoot predicted in every case: reproduced; the onset or >= 90% of the Adam cases: partial; else "
             "not_reproduced. The lag's effect is reported, not scored (the paper states it as the model's "
             "mechanism, not as a bandit result). The "
             "language-model b1 and staleness sweeps are reported, not scored (the paper shows the transition on "
             "the bandit only)",
        adam=adam,
    )


def claim_two_grpo(results: study.Results | None) -> dict:
    two, sixteen = ENDS

    def measure(results):
        acc = results.values(two, final_accuracy) / results.values(sixteen, final_accuracy)
        gain = ((results.values(two, final_accuracy) - results.values(two, initial_accuracy))
                / (results.values(sixteen, final_accuracy) - results.values(sixteen, initial_accuracy)))
        ratio = {name: results.values(two, fn).mean() / results.values(sixteen, fn).mean() for name, fn in (
            ("rollouts", rollouts), ("tokens", lambda r: r.last("tokens")), ("wall", lambda r: r.wall_seconds))}
        matched, faster = acc.mean() >= 0.95, ratio["wall"] <= 0.3
        pair = (scan_arm(2, ROLLOUTS // 2), scan_arm(16, ROLLOUTS // 16))
        same = (f"; at equal rollouts per step ({ROLLOUTS}: G=2 x {ROLLOUTS // 2} prompts vs G=16 x {ROLLOUTS // 16}): "
                f"held-out {study.spread(results.values(pair[0], final_accuracy))} vs "
                f"{study.spread(results.values(pair[1], final_accuracy))}" if all(a in results for a in pair) else "")
        measured = (f"{PROMPTS} prompts per step, same updates: final held-out greedy accuracy G=2 "
                    f"{study.spread(results.values(two, final_accuracy))} vs G=16 "
                    f"{study.spread(results.values(sixteen, final_accuracy))}, ratio {study.spread(acc)} (gain over "
                    f"the warm start, ratio {study.spread(gain)}); rollouts {ratio['rollouts']:.3f}x, completion tokens "
                    f"{ratio['tokens']:.3f}x, wall time {ratio['wall']:.2f}x (shared machine, compilation included)" + same)
        return measured, "reproduced" if matched and faster else "partial" if matched or faster else "not_reproduced", {}

    return lm_claim(
        results, ENDS, measure,
        claim="2-GRPO: G=2 matches G=16 with 1/8 of the rollouts and over 70% less training time",
        source=f"{TWO_GRPO}, abstract",
        paper="2-GRPO retains 97.6% of 16-GRPO's performance with 12.5% of the rollouts and 21% of the training time",
        rule="G=2's final held-out accuracy >= 95% of G=16's (mean of per-seed ratios) and its wall time <= 30%: "
             "reproduced; one of the two: partial; neither: not_reproduced",
    )


def claims(results: study.Results | None) -> list[dict]:
    """Every claim; `results` None: the toy only (the language-model claims read not_run)."""
    t = toy()
    return [claim_toy_laws(t), claim_lm_laws(results), claim_toy_invariance(t), claim_lm_invariance(results),
            claim_toy_fluctuation(t), claim_lm_fluctuation(results), claim_thresholds(t, results),
            claim_transition(t, results), claim_two_grpo(results)]


# -- the report: the toy's tables and the figures ----------------------------------------------


def md_table(header: list, rows: list[list]) -> list[str]:
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(map(str, header)) + " |", "|---" * len(header) + "|",
            *("| " + " | ".join(map(cell, r)) + " |" for r in rows), ""]


def toy_markdown(t: dict) -> str:
    inv, lr, adam, ref, fl = t["invariance"], t["lr threshold"], t["adam"], t["refresh"], t["fluctuation"]
    gs = [str(g) for g in GROUP_SIZES]
    lines = ["", "## The toy (exact expected GRPO gradients on a softmax bandit; experiments/softmax_bandit.py)", "",
             f"8 answers (2 correct), P(correct) from 0.1, KL to the initial policy beta = {TOY_BETA:g} where stated; "
             "p* and kappa measured from the exact gradient field.", "",
             "Drift factor s_G(p)/sqrt(p(1-p)) (GRPO's expected step relative to G = infinity):", ""]
    lines += md_table(["G", "p=0.1", "p=0.5", "p=0.9"],
                      [[g, *v.values()] for g, v in inv["drift factor s_G(p) / sqrt(p(1-p))"].items()])
    lines += ["Exact trajectories by G (G = 2, 4, 8, 16, infinity):", ""]
    lines += md_table(["optimizer, KL", "final p", "batches to 90% of the rise", "max abs(p_G - p_inf), G=2..16",
                       "exponent in G"],
                      [[k, ", ".join(f"{p:.3f}" for p in v["final p"].values()),
                        ", ".join(map(str, v["batches to 90% of its rise"].values())),
                        ", ".join(f"{d:.3g}" for d in v["max |p_G - p_inf|"].values()),
                        f"{v['deviation exponent in G (se)'][0]:.2f} ± {v['deviation exponent in G (se)'][1]:.2f}"]
                       for k, v in inv["trajectories"].items()])
    lines += [f"Laws fitted to exact trajectories (G=8, {TOY_SIZE.fit} batches):", ""]
    lines += md_table(["optimizer", "R^2 single", "R^2 damped", "fitted zeta", "rate single", "rate damped",
                       "true overshoot"],
                      [[k, v["R^2 single"], v["R^2 damped"], v["zeta"], v["rate single"], v["rate damped"],
                        max(v["overshoot"], 0.0)] for k, v in t["fits"].items()])
    lines += [f"Stability and oscillation of SGD with heavy-ball momentum (kappa = {lr['kappa']:.4g}, p* = {lr['p*']:.4f}):", ""]
    lines += md_table(["momentum", "predicted lr* = 2(1+mu)/kappa", "found lr*", "relative error",
                       "onset lr = (1-sqrt mu)^2/kappa", "p - p* changes sign at x0.5, 0.8, 1.25, 1.6 onset"],
                      [[k.split()[1], v["predicted lr*"], v["observed lr*"], f"{v['relative error']:.1e}",
                        v["predicted onset lr"], ", ".join("yes" if o else "no" for o in v["oscillates at x onset"].values())]
                       for k, v in lr.items() if k.startswith("momentum")])
    lines += [f"Adam: overshoot of p* predicted by heavy ball (mu = b1, gain from Adam's second moment at arrival), "
              f"agreement {adam['agreement']}:", ""]
    lines += md_table(["lr", "b1", "gain", "onset (1-sqrt b1)^2", "predicted", "overshoot", "observed", "fitted zeta"],
                      [[c["lr"], c["b1"], c["gain at arrival"], c["onset"], c["predicted oscillation"],
                        max(c["overshoot"], 0.0), c["observed oscillation"], c["fitted zeta"]] for c in adam["cases"]])
    ns = sorted({c["n"] for c in ref["cells"]})
    grid = {}
    for c in ref["cells"]:
        grid.setdefault(c["lr kappa"], {})[c["n"]] = "/".join(
            "U" if c[k] else "s" for k in ("observed unstable", "linearized unstable", "delay model unstable"))
    lines += [f"Refresh interval: n SGD updates per rollout batch; cells observed/linearized/delay-model "
              f"(U unstable, s stable); a = {ref['a (current policy)']:.4f}, b = {ref['b (stale policy)']:.4f}, "
              f"agreement linearized {ref['agreement']['linearized']}, delay model {ref['agreement']['delay model']}:", ""]
    lines += md_table(["lr kappa", *(f"n={n}" for n in ns)], [[g, *(row[n] for n in ns)] for g, row in grid.items()])
    lines += ["Stationary fluctuation Var(p) around p* by G (Monte Carlo of the sampled toy, and SGD's first-order theory):", ""]
    lines += md_table(["case", *(f"G={g}" for g in gs), "exponent"],
                      [[k, *(f"{v['variance'][g]:.3g}" for g in gs),
                        f"{v['exponent (se)'][0]:.2f} ± {v['exponent (se)'][1]:.2f}"] for k, v in fl.items()])
    return "\n".join(lines)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors() -> dict:
    """G (None: infinity) -> its colour in every figure."""
    return dict(zip((*GROUP_SIZES, None), pyplot().rcParams["axes.prop_cycle"].by_key()["color"]))


def toy_figure(t: dict, path) -> None:
    """toy.png: exact trajectories by G, the finite-G drift factor, Adam's overshoot by b1, the refresh-interval
    stability grid and the stationary fluctuation by G."""
    plt = pyplot()
    color = colors()
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    for axis, key in zip(ax[0, :2], (f"Adam lr 0.02, beta {TOY_BETA:g}", "SGD lr 0.5, beta 0")):
        for g, p in t["invariance"]["curves"][key].items():
            axis.plot(p, color=color[g], label=f"G={g or 'inf'}")
        axis.set(title=f"toy, exact: {key}", xlabel="rollout batch", ylabel="P(correct)")
        axis.legend(fontsize=7)
    grid = np.linspace(0.01, 0.99, 99)
    for g in GROUP_SIZES:
        ax[0, 2].plot(grid, [sb.group_weight(p, toy_alg(g)) / math.sqrt(p * (1 - p)) for p in grid], color=color[g],
                      label=f"G={g}")
    ax[0, 2].set(title="GRPO's expected step / G=inf's", xlabel="p", ylim=(0, 1.05))
    ax[0, 2].legend(fontsize=7)
    for lr_ in (0.005, 0.02, 0.05):
        cases = [c for c in t["adam"]["cases"] if c["lr"] == lr_]
        line, = ax[1, 0].plot([c["b1"] for c in cases], [max(c["overshoot"], 1e-12) for c in cases], "o-", label=f"lr {lr_:g}")
        ax[1, 0].scatter([c["b1"] for c in cases if c["predicted oscillation"]],
                         [max(c["overshoot"], 1e-12) for c in cases if c["predicted oscillation"]],
                         s=90, facecolors="none", edgecolors=line.get_color())
    ax[1, 0].set(yscale="log", title="toy, Adam: overshoot of p* (circled: predicted)", xlabel="b1")
    ax[1, 0].legend(fontsize=7)
    cells = t["refresh"]["cells"]
    gains_, ns = sorted({c["lr kappa"] for c in cells}), sorted({c["n"] for c in cells})
    image = np.array([[next(c["observed unstable"] for c in cells if c["lr kappa"] == g and c["n"] == n) for n in ns]
                      for g in gains_], float)
    ax[1, 1].imshow(image, cmap="coolwarm", aspect="auto", origin="lower", vmin=0, vmax=1)
    for i, g in enumerate(gains_):
        for j, n in enumerate(ns):
            c = next(c for c in cells if c["lr kappa"] == g and c["n"] == n)
            ax[1, 1].text(j, i, ("L" if c["linearized unstable"] else "") + ("D" if c["delay model unstable"] else ""),
                          ha="center", va="center", fontsize=7)
    ax[1, 1].set(xticks=range(len(ns)), xticklabels=ns, yticks=range(len(gains_)), yticklabels=gains_, xlabel="n",
                 ylabel="lr kappa", title="toy, SGD: unstable (red); L/D: linearized/delay predict unstable")
    for k, v in t["fluctuation"].items():
        style = "--" if "theory" in k else "o-"
        ax[1, 2].plot(GROUP_SIZES, list(v["variance"].values()), style, label=k, ms=3)
    ax[1, 2].set(xscale="log", yscale="log", title="toy: Var(p) by G", xlabel="G")
    ax[1, 2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def lm_figures(results: study.Results, results_dir: pathlib.Path) -> None:
    """lm_fits.png (seed-mean training reward of each scan and both fits) and lm_fluctuation.png (residual
    variance against G)."""
    plt = pyplot()
    color = colors()
    members = scans(results)
    if members:
        fig, ax = plt.subplots(1, len(members), figsize=(6 * len(members), 4), squeeze=False)
        for axis, (scan, arms) in zip(ax[0], members.items()):
            for g, a in arms.items():
                xs, ys = zip(*(r.series("reward/mean") for r in results[a]))
                n = min(map(len, xs))
                x, y = xs[0][:n], np.mean([v[:n] for v in ys], 0)
                axis.plot(x, y, color=color[g], lw=0.6, alpha=0.6)
                if n >= MIN_POINTS:
                    for law, style in (("damped", "-"), ("single_exponential", ":")):
                        f = rc.fit(law, x, y)
                        axis.plot(x, rc.LAWS[law][0](x - x[0], *f.params.values()), style, color=color[g], lw=2,
                                  label=f"G={g} {law} R^2 {f.r2:.2f}")
            axis.set(title=f"LM, {scan}: seed-mean training reward and fits", xlabel="updates")
            if axis.get_legend_handles_labels()[0]:  # no fit on runs shorter than MIN_POINTS
                axis.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(results_dir / "lm_fits.png", dpi=90)
        plt.close(fig)
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for axis, (label, fn) in zip(ax, (("training reward", fluctuation),
                                         ("held-out greedy accuracy", lambda r: fluctuation(r, "held-out")))):
            axis.set(xscale="log", xlabel="G", title=f"LM: residual variance of the {label}")
            for scan, arms in members.items():
                gs, v = across_g(results, arms, fn)
                if not np.any(v > 0):  # runs too short to fit (NaN) or flat: nothing to draw on a log scale
                    continue
                line, = axis.plot(gs, np.nanmean(v, 0), "o-", label=scan)
                for row in v:
                    axis.plot(gs, row, ".", color=line.get_color(), alpha=0.5)
                axis.plot(gs, np.nanmean(v) * gs.mean() / gs, ":", color=line.get_color(), label=f"1/G ({scan})")
                axis.set(yscale="log")
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(results_dir / "lm_fluctuation.png", dpi=90)
        plt.close(fig)


def report(results: study.Results, results_dir: pathlib.Path) -> str:
    """With --lm (study.Study.report): the figures, and the toy's tables that end table.md."""
    toy_figure(toy(), results_dir / "toy.png")
    lm_figures(results, results_dir)
    return toy_markdown(toy())


def run_toy(results_dir: pathlib.Path, quick: bool) -> dict:
    """The toy only (no --lm): summary.json (the claims, the language-model ones not_run), table.md, toy.png."""
    start, load, git = time.perf_counter(), list(os.getloadavg()), study.git_state()
    results_dir.mkdir(parents=True, exist_ok=True)
    summary = study.finite({
        "study": "group_size_dynamics", "quick": quick, "language_model_runs": LM_NOT_RUN, "claims": claims(None),
        "git": git, "machine": study.machine(),
        "load_average_1_5_15min": {"start": load, "end": list(os.getloadavg())},
        "wall_seconds": round(time.perf_counter() - start, 1),
    })
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    toy_figure(toy(), results_dir / "toy.png")
    footer = (f"Toy only ({LM_NOT_RUN}). Wall time {summary['wall_seconds']:.0f} s on {os.cpu_count()} cores, load "
              f"average {load[0]:.1f} at the start, {summary['load_average_1_5_15min']['end'][0]:.1f} at the end. "
              f"Commit {git['commit'][:10]}" + (" (with local changes)." if git["dirty"] else "."))
    (results_dir / "table.md").write_text("\n".join([f"# group_size_dynamics{' (quick)' if quick else ''}", "",
                                                     *study.claims_md(summary["claims"]), "", footer, ""])
                                          + toy_markdown(toy()) + "\n")
    print((results_dir / "table.md").read_text())
    return summary


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lm", action="store_true", help="also the language-model runs (hours of CPU; the study "
                        "harness's flags --quick, --results-dir, --seeds, --arms and --resume then apply to them)")
    parser.add_argument("--quick", action="store_true", help="with --lm the reduced study; the toy is the same")
    parser.add_argument("--results-dir", type=pathlib.Path, help="default: experiments/results/group_size_dynamics "
                        "(the committed table, with --lm), its toy/ subfolder for the toy alone, quick/ with --quick")
    args, rest = parser.parse_known_args(argv)
    if args.lm:
        return study.main(get_study, claims, rest + ["--quick"] * args.quick
                          + ["--results-dir", str(args.results_dir)] * (args.results_dir is not None))
    if rest:
        parser.error(f"{' '.join(rest)}: without --lm only --quick and --results-dir apply")
    default = study.HERE / "results" / "group_size_dynamics" / ("quick" if args.quick else "toy")  # not the --lm table
    return run_toy(args.results_dir or default, args.quick)


if __name__ == "__main__":
    main()
