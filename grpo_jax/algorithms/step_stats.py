"""Step-level statistics: decisions a variant takes over the whole optimizer-step batch.

Clip-Cov and KL-Cov pick tokens by their covariance over all counted tokens of the step (arXiv
2505.22617), top-entropy selection keeps the tokens above an entropy quantile of the step (arXiv
2506.01939, TRL's `top_entropy_quantile`). Taken per micro-batch, as trainers do, such decisions
change with the micro-batch size and the device count. Here `train_step` runs a no-grad pass over
all micro-batches (only when `needs_step_stats`), calls `step_stats` once on the whole step batch,
and splits the per-token decisions with the micro-batches like the batch rows: every micro-batch
sees exactly the decision of the unsplit batch.
"""

import dataclasses
import typing
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from grpo_jax.algorithms.losses import LOSSES

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepStats:
    """Per-token decisions over the whole step batch; rows split with the batch's micro-batches."""

    select: Float[Array, "batch seq"]  # the loss's selection (Clip-Cov: detached, KL-Cov: penalized)
    keep: Float[Array, "batch seq"]  # top-entropy tokens whose policy loss counts (1 when off)


def needs_step_stats(cfg: "AlgorithmConfig") -> bool:
    return LOSSES[cfg.loss].select is not None or cfg.top_entropy_quantile < 1


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
) -> StepStats:
    """The step's decisions from the current log-probs and entropies of EVERY completion of the step.

    `priority` is a random permutation of the token slots (distinct integers): the random choice of
    Clip-Cov, reproducible from the key that drew it. All inputs are detached.
    """
    logp, old_logp, entropy = (jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for v in (logp, old_logp, entropy))
    mask = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = adv if adv.ndim == 2 else jnp.broadcast_to(adv[:, None], mask.shape)
    spec = LOSSES[cfg.loss]
    select = jnp.zeros(mask.shape, bool)
    if spec.select is not None:
        select = spec.select(cfg, logp, old_logp, adv, mask, priority)
    keep = entropy_keep(cfg.top_entropy_quantile, entropy, mask)
    return StepStats(select.astype(jnp.float32), keep.astype(jnp.float32))
