"""The two laws of a mean-reward curve that group_size_dynamics.py fits, by least squares (scipy, a
dependency of jax).

- single exponential (the overdamped limit): y(t) = plateau - (plateau - start) exp(-rate t);
- damped second order from rest (the inertial model of arXiv 2606.30789:
  y'' + 2 zeta omega y' + omega^2 (y - plateau) = 0, y(0) = start, y'(0) = 0):
  y(t) = plateau + (start - plateau) (l+ e^{l- t} - l- e^{l+ t}) / (l+ - l-),
  l+- = omega (-zeta +- sqrt(zeta^2 - 1)): a slow start, then an exponential approach (zeta >= 1) or a
  damped oscillation (zeta < 1). Its slowest decay rate, omega (zeta - sqrt(zeta^2 - 1)) or zeta omega,
  is comparable to the single exponential's rate; as zeta -> infinity at fixed rate it becomes the
  single exponential.

The damped law nests the single exponential, so it never fits worse: which law a curve follows is asked of
the BIC, whose penalty (log n per parameter) the damped law's extra parameter must earn.
"""

import dataclasses

import numpy as np
from scipy import optimize


def single_exponential(t, plateau, start, rate):
    return plateau - (plateau - start) * np.exp(-rate * np.asarray(t, float))


def damped(t, plateau, start, omega, zeta):
    t = np.asarray(t, float)
    if abs(zeta - 1) < 1e-6:  # critical: the two roots meet
        return plateau + (start - plateau) * (1 + omega * t) * np.exp(-omega * t)
    root = omega * np.sqrt(complex(zeta * zeta - 1))
    hi, lo = -zeta * omega + root, -zeta * omega - root
    return plateau + (start - plateau) * ((hi * np.exp(lo * t) - lo * np.exp(hi * t)) / (hi - lo)).real


def damped_rate(omega: float, zeta: float) -> float:
    """The slowest decay rate of the damped law (its envelope when it oscillates)."""
    return omega * (zeta - np.sqrt(zeta * zeta - 1)) if zeta >= 1 else zeta * omega


@dataclasses.dataclass(frozen=True)
class Fit:
    law: str  # "single_exponential" | "damped"
    params: dict
    rate: float  # the slowest decay rate, per unit of t
    r2: float  # 1 - residual / total sum of squares
    bic: float  # n log(rss / n) + k log n: lower is better, k the number of parameters
    residuals: np.ndarray  # fitted minus observed


LAWS = {  # name -> (function, parameter names)
    "single_exponential": (single_exponential, ("plateau", "start", "rate")),
    "damped": (damped, ("plateau", "start", "omega", "zeta")),
}


def fit(law: str, t, y, polish: int = 3) -> Fit:
    """The least-squares fit of `law` to (t, y) (t from its first value): a grid of starts (rates or omega
    from 1/span to 30/span; zeta 0.3, 1 and 3), the `polish` with the lowest residual optimized, the best kept."""
    fn, names = LAWS[law]
    t, y = np.asarray(t, float), np.asarray(y, float)
    span = max(t.max() - t.min(), 1e-12)
    t0 = t - t.min()
    ends = (y[-max(1, len(y) // 10):].mean(), y[: max(1, len(y) // 10)].mean())
    rates = np.geomspace(1 / span, 30 / span, 4)
    starts = ([(*ends, r) for r in rates] if law == "single_exponential"
              else [(*ends, r, z) for r in rates for z in (0.3, 1.0, 3.0)])
    lower = [-np.inf, -np.inf, 1e-6 / span] + ([1e-3] if law == "damped" else [])
    upper = [np.inf, np.inf, 1e3 / span] + ([1e3] if law == "damped" else [])
    with np.errstate(all="ignore"):
        start_cost = [float(np.nan_to_num(((fn(t0, *x0) - y) ** 2).sum(), nan=np.inf)) for x0 in starts]
    best = None
    for x0 in [starts[i] for i in np.argsort(start_cost)[:polish]]:
        try:
            res = optimize.least_squares(lambda p: fn(t0, *p) - y, x0, bounds=(lower, upper), method="trf")
        except ValueError:  # a start outside the bounds or non-finite
            continue
        if best is None or res.cost < best.cost:
            best = res
    params = dict(zip(names, best.x))
    resid = fn(t0, *best.x) - y
    rss, n, k = float(resid @ resid), len(y), len(names)
    tss = float(((y - y.mean()) ** 2).sum())
    rate = params["rate"] if law == "single_exponential" else damped_rate(params["omega"], params["zeta"])
    return Fit(law, params, float(rate), 1 - rss / tss if tss > 0 else float("nan"),
               float(n * np.log(max(rss, 1e-300) / n) + k * np.log(n)), resid)


def power_law(x, y) -> tuple[float, float]:
    """(exponent, its standard error) of y ~ x^exponent, by least squares on the logs."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    slope, intercept = np.polyfit(lx, ly, 1)
    resid = ly - (slope * lx + intercept)
    dof = max(len(lx) - 2, 1)
    se = np.sqrt(resid @ resid / dof / ((lx - lx.mean()) ** 2).sum()) if len(lx) > 2 else float("nan")
    return float(slope), float(se)
