"""The advantage registry and the per-group reductions every estimator is written with.

An estimator is `fn(cfg, rewards, groups, lengths) -> advantages` over float32 [N] arrays (groups:
integer ids in [0, N), samples sharing an id share a prompt; lengths: counted completion lengths,
or None), registered with `@advantage(name, reference=..., fields=...)`.
"""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from grpo_jax.algorithms.registry import Registry

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig


@dataclasses.dataclass(frozen=True)
class Advantage:
    fn: Callable[["AlgorithmConfig", jax.Array, jax.Array, jax.Array | None], jax.Array]
    reference: Callable  # float64 twin in algorithms.reference
    needs_lengths: bool  # counted completion lengths must be passed
    fields: tuple[str, ...]  # the AlgorithmConfig fields it reads (the others must stay default)
    # False (every estimator but NGRPO): a group whose rewards are all equal gets exactly 0, applied
    # by compute_advantages. True: the estimator gives such groups a signal by design.
    learns_from_uniform_groups: bool
    min_group_size: Callable[["AlgorithmConfig"], int] | None  # groups smaller than this are an error


ADVANTAGES: Registry[Advantage] = Registry("advantage")


def advantage(name: str, *, reference: Callable, needs_lengths: bool = False, fields: tuple[str, ...] = (),
              learns_from_uniform_groups: bool = False, min_group_size: Callable | None = None):
    """Registers an estimator under `name` (the value of `AlgorithmConfig.advantage`)."""

    def register(fn):
        ADVANTAGES.add(name, Advantage(fn, reference, needs_lengths, tuple(fields), learns_from_uniform_groups,
                                       min_group_size))
        return fn

    return register


def group_sum(x, groups):
    """Per-sample sum of x over the sample's group."""
    return jax.ops.segment_sum(x, groups, num_segments=x.shape[0])[groups]


def group_spread(x, groups):
    """Per-sample max - min of x over the sample's group."""
    n = x.shape[0]
    return (jax.ops.segment_max(x, groups, n) - jax.ops.segment_min(x, groups, n))[groups]


def group_stats(rewards, groups):
    """Per-sample group size, mean and std (ddof=1) of the sample's group."""
    size = group_sum(jnp.ones_like(rewards), groups)
    mean = group_sum(rewards, groups) / size
    var = group_sum((rewards - mean) ** 2, groups) / (size - 1)
    return size, mean, jnp.sqrt(var)


def batch_standardize(x, eps):
    """(x - mean) / (std + eps) over the batch; exactly 0 where the batch has no spread."""
    return jnp.where(jnp.ptp(x) > 0, (x - x.mean()) / (jnp.std(x, ddof=1) + eps), 0.0)
