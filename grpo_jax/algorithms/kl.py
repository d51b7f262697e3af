"""KL estimators to the reference policy, per token (Schulman's k1, k2, k3).

Registered with `@kl_estimator(name, reference=...)`, the float64 twin in `algorithms.reference`.
"""

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.registry import Registry
from kernels.ratio_clip import LOG_RATIO_BOUND


@dataclasses.dataclass(frozen=True)
class KLEstimator:
    fn: Callable  # (logp, ref_logp) -> per-token estimate
    reference: Callable


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


def kl_estimator(name: str, *, reference: Callable):
    """Registers a per-token KL estimator (the value of `AlgorithmConfig.kl_estimator`)."""

    def register(fn):
        KL_ESTIMATORS.add(name, KLEstimator(fn, reference))
        return fn

    return register


@kl_estimator("k1", reference=reference.k1)
def k1(logp, ref_logp):
    """l - l^ref (unbiased, can be negative)."""
    return logp - ref_logp


@kl_estimator("k2", reference=reference.k2)
def k2(logp, ref_logp):
    """(l - l^ref)^2 / 2."""
    return 0.5 * (logp - ref_logp) ** 2


@kl_estimator("k3", reference=reference.k3)
def k3(logp, ref_logp):
    """exp(x) - x - 1 with x = l^ref - l (non-negative, unbiased); x clamped to +-20, value to <= 10."""
    x = ref_logp - logp
    return jnp.minimum(jnp.exp(jnp.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)) - x - 1.0, 10.0)
