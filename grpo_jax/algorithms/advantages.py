"""Advantage estimators: scalar rewards of a batch of groups -> one advantage per completion.

An estimator is `fn(rewards, groups, lengths, eps) -> advantages` over float32 [N] arrays, registered
with `@advantage("name")`; groups are integer ids (samples sharing an id share a prompt), so the
[num_groups, G] layout and explicit ids go through one code path.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

ADVANTAGES: dict[str, Callable] = {}


def advantage(name: str):
    """Registers an estimator under `name` (the value of `AlgorithmConfig.advantage`)."""

    def register(fn):
        ADVANTAGES[name] = fn
        return fn

    return register


def _group_sum(x, groups):
    """Per-sample sum of x over the sample's group."""
    return jax.ops.segment_sum(x, groups, num_segments=x.shape[0])[groups]


def _group_stats(rewards, groups):
    """Per-sample group size, mean and std (ddof=1) of the sample's group."""
    size = _group_sum(jnp.ones_like(rewards), groups)
    mean = _group_sum(rewards, groups) / size
    var = _group_sum((rewards - mean) ** 2, groups) / (size - 1)
    return size, mean, jnp.sqrt(var)


def _batch_standardize(x, eps):
    return (x - x.mean()) / (jnp.std(x, ddof=1) + eps)


@advantage("group_std")
def group_std(rewards, groups, lengths, eps):
    """GRPO: (R - mean_g) / (std_g + eps)."""
    _, mean, std = _group_stats(rewards, groups)
    return (rewards - mean) / (std + eps)


@advantage("group_mean")
def group_mean(rewards, groups, lengths, eps):
    """Dr. GRPO: R - mean_g (no std division, which up-weights easy and hard prompts)."""
    _, mean, _ = _group_stats(rewards, groups)
    return rewards - mean


@advantage("rloo")
def rloo(rewards, groups, lengths, eps):
    """RLOO: R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g)."""
    size, mean, _ = _group_stats(rewards, groups)
    return size / (size - 1) * (rewards - mean)


@advantage("opo")
def opo(rewards, groups, lengths, eps):
    """OPO: R_i - sum_j L_j R_j / sum_j L_j, the length-weighted (optimal for on-policy) baseline."""
    lengths = lengths.astype(jnp.float32)
    baseline = _group_sum(lengths * rewards, groups) / jnp.maximum(_group_sum(lengths, groups), 1.0)
    return rewards - baseline


@advantage("batch_std")
def batch_std(rewards, groups, lengths, eps):
    """TRL scale_rewards="batch": group-centred, scaled by the std of the whole batch."""
    _, mean, _ = _group_stats(rewards, groups)
    return (rewards - mean) / (jnp.std(rewards, ddof=1) + eps)


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
    rewards: Float[Array, "n"] | Float[Array, "n k"],
    group_size: int | None = None,
    group_ids: Int[Array, " n"] | None = None,
    lengths: Int[Array, " n"] | None = None,
    reward_weights: Sequence[float] | None = None,
) -> Float[Array, " n"]:
    """Advantages for N completions from one reward per completion, or K weighted rewards [N, K].

    Groups: `group_size=G` (consecutive rows form a group) or `group_ids` (any integers in [0, N)).
    `lengths` (counted completion lengths) are needed by the opo estimator only.
    `reward_weights` w_k (one per column, default all 1; the trainer passes RewardConfig.weights)
    combine per `cfg.reward_combine`: sum_then_normalize (R = sum_k w_k R^k, then the
    estimator) or normalize_then_sum (GDPO: the estimator on each R^k, weighted sum, then
    standardized over the batch). `cfg.gpg_scale` multiplies by N / N_valid, N_valid the samples in
    groups whose reward rows are not all equal.
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
    if cfg.advantage == "opo" and lengths is None:
        raise ValueError("compute_advantages: advantage='opo' needs lengths= (counted completion lengths).")
    groups = _group_ids(n, group_size, group_ids)
    estimate = ADVANTAGES[cfg.advantage]
    w = jnp.asarray(weights, jnp.float32)
    if cfg.reward_combine == "sum_then_normalize":
        adv = estimate((rewards * w).sum(1), groups, lengths, cfg.adv_eps)
    else:
        per_reward = jax.vmap(estimate, in_axes=(1, None, None, None), out_axes=1)(
            rewards, groups, lengths, cfg.adv_eps
        )
        adv = _batch_standardize((per_reward * w).sum(1), cfg.adv_eps)
    if cfg.gpg_scale:
        spread = jax.ops.segment_max(rewards, groups, n) - jax.ops.segment_min(rewards, groups, n)
        valid = (spread[groups] > 0).any(axis=1)
        adv = adv * n / jnp.maximum(valid.sum(), 1)
    return adv.astype(jnp.float32)


def overlong_penalty(
    cfg: "AlgorithmConfig", lengths: Int[Array, " n"], max_len: int
) -> Float[Array, " n"]:
    """DAPO overlong shaping, a reward term: 0 up to L_max - B, then linear down to -kappa at L_max
    (B = overlong_buffer_frac * L_max, at least one token); -kappa past L_max."""
    buffer = max(int(cfg.overlong_buffer_frac * max_len), 1)
    soft = max_len - buffer
    lengths = jnp.asarray(lengths, jnp.float32)
    ramp = (soft - lengths) / buffer * cfg.overlong_kappa
    return jnp.where(lengths <= soft, 0.0, jnp.where(lengths <= max_len, ramp, -cfg.overlong_kappa))
