"""Aggregation of unit losses into one optimizer step's loss, exact under micro-batching.

Every denominator (N, counted tokens, L_max) comes from a `Normalizer` computed once for the whole
step batch, so a micro-batch's loss is its exact share and the step loss is the plain sum over
micro-batches (and devices). An aggregation is registered with `@aggregation(name, unit=...,
over=..., reference=...)`: `unit` is the loss unit it aggregates (token or sequence), `over` what
the step loss is a mean over (tokens or sequences: the weight of an update's loss when the updates
of an RL step are combined), `reference` its float64 NumPy twin in `algorithms.reference`, and
`params` its parameter dataclass (none of the built-in ones has parameters).
"""

import dataclasses
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from grpo_jax.algorithms import reference
from grpo_jax.registry import Params, Registry

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

UNITS = ("token", "sequence")


@dataclasses.dataclass(frozen=True)
class Aggregation:
    fn: Callable  # (params, u, mask, normalizer) -> this micro-batch's share of the step loss
    params: type  # its parameter dataclass (an AggregationParams)
    unit: str  # the loss unit it takes: "token" (u is [batch, seq]) or "sequence" (u is [batch])
    over: str  # "tokens" or "sequences": what the step loss averages over
    reference: Callable  # (params, per-completion unit losses, N, counted tokens, L_max) -> step loss


AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


class AggregationParams(Params):
    """Base of an aggregation's parameters (`AlgorithmConfig.aggregation`)."""

    registry, path = AGGREGATIONS, "algorithm.aggregation"


def aggregation(name: str, *, unit: str, over: str, reference: Callable, params: type | None = None):
    """Registers an aggregation under `name` with its parameter class (`AlgorithmConfig.aggregation`)."""
    if unit not in UNITS or over not in ("tokens", "sequences"):
        raise ValueError(f"aggregation {name!r}: unit must be one of {UNITS}, over 'tokens' or 'sequences'")
    def register(fn):
        cls = AGGREGATIONS.params_class(name, params, AggregationParams, fn.__module__)
        AGGREGATIONS.add(name, Aggregation(fn, cls, unit, over, reference))
        return fn

    return register


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Normalizer:
    """Whole-step counts: N (completions with >= 1 counted token), counted tokens, and L_max."""

    num_sequences: Float[Array, ""]
    num_tokens: Float[Array, ""]
    max_completion_len: Float[Array, ""]


def normalizer(cfg: "AlgorithmConfig", mask: Float[ArrayLike, "batch seq"], max_completion_len: int) -> Normalizer:
    """Denominators of the FULL optimizer-step batch; pass the result to every micro-batch's policy_loss.

    N counts completions with at least one counted token (padding rows and fully masked completions
    contribute 0 and are not counted, as in verl); `max_completion_len` is the configured limit L_max
    (SamplingConfig.max_new_tokens) used by seq_mean_token_sum_norm.
    """
    if max_completion_len < 1:
        raise ValueError(
            f"normalizer: max_completion_len={max_completion_len} (aggregation={cfg.aggregation.name!r}); pass the "
            "completion limit L_max >= 1, i.e. SamplingConfig.max_new_tokens."
        )
    mask = jnp.asarray(mask, jnp.float32)
    return Normalizer(
        num_sequences=(mask.sum(-1) > 0).sum().astype(jnp.float32),
        num_tokens=mask.sum(),
        max_completion_len=jnp.float32(max_completion_len),
    )


def seq_mean_over_tokens(x, mask):
    """(1/L_i) sum_t m x per sequence; 0 for empty sequences."""
    return (x * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def _n(norm):
    return jnp.maximum(norm.num_sequences, 1.0)


@aggregation("token_mean", unit="token", over="tokens", reference=reference.token_mean)
def token_mean(p, u, mask, norm):
    """sum_{i,t} m u / sum_{i,t} m (DAPO; TRL's "bnpo")."""
    return (u * mask).sum() / jnp.maximum(norm.num_tokens, 1.0)


@aggregation("seq_mean_token_mean", unit="token", over="sequences", reference=reference.seq_mean_token_mean)
def seq_mean_token_mean(p, u, mask, norm):
    """(1/N) sum_i (1/L_i) sum_t m u (original GRPO, GSPO-token, SAPO)."""
    return seq_mean_over_tokens(u, mask).sum() / _n(norm)


@aggregation("seq_mean_token_sum", unit="token", over="sequences", reference=reference.seq_mean_token_sum)
def seq_mean_token_sum(p, u, mask, norm):
    """(1/N) sum_i sum_t m u (RLOO, OPO: summed log-prob per completion)."""
    return (u * mask).sum() / _n(norm)


@aggregation("seq_mean_token_sum_norm", unit="token", over="sequences", reference=reference.seq_mean_token_sum_norm)
def seq_mean_token_sum_norm(p, u, mask, norm):
    """sum_{i,t} m u / (N L_max) (Dr. GRPO)."""
    return (u * mask).sum() / (_n(norm) * norm.max_completion_len)


@aggregation("seq_mean", unit="sequence", over="sequences", reference=reference.seq_mean)
def seq_mean(p, u, mask, norm):
    """(1/N) sum_i u_i, for sequence losses (gspo, gmpo)."""
    return (u * (mask.sum(-1) > 0)).sum() / _n(norm)
