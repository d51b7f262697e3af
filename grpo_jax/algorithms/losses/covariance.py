"""Clip-Cov and KL-Cov: "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617), as verl
implements them (verl/trainer/ppo/core_algos.py: compute_policy_loss_clip_cov / _kl_cov).

The token covariance cov = (A - mean A)(l - mean l) over the counted tokens of the whole step batch
decides which tokens are restricted. The decision is taken once per update by `step_stats` (exact
under micro-batching and sharding, where verl takes it per micro-batch).
"""

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import LossTerms, loss, surrogate
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric


def _covariance(logp, adv, mask):
    n = jnp.maximum(mask.sum(), 1.0)
    return (adv - (adv * mask).sum() / n) * (logp - (logp * mask).sum() / n)


def _count(fraction, mask):
    """max(floor(fraction * counted tokens), 1) (the relative slack absorbs float32 rounding)."""
    return jnp.maximum(jnp.floor(fraction * mask.sum() * (1 + 1e-6)), 1.0)


def _first(key, eligible, n):
    """The n eligible tokens of smallest key (ties: first in the batch's row-major order)."""
    order = jnp.lexsort((key.reshape(-1), ~eligible.reshape(-1)))
    rank = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
    return eligible & (rank.reshape(eligible.shape) < n)


def clip_cov_select(cfg, s):
    """Clip-Cov: a random max(int(r N), 1) of the counted tokens that the PPO clip leaves unclipped and
    whose covariance lies in (clip_cov_lb, clip_cov_ub); `s.priority` (a random permutation) picks them."""
    counted = s.mask > 0
    ratio = clamped_exp(s.logp - s.old_logp)
    adv = s.advantages
    clipped = ((adv < 0) & (ratio < 1 - cfg.eps_low)) | ((adv > 0) & (ratio > 1 + cfg.eps_high))
    cov = _covariance(s.logp, adv, s.mask)
    candidates = counted & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    return {"select": _first(s.priority, candidates, _count(cfg.clip_cov_ratio, s.mask)).astype(jnp.float32)}


def kl_cov_select(cfg, s):
    """KL-Cov: the max(int(k N), 1) counted tokens of largest covariance."""
    chosen = _first(-_covariance(s.logp, s.advantages, s.mask), s.mask > 0, _count(cfg.kl_cov_ratio, s.mask))
    return {"select": chosen.astype(jnp.float32)}


def _selected_frac(x):
    return {"cov_selected_frac": Metric.mean(x.stats["select"], x.mask)}


@loss("clip_cov", unit="token", ratio=True, kernel="ratio_clip", reference=reference.clip_cov,
      fields=("eps_low", "eps_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
      stats=clip_cov_select, stats_reference=reference.clip_cov_select,
      on_policy=lambda cfg, x: x.advantages * (1.0 - x.stats["select"]))
def clip_cov(cfg, x):
    """Clip-Cov: the PPO surrogate with the selected high-covariance tokens' loss and gradient removed."""
    terms = surrogate(cfg, x, x.logp - x.old_logp, x.advantages)
    return LossTerms(terms.u * (1.0 - x.stats["select"]), terms.clipped_low, terms.clipped_high,
                     {**terms.metrics, **_selected_frac(x)})


@loss("kl_cov", unit="token", ratio=True, reference=reference.kl_cov, fields=("kl_cov_ratio", "kl_cov_coef"),
      stats=kl_cov_select, stats_reference=reference.kl_cov_select,
      on_policy=lambda cfg, x: x.advantages - cfg.kl_cov_coef * x.stats["select"])
def kl_cov(cfg, x):
    """KL-Cov: -A r, plus kl_cov_coef |D| on the selected tokens (no clip). At D = 0 the penalty's
    gradient is JAX's subgradient of |D|, +kl_cov_coef (its declared `on_policy`)."""
    d = x.logp - x.old_logp
    u = -x.advantages * clamped_exp(d) + cfg.kl_cov_coef * jnp.abs(d) * x.stats["select"]
    return LossTerms(u, metrics=_selected_frac(x))
