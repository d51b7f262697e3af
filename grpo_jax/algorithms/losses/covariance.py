"""Clip-Cov and KL-Cov: "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617), as verl
implements them (verl/trainer/ppo/core_algos.py: compute_policy_loss_clip_cov / _kl_cov).

The token covariance cov = (A - mean A)(l - mean l) over the counted tokens of the whole step batch
decides which tokens are restricted. The decision is taken once per update by `step_stats` (exact
under micro-batching and sharding, where verl takes it per micro-batch).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import CLIP_TEST, Clip, LossParams, LossTerms, loss, surrogate
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric


def _covariance(logp, adv, mask):
    n = jnp.maximum(mask.sum(), 1.0)
    return (adv - (adv * mask).sum() / n) * (logp - (logp * mask).sum() / n)


def _count(fraction: float, mask):
    """max(floor(fraction * N), 1) for N counted tokens, a product within a relative 1e-9 of a whole
    number being that number (0.29 * 100 is 29, where float64's int(0.29 * 100) is 28).

    float32 rounds both the fraction and f * N, which can carry the product across a whole number.
    So the product is kept as p + e: p = fl(f * N), e its exact rounding error (Dekker's two-product:
    f and N each split into 12-bit halves, every partial product exact) plus the fraction's float32
    residue times N."""
    f = np.float32(fraction)
    rest = np.float32(fraction - float(f))  # the fraction's residue beyond float32
    f_high = np.float32(np.float32(4097.0) * f - (np.float32(4097.0) * f - f))  # Veltkamp split of f
    f_low = np.float32(f - f_high)
    n = mask.sum()
    n_high = jnp.floor(n / 4096) * 4096
    n_low = n - n_high
    p = f * n
    e = (((f_high * n_high - p) + f_high * n_low + f_low * n_high) + f_low * n_low) + rest * n
    whole = jnp.round(p)
    k = jnp.floor(p)
    k = k + ((p - (k + 1)) + e >= 0) - ((p - k) + e < 0)
    k = jnp.where(jnp.abs((p - whole) + e) <= 1e-9 * jnp.maximum(whole, 1.0), whole, k)
    return jnp.maximum(k, 1.0)


def _first(key, eligible, n):
    """The n eligible tokens of smallest key (ties: first in the batch's row-major order)."""
    order = jnp.lexsort((key.reshape(-1), ~eligible.reshape(-1)))
    rank = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
    return eligible & (rank.reshape(eligible.shape) < n)


@dataclasses.dataclass(frozen=True)
class ClipCov(Clip):
    """The PPO clip, and the fraction `ratio` of counted tokens whose gradient it removes, drawn from
    those whose covariance lies in (lb, ub) (verl's defaults)."""

    ratio: float = 2e-4
    lb: float = 1.0
    ub: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        self.check({"ratio": (0 < self.ratio <= 1, "is a fraction of the counted tokens, in (0, 1]"),
                    "lb": (self.lb < self.ub, f"must be < ub={self.ub}")})


@dataclasses.dataclass(frozen=True)
class KlCov(LossParams):
    """The fraction `ratio` of counted tokens it penalizes and the coefficient `coef` of their |D|
    (verl's PolicyLossConfig defaults, 2e-4 and 0.1; the paper's example scripts set coef 1)."""

    ratio: float = 2e-4
    coef: float = 0.1

    def __post_init__(self):
        self.check({"ratio": (0 < self.ratio <= 1, "is a fraction of the counted tokens, in (0, 1]"),
                    "coef": (self.coef >= 0, "must be >= 0")})


def clip_cov_select(p, s):
    """Clip-Cov: a random max(int(r N), 1) of the counted tokens that the PPO clip leaves unclipped and
    whose covariance lies in (lb, ub); `s.priority` (a random permutation) picks them."""
    counted = s.mask > 0
    ratio = clamped_exp(s.logp - s.old_logp)
    adv = s.advantages
    clipped = ((adv < 0) & (ratio < 1 - p.eps_low)) | ((adv > 0) & (ratio > 1 + p.eps_high))
    cov = _covariance(s.logp, adv, s.mask)
    candidates = counted & ~clipped & (cov > p.lb) & (cov < p.ub)
    return {"select": _first(s.priority, candidates, _count(p.ratio, s.mask)).astype(jnp.float32)}


def kl_cov_select(p, s):
    """KL-Cov: the max(int(k N), 1) counted tokens of largest covariance."""
    chosen = _first(-_covariance(s.logp, s.advantages, s.mask), s.mask > 0, _count(p.ratio, s.mask))
    return {"select": chosen.astype(jnp.float32)}


def _selected_frac(x):
    return {"cov_selected_frac": Metric.mean(x.stats["select"], x.mask)}


@loss("clip_cov", params=ClipCov, unit="token", ratio=True, kernel="ratio_clip", reference=reference.clip_cov,
      test_params=dict(CLIP_TEST, ratio=0.25, lb=0.0, ub=1.0),
      stats=clip_cov_select, stats_reference=reference.clip_cov_select,
      on_policy=lambda p, x: x.advantages * (1.0 - x.stats["select"]))
def clip_cov(p, x):
    """Clip-Cov: the PPO surrogate with the selected high-covariance tokens' loss and gradient removed."""
    terms = surrogate(p, x, x.logp - x.old_logp, x.advantages)
    return LossTerms(terms.u * (1.0 - x.stats["select"]), terms.clipped_low, terms.clipped_high,
                     {**terms.metrics, **_selected_frac(x)})


@loss("kl_cov", params=KlCov, unit="token", ratio=True, reference=reference.kl_cov, test_params=dict(ratio=0.25),
      stats=kl_cov_select, stats_reference=reference.kl_cov_select,
      on_policy=lambda p, x: x.advantages - p.coef * x.stats["select"])
def kl_cov(p, x):
    """KL-Cov: -A r, plus coef |D| on the selected tokens (no clip). At D = 0 the penalty's
    gradient is JAX's subgradient of |D|, +coef (its declared `on_policy`)."""
    d = x.logp - x.old_logp
    u = -x.advantages * clamped_exp(d) + p.coef * jnp.abs(d) * x.stats["select"]
    return LossTerms(u, metrics=_selected_frac(x))
