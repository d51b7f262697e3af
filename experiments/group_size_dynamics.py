"""Group size and the dynamics of GRPO, under the shared protocol (experiments/protocol.py): the inertial
model of the mean-reward curve ("Predictable GRPO: A Closed-Form Model of Training Dynamics", arXiv
2606.30789, the hub page of the GSPO paper in shared/seeds/) and 2-GRPO ("It Takes Two: Your GRPO Is
Secretly DPO", arXiv 2510.00977).

    python experiments/group_size_dynamics.py [--quick] [--resume] [--rejudge]   # the study (toy included)
    python experiments/group_size_dynamics.py --toy [--results-dir DIR]          # the toy alone

The inertial model reduces GRPO to a damped oscillator in the mean reward: momentum supplies the inertia,
off-policy lag erodes the damping, the group size G enters only as a noise temperature. It claims a damped
second-order law for the mean-reward curve (single-exponential saturation its overdamped limit), a mean
trajectory invariant in G, a stationary fluctuation ~ 1/G (these three on language models), a
refresh-interval stability threshold at an independently measured stiffness and an overdamped-to-
oscillatory transition (these two on a softmax bandit). 2-GRPO claims that G=2 keeps G=16's accuracy with
1/8 of the rollouts. None of this depends on completion length, so the study stays on the quickstart's
short arithmetic (issue 37).

Two testbeds, each claim on one (the table lists them in pairs):
- The toy (experiments/softmax_bandit.py), the same with --quick: GRPO's exact expected gradient on a
  softmax policy over 8 answers (2 correct), from P(correct) = 0.1, with a KL term to the initial policy
  (beta 0.5) so that the drift has a fixed point p* and a stiffness kappa, both measured from the gradient
  field; SGD and Adam in float64. The mean-field reduction is exact there (the dynamics stay in the logit
  gap). An exact half has no noise, so no seeds and no test: it holds when every case meets its bound
  (`Exact`; summary.json keeps each case's value). The fluctuation is Monte Carlo (sampled groups): 8
  seeds, judged by protocol.judge like the language model's halves.
- The language model: the quickstart's tiny Qwen3-style model on two-operand arithmetic (operands 0-9),
  warm-started to 20% greedy held-out accuracy; GRPO (grpo preset, beta 0, clip 0.2) on-policy (one Adam
  update per rollout batch, constant rate after 10 warmup steps), 32 prompts a step, 300 steps; 8
  evaluation seeds. Arms:
  - g16: G=16, its rate chosen among RATES on the selection seeds (100, 101) by the mean training reward;
  - g2: G=2 at g16's chosen rate: G varied at one setting, as the model's claims need (a rate chosen per G
    would confound G with the rate);
  - g2_tuned: G=2 at its own chosen rate: 2-GRPO against g16, each tuned (the protocol);
  - gspo, gspo_token: the null pair at G=4 and g16's rate, the second on its own rollouts. On-policy the
    sequence ratio is 1 at the one update, so both are GRPO's objective: their spread is this study's
    sampling noise, the floor of every comparative half.
  With --quick: 2 seeds of 120 steps, every arm at 5e-4 (no rate sweep: marked as not under the full
  protocol).

Rules that could not fail were replaced (issue 37's audit):
- 2-GRPO's "70% less training time" follows from sampling 1/8 of the rollouts, a quantity the design
  fixes: not a half (rollouts, tokens and wall time are in the table). Its half is the accuracy.
- The damped law nests the single exponential, so its R^2 is never lower: the language-model half is the
  BIC instead (penalty log n per parameter: the damped law must buy its extra parameter), per seed at
  G=2 and G=16 (the paper fits two group sizes). On the toy's noise-free curves a better fit is by
  construction too, so the toy half is whether the fitted zeta reads the regime (zeta < 1 exactly where
  P(correct) overshoots p*).
- The learning-rate threshold 2 (1 + mu) / kappa and the oscillation onset (1 - sqrt(mu))^2 / kappa of SGD
  with heavy-ball momentum are textbook (Polyak 1964), and exact by construction on a linearization whose
  kappa is measured from the same gradient field: dropped. The refresh threshold is tested against the
  stiffness alone (our reading of the abstract: the drift of n updates all taken at the stale policy,
  unstable past n lr kappa = 2); the exact linearization with the gains a (current policy) and b (stale
  policy), which agrees by construction, is reported to say why.
- The transition is restated as the model's mechanism, not as the paper's bandit result: (a) Adam's
  overshoot is heavy ball's with mu = b1 and the gain of its second moment (the inertia is the momentum),
  (b) off-policy lag erodes the damping (Adam's overshoot grows with the updates per rollout batch).
- Invariance is one-sided (G=2 no worse than G=16 by more than 0.05, reward and held-out accuracy): a finite
  group shrinks the expected step (the toy's drift factor s_G(p) < sqrt(p (1 - p)), smallest at G=2), so
  that is the side a departure takes; a two-sided rule would read "partial" whenever G=16 is simply ahead.
- The fluctuation is the held-out greedy accuracy's (no sampling noise): the training reward's includes the
  batch mean's binomial noise, ~ 1/(prompts x G) by design. Its half is G=2's at least sqrt(8) times
  G=16's (an exponent in G below -1/2; 1/G gives 8).

Trimmed for the budget (8 seeds and a rate sweep): the fixed-rollouts scan (G x prompts = 128), G=4 and
G=8 with GRPO, and the sweeps of the learning rate, Adam's b1 and the staleness around G=4. They were
reported, never scored (the paper shows the threshold and the transition on the bandit only), so no claim
is cut, but those two claims now rest on the toy alone. The learning-rate sweep, the one knob that is the
rate itself, is what the rate selection now measures: each rate's mean training reward per tuned arm is
in summary.json's learning_rate_selection.

Budget (a full study in about 2 hours on 2 CPU cores): selection 6 runs each of g16 and g2_tuned,
evaluation 8 runs of each of the 5 arms, 10 warm starts; --quick: 2 seeds of 120 steps, no selection.

Per run: the training reward's fits of both laws against optimizer updates (reward_curves.py), the
held-out accuracy's residual variance around its damped fit over the second half, the mean training
reward, the held-out greedy accuracy of the last 20%, rollouts and tokens sampled, wall time.
"""

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import time
from collections.abc import Callable

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax.config import override

import protocol
import reward_curves as rc
import softmax_bandit as sb
import study
from study import final_accuracy, reward
from warm_start import WarmStart

INERTIAL = "arXiv 2606.30789 (Predictable GRPO)"
TWO_GRPO = "arXiv 2510.00977 (It Takes Two: 2-GRPO)"
NULL = ("gspo", "gspo_token")
ARMS = {  # arm -> (G, changes); the first, the reference of every comparison, is summary.json's base config
    "g16": (16, []),
    "g2": (2, []),
    "g2_tuned": (2, []),
    "gspo": (4, ["algorithm.preset=gspo"]),
    "gspo_token": (4, ["algorithm.preset=gspo_token"]),
}
AT_G16_RATE = ("g2", "gspo")  # the null pair's second follows gspo
PROMPTS, LEARNING_RATE, RATES = 32, 5e-4, (2.5e-4, 5e-4, 1e-3)


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [
        "task.max_value=9", "algorithm.preset=grpo", "algorithm.beta=0", "train.minibatches=1", "optim.schedule=constant",
        f"optim.learning_rate={LEARNING_RATE}", "optim.warmup_steps=10", f"train.steps={120 if quick else 300}",
        f"train.prompts_per_step={PROMPTS}", "train.eval_prompts=256", "train.eval_every=10", "train.checkpoint_every=150",
    ])
    return study.Study(
        name="group_size_dynamics",
        arms={arm: override(base, [f"sampling.group_size={g}", *changes]) for arm, (g, changes) in ARMS.items()},
        **study.sized(quick, RATES),
        rate_from={arm: ("g16", 1.0) for arm in AT_G16_RATE},
        null_pair=NULL,
        warm_start=WarmStart(accuracy=0.2, eval_every=5),
        table=TABLE,
        plots=(study.Plot("curves", ("reward/mean", "eval/accuracy_greedy")),
               study.Plot("two_grpo_vs_tokens", ("reward/mean", "eval/accuracy_greedy"), x="tokens",
                          arms=("g2_tuned", "g16"))),
        report=report,
    )


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


def bic_gain(run: study.Run) -> float:
    """BIC of the single exponential minus the damped law's on the training reward: above 0, the damped law
    fits better by more than its extra parameter's penalty (log n)."""
    return fitted(run, "single_exponential", "bic") - fitted(run, "damped", "bic")


def fluctuation(run: study.Run, curve: str = "held-out") -> float:
    """Variance of the residuals around the curve's damped fit over the second half of the run."""
    f = fits(run)[curve]
    return float(f.residuals[len(f.residuals) // 2:].var()) if f is not None else math.nan


def rollouts(run: study.Run) -> float:
    cfg = run.config
    rounds = sum(r.get("groups/gen_rounds", 0) for r in run.rows if r["step"] > 0)
    return rounds * cfg.train.prompts_per_step * cfg.sampling.group_size


TABLE = {
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "training reward, mean over the run": reward,
    "BIC single exponential - BIC damped law (training reward)": bic_gain,
    "R^2, single exponential": lambda r: fitted(r, "single_exponential", "r2"),
    "R^2, damped law": lambda r: fitted(r, "damped", "r2"),
    "fitted damping ratio zeta": lambda r: fitted(r, "damped", "zeta"),
    "fitted rate per update, damped law": lambda r: fitted(r, "damped", "rate"),
    "held-out accuracy fluctuation (residual variance x 1e3)": lambda r: 1e3 * fluctuation(r),
    "training reward fluctuation (residual variance x 1e3)": lambda r: 1e3 * fluctuation(r, "damped"),
    "rollouts sampled (thousands)": lambda r: rollouts(r) / 1e3,
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
}


# -- the toy: exact dynamics and sampled fluctuations -------------------------------------------

TOY = sb.Bandit(answers=8, correct=2, p0=0.1)
TOY_BETA = 0.5
GROUP_SIZES = (2, 4, 8, 16)
TOY_OPTIMIZERS = {"SGD lr 0.5": sb.Sgd(0.5), "Adam lr 0.02": sb.Adam(0.02)}
NOISY_OPTIMIZERS = {"SGD lr 1": sb.Sgd(1.0), "Adam lr 0.01": sb.Adam(0.01)}  # the Monte Carlo runs
TOY_GROUPS = 16  # groups per sampled update: fixed prompts, as the language model's
TOY_SEEDS = tuple(range(protocol.MIN_SEEDS))
REFRESH = (1, 2, 3, 4, 8, 16)  # updates per rollout batch
OVERSHOOT = 1e-3  # of the rise: an oscillating approach


@dataclasses.dataclass(frozen=True)
class ToySize:
    """Rollout batches (or updates) of the toy's runs."""

    trajectory: int = 600  # exact trajectories by G
    fit: int = 300  # the transient the damped law is fitted to
    halvings: int = 16  # of a threshold's bracket [0.01, 10] in lr kappa
    refresh: int = 200  # each run of the threshold's bisection
    adam: int = 800  # each run of the Adam grid
    monte_carlo: int = 2000  # each sampled run (the first eighth is burn-in)


TOY_SIZE = ToySize()


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


def threshold(unstable: Callable[[float], bool], lo: float, hi: float, halvings: int) -> float:
    """Where `unstable` turns true in [lo, hi] (false at lo, true at hi), by bisection on a log scale."""
    for _ in range(halvings):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if unstable(mid) else (mid, hi)
    return math.sqrt(lo * hi)


def overshoot(p: np.ndarray, p_star: float) -> float:
    """How far p went past p*, as a fraction of the distance from the start (negative: it never got there)."""
    return float((np.nanmax(p) - p_star) / (p_star - p[0]))


def toy_invariance(size: ToySize) -> dict:
    """Exact trajectories for each G (and G = infinity), without and with the KL term: deviation from the
    G = infinity curve, final p, batches to 90% of the rise; and the finite-G factor of the drift."""
    out, curves = {}, {}
    for name, opt in TOY_OPTIMIZERS.items():
        for beta in (0.0, TOY_BETA):
            runs = {g: sb.run(TOY, toy_alg(g, beta), opt, size.trajectory)[0] for g in (*GROUP_SIZES, None)}
            reach = {g: int(np.argmax(p >= TOY.p0 + 0.9 * (p[-1] - TOY.p0))) for g, p in runs.items()}
            dev = [float(np.abs(runs[g] - runs[None]).max()) for g in GROUP_SIZES]
            curves[f"{name}, beta {beta:g}"] = runs
            out[f"{name}, beta {beta:g}"] = {
                "max |p_G - p_inf|": dict(zip(map(str, GROUP_SIZES), dev)),
                "deviation exponent in G": rc.power_law(GROUP_SIZES, dev)[0],
                "final p": {str(g or "inf"): float(p[-1]) for g, p in runs.items()},
                "batches to 90% of its rise": {str(g or "inf"): r for g, r in reach.items()}}
    factor = {str(g): {f"p={p:g}": sb.group_weight(p, toy_alg(g)) / math.sqrt(p * (1 - p)) for p in (0.1, 0.5, 0.9)}
              for g in GROUP_SIZES}
    return {"trajectories": out, "drift factor s_G(p) / sqrt(p(1-p))": factor, "curves": curves}


def toy_fits(size: ToySize) -> dict:
    """The damped law fitted to exact trajectories (G=8, the transient's first batches), with and without
    inertia, beside the true overshoot of p*."""
    p_star = sb.fixed_point(TOY, toy_alg())
    out = {}
    for name, opt in {"SGD lr 0.5, no momentum": sb.Sgd(0.5), "SGD lr 0.5, momentum 0.9": sb.Sgd(0.5, 0.9),
                      "Adam lr 0.02, b1 0": sb.Adam(0.02, b1=0.0), "Adam lr 0.02, b1 0.9": sb.Adam(0.02)}.items():
        p, _ = sb.run(TOY, toy_alg(), opt, size.fit)
        f = rc.fit("damped", np.arange(p.size), p)
        out[name] = {"zeta": f.params["zeta"], "R^2": f.r2, "overshoot": overshoot(p, p_star)}
    return out


def toy_refresh(size: ToySize) -> dict:
    """Per refresh interval n (SGD updates per rollout batch, G=8): lr kappa at which the displaced fixed point
    diverges, by bisection on the exact dynamics; the stiffness alone's 2/n; and the exact linearization's
    (gain a through the current policy, b through the stale one: `softmax_bandit.batch_multiplier`)."""
    a, b = sb.gains(TOY, toy_alg())
    kappa = -(a + b)
    out = {}
    for n in REFRESH:
        observed = threshold(lambda g: diverges(displaced(sb.Sgd(g / kappa), toy_alg(n=n), size.refresh)),
                             0.01, 10.0, size.halvings)
        linear = threshold(lambda g: abs(sb.batch_multiplier(g / kappa, a, b, n)) > 1, 0.01, 10.0, size.halvings)
        out[str(n)] = {"observed": observed, "stiffness alone": 2 / n, "linearized": linear}
    return {"a (current policy)": a, "b (stale policy)": b, "kappa": kappa, "lr kappa at the threshold": out}


def toy_adam(size: ToySize) -> dict:
    """Adam (G=8) at three learning rates and six b1: does p overshoot p*? Predicted by heavy ball with momentum
    b1 and the gain lr_eff (1 - b1) kappa, lr_eff from Adam's second moment when p first comes within 10% of
    p* (`softmax_bandit.adam_lr`). And the lag: Adam lr 0.02's overshoot by updates per rollout batch."""
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
                          "predicted oscillation": gain > sb.oscillation_onset(b1), "overshoot": overshoot(p, p_star)})
    lag = {str(n): overshoot(sb.run(TOY, toy_alg(n=n), sb.Adam(0.02), size.adam)[0], p_star) for n in (1, 2, 4, 8)}
    return {"cases": cases, "overshoot by n, Adam lr 0.02 b1 0.9": lag}


def toy_fluctuation(size: ToySize) -> dict:
    """Monte Carlo runs of the toy from p* (TOY_GROUPS sampled groups per update), per optimizer and seed: the
    stationary variance of p by G and its exponent in G; beside them SGD's first-order theory
    (`softmax_bandit.sgd_stationary_variance`) and the noise temperature (one group's step variance at p=0.7)."""
    runs = {}
    for name, opt in NOISY_OPTIMIZERS.items():
        runs[name] = []
        for seed in TOY_SEEDS:
            var = []
            for g in GROUP_SIZES:
                alg = toy_alg(g)
                p, _ = sb.run(TOY, alg, opt, size.monte_carlo, p_start=sb.fixed_point(TOY, alg),
                              rng=np.random.default_rng((seed, g)), groups=TOY_GROUPS)
                var.append(float(p[size.monte_carlo // 8:].var()))
            runs[name].append({"seed": seed, "variance": dict(zip(map(str, GROUP_SIZES), var)),
                               "exponent": rc.power_law(GROUP_SIZES, var)[0]})
    theory = [sb.sgd_stationary_variance(TOY, toy_alg(g), 1.0, TOY_GROUPS) for g in GROUP_SIZES]
    noise = [sb.drift_noise(0.7, TOY, toy_alg(g)) for g in GROUP_SIZES]
    return {"runs": runs, "SGD lr 1 first-order theory": dict(zip(map(str, GROUP_SIZES), theory)),
            "exponent, SGD first-order theory": rc.power_law(GROUP_SIZES, theory)[0],
            "exponent, noise temperature at p=0.7": rc.power_law(GROUP_SIZES, noise)[0]}


def toy() -> dict:
    """Every toy result at TOY_SIZE (computed once: the claims and the report read the same)."""
    return _toy(TOY_SIZE)


@functools.cache
def _toy(size: ToySize) -> dict:
    return {"invariance": toy_invariance(size), "fits": toy_fits(size), "refresh": toy_refresh(size),
            "adam": toy_adam(size), "fluctuation": toy_fluctuation(size)}


# -- the claims, declared before any run --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Exact:
    """A half of a claim on the exact toy: no noise, so no seeds and no test. `cases` reads the toy's results
    into {case: (value, whether it meets the bound the label states)}; the half holds when every case does."""

    label: str
    cases: Callable[[dict], dict[str, tuple[float, bool]]]


@dataclasses.dataclass(frozen=True)
class ExactClaim:
    claim: str
    source: str
    paper: str
    halves: tuple[Exact, ...]

    def rule(self) -> str:
        return (" and ".join(h.label for h in self.halves) + ", on the exact dynamics (deterministic: every case "
                "must meet it): all hold, reproduced" + ("; one, partial" if len(self.halves) == 2 else "")
                + "; none, not_reproduced")


def judge_exact(claim: ExactClaim, t: dict) -> dict:
    """summary.json's entry of an exact toy claim, in protocol.judge's fields: its rule, each half's per-case
    values and the verdict."""
    halves = []
    for h in claim.halves:
        cases = h.cases(t)
        halves.append({"half": h.label, "per_case": {c: float(v) for c, (v, _) in cases.items()},
                       "cases_meeting": [c for c, (_, ok) in cases.items() if ok],
                       "holds": all(ok for _, ok in cases.values())})
    held = sum(h["holds"] for h in halves)
    measured = "; ".join(f"{h['half']}: " + ", ".join(f"{c}: {v:.4g}" for c, v in h["per_case"].items())
                         + f" ({len(h['cases_meeting'])} of {len(h['per_case'])} meet it)"
                         + (" -> holds" if h["holds"] else " -> fails") for h in halves)
    return {"claim": claim.claim, "source": claim.source, "paper": claim.paper, "rule": claim.rule(),
            "measured": measured, "verdict": "reproduced" if held == len(halves) else "partial" if held
            else "not_reproduced", "halves": halves}


LAWS = "The mean-reward curve follows a damped second-order law whose overdamped limit is single-exponential saturation"
INVARIANCE = "The deterministic (mean) trajectory is invariant in the group size G"
FLUCTUATION = "The stationary fluctuation shrinks like 1/G"
ABSTRACT = f"{INERTIAL}, abstract"


def invariant_within(opt: str, bound: float = 0.05) -> Exact:
    def cases(t):
        traj = t["invariance"]["trajectories"]
        worst = {f"beta {beta:g}": max(traj[f"{opt}, beta {beta:g}"]["max |p_G - p_inf|"].values())
                 for beta in (0.0, TOY_BETA)}
        return {c: (w, w <= bound) for c, w in worst.items()}

    return Exact(f"{opt}: max over batches and G = 2..16 of |P_G(correct) - P_inf(correct)| (the value, without and "
                 f"with the KL term) at most {bound:g}", cases)


def growing_with_n(t: dict) -> dict:
    lag = list(t["adam"]["overshoot by n, Adam lr 0.02 b1 0.9"].items())
    return {f"n={n}": (o, o > before) for (_, before), (n, o) in zip(lag, lag[1:])}


TOY_LAWS = ExactClaim(
    f"{LAWS} (toy, exact)", source=ABSTRACT,
    paper="the inertial law subsumes single-exponential saturation as its overdamped limit and adds the slow start; "
          "its damping ratio zeta < 1 means an oscillatory (underdamped) approach",
    halves=(Exact(f"the damped law's fitted zeta (the value) below 1 exactly where P(correct) overshoots p* by more "
                  f"than {OVERSHOOT:g} of its rise (G=8, four optimizers)",
                  lambda t: {k: (v["zeta"], (v["zeta"] < 1) == (v["overshoot"] > OVERSHOOT)) for k, v in t["fits"].items()}),))
LM_LAWS = protocol.Claim(
    f"{LAWS} (language model)", source=ABSTRACT,
    paper="the closed-form trajectory fits training reward to R^2 >= 0.91 across three models and two group sizes",
    halves=tuple(protocol.Level("BIC of the single exponential minus the damped law's, training reward against updates "
                                "(penalty log n per parameter)", bic_gain, arm, 0.0) for arm in ("g2", "g16")))
TOY_INVARIANCE = ExactClaim(
    f"{INVARIANCE} (toy, exact)", source=ABSTRACT,
    paper="group-size invariance of the deterministic trajectory (to leading order: G enters as a noise temperature)",
    halves=tuple(invariant_within(opt) for opt in TOY_OPTIMIZERS))
LM_INVARIANCE = protocol.Claim(
    f"{INVARIANCE} (language model)", source=ABSTRACT,
    paper="the mean trajectory is group-size invariant to leading order, on the reward curve and on transfer",
    halves=(protocol.Difference("training reward over the run (G=2 at G=16's rate)", reward, "g2", "g16", at_least=-0.05),
            protocol.Difference("held-out greedy accuracy, last 20% (G=2 at G=16's rate)", final_accuracy, "g2", "g16",
                                at_least=-0.05)))
TOY_FLUCTUATION = protocol.Claim(
    f"{FLUCTUATION} (toy, Monte Carlo)", source=ABSTRACT, paper="a 1/G stationary fluctuation around the G-invariant trajectory",
    halves=tuple(protocol.Level(f"-|exponent in G of Var(p) around p* + 1| ({TOY_GROUPS} groups per update, seeds: "
                                "Monte Carlo runs; within 0.25 of 1/G)", lambda run: -abs(run["exponent"] + 1), opt, -0.25)
                 for opt in NOISY_OPTIMIZERS))
LM_FLUCTUATION = protocol.Claim(
    f"{FLUCTUATION} (language model)", source=ABSTRACT, paper="a 1/G stationary fluctuation around the G-invariant trajectory",
    halves=(protocol.Ratio("residual variance of the held-out greedy accuracy around its damped fit, second half (1/G "
                           "gives 8; at least sqrt 8: an exponent in G below -1/2)", fluctuation, "g2", "g16",
                           at_least=8 ** 0.5),))
TOY_REFRESH = ExactClaim(
    "The refresh-interval stability threshold sits at the independently measured stiffness (toy, exact)",
    source=f"{ABSTRACT} (softmax-bandit reduction)",
    paper="a softmax-bandit reduction locates the refresh-interval stability threshold at the independently measured "
          "stiffness",
    halves=(Exact("lr kappa at which SGD with n updates per rollout batch turns unstable over the stiffness alone's "
                  "2/n (the value) within 10% of 1 (G=8)",
                  lambda t: {f"n={n}": (v["observed"] / v["stiffness alone"],
                                        abs(v["observed"] / v["stiffness alone"] - 1) <= 0.1)
                             for n, v in t["refresh"]["lr kappa at the threshold"].items()}),))
TOY_MECHANISM = ExactClaim(
    "Momentum is the inertia and off-policy lag erodes the damping (toy, exact: the model's mechanism, not the "
    "paper's bandit result)",
    source=f"{ABSTRACT} (mechanism)",
    paper="momentum supplies the inertia, off-policy lag erodes the damping; the bandit reduction reproduces the "
          "overdamped-to-oscillatory transition",
    halves=(Exact(f"Adam (G=8) overshoots p* by more than {OVERSHOOT:g} of the rise exactly where heavy ball with mu = b1 "
                  "and Adam's gain at arrival oscillates (the value: that gain over the onset (1 - sqrt b1)^2)",
                  lambda t: {f"lr {c['lr']:g} b1 {c['b1']:g}": (c["gain at arrival"] / c["onset"],
                                                                c["predicted oscillation"] == (c["overshoot"] > OVERSHOOT))
                             for c in t["adam"]["cases"]}),
            Exact("Adam lr 0.02 b1 0.9's overshoot of p* (the value) with n updates per rollout batch above that with "
                  "n/2", growing_with_n)))
TWO_GRPO_CLAIM = protocol.Claim(
    "2-GRPO: G=2 keeps G=16's accuracy with 1/8 of the rollouts", source=f"{TWO_GRPO}, abstract",
    paper="2-GRPO retains 97.6% of 16-GRPO's performance with 12.5% of the rollouts and 21% of the training time",
    halves=(protocol.Ratio("held-out greedy accuracy, last 20% (each G at its own chosen rate)", final_accuracy,
                           "g2_tuned", "g16", at_least=0.95),))


def toy_claims() -> list[dict]:
    t = toy()
    fluctuation_runs = study.Results(t["fluctuation"]["runs"])  # per optimizer, a record per Monte Carlo seed
    return [judge_exact(TOY_LAWS, t), judge_exact(TOY_INVARIANCE, t),
            protocol.judge(TOY_FLUCTUATION, fluctuation_runs, None), judge_exact(TOY_REFRESH, t),
            judge_exact(TOY_MECHANISM, t)]


def claims(results: study.Results) -> list[dict]:
    """Every claim, the toy's beside the language model's."""
    laws, invariance, fluct, refresh, mechanism = toy_claims()
    return [laws, protocol.judge(LM_LAWS, results, NULL), invariance, protocol.judge(LM_INVARIANCE, results, NULL),
            fluct, protocol.judge(LM_FLUCTUATION, results, NULL), refresh, mechanism,
            protocol.judge(TWO_GRPO_CLAIM, results, NULL)]


# -- the report: the toy's tables and the figures ----------------------------------------------


def md_table(header: list, rows: list[list]) -> list[str]:
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(map(str, header)) + " |", "|---" * len(header) + "|",
            *("| " + " | ".join(map(cell, r)) + " |" for r in rows), ""]


def toy_markdown(t: dict) -> str:
    inv, ref, adam, fl = t["invariance"], t["refresh"], t["adam"], t["fluctuation"]
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
                        ", ".join(f"{d:.3g}" for d in v["max |p_G - p_inf|"].values()), v["deviation exponent in G"]]
                       for k, v in inv["trajectories"].items()])
    lines += [f"The damped law fitted to exact trajectories (G=8, {TOY_SIZE.fit} batches):", ""]
    lines += md_table(["optimizer", "fitted zeta", "R^2", "true overshoot of p*"],
                      [[k, v["zeta"], v["R^2"], max(v["overshoot"], 0.0)] for k, v in t["fits"].items()])
    lines += [f"Refresh interval n (SGD updates per rollout batch): lr kappa at the stability threshold (kappa = "
              f"{ref['kappa']:.4g}; gains a = {ref['a (current policy)']:.4g} through the current policy, b = "
              f"{ref['b (stale policy)']:.4g} through the stale one):", ""]
    lines += md_table(["n", "found (exact dynamics)", "stiffness alone 2/n", "linearization with a and b"],
                      [[n, v["observed"], v["stiffness alone"], v["linearized"]]
                       for n, v in ref["lr kappa at the threshold"].items()])
    lines += ["Adam: overshoot of p* against heavy ball's prediction (mu = b1, gain from Adam's second moment at arrival):", ""]
    lines += md_table(["lr", "b1", "gain", "onset (1-sqrt b1)^2", "predicted", "overshoot", "observed"],
                      [[c["lr"], c["b1"], c["gain at arrival"], c["onset"], c["predicted oscillation"],
                        max(c["overshoot"], 0.0), c["overshoot"] > OVERSHOOT] for c in adam["cases"]])
    lines += ["Adam lr 0.02, b1 0.9: overshoot by updates per rollout batch, " + ", ".join(
        f"n={n}: {o:.3g}" for n, o in adam["overshoot by n, Adam lr 0.02 b1 0.9"].items()), ""]
    lines += [f"Stationary Var(p) around p* by G (Monte Carlo, {TOY_GROUPS} groups per update, mean over "
              f"{len(TOY_SEEDS)} seeds) and the exponent in G per seed:", ""]
    gs = [str(g) for g in GROUP_SIZES]
    lines += md_table(["optimizer", *(f"G={g}" for g in gs), "exponent per seed"],
                      [[k, *(float(np.mean([r["variance"][g] for r in runs])) for g in gs),
                        ", ".join(f"{r['exponent']:.2f}" for r in runs)] for k, runs in fl["runs"].items()])
    lines += [f"SGD's first-order theory gives an exponent of {fl['exponent, SGD first-order theory']:.2f}: the noise "
              f"temperature itself (one group's step variance at p = 0.7) falls as G^{fl['exponent, noise temperature at p=0.7']:.2f}, "
              "since at small G the group std also shrinks the step.", ""]
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
    """toy.png: exact trajectories by G, the finite-G drift factor, Adam's overshoot by b1, the refresh threshold
    by n and the stationary fluctuation by G."""
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
    for lr in (0.005, 0.02, 0.05):
        cases = [c for c in t["adam"]["cases"] if c["lr"] == lr]
        line, = ax[1, 0].plot([c["b1"] for c in cases], [max(c["overshoot"], 1e-12) for c in cases], "o-", label=f"lr {lr:g}")
        ax[1, 0].scatter([c["b1"] for c in cases if c["predicted oscillation"]],
                         [max(c["overshoot"], 1e-12) for c in cases if c["predicted oscillation"]],
                         s=90, facecolors="none", edgecolors=line.get_color())
    ax[1, 0].set(yscale="log", title="toy, Adam: overshoot of p* (circled: predicted)", xlabel="b1")
    ax[1, 0].legend(fontsize=7)
    ref = t["refresh"]["lr kappa at the threshold"]
    ns = [int(n) for n in ref]
    for key, style in (("observed", "o"), ("stiffness alone", "--"), ("linearized", "-")):
        ax[1, 1].plot(ns, [v[key] for v in ref.values()], style, label=key)
    ax[1, 1].set(xscale="log", yscale="log", title="toy, SGD: stability threshold by refresh interval",
                 xlabel="n (updates per rollout batch)", ylabel="lr kappa")
    ax[1, 1].legend(fontsize=7)
    for name, runs in t["fluctuation"]["runs"].items():
        var = np.array([list(r["variance"].values()) for r in runs])
        line, = ax[1, 2].plot(GROUP_SIZES, var.mean(0), "o-", label=name, ms=3)
        for v in var:
            ax[1, 2].plot(GROUP_SIZES, v, ".", color=line.get_color(), alpha=0.4)
        ax[1, 2].plot(GROUP_SIZES, var.mean(0)[0] * 2 / np.asarray(GROUP_SIZES), ":", color=line.get_color())
    ax[1, 2].set(xscale="log", yscale="log", title="toy: Var(p) by G (dotted: 1/G)", xlabel="G")
    ax[1, 2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def lm_figure(results: study.Results, path: pathlib.Path) -> None:
    """lm_fits.png: the seed-mean training reward of G=2 and G=16 at one rate, and both laws fitted to it."""
    plt = pyplot()
    color = colors()
    fig, axis = plt.subplots(figsize=(7, 4))
    for arm, g in (("g2", 2), ("g16", 16)):
        if arm not in results:
            continue
        xs, ys = zip(*(r.series("reward/mean") for r in results[arm]))
        n = min(map(len, xs))
        x, y = xs[0][:n], np.mean([v[:n] for v in ys], 0)
        axis.plot(x, y, color=color[g], lw=0.6, alpha=0.6)
        if n >= MIN_POINTS:
            for law, style in (("damped", "-"), ("single_exponential", ":")):
                f = rc.fit(law, x, y)
                axis.plot(x, rc.LAWS[law][0](x - x[0], *f.params.values()), style, color=color[g], lw=2,
                          label=f"G={g} {law} R^2 {f.r2:.2f}")
    axis.set(title="LM: seed-mean training reward and fits (one rate)", xlabel="updates")
    if axis.get_legend_handles_labels()[0]:  # no fit on runs shorter than MIN_POINTS
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(results: study.Results, results_dir: pathlib.Path) -> str:
    """study.Study.report: the figures, and the toy's tables that end table.md."""
    toy_figure(toy(), results_dir / "toy.png")
    lm_figure(results, results_dir / "lm_fits.png")
    return toy_markdown(toy())


def run_toy(results_dir: pathlib.Path) -> dict:
    """The toy alone (--toy): summary.json with its claims, table.md and toy.png."""
    start, load, git = time.perf_counter(), list(os.getloadavg()), study.git_state()
    results_dir.mkdir(parents=True, exist_ok=True)
    summary = study.finite({
        "study": "group_size_dynamics", "part": "the toy alone", "claims": toy_claims(), "git": git,
        "machine": study.machine(), "load_average_1_5_15min": {"start": load, "end": list(os.getloadavg())},
        "wall_seconds": round(time.perf_counter() - start, 1),
    })
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    toy_figure(toy(), results_dir / "toy.png")
    footer = (f"The toy alone. Wall time {summary['wall_seconds']:.0f} s on {os.cpu_count()} cores, load average "
              f"{load[0]:.1f} at the start. Commit {git['commit'][:10]}" + (" (with local changes)." if git["dirty"] else "."))
    (results_dir / "table.md").write_text("\n".join(["# group_size_dynamics: the toy", "", *study.claims_md(summary["claims"]),
                                                     "", footer, ""]) + toy_markdown(toy()) + "\n")
    print((results_dir / "table.md").read_text())
    return summary


def main(argv=None) -> dict:
    """--toy [--results-dir DIR]: the toy alone; otherwise the study, with the harness's flags (study.main)."""
    parser = argparse.ArgumentParser(add_help=False)  # --help: the harness's, with this docstring
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--results-dir", type=pathlib.Path)
    args, rest = parser.parse_known_args(argv)
    if not args.toy:
        return study.main(get_study, claims, rest + ["--results-dir", str(args.results_dir)] * (args.results_dir is not None))
    if rest:
        parser.error(f"{' '.join(rest)}: with --toy only --results-dir applies")
    return run_toy(args.results_dir or study.HERE / "results" / "group_size_dynamics" / "toy")


if __name__ == "__main__":
    main()
