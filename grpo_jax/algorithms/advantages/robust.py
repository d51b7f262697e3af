"""Estimators that change what a group's baseline or weight is where the plain group mean misleads:
all-wrong groups (NGRPO), skewed or noisy reward distributions (GAPO), noisy binary verifiers (S-GRPO)."""

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.advantages.base import Standardized, advantage, group_stats, group_sum


@dataclasses.dataclass(frozen=True)
class Ngrpo(Standardized):
    """`virtual_samples` virtual samples of reward `max_reward` join every group."""

    max_reward: float = 1.0
    virtual_samples: int = 1

    def __post_init__(self):
        super().__post_init__()
        self.check({"virtual_samples": (self.virtual_samples >= 1, "must be >= 1 (virtual samples per group)")})


@dataclasses.dataclass(frozen=True)
class Gapo(Standardized):
    """`fraction`: the share of the group its narrowest interval covers."""

    fraction: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        self.check({"fraction": (0 < self.fraction <= 1, "must lie in (0, 1] (a share of the group)")})


@dataclasses.dataclass(frozen=True)
class NoiseAware(Standardized):
    """`noise_rate`: the probability p that a binary reward is flipped."""

    noise_rate: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        self.check({"noise_rate": (0 <= self.noise_rate < 0.5,
                                   "must lie in [0, 0.5) (a flip probability; 0.5 is pure noise)")})


@advantage("ngrpo", params=Ngrpo, reference=reference.ngrpo, learns_from_uniform_groups=True)
def ngrpo(p, rewards, groups, lengths):
    """NGRPO advantage calibration (arXiv 2509.18851; the authors' `compute_ngrpo_outcome_advantage`):
    each group's mean and std (ddof 1) include `virtual_samples` virtual samples of reward
    `max_reward`, so an all-wrong group gets negative advantages instead of 0 (a group all at the
    maximum still gets exactly 0)."""
    k, top = p.virtual_samples, p.max_reward
    n = group_sum(jnp.ones_like(rewards), groups) + k
    mean = (group_sum(rewards, groups) + k * top) / n
    var = (group_sum((rewards - mean) ** 2, groups) + k * (top - mean) ** 2) / (n - 1)
    return (rewards - mean) / (jnp.sqrt(var) + p.eps)


def gapo_window(fraction, size):
    """Rewards the GAPO interval covers: ceil(fraction * size), at least 1 (the slack absorbs the float
    rounding of fraction * size)."""
    return jnp.maximum(jnp.ceil(fraction * size - 1e-6), 1.0).astype(jnp.int32)


@advantage("gapo", params=Gapo, reference=reference.gapo, test_params=dict(fraction=0.6))
def gapo(p, rewards, groups, lengths):
    """GAPO (arXiv 2510.21830; the authors' verl-GAPO `find_shortest_covering_subarray`): Q is the
    median of the narrowest interval of the sorted group rewards that covers ceil(fraction * G)
    of them (ties: the lowest such interval); A = (R - Q) / (sqrt(sum_g (R - Q)^2 / (G - 1)) + eps)."""
    n = rewards.shape[0]
    order = jnp.lexsort((rewards, groups))  # by group, then by reward
    sorted_r, sorted_g = rewards[order], groups[order]
    pos = jnp.arange(n)
    first = jax.ops.segment_min(pos, sorted_g, n)  # per group id: its first sorted position
    size = jax.ops.segment_sum(jnp.ones(n), sorted_g, n)
    m = gapo_window(p.fraction, size)  # per group id
    rank, m_at = pos - first[sorted_g], m[sorted_g]
    fits = rank + m_at <= size[sorted_g]
    width = jnp.where(fits, sorted_r[jnp.minimum(pos + m_at - 1, n - 1)] - sorted_r, jnp.inf)
    narrowest = jax.ops.segment_min(width, sorted_g, n)[sorted_g]
    best = jax.ops.segment_min(jnp.where(fits & (width == narrowest), rank, n), sorted_g, n)  # per group id
    start, m = first[groups] + best[groups], m[groups]
    q = 0.5 * (sorted_r[start + (m - 1) // 2] + sorted_r[start + m // 2])
    size = size[groups]
    scale = jnp.sqrt(group_sum((rewards - q) ** 2, groups) / (size - 1))
    return (rewards - q) / (scale + p.eps)


@advantage("noise_aware", params=NoiseAware, reference=reference.noise_aware)
def noise_aware(p, rewards, groups, lengths):
    """S-GRPO (arXiv 2508.05928; the authors' `group_weight`): group_std advantages times the optimal
    weight under symmetric reward-flip noise p = noise_rate. With q = k / G (k rewards > 0) and the
    denoised success rate t = clip((q - p) / (1 - 2p), 0, 1):
    w = (1 - 2p) t (1 - t) / (sqrt(q (1 - q) + 1e-8) sqrt(t (1 - t) + 1e-8))."""
    size, mean, std = group_stats(rewards, groups)
    rate = p.noise_rate
    q = group_sum((rewards > 0).astype(jnp.float32), groups) / size
    t = jnp.clip((q - rate) / (1 - 2 * rate), 0.0, 1.0)
    w = (1 - 2 * rate) * t * (1 - t) / (jnp.sqrt(q * (1 - q) + 1e-8) * jnp.sqrt(t * (1 - t) + 1e-8))
    return w * (rewards - mean) / (std + p.eps)
