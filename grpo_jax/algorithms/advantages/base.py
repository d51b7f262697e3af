"""The advantage registry and the per-group reductions every estimator is written with.

An estimator is `fn(p, rewards, groups, lengths) -> advantages` over float32 [N] arrays (p: its
parameters, the `AdvantageParams` instance `AlgorithmConfig.advantage` holds; groups: integer ids in
[0, N), samples sharing an id share a prompt; lengths: counted completion lengths, or None),
registered with `@advantage(name, params=P, reference=...)`.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.registry import Params, Registry


@dataclasses.dataclass(frozen=True)
class Advantage:
    fn: Callable[["AdvantageParams", jax.Array, jax.Array, jax.Array | None], jax.Array]
    params: type  # its parameter dataclass (an AdvantageParams): the value of AlgorithmConfig.advantage
    reference: Callable  # float64 twin in algorithms.reference, reference(params, rewards, groups, lengths)
    needs_lengths: bool  # counted completion lengths must be passed
    # False (every estimator but NGRPO): a group whose rewards are all equal gets exactly 0, applied
    # by compute_advantages. True: the estimator gives such groups a signal by design.
    learns_from_uniform_groups: bool
    min_group_size: Callable[["AdvantageParams"], int] | None  # groups smaller than this are an error
    # Parameter values under which the registry-wide tests exercise it ({}: its defaults).
    test_params: dict = dataclasses.field(default_factory=dict)


ADVANTAGES: Registry[Advantage] = Registry("advantage")


class AdvantageParams(Params):
    """Base of an estimator's parameters (`AlgorithmConfig.advantage`)."""

    registry, path = ADVANTAGES, "algorithm.advantage"


@dataclasses.dataclass(frozen=True)
class Standardized(AdvantageParams):
    """An estimator that divides by a spread: `eps` is added to the denominator."""

    eps: float = 1e-6

    def __post_init__(self):
        self.check({"eps": (self.eps >= 0, "must be >= 0")})


def advantage(name: str, *, reference: Callable, params: type | None = None, needs_lengths: bool = False,
              learns_from_uniform_groups: bool = False, min_group_size: Callable | None = None,
              test_params: dict | None = None):
    """Registers an estimator under `name` with its parameter class (`AlgorithmConfig.advantage`)."""
    def register(fn):
        cls = ADVANTAGES.params_class(name, params, AdvantageParams, fn.__module__)
        cls(**(test_params or {}))  # the test values must be valid parameters
        ADVANTAGES.add(name, Advantage(fn, cls, reference, needs_lengths, learns_from_uniform_groups,
                                       min_group_size, dict(test_params or {})))
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
