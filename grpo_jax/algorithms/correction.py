"""Rollout correction: the sampler is not the trainer (different kernels, precisions, batching), so
l^samp != l^old; detached weights from d = l^old - l^samp multiply the policy unit loss.

- `tis_level` token: w_t = exp(d_t); sequence: w_i = exp(sum_t d) (crushes long completions: a
  weight of 0.06 against 0.9999 at token level was reported on 8-10k-token episodes); geometric:
  w_i = exp(mean_t d). The exponent is clamped to +-20.
- `tis_mode` truncate: min(w, C); mask: w where w <= C, else 0; icepop: w where 1/C <= w <= C, else 0.
- `off_policy_threshold` delta (DeepSeek-V3.2's off-policy sequence masking): completions with
  A < 0 and mean_t |d| > delta get 0.
The fractions of units zeroed are reported (`tis_masked_frac`, `off_policy_masked_frac`).
"""

from typing import TYPE_CHECKING

import jax.numpy as jnp

from grpo_jax.algorithms.aggregation import seq_mean_over_tokens
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

TIS_LEVELS = (None, "token", "sequence", "geometric")
TIS_MODES = ("truncate", "mask", "icepop")


def rollout_correction(cfg: "AlgorithmConfig", old_logp, sampler_logp, advantages, mask, unit_shape):
    """(factor, metrics): the detached factor of the unit losses ([batch, seq] for token losses,
    [batch] for sequence losses) and the drift metrics. Inputs are float32, 0 where masked."""
    on = mask > 0
    d = jnp.where(on, old_logp - sampler_logp, 0.0)
    drift = jnp.abs(d)
    metrics = {"sampler_drift_mean": Metric.mean(drift, mask), "sampler_drift_max": Metric.max(drift, mask)}
    per_token = len(unit_shape) == 2
    unit_weight = mask if per_token else (mask.sum(-1) > 0).astype(jnp.float32)

    def to_units(x):  # per-sequence values onto token units
        return jnp.broadcast_to(x[:, None], unit_shape) if per_token and x.ndim == 1 else x

    factor = jnp.ones(unit_shape, jnp.float32)
    if cfg.tis_level is not None:
        log_w = {"token": d, "sequence": d.sum(-1), "geometric": seq_mean_over_tokens(d, mask)}[cfg.tis_level]
        w = clamped_exp(log_w)
        if cfg.tis_mode == "truncate":
            w = jnp.minimum(w, cfg.tis_cap)
        else:
            keep = w <= cfg.tis_cap if cfg.tis_mode == "mask" else (w >= 1.0 / cfg.tis_cap) & (w <= cfg.tis_cap)
            w = jnp.where(keep, w, 0.0)
        w = to_units(w)
        factor = factor * w
        metrics["tis_weight_mean"] = Metric.mean(w, unit_weight)
        metrics["tis_masked_frac"] = Metric.mean(w == 0, unit_weight)
    if cfg.off_policy_threshold is not None:
        off = to_units(seq_mean_over_tokens(drift, mask) > cfg.off_policy_threshold)
        dropped = off & (advantages < 0)
        factor = factor * ~dropped
        metrics["off_policy_masked_frac"] = Metric.mean(dropped, unit_weight)
    return factor, metrics
