"""Step-level statistics: decisions a variant takes over the whole optimizer-step batch.

Clip-Cov and KL-Cov pick tokens by their covariance over all counted tokens of the step (arXiv
2505.22617), top-entropy selection keeps the tokens above an entropy quantile of the step (arXiv
2506.01939, TRL's `top_entropy_quantile`), and the group losses (GVPO, DisCO, GTPO, EGSW) need
statistics of each completion's whole group and of the batch. Taken per micro-batch, as trainers do,
such decisions change with the micro-batch size and the device count (and a group's rows are spread
over micro-batches). Here `train_step` runs a no-grad pass over all micro-batches (only when
`needs_step_stats`), calls `step_stats` once on the whole step batch, and splits the per-row results
with the micro-batches like the batch rows: every micro-batch sees exactly the decision of the
unsplit batch.
"""

import dataclasses
import typing
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from grpo_jax.algorithms.losses import StepBatch

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepStats:
    """Per-row results over the whole step batch; rows split with the batch's micro-batches."""

    loss: dict  # the loss's statistics, {name: [batch] or [batch, seq]} ({} unless it declares `stats`)
    keep: Float[Array, "batch seq"]  # top-entropy tokens whose policy loss counts (1 when off)


def needs_step_stats(cfg: "AlgorithmConfig") -> bool:
    return cfg.loss.spec.stats is not None or cfg.top_entropy_quantile < 1


def entropy_keep(quantile: float, entropy, mask):
    """Counted tokens whose entropy is >= the (1 - quantile) quantile (linear interpolation, as
    torch.quantile) of the counted tokens' entropies."""
    counted = mask > 0
    if quantile >= 1:
        return counted
    threshold = jnp.nanquantile(jnp.where(counted, entropy, jnp.nan), 1.0 - quantile)
    return counted & (entropy >= threshold)


def step_stats(
    cfg: "AlgorithmConfig",
    logp: Float[ArrayLike, "batch seq"],
    old_logp: Float[ArrayLike, "batch seq"],
    advantages: Float[ArrayLike, " batch"] | Float[ArrayLike, "batch seq"],
    mask: Float[ArrayLike, "batch seq"],
    entropy: Float[ArrayLike, "batch seq"],
    priority: Int[ArrayLike, "batch seq"],
    *,
    tokens: Int[ArrayLike, "batch seq"] | None = None,
    group_size: int | None = None,
) -> StepStats:
    """The step's decisions from the current log-probs and entropies of EVERY completion of the step.

    `priority` is a random permutation of the token slots (distinct integers): the random choice of
    Clip-Cov, reproducible from the key that drew it. `tokens` (the completion ids) and `group_size`
    (rows [k G, (k + 1) G) are group k) are needed by losses that declare `needs_groups`. All inputs
    are detached.
    """
    spec = cfg.loss.spec
    if spec.needs_groups:
        if group_size is None or tokens is None:
            raise ValueError(f"step_stats: loss={cfg.loss.name!r} compares the completions of a group; pass "
                             "group_size= (SamplingConfig.group_size) and tokens= (the completion ids).")
        if mask.shape[0] % group_size:
            raise ValueError(f"step_stats: loss={cfg.loss.name!r} needs whole groups, but {mask.shape[0]} rows do not "
                             f"split into groups of {group_size}.")
    mask = jnp.asarray(mask, jnp.float32)
    on = mask > 0

    def detached(x):
        return jnp.where(on, jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)), 0.0)

    adv = jnp.asarray(advantages, jnp.float32)
    adv = adv if adv.ndim == 2 else jnp.broadcast_to(adv[:, None], mask.shape)
    batch = StepBatch(detached(logp), detached(old_logp), detached(adv), mask, detached(entropy),
                      jnp.asarray(priority), jnp.zeros(mask.shape, jnp.int32) if tokens is None else jnp.asarray(tokens),
                      group_size or 1)
    stats = spec.stats(cfg.loss, batch) if spec.stats is not None else {}
    keep = entropy_keep(cfg.top_entropy_quantile, batch.entropy, mask)
    return StepStats(jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), stats), keep.astype(jnp.float32))
