"""Advantage estimators: scalar rewards of a batch of groups -> one advantage per completion.

The registry and per-group reductions are in `base`; the estimators by family in `classic`
(baseline and scale), `robust` (NGRPO, GAPO, S-GRPO) and `shaped` (BNPO, pass@k). An estimator is
`fn(p, rewards, groups, lengths) -> advantages` over float32 [N] arrays, registered with
`@advantage(name, params=P, reference=...)` (P its parameter dataclass, p the instance
`AlgorithmConfig.advantage` holds; its float64 twin in `algorithms.reference`); groups are
integer ids (samples sharing an id share a prompt), so the [num_groups, G] layout and explicit ids go
through one code path. `compute_advantages` gives every estimator exactly 0 on a group whose rewards
are all equal (no float residue of R - mean divided by std + eps) and 0 where a batch-level spread
is 0, so a new estimator inherits that without writing it (unless it registers
`learns_from_uniform_groups`, as NGRPO does by design).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Real

from grpo_jax.algorithms.advantages.base import (
    ADVANTAGES, Advantage, AdvantageParams, Standardized, advantage, batch_standardize, group_spread,
)
from grpo_jax.algorithms.advantages.classic import BatchStd, GroupStd, ReinforcePp, Spo
from grpo_jax.algorithms.advantages.robust import Gapo, NoiseAware, Ngrpo
from grpo_jax.algorithms.advantages.shaped import PassAtK, unlikeliness_scale

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

__all__ = [
    "ADVANTAGES", "Advantage", "AdvantageParams", "BatchStd", "Gapo", "GroupStd", "NoiseAware", "Ngrpo", "PassAtK",
    "ReinforcePp", "Spo", "Standardized", "advantage", "compute_advantages", "distinct_per_group", "min_group_size", "overlong_penalty",
    "turn_advantages",
]
BATCH_STD_EPS = 1e-6  # normalize_then_sum's batch standardization: std + this


def _group_ids(n: int, group_size: int | None, group_ids, need: int, why: str) -> Int[Array, " n"]:
    """Validates the grouping (before any compile) and returns integer ids in [0, n). Every group
    must hold at least `need` completions (2, or what the estimator declares: `why` says so)."""
    if (group_size is None) == (group_ids is None):
        raise ValueError("compute_advantages: pass exactly one of group_size= or group_ids=.")
    if group_size is not None:
        if group_size < need:
            raise ValueError(
                f"compute_advantages: group_size={group_size}, but {why} needs at least {need} completions "
                "per prompt; sample more (SamplingConfig.group_size)."
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
        small = np.flatnonzero((counts > 0) & (counts < need))
        if small.size:
            raise ValueError(
                f"compute_advantages: group(s) {small.tolist()} hold fewer than {need} completions; {why} "
                f"needs at least {need} per group."
            )
    return jnp.asarray(group_ids, jnp.int32)


def compute_advantages(
    cfg: "AlgorithmConfig",
    rewards: Float[ArrayLike, "n"] | Float[ArrayLike, "n k"],
    group_size: int | None = None,
    group_ids: Int[ArrayLike, " n"] | None = None,
    lengths: Real[ArrayLike, " n"] | None = None,  # counted completion lengths
    reward_weights: Sequence[float] | Float[ArrayLike, " k"] | None = None,
    sampler_logprobs: Float[ArrayLike, " n"] | None = None,  # each completion's mean token l^samp
) -> Float[Array, " n"]:
    """Advantages for N completions from one reward per completion, or K weighted rewards [N, K].

    Groups: `group_size=G` (consecutive rows form a group) or `group_ids` (any integers in [0, N)).
    `lengths` (counted completion lengths) are needed by estimators registered with needs_lengths.
    `reward_weights` w_k (one per column, default all 1; the trainer passes RewardConfig.weights)
    combine per `cfg.reward_combine`: sum_then_normalize (R = sum_k w_k R^k, then the estimator),
    normalize_each (MO-GRPO: the estimator on each R^k, then their weighted sum) or
    normalize_then_sum (GDPO: the same sum, then standardized over the batch). `cfg.gpg_scale`
    multiplies by N / N_valid, N_valid the samples in groups whose combined signal (the weighted
    reward sum, or the weighted sum of per-reward advantages) is not all equal. `cfg.unlikeliness` > 0
    first scales every reward by its completion's likelihood rank in its group (`unlikeliness_scale`,
    from `sampler_logprobs`, which it then needs).
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
    params = cfg.advantage
    spec = params.spec
    if spec.needs_lengths and lengths is None:
        raise ValueError(f"compute_advantages: advantage={params.name!r} needs lengths= (counted completion lengths).")
    need, why = min_group_size(params), "every estimator (it compares a completion with the others of its group)"
    if need != 2:
        why = f"algorithm.advantage={params!r}"
    groups = _group_ids(n, group_size, group_ids, need, why)
    if cfg.unlikeliness:
        if sampler_logprobs is None:
            raise ValueError(f"compute_advantages: algorithm.unlikeliness={cfg.unlikeliness} ranks completions by "
                             "likelihood; pass sampler_logprobs= (each completion's mean token log-prob).")
        rewards = rewards * unlikeliness_scale(cfg.unlikeliness, jnp.asarray(sampler_logprobs, jnp.float32), groups)[:, None]

    def informative(signal):  # groups whose signal varies (all of them for estimators that learn from the others)
        return group_spread(signal, groups) > 0 if not spec.learns_from_uniform_groups else jnp.ones(n, bool)

    def estimate(r):  # exactly 0 on groups without spread
        return jnp.where(informative(r), spec.fn(params, r, groups, lengths), 0.0)

    w = jnp.asarray(weights, jnp.float32)
    if cfg.reward_combine == "sum_then_normalize":
        combined = (rewards * w).sum(1)
        adv = estimate(combined)
    else:
        combined = (jax.vmap(estimate, in_axes=1, out_axes=1)(rewards) * w).sum(1)
        valid = informative(combined)
        adv = jnp.where(valid, combined, 0.0)
        if cfg.reward_combine == "normalize_then_sum":
            adv = jnp.where(valid, batch_standardize(adv, BATCH_STD_EPS), 0.0)
    if cfg.gpg_scale:
        valid = group_spread(combined, groups) > 0
        adv = adv * n / jnp.maximum(valid.sum(), 1)
    return adv.astype(jnp.float32)


def distinct_per_group(
    rewards: Float[np.ndarray, "n k"], advantages: Float[np.ndarray, " n"], group_size: int, rtol: float = 1e-5,
) -> tuple[float, float]:
    """(distinct reward combinations, distinct advantage values), each averaged over the groups of
    `group_size` consecutive rows: how far a reward combination collapses distinct outcomes (GDPO,
    arXiv 2601.05242: sum-then-normalize gives (1, 0) and (0, 1) one advantage). Advantages within
    rtol * (1 + |A|) of the previous sorted value count as one (normalize_each's sums differ by rounding)."""
    combos, values = [], []
    for r, a in zip(rewards.reshape(-1, group_size, rewards.shape[-1]), advantages.reshape(-1, group_size)):
        combos.append(len(np.unique(r, axis=0)))
        a = np.sort(a)
        values.append(1 + int((np.diff(a) > rtol * (1 + np.abs(a[1:]))).sum()))
    return float(np.mean(combos)), float(np.mean(values))


def turn_advantages(
    cfg: "AlgorithmConfig", turn_rewards: Float[np.ndarray, "n turns"], turn_mask: Bool[np.ndarray, "n turns"],
    group_ids: Int[np.ndarray, " n"],
) -> Float[np.ndarray, "n turns"]:
    """Turn-level credit of multi-turn trajectories (GTPO, arXiv 2511.14846: turn-level rewards,
    "normalized discounted returns" as advantages): trajectory i's turn j has the discounted return
    G_ij = sum_{k >= j} gamma^(k - j) r_ik (gamma = `cfg.turn_discount`, r_ik turn k's reward, the last
    turn's the final reward); `cfg.advantage` estimates A_ij from G_ij among the G_i'j of the same group's
    trajectories that have a turn j (group_std: (G_ij - mean) / (std + eps)), exactly 0 where those are
    all equal or where one trajectory alone reaches turn j. The paper's normalization set is read here as
    the same turn of the group's trajectories. Host numpy in, host numpy out (`turn_mask`: the turns
    each trajectory has, a prefix of each row); every token of turn j takes A_ij (the trainer)."""
    r = np.where(turn_mask, turn_rewards, 0.0).astype(np.float32)
    returns, acc = np.zeros_like(r), np.zeros(len(r), np.float32)
    for j in reversed(range(r.shape[1])):
        acc = r[:, j] + np.float32(cfg.turn_discount) * acc
        returns[:, j] = acc
    keys = np.asarray(group_ids)[:, None] * r.shape[1] + np.arange(r.shape[1])
    _, units = np.unique(keys[turn_mask], return_inverse=True)
    x, units = jnp.asarray(returns[turn_mask]), jnp.asarray(units.reshape(-1), jnp.int32)
    adv = jnp.where(group_spread(x, units) > 0, cfg.advantage.spec.fn(cfg.advantage, x, units, None), 0.0)
    out = np.zeros(r.shape, np.float32)
    out[turn_mask] = np.asarray(adv)
    return out


def min_group_size(params: AdvantageParams) -> int:
    """The fewest completions per prompt the estimator `params` works with (2 unless it declares others)."""
    return params.spec.min_group_size(params) if params.spec.min_group_size is not None else 2


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
