"""The pre-registered protocol every study is judged by: claims declared before any run, one test.

A study declares its claims in `get_study`, before a run exists; each is written into summary.json with
its rule, and `judge` applies the same rule everywhere, to the stored curves alone (so `--rejudge`
recomputes every verdict from the committed data):

- A `Claim` has one or two halves. Every half holds: "reproduced"; one of two: "partial"; none:
  "not_reproduced"; an arm it needs was not run: "not_run".
- A half is a per-seed quantity q_s with a target t, claimed above it: `Difference` (metric of arm a
  minus arm b, t = at_least: 0 for "a above b", -margin for "a no worse than b by more than margin"),
  `Ratio` (log10 of a's metric over b's, t = log10(at_least)), `Contrast` (a weighted sum of several
  arms' metrics whose weights sum to 0, e.g. a difference of differences), `Level` (one arm's metric
  against a threshold, either side).
- It holds if the one-sided exact sign test of q_s > t (q_s < t for a `Level` claimed below) gives
  p <= ALPHA over the evaluation seeds (ties dropped; 8 seeds need 7 on the claimed side), and the mean's
  distance past t clears the noise floor. summary.json keeps q_s, its mean and interval as measured.
- The noise floor of a comparative half (`Difference`, `Ratio`, `Contrast`) is the same quantity between the study's
  null-control pair, two arms with one objective (GSPO and GSPO-token at sequence-level advantages,
  the second drawing its own rollouts: study.Study.null_pair): the larger end, in absolute value, of
  its paired-bootstrap 95% interval of the mean. A difference that sampling noise alone produces at
  this seed count is never "reproduced". A `Contrast`'s floor is that of the null pair's difference
  times sqrt(sum w^2 / 2), the spread of its weighted sum if each run's noise were the pair's (runs of a
  seed share a warm start and sampling keys; the pair's second draws its own rollouts, so this errs
  large). A `Level` has no floor.
- Collapse (`collapse`): held-out greedy accuracy at the end of a run (its last 20%) below the warm
  start's by more than two binomial standard errors, or the training reward (a moving average over 10%
  of the steps) falling below half its peak after reaching it.

What a rule cannot fail on is the study's to avoid: a quantity fixed by the design (tokens sampled,
when one arm samples fewer), or a model nested in another (which never fits worse), is not a half.
"""

import dataclasses
import math
from collections.abc import Callable

import numpy as np

ALPHA = 0.05
MIN_SEEDS = 8  # evaluation seeds of a comparative claim in a full study
MIN_RATES = 3  # learning rates swept per arm in a full study
BOOTSTRAP = 10_000  # paired-bootstrap resamples (a fixed generator: the interval is reproducible)
VERDICTS = ("reproduced", "partial", "not_reproduced", "not_run")


def sign_test(q, target: float = 0.0) -> float:
    """One-sided exact sign test of "q > target": P(at least k of n above | p = 1/2), ties dropped."""
    q = np.asarray(q, float) - target
    n, k = int((q != 0).sum()), int((q > 0).sum())
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


def bootstrap_interval(q, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of q over BOOTSTRAP resamples of its seeds (seeded: reproducible)."""
    q = np.asarray(q, float)
    if not np.isfinite(q).all():  # a run without the quantity (nan): no interval
        return float("nan"), float("nan")
    means = q[np.random.default_rng(0).integers(0, q.size, (BOOTSTRAP, q.size))].mean(1)
    return tuple(float(v) for v in np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))


Metric = Callable[["study.Run"], float]  # noqa: F821  (a number per run: experiments/study.py's Run)


@dataclasses.dataclass(frozen=True)
class Difference:
    """metric(a) - metric(b) per seed, claimed > at_least (0: a beats b; negative: a is no worse than b
    by more than -at_least)."""

    label: str
    metric: Metric
    a: str
    b: str
    at_least: float = 0.0
    comparative = True
    side = 1  # claimed above the target

    @property
    def arms(self) -> tuple[str, ...]:
        return self.a, self.b

    @property
    def target(self) -> float:
        return self.at_least

    def values(self, results) -> np.ndarray:
        return results.values(self.a, self.metric) - results.values(self.b, self.metric)

    def between(self, a: str, b: str) -> "Difference":
        return dataclasses.replace(self, a=a, b=b)

    def describe(self) -> str:
        return f"{self.label}: {self.a} minus {self.b} above {self.at_least:g}"


@dataclasses.dataclass(frozen=True)
class Ratio(Difference):
    """log10(metric(a) / metric(b)) per seed, claimed > log10(at_least)."""

    at_least: float = 1.0  # the ratio

    @property
    def target(self) -> float:
        return math.log10(self.at_least)

    def values(self, results) -> np.ndarray:
        a, b = (np.maximum(results.values(arm, self.metric), 1e-12) for arm in (self.a, self.b))
        return np.log10(a / b)

    def describe(self) -> str:
        return f"{self.label}: log10({self.a} / {self.b}) above log10({self.at_least:g})"


@dataclasses.dataclass(frozen=True)
class Level:
    """metric(arm) per seed, claimed above `threshold` (or below it, `above=False`)."""

    label: str
    metric: Metric
    arm: str
    threshold: float
    above: bool = True
    comparative = False

    @property
    def arms(self) -> tuple[str, ...]:
        return (self.arm,)

    @property
    def target(self) -> float:
        return self.threshold

    @property
    def side(self) -> int:
        return 1 if self.above else -1

    def values(self, results) -> np.ndarray:
        return results.values(self.arm, self.metric)

    def describe(self) -> str:
        return f"{self.label}: {self.arm} {'above' if self.above else 'below'} {self.threshold:g}"


@dataclasses.dataclass(frozen=True)
class Contrast:
    """sum_arm w * metric(arm) per seed, claimed > at_least; the weights sum to 0, so a shift common to
    every arm cancels (("a0", 1), ("a8", -1), ("b0", -1), ("b8", 1)): a's loss from 0 to 8 minus b's)."""

    label: str
    metric: Metric
    weights: tuple[tuple[str, float], ...]
    at_least: float = 0.0
    comparative = True
    side = 1

    def __post_init__(self):
        if abs(sum(w for _, w in self.weights)) > 1e-9 or len({a for a, _ in self.weights}) != len(self.weights):
            raise ValueError(f"Contrast {self.label!r}: weights {self.weights} must name each arm once and sum to 0")

    @property
    def arms(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.weights)

    @property
    def target(self) -> float:
        return self.at_least

    def values(self, results) -> np.ndarray:
        return sum(w * results.values(a, self.metric) for a, w in self.weights)

    def between(self, a: str, b: str) -> "Contrast":
        """The null pair's difference scaled to this contrast's noise: x sqrt(sum w^2 / 2)."""
        s = math.sqrt(sum(w * w for _, w in self.weights) / 2)
        return dataclasses.replace(self, weights=((a, s), (b, -s)))

    def describe(self) -> str:
        terms = " ".join(f"{'-' if w < 0 else '+'} {abs(w):g} {a}" for a, w in self.weights).lstrip("+ ")
        return f"{self.label}: {terms} above {self.at_least:g}"


Half = Difference | Ratio | Contrast | Level


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of a paper and the halves that test it (one or two)."""

    claim: str
    source: str
    paper: str  # what the paper reports
    halves: tuple[Half, ...]

    def __post_init__(self):
        if not 1 <= len(self.halves) <= 2:
            raise ValueError(f"Claim {self.claim!r}: give one or two halves, not {len(self.halves)}")

    def rule(self) -> str:
        both = " and ".join(h.describe() for h in self.halves)
        return (f"{both}, each by a one-sided sign test over the evaluation seeds (p <= {ALPHA}) with its mean "
                "beyond the null pair's noise floor (comparative halves): all hold, reproduced"
                + ("; one, partial" if len(self.halves) == 2 else "") + "; none, not_reproduced")


def judge_half(half: Half, results, null_pair: tuple[str, str] | None) -> dict:
    """The half's per-seed inputs, test, interval, floor and whether it holds. The inputs, mean and
    interval are the measured quantity's; the test and the floor look from its claimed side."""
    q, side = half.values(results), half.side
    lo, hi = bootstrap_interval(q)
    floor = None
    if half.comparative and null_pair and set(null_pair) <= set(results):
        floor = max(map(abs, bootstrap_interval(half.between(*null_pair).values(results))))
    p, excess = sign_test(side * q, side * half.target), float(side * (q.mean() - half.target))
    # A comparison without its null pair has no floor, and cannot hold.
    clears = (floor is not None and excess > floor) if half.comparative else excess > 0
    return {"half": half.describe(), "per_seed": [float(v) for v in q], "mean": float(q.mean()),
            "interval_95": [lo, hi], "sign_test_p": p, f"seeds_{'above' if side > 0 else 'below'}":
            int((side * q > side * half.target).sum()), "noise_floor": floor, "holds": bool(p <= ALPHA and clears)}


def judge(claim: Claim, results, null_pair: tuple[str, str] | None) -> dict:
    """summary.json's entry of `claim`: its rule, each half's inputs and the verdict."""
    needed = {arm for h in claim.halves for arm in h.arms}
    if not needed <= set(results):
        halves, verdict = [], "not_run"
    else:
        halves = [judge_half(h, results, null_pair) for h in claim.halves]
        held = sum(h["holds"] for h in halves)
        verdict = "reproduced" if held == len(halves) else "partial" if held else "not_reproduced"
    side = lambda h: "below" if "seeds_below" in h else "above"  # noqa: E731  (the side the half claims)
    measured = "; ".join(
        f"{h['half']}: mean {h['mean']:.4g} (95% interval {h['interval_95'][0]:.3g} to {h['interval_95'][1]:.3g}), "
        f"{h[f'seeds_{side(h)}']} of {len(h['per_seed'])} seeds {side(h)}, p = {h['sign_test_p']:.3g}"
        + (f", noise floor {h['noise_floor']:.3g}" if h["noise_floor"] is not None else "")
        + (" -> holds" if h["holds"] else " -> fails") for h in halves) or "its arms were not run"
    return {"claim": claim.claim, "source": claim.source, "paper": claim.paper, "rule": claim.rule(),
            "measured": measured, "verdict": verdict, "halves": halves}



def judging(claims: tuple[Claim, ...], null_pair: tuple[str, str] | None):
    """A study's `claims(results)`: each of `claims` judged under the null pair, in order."""
    return lambda results: [judge(c, results, null_pair) for c in claims]

def smoothed(values: np.ndarray, frac: float = 0.1) -> np.ndarray:
    w = max(1, int(round(frac * len(values))))
    return np.convolve(values, np.ones(w) / w, mode="valid") if len(values) > w else values


def collapse(run) -> dict:
    """Whether `run` collapsed (the module's rule), with the numbers the rule read."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    warm, n = (float(acc[0]), run.config.train.eval_prompts) if acc.size else (float("nan"), 1)
    final = run.mean("eval/accuracy_greedy", 0.8)
    margin = 2 * math.sqrt(max(warm * (1 - warm), 1e-12) / n)
    reward = smoothed(run.series("reward/mean", "step")[1])
    peak = int(np.argmax(reward)) if reward.size else 0
    below_half = bool(reward.size and reward[peak] > 0 and (reward[peak:] < reward[peak] / 2).any())
    below_warm = bool(acc.size and steps[0] == 0 and final < warm - margin)
    return {"collapsed": below_warm or below_half, "held_out_below_warm_start": below_warm,
            "reward_below_half_peak": below_half, "warm_start_accuracy": warm, "final_accuracy": final,
            "reward_peak": float(reward[peak]) if reward.size else None}


def collapsed(run) -> float:
    """1 if `run` collapsed, else 0: a metric for a `Level` half."""
    return float(collapse(run)["collapsed"])
