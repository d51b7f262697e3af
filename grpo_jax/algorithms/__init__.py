"""The GRPO family (docs/algorithms.md): advantages, policy losses, KL, aggregation, rollout
correction, step-level statistics, presets.

Registries map names to entries that carry each variant's capabilities and float64 reference
(ADVANTAGES, LOSSES, AGGREGATIONS, KL_ESTIMATORS); a new variant is one function, its parameter
dataclass and its `@advantage(...)` / `@loss(...)` / `@aggregation(...)` line, in one file of its own
if it likes: config, CLI, docs/presets.md and the registry-wide tests pick it up (README, "Add a
variant"). `AlgorithmConfig` holds the selected parts with their parameters; `preset` names a set of
its fields.
"""

from grpo_jax.algorithms.advantages import (
    ADVANTAGES, AdvantageParams, advantage, compute_advantages, distinct_per_group, overlong_penalty, turn_advantages,
)
from grpo_jax.algorithms.aggregation import AGGREGATIONS, AggregationParams, Normalizer, aggregation, normalizer
from grpo_jax.algorithms.config import PRESETS, AlgorithmConfig, preset
from grpo_jax.algorithms.kl import KL_ESTIMATORS, kl_estimator
from grpo_jax.algorithms.losses import LOSSES, LossInputs, LossParams, LossTerms, loss
from grpo_jax.algorithms.objective import policy_loss, ratio_by_length
from grpo_jax.algorithms.ratio import clipped_surrogate
from grpo_jax.algorithms.step_stats import StepStats, needs_step_stats, step_stats

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "LOSSES", "PRESETS", "AdvantageParams", "AggregationParams",
    "AlgorithmConfig", "LossInputs", "LossParams", "LossTerms", "Normalizer", "StepStats", "advantage", "aggregation",
    "clipped_surrogate", "compute_advantages", "distinct_per_group", "kl_estimator", "loss", "needs_step_stats", "normalizer",
    "overlong_penalty", "policy_loss", "preset", "ratio_by_length", "step_stats", "turn_advantages",
]
