"""The GRPO family (shared/ALGORITHMS.md): advantages, policy losses, KL, aggregation, presets.

Registries map names to functions (ADVANTAGES, LOSSES); a new variant is one function plus its
`@advantage(...)` / `@loss(...)` line, and the tests iterate over the registries.
"""

from grpo_jax.algorithms.advantages import ADVANTAGES, advantage, compute_advantages, overlong_penalty
from grpo_jax.algorithms.config import PRESETS, AlgorithmConfig
from grpo_jax.algorithms.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    SEQUENCE_LOSSES,
    Normalizer,
    combine_metrics,
    finalize_metrics,
    kl_penalty,
    loss,
    normalizer,
    policy_loss,
)
from grpo_jax.algorithms.ratio import clipped_surrogate

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "LOSSES", "PRESETS", "SEQUENCE_LOSSES",
    "AlgorithmConfig", "Normalizer", "advantage", "clipped_surrogate", "combine_metrics",
    "compute_advantages", "finalize_metrics", "kl_penalty", "loss", "normalizer", "overlong_penalty",
    "policy_loss",
]
