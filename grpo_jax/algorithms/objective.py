"""`policy_loss`: one micro-batch's exact share of the optimizer step's loss, and its metrics.

The registry loss gives unit losses and clip flags; everything around it is applied here, once:
top-entropy selection, rollout correction, KL to the reference and the entropy bonus (per token,
before aggregation; for sequence losses their per-sequence token mean is added to u_i, the 1/L_i
weights of the sequence form), then the aggregation with the step's `Normalizer`.
"""

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from grpo_jax.algorithms.aggregation import Normalizer, seq_mean_over_tokens
from grpo_jax.algorithms.correction import rollout_correction
from grpo_jax.algorithms.kl import KL_ESTIMATORS
from grpo_jax.algorithms.losses import LossInputs
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.algorithms.step_stats import StepStats, needs_step_stats
from grpo_jax.metrics import Metric, length_buckets

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig


def _check(cfg, spec, logp, old_logp, advantages, mask, ref_logp, sampler_logp, entropy, stats):
    if logp.ndim != 2 or not (logp.shape == old_logp.shape == mask.shape):
        raise ValueError(f"policy_loss: logp {logp.shape}, old_logp {old_logp.shape}, mask {mask.shape} must all be [batch, seq].")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"policy_loss: advantages {advantages.shape} must be [batch] or [batch, seq] = {logp.shape}.")
    if spec.unit == "sequence" and advantages.ndim == 2:
        raise ValueError(
            f"policy_loss: loss={cfg.loss.name!r} is a sequence loss and needs one advantage per completion "
            "[batch]; for token-level advantages use loss='gspo_token' (GSPO) or a token loss."
        )
    needs = {
        "ref_logp": (cfg.beta > 0, ref_logp, f"AlgorithmConfig.beta={cfg.beta} (or set beta=0)"),
        "sampler_logp": (cfg.tis_level is not None or cfg.off_policy_threshold is not None, sampler_logp,
                         f"tis_level={cfg.tis_level!r} / off_policy_threshold={cfg.off_policy_threshold!r}"),
        "entropy": (cfg.entropy_coef != 0 or cfg.top_entropy_quantile < 1, entropy,
                    f"entropy_coef={cfg.entropy_coef} / top_entropy_quantile={cfg.top_entropy_quantile}"),
        "stats": (needs_step_stats(cfg), stats, f"loss={cfg.loss.name!r} / top_entropy_quantile="
                  f"{cfg.top_entropy_quantile}: pass stats=algorithms.step_stats(...) of the whole step batch"),
    }
    for name, (needed, value, why) in needs.items():
        if needed and value is None:
            raise ValueError(f"policy_loss: {why} needs {name}.")


def policy_loss(
    cfg: "AlgorithmConfig",
    logp: Float[ArrayLike, "batch seq"],
    old_logp: Float[ArrayLike, "batch seq"],
    advantages: Float[ArrayLike, " batch"] | Float[ArrayLike, "batch seq"],
    mask: Float[ArrayLike, "batch seq"],
    ref_logp: Float[ArrayLike, "batch seq"] | None = None,
    sampler_logp: Float[ArrayLike, "batch seq"] | None = None,
    entropy: Float[ArrayLike, "batch seq"] | None = None,
    *,
    normalizer: Normalizer,
    stats: StepStats | None = None,
) -> tuple[Float[Array, ""], dict[str, Metric]]:
    """(loss, metrics) of one micro-batch given the step's `normalizer` (and `stats`, for variants
    that decide over the whole step: `needs_step_stats`). Summed over micro-batches, the losses and
    gradients are those of the unsplit batch; merged with `metrics.combine`, so are the metrics.
    """
    spec = cfg.loss.spec
    _check(cfg, spec, logp, old_logp, advantages, mask, ref_logp, sampler_logp, entropy, stats)
    mask = mask.astype(jnp.float32)
    on = mask > 0
    logp = jnp.where(on, logp.astype(jnp.float32), 0.0)  # D = 0 where masked; where() also blocks their gradient
    old_logp = jnp.where(on, old_logp.astype(jnp.float32), 0.0)
    seq_on = (mask.sum(-1) > 0).astype(jnp.float32)  # completions with >= 1 counted token
    adv = advantages.astype(jnp.float32)
    adv_tokens = jnp.where(on, adv if adv.ndim == 2 else jnp.broadcast_to(adv[:, None], logp.shape), 0.0)
    unit_adv = adv_tokens if spec.unit == "token" else adv
    terms = spec.fn(cfg.loss, LossInputs(logp, old_logp, unit_adv, mask, stats.loss if stats is not None else {}))
    u = terms.u
    metrics = dict(terms.metrics or {})
    if cfg.top_entropy_quantile < 1:
        u = u * stats.keep
        metrics["top_entropy_kept_frac"] = Metric.mean(stats.keep, mask)
    if sampler_logp is not None:
        factor, correction_metrics = rollout_correction(
            cfg, old_logp, sampler_logp.astype(jnp.float32), unit_adv, mask, u.shape)
        u = u * jax.lax.stop_gradient(factor)
        metrics.update(correction_metrics)

    reg = jnp.zeros_like(logp)
    if ref_logp is not None:
        ref_logp = jnp.where(on, ref_logp.astype(jnp.float32), 0.0)
        metrics["kl_k3_mean"] = Metric.mean(KL_ESTIMATORS["k3"].fn(logp, ref_logp), mask)
        if cfg.beta > 0:
            reg = reg + cfg.beta * KL_ESTIMATORS[cfg.kl_estimator].fn(logp, ref_logp)
    if entropy is not None:
        entropy = jnp.where(on, entropy.astype(jnp.float32), 0.0)
        metrics["entropy_mean"] = Metric.mean(entropy, mask)
        if cfg.entropy_coef != 0:
            reg = reg - cfg.entropy_coef * entropy
    u = u + (seq_mean_over_tokens(reg, mask) if spec.unit == "sequence" else reg)
    agg = cfg.aggregation.spec
    loss_value = agg.fn(cfg.aggregation, u, mask, normalizer)
    # The update's loss, weighted by what the aggregation averages over (merging updates then gives
    # the loss of their concatenated batches, not a mean of means).
    step_count, own_count = ((normalizer.num_tokens, mask.sum()) if agg.over == "tokens"
                             else (normalizer.num_sequences, seq_on.sum()))
    metrics["loss"] = Metric(loss_value * step_count, own_count, "mean")

    zeros = jnp.zeros(u.shape, bool)
    low = zeros if terms.clipped_low is None else terms.clipped_low
    high = zeros if terms.clipped_high is None else terms.clipped_high
    unit_weight = mask if low.ndim == 2 else seq_on  # clip flags per token or per sequence
    for side, flags in (("low", low), ("high", high)):
        flags = flags.astype(jnp.float32)
        metrics[f"clip_frac_{side}"] = Metric.mean(flags, unit_weight)
        metrics[f"clip_frac_{side}_tokens"] = Metric.mean(flags if flags.ndim == 2 else flags[:, None], mask)
    d = jax.lax.stop_gradient(logp - old_logp)
    ratio = clamped_exp(d)
    metrics["ratio_mean"] = Metric.mean(ratio, mask)
    metrics["ratio_min"] = Metric.min(ratio, mask)
    metrics["ratio_max"] = Metric.max(ratio, mask)
    metrics["log_ratio_abs_max"] = Metric.max(jnp.abs(d), mask)
    return loss_value, jax.tree.map(jax.lax.stop_gradient, metrics)


def ratio_by_length(logp, old_logp, mask, edges: tuple[int, ...]) -> dict[str, Metric]:
    """The token-ratio noise GSPO's argument is about (arXiv 2507.18071, sec. 3.1: token-level weights
    are single-sample estimates whose noise accumulates with length), per completion-length bucket
    [0, e1), [e1, e2), ..., [ek, inf) of `edges` (`train.length_buckets`). Per bucket "LO-HI":
    `ratio/token_log_var@LO-HI`, the unbiased variance of the token log-ratios within a completion
    (over n - 1: a longer completion is not noisier by construction), averaged over its completions
    (of >= 2 tokens); `ratio/seq_log_ratio_abs@LO-HI`, the mean |length-normalized
    sequence log-ratio| (GSPO's ratio); `length/sequences@LO-HI`, how many completions fell in it (read
    a bucket's means only where it is > 0: an empty bucket reads 0)."""
    mask = mask.astype(jnp.float32)
    n = mask.sum(-1)
    d = jnp.where(mask > 0, jax.lax.stop_gradient(logp - old_logp).astype(jnp.float32), 0.0)
    mean = d.sum(-1) / jnp.maximum(n, 1.0)
    var = (jnp.square(d - mean[:, None]) * mask).sum(-1) / jnp.maximum(n - 1.0, 1.0)
    metrics = {}
    for lo, hi, name in length_buckets(edges):
        inside = (n >= max(lo, 1)) & (n < hi)
        metrics[f"ratio/token_log_var@{name}"] = Metric.mean(var, inside & (n >= 2))
        metrics[f"ratio/seq_log_ratio_abs@{name}"] = Metric.mean(jnp.abs(mean), inside)
        metrics[f"length/sequences@{name}"] = Metric.sum(inside)
    return metrics
