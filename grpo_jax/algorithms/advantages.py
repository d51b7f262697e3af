"""Advantage estimators: scalar rewards of a batch of groups -> one advantage per completion.

An estimator is `fn(rewards, groups, lengths, eps) -> advantages` over float32 [N] arrays, registered
with `@advantage(name, reference=...)` (its float64 twin in `algorithms.reference`); groups are
integer ids (samples sharing an id share a prompt), so the [num_groups, G] layout and explicit ids go
through one code path. `compute_advantages` gives every estimator exactly 0 on a group whose rewards
are all equal (no float residue of R - mean divided by std + eps) and 0 where a batch-level spread
is 0, so a new estimator inherits that without writing it.
"""

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int, Real

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.registry import Registry

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig


@dataclasses.dataclass(frozen=True)
class Advantage:
    fn: Callable  # (rewards f32[N], groups int[N], lengths [N] or None, eps) -> f32[N]
    reference: Callable
    needs_lengths: bool  # counted completion lengths must be passed


ADVANTAGES: Registry[Advantage] = Registry("advantage")


def advantage(name: str, *, reference: Callable, needs_lengths: bool = False):
    """Registers an estimator under `name` (the value of `AlgorithmConfig.advantage`)."""

    def register(fn):
        ADVANTAGES.add(name, Advantage(fn, reference, needs_lengths))
        return fn

    return register


def _group_sum(x, groups):
    """Per-sample sum of x over the sample's group."""
    return jax.ops.segment_sum(x, groups, num_segments=x.shape[0])[groups]


def _group_spread(x, groups):
    """Per-sample max - min of x over the sample's group."""
    n = x.shape[0]
    return (jax.ops.segment_max(x, groups, n) - jax.ops.segment_min(x, groups, n))[groups]


def _group_stats(rewards, groups):
    """Per-sample group size, mean and std (ddof=1) of the sample's group."""
    size = _group_sum(jnp.ones_like(rewards), groups)
    mean = _group_sum(rewards, groups) / size
    var = _group_sum((rewards - mean) ** 2, groups) / (size - 1)
    return size, mean, jnp.sqrt(var)


def _batch_standardize(x, eps):
    """(x - mean) / (std + eps) over the batch; exactly 0 where the batch has no spread."""
    return jnp.where(jnp.ptp(x) > 0, (x - x.mean()) / (jnp.std(x, ddof=1) + eps), 0.0)


@advantage("group_std", reference=reference.group_std)
def group_std(rewards, groups, lengths, eps):
    """GRPO: (R - mean_g) / (std_g + eps)."""
    _, mean, std = _group_stats(rewards, groups)
    return (rewards - mean) / (std + eps)


@advantage("group_mean", reference=reference.group_mean)
def group_mean(rewards, groups, lengths, eps):
    """Dr. GRPO: R - mean_g (no std division, which up-weights easy and hard prompts)."""
    _, mean, _ = _group_stats(rewards, groups)
    return rewards - mean


@advantage("rloo", reference=reference.rloo)
def rloo(rewards, groups, lengths, eps):
    """RLOO: R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g)."""
    size, mean, _ = _group_stats(rewards, groups)
    return size / (size - 1) * (rewards - mean)


@advantage("opo", reference=reference.opo, needs_lengths=True)
def opo(rewards, groups, lengths, eps):
    """OPO: R_i - sum_j L_j R_j / sum_j L_j, the length-weighted (optimal for on-policy) baseline."""
    lengths = lengths.astype(jnp.float32)
    baseline = _group_sum(lengths * rewards, groups) / jnp.maximum(_group_sum(lengths, groups), 1.0)
    return rewards - baseline


@advantage("batch_std", reference=reference.batch_std)
def batch_std(rewards, groups, lengths, eps):
    """TRL scale_rewards="batch": group-centred, scaled by the std of the whole batch."""
    _, mean, _ = _group_stats(rewards, groups)
    return (rewards - mean) / (jnp.std(rewards, ddof=1) + eps)


@advantage("beta_norm", reference=reference.beta_norm)
def beta_norm(rewards, groups, lengths, eps):
    """BNPO (arXiv 2506.02864, the authors' verl recipe): A = (R - p) / f(p; alpha, beta).

    Rewards are mapped to [0, 1] by the batch's range (for 0/1 rewards: unchanged), p is the group's
    mean, f the Beta density whose parameters come from a moment fit Beta(a, b) to the groups' p:
    alpha = max(1 + a/3, 1), beta = max(1 + b/3, 1) (uniform, i.e. A = R - p, with one group or no
    spread of p); 1/f is capped at 1e6. Not TRL's loss_type="bnpo" (the `bnpo` preset: token-mean
    aggregation of group_std advantages).
    """
    lo, hi = rewards.min(), rewards.max()
    s = jnp.where(hi > lo, (rewards - lo) / jnp.where(hi > lo, hi - lo, 1.0), 0.0)
    n = s.shape[0]
    count = jax.ops.segment_sum(jnp.ones_like(s), groups, n)
    is_group = count > 0
    p_of = jax.ops.segment_sum(s, groups, n) / jnp.maximum(count, 1.0)  # per group id
    num = is_group.sum()
    m = jnp.where(is_group, p_of, 0.0).sum() / num
    v = jnp.where(is_group, (p_of - m) ** 2, 0.0).sum() / jnp.maximum(num - 1, 1)
    fit = (num > 1) & (v > 0)
    common = m * (1 - m) / jnp.where(fit, v, 1.0) - 1
    alpha = jnp.where(fit, jnp.maximum(1 + common * m / 3, 1.0), 1.0)
    beta = jnp.where(fit, jnp.maximum(1 + common * (1 - m) / 3, 1.0), 1.0)
    p = p_of[groups]
    inside = (p > 0) & (p < 1)  # p = 0 or 1: the whole group equals p, A = 0
    log_pdf = jax.scipy.stats.beta.logpdf(jnp.where(inside, p, 0.5), alpha, beta)
    return jnp.where(inside, jnp.minimum(jnp.exp(-log_pdf), 1e6) * (s - p), 0.0)


def _group_ids(n: int, group_size: int | None, group_ids) -> Int[Array, " n"]:
    """Validates the grouping (before any compile) and returns integer ids in [0, n)."""
    if (group_size is None) == (group_ids is None):
        raise ValueError("compute_advantages: pass exactly one of group_size= or group_ids=.")
    if group_size is not None:
        if group_size < 2:
            raise ValueError(
                f"compute_advantages: group_size={group_size}, but every estimator compares a "
                "completion with the others of its group; sample at least 2 per prompt "
                "(SamplingConfig.group_size >= 2)."
            )
        if n % group_size:
            raise ValueError(f"compute_advantages: {n} rewards do not split into groups of {group_size}.")
        return jnp.arange(n) // group_size
    if group_ids.shape != (n,):
        raise ValueError(f"compute_advantages: group_ids has shape {group_ids.shape}, rewards have {n} rows.")
    if not isinstance(group_ids, jax.core.Tracer):  # concrete ids: check here; traced: caller's job
        ids = np.asarray(group_ids)
        if ids.min() < 0 or ids.max() >= n:
            raise ValueError(f"compute_advantages: group_ids must lie in [0, {n}).")
        counts = np.bincount(ids)
        if (counts == 1).any():
            raise ValueError(
                f"compute_advantages: group(s) {np.flatnonzero(counts == 1).tolist()} hold a single "
                "completion; every estimator needs at least 2 per group."
            )
    return jnp.asarray(group_ids, jnp.int32)


def compute_advantages(
    cfg: "AlgorithmConfig",
    rewards: Float[ArrayLike, "n"] | Float[ArrayLike, "n k"],
    group_size: int | None = None,
    group_ids: Int[ArrayLike, " n"] | None = None,
    lengths: Real[ArrayLike, " n"] | None = None,  # counted completion lengths
    reward_weights: Sequence[float] | Float[ArrayLike, " k"] | None = None,
) -> Float[Array, " n"]:
    """Advantages for N completions from one reward per completion, or K weighted rewards [N, K].

    Groups: `group_size=G` (consecutive rows form a group) or `group_ids` (any integers in [0, N)).
    `lengths` (counted completion lengths) are needed by estimators registered with needs_lengths (opo).
    `reward_weights` w_k (one per column, default all 1; the trainer passes RewardConfig.weights)
    combine per `cfg.reward_combine`: sum_then_normalize (R = sum_k w_k R^k, then the
    estimator) or normalize_then_sum (GDPO: the estimator on each R^k, weighted sum, then
    standardized over the batch). `cfg.gpg_scale` multiplies by N / N_valid, N_valid the samples in
    groups whose combined signal (the weighted reward sum; with normalize_then_sum the weighted sum
    of per-reward advantages) is not all equal.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    rewards = rewards[:, None] if rewards.ndim == 1 else rewards
    n, k = rewards.shape
    weights = (1.0,) * k if reward_weights is None else tuple(reward_weights)
    if len(weights) != k:
        raise ValueError(
            f"compute_advantages: {k} reward column(s) but {len(weights)} reward_weights; give one "
            "weight per reward function."
        )
    spec = ADVANTAGES[cfg.advantage]
    if spec.needs_lengths and lengths is None:
        raise ValueError(f"compute_advantages: advantage={cfg.advantage!r} needs lengths= (counted completion lengths).")
    groups = _group_ids(n, group_size, group_ids)

    def estimate(r):  # exactly 0 on groups without spread
        return jnp.where(_group_spread(r, groups) > 0, spec.fn(r, groups, lengths, cfg.adv_eps), 0.0)

    w = jnp.asarray(weights, jnp.float32)
    if cfg.reward_combine == "sum_then_normalize":
        combined = (rewards * w).sum(1)
        adv = estimate(combined)
    else:
        combined = (jax.vmap(estimate, in_axes=1, out_axes=1)(rewards) * w).sum(1)
        valid = _group_spread(combined, groups) > 0
        adv = jnp.where(valid, _batch_standardize(jnp.where(valid, combined, 0.0), cfg.adv_eps), 0.0)
    if cfg.gpg_scale:
        valid = _group_spread(combined, groups) > 0
        adv = adv * n / jnp.maximum(valid.sum(), 1)
    return adv.astype(jnp.float32)


def overlong_penalty(
    cfg: "AlgorithmConfig", lengths: Real[ArrayLike, " n"], max_len: int
) -> Float[Array, " n"]:
    """DAPO overlong shaping, a reward term: 0 up to L_max - B, then linear down to -kappa at L_max
    (B = overlong_buffer_frac * L_max, at least one token); -kappa past L_max."""
    buffer = max(int(cfg.overlong_buffer_frac * max_len), 1)
    soft = max_len - buffer
    lengths = jnp.asarray(lengths, jnp.float32)
    ramp = (soft - lengths) / buffer * cfg.overlong_kappa
    return jnp.where(lengths <= soft, 0.0, jnp.where(lengths <= max_len, ramp, -cfg.overlong_kappa))
