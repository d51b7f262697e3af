"""Baseline-and-scale estimators: A = (R - baseline) / scale, the baseline a group mean (or its
leave-one-out or length-weighted form), the scale a group or batch standard deviation."""

import dataclasses

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.advantages.base import Standardized, advantage, batch_standardize, group_stats, group_sum


@dataclasses.dataclass(frozen=True)
class GroupStd(Standardized):
    """GRPO's std-scaled group advantage."""


@dataclasses.dataclass(frozen=True)
class BatchStd(Standardized):
    """Group-centred, scaled by the batch's std."""


@dataclasses.dataclass(frozen=True)
class ReinforcePp(Standardized):
    """Group-centred, whitened over the batch's tokens."""


@dataclasses.dataclass(frozen=True)
class Spo(Standardized):
    """Standardized over the whole batch, no groups (with the `spo` sampler, of rewards less its per-prompt
    baseline)."""


@advantage("group_std", params=GroupStd, reference=reference.group_std)
def group_std(p, rewards, groups, lengths):
    """GRPO: (R - mean_g) / (std_g + eps)."""
    _, mean, std = group_stats(rewards, groups)
    return (rewards - mean) / (std + p.eps)


@advantage("group_mean", reference=reference.group_mean)
def group_mean(p, rewards, groups, lengths):
    """Dr. GRPO: R - mean_g (no std division, which up-weights easy and hard prompts)."""
    _, mean, _ = group_stats(rewards, groups)
    return rewards - mean


@advantage("rloo", reference=reference.rloo)
def rloo(p, rewards, groups, lengths):
    """RLOO: R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g)."""
    size, mean, _ = group_stats(rewards, groups)
    return size / (size - 1) * (rewards - mean)


@advantage("opo", reference=reference.opo, needs_lengths=True)
def opo(p, rewards, groups, lengths):
    """OPO: R_i - sum_j L_j R_j / sum_j L_j, the length-weighted (optimal for on-policy) baseline."""
    lengths = lengths.astype(jnp.float32)
    baseline = group_sum(lengths * rewards, groups) / jnp.maximum(group_sum(lengths, groups), 1.0)
    return rewards - baseline


@advantage("batch_std", params=BatchStd, reference=reference.batch_std)
def batch_std(p, rewards, groups, lengths):
    """TRL scale_rewards="batch": group-centred, scaled by the std of the whole batch."""
    _, mean, _ = group_stats(rewards, groups)
    return (rewards - mean) / (jnp.std(rewards, ddof=1) + p.eps)


@advantage("spo", params=Spo, reference=reference.spo, learns_from_uniform_groups=True, min_group_size=lambda p: 1)
def spo(p, rewards, groups, lengths):
    """SPO (arXiv 2509.13232): R standardized over the whole batch; groups play no part, so a prompt may have
    a single sample and a group of equal rewards still learns. With a sampler that keeps a baseline (the
    `spo` sampler's value tracker) the trainer passes R - b, b the prompt's baseline; without one, the
    batch mean is the baseline."""
    return batch_standardize(rewards, p.eps)


@advantage("reinforce_pp", params=ReinforcePp, reference=reference.reinforce_pp, needs_lengths=True)
def reinforce_pp(p, rewards, groups, lengths):
    """REINFORCE++-baseline (arXiv 2501.03262; OpenRLHF `reinforce_baseline`, verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`): c = R - mean_g, then whitened over the
    batch's counted tokens (every token of completion i carries c_i): (c - mu) / (sigma + eps) with mu,
    sigma the token-weighted mean and std (ddof 1) over the whole rollout batch."""
    _, mean, _ = group_stats(rewards, groups)
    c = rewards - mean
    w = lengths.astype(jnp.float32)
    tokens = w.sum()
    mu = (w * c).sum() / jnp.maximum(tokens, 1.0)
    sigma = jnp.sqrt((w * (c - mu) ** 2).sum() / jnp.maximum(tokens - 1.0, 1.0))
    return jnp.where(sigma > 0, (c - mu) / (sigma + p.eps), 0.0)
