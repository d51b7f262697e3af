"""Estimators derived from a reshaped objective rather than a baseline: BNPO's Beta-density
normalization, and the analytical advantage of the pass@k reward."""

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.advantages.base import Standardized, advantage, group_sum


@dataclasses.dataclass(frozen=True)
class PassAtK(Standardized):
    """`k` of pass@k (at most the group size)."""

    k: int = 4

    def __post_init__(self):
        super().__post_init__()
        self.check({"k": (self.k >= 1, "must be >= 1")})


@advantage("beta_norm", reference=reference.beta_norm)
def beta_norm(p, rewards, groups, lengths):
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


def _binomial_ratio(a, b, k: int):
    """C(a, k) / C(b, k) = prod_{i<k} (a - i) / (b - i) for b >= k (0 when a < k)."""
    out = jnp.ones_like(a)
    for i in range(k):
        out = out * jnp.maximum(a - i, 0.0) / (b - i)
    return out


@advantage("pass_at_k", params=PassAtK, reference=reference.pass_at_k, min_group_size=lambda p: max(p.k, 2),
           test_params=dict(k=2))
def pass_at_k(p, rewards, groups, lengths):
    """Pass@k Training, analytical form (arXiv 2508.10751; the authors' `code/passk_adv.py`), for
    binary rewards (a reward > 0 counts as correct). With c correct of G and k = k, the group's
    pass@k is rho = 1 - C(G - c, k) / C(G, k) and sigma = sqrt(rho (1 - rho)); a correct completion
    gets (1 - rho) / (sigma + eps), a wrong one (1 - rho - C(G - c - 1, k - 1) / C(G - 1, k - 1)) /
    (sigma + eps). k = 1 is GRPO with the population std."""
    correct = rewards > 0
    n = group_sum(jnp.ones_like(rewards), groups)
    c = group_sum(correct.astype(jnp.float32), groups)
    k = p.k
    rho = 1.0 - _binomial_ratio(n - c, n, k)
    sigma = jnp.sqrt(rho * (1.0 - rho))
    wrong = 1.0 - rho - _binomial_ratio(n - c - 1, n - 1, k - 1)
    return jnp.where(correct, 1.0 - rho, wrong) / (sigma + p.eps)


def unlikeliness_scale(beta_rank: float, logprobs, groups):
    """Rewarding the Unlikely (He, Fried, Welleck, arXiv 2506.02355; the authors'
    `_compute_advantages` in verl/trainer/ppo/ray_lean_trainer.py): each reward is multiplied by
    1 - beta_rank * rank_i / G, rank_i in [0, G) the rank of completion i's mean token log-prob under
    the sampler among its group's (ascending, ties by position; G the group size), so the likeliest
    correct completion is rewarded least and GRPO's rank bias toward already likely solutions is
    countered. Wrong completions (reward 0) stay 0; an all-correct group gets a signal."""
    n = logprobs.shape[0]
    pos = jnp.arange(n)
    order = jnp.lexsort((pos, logprobs, groups))  # by group, then log-prob, then position
    first = jax.ops.segment_min(pos, groups[order], n)  # per group id: its first sorted position
    rank = jnp.zeros(n, jnp.float32).at[order].set((pos - first[groups[order]]).astype(jnp.float32))
    return 1.0 - beta_rank * rank / group_sum(jnp.ones(n, jnp.float32), groups)
