"""Policy losses, regularizers and aggregation: one optimizer step's loss, split exactly over micro-batches.

A loss is `fn(cfg, logp, old_logp, advantages, mask) -> (u, clipped_low, clipped_high)`, registered
with `@loss("name")` (token losses: u is [batch, seq]) or `@loss("name", sequence=True)` (u is
[batch]). D = logp - old_logp is zeroed where mask = 0 before anything is exponentiated, so padding
never produces inf/NaN and never reaches a value or a gradient.

Exact accumulation: every normalizer (N, token count, L_max) comes from a `Normalizer` computed once
for the whole step batch, so a micro-batch's loss is its exact share and the step loss is the plain
sum over micro-batches (and devices). Metrics are `{name: (value, weight)}`; combine micro-batches with
`combine_metrics` (weights add; values add, or max/min for names ending in _max/_min) and read them
with `finalize_metrics` (value / weight for means).
"""

import dataclasses
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

import kernels
from grpo_jax.algorithms.ratio import clipped_surrogate

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

LOSSES: dict[str, Callable] = {}
SEQUENCE_LOSSES: set[str] = set()
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "seq_mean")
KL_ESTIMATORS = ("k1", "k2", "k3")

sg = jax.lax.stop_gradient


def loss(name: str, sequence: bool = False):
    """Registers a policy loss under `name` (the value of `AlgorithmConfig.loss`)."""

    def register(fn):
        LOSSES[name] = fn
        if sequence:
            SEQUENCE_LOSSES.add(name)
        return fn

    return register


def _seq_mean(x, mask):
    """(1/L_i) sum_t m x per sequence; 0 for empty sequences."""
    return (x * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def _surrogate(cfg, log_ratio, adv):
    """The clipped surrogate of ppo_clip, gspo and gspo_token, through `cfg.ratio_impl`: the fused
    kernel (`kernels.ratio_clip`, same values and gradients) or the jnp reference it replaces."""
    if cfg.ratio_impl == "reference":
        return clipped_surrogate(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c)
    impl = None if cfg.ratio_impl == "auto" else cfg.ratio_impl
    return kernels.ratio_clip(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c, impl=impl)


def _no_clip(u):
    return u, jnp.zeros(u.shape, bool), jnp.zeros(u.shape, bool)


@loss("ppo_clip")
def ppo_clip(cfg, logp, old_logp, adv, mask):
    """GRPO/DAPO/Dr. GRPO/BNPO token surrogate, optional `delta` cap and dual clip `clip_c`."""
    return _surrogate(cfg, logp - old_logp, adv)


@loss("gspo", sequence=True)
def gspo(cfg, logp, old_logp, adv, mask):
    """GSPO: clip the sequence ratio s_i = exp(mean_t D); gradient flows through s_i."""
    return _surrogate(cfg, _seq_mean(logp - old_logp, mask), adv)


@loss("gspo_token")
def gspo_token(cfg, logp, old_logp, adv, mask):
    """GSPO-token: rho = sg(s_i) exp(l - sg(l)) has the value of s_i and d rho / d l_t = s_i per token."""
    log_rho = sg(_seq_mean(logp - old_logp, mask))[:, None] + logp - sg(logp)
    return _surrogate(cfg, log_rho, adv)


@loss("gmpo", sequence=True)
def gmpo(cfg, logp, old_logp, adv, mask):
    """GMPO: per-token log-space clip with the sign rule, then u_i = -A_i exp(mean_t D~).

    Its clip flags are per token, where the clip acts (clipped tokens carry no gradient).
    """
    d = logp - old_logp
    a = adv[:, None]
    d_clip = jnp.where(a > 0, jnp.minimum(d, cfg.eps_high), jnp.maximum(d, -cfg.eps_low))
    u = -adv * jnp.exp(_seq_mean(d_clip, mask))
    return u, (a < 0) & (d < -cfg.eps_low), (a > 0) & (d > cfg.eps_high)


@loss("sapo")
def sapo(cfg, logp, old_logp, adv, mask):
    """SAPO: soft gate f(r) = (4/tau) sigmoid(tau (r - 1)), slope 1 at r = 1; tau by the sign of A."""
    tau = jnp.where(adv > 0, cfg.tau_pos, cfg.tau_neg)
    return _no_clip(-4.0 / tau * jax.nn.sigmoid(tau * (jnp.exp(logp - old_logp) - 1.0)) * adv)


@loss("cispo")
def cispo(cfg, logp, old_logp, adv, mask):
    """CISPO: REINFORCE weighted by the detached truncated ratio min(r, eps_max)."""
    ratio = jnp.exp(logp - old_logp)
    u = -sg(jnp.minimum(ratio, cfg.eps_max)) * adv * logp
    return u, jnp.zeros(u.shape, bool), ratio > cfg.eps_max


@loss("reinforce")
def reinforce(cfg, logp, old_logp, adv, mask):
    """REINFORCE with the given (baseline-subtracted) advantages; no ratio."""
    return _no_clip(-adv * logp)


def kl_penalty(cfg: "AlgorithmConfig", logp, ref_logp):
    """Per-token KL estimate to the reference: k1, k2 or k3 (exponent clamped to [-20, 20], value <= 10)."""
    if cfg.kl_estimator == "k1":
        return logp - ref_logp
    if cfg.kl_estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    return _k3(logp, ref_logp)


def _k3(logp, ref_logp):
    diff = ref_logp - logp
    return jnp.minimum(jnp.exp(jnp.clip(diff, -20.0, 20.0)) - diff - 1.0, 10.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Normalizer:
    """Whole-step denominators: N (completions with >= 1 counted token), counted tokens, L_max."""

    num_sequences: Float[Array, ""]
    num_tokens: Float[Array, ""]
    max_completion_len: Float[Array, ""]


def normalizer(cfg: "AlgorithmConfig", mask: Float[Array, "batch seq"], max_completion_len: int) -> Normalizer:
    """Denominators of the FULL optimizer-step batch; pass the result to every micro-batch's policy_loss.

    N counts completions with at least one counted token (padding rows and fully masked completions
    contribute 0 and are not counted, as in verl); `max_completion_len` is the configured limit L_max
    (SamplingConfig.max_new_tokens) used by seq_mean_token_sum_norm.
    """
    if max_completion_len < 1:
        raise ValueError(
            f"normalizer: max_completion_len={max_completion_len} (aggregation={cfg.aggregation!r}); pass the "
            "completion limit L_max >= 1, i.e. SamplingConfig.max_new_tokens."
        )
    mask = jnp.asarray(mask, jnp.float32)
    return Normalizer(
        num_sequences=jnp.maximum((mask.sum(-1) > 0).sum().astype(jnp.float32), 1.0),
        num_tokens=jnp.maximum(mask.sum(), 1.0),
        max_completion_len=jnp.float32(max_completion_len),
    )


def aggregate(aggregation: str, u, mask, norm: Normalizer) -> Float[Array, ""]:
    """This micro-batch's exact share of the step loss; u is [batch, seq] or, for seq_mean, [batch]."""
    if aggregation == "seq_mean":
        return (u * (mask.sum(-1) > 0)).sum() / norm.num_sequences
    if aggregation == "token_mean":
        return (u * mask).sum() / norm.num_tokens
    if aggregation == "seq_mean_token_mean":
        return _seq_mean(u, mask).sum() / norm.num_sequences
    if aggregation == "seq_mean_token_sum":
        return (u * mask).sum() / norm.num_sequences
    return (u * mask).sum() / (norm.num_sequences * norm.max_completion_len)


def _mean(x, w):
    return (x * w).sum(), w.sum()


def _max(x, w):
    return jnp.where(w > 0, x, -jnp.inf).max(), w.sum()


def _min(x, w):
    return jnp.where(w > 0, x, jnp.inf).min(), w.sum()


def policy_loss(
    cfg: "AlgorithmConfig",
    logp: Float[Array, "batch seq"],
    old_logp: Float[Array, "batch seq"],
    advantages: Float[Array, " batch"] | Float[Array, "batch seq"],
    mask: Float[Array, "batch seq"],
    ref_logp: Float[Array, "batch seq"] | None = None,
    sampler_logp: Float[Array, "batch seq"] | None = None,
    entropy: Float[Array, "batch seq"] | None = None,
    *,
    normalizer: Normalizer,
) -> tuple[Float[Array, ""], dict[str, tuple[Float[Array, ""], Float[Array, ""]]]]:
    """(loss, metrics) of one micro-batch: its exact share of the step loss given the step `normalizer`.

    Per-token KL (beta * k) and entropy bonus (-entropy_coef * H) are added to token unit losses
    before aggregation; for sequence losses their per-sequence token mean is added to u_i (the 1/L_i
    weights of the sequence form). Truncated IS weights min(exp(l^old - l^samp), C) (token or
    sequence level, detached) multiply the policy unit loss.
    """
    is_seq = cfg.loss in SEQUENCE_LOSSES
    if logp.ndim != 2 or not (logp.shape == old_logp.shape == mask.shape):
        raise ValueError(f"policy_loss: logp {logp.shape}, old_logp {old_logp.shape}, mask {mask.shape} must all be [batch, seq].")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"policy_loss: advantages {advantages.shape} must be [batch] or [batch, seq] = {logp.shape}.")
    if is_seq and advantages.ndim == 2:
        raise ValueError(
            f"policy_loss: loss={cfg.loss!r} is a sequence loss and needs one advantage per completion "
            "[batch]; for token-level advantages use loss='gspo_token' (GSPO) or a token loss."
        )
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError(f"policy_loss: AlgorithmConfig.beta={cfg.beta} needs ref_logp (or set beta=0).")
    if cfg.tis_level is not None and sampler_logp is None:
        raise ValueError(f"policy_loss: AlgorithmConfig.tis_level={cfg.tis_level!r} needs sampler_logp (or set tis_level=None).")
    if cfg.entropy_coef != 0 and entropy is None:
        raise ValueError(f"policy_loss: AlgorithmConfig.entropy_coef={cfg.entropy_coef} needs entropy.")

    mask = mask.astype(jnp.float32)
    on = mask > 0
    logp = logp.astype(jnp.float32)
    logp_safe = jnp.where(on, logp, 0.0)  # D = 0 where masked; where() also blocks their gradient
    old_logp = jnp.where(on, old_logp.astype(jnp.float32), 0.0)
    seq_on = (mask.sum(-1) > 0).astype(jnp.float32)  # completions with >= 1 counted token
    adv = advantages.astype(jnp.float32)
    if not is_seq:
        adv = jnp.where(on, adv if adv.ndim == 2 else jnp.broadcast_to(adv[:, None], logp.shape), 0.0)

    u, low, high = LOSSES[cfg.loss](cfg, logp_safe, old_logp, adv, mask)

    metrics = {}
    if sampler_logp is not None:
        samp_diff = jnp.where(on, old_logp - sampler_logp.astype(jnp.float32), 0.0)
        if cfg.tis_level is not None:
            log_w = samp_diff if cfg.tis_level == "token" else samp_diff.sum(-1)
            w = sg(jnp.minimum(jnp.exp(log_w), cfg.tis_cap))
            u = u * (w[:, None] if w.ndim < u.ndim else w)
            metrics["tis_weight_mean"] = _mean(w, mask if cfg.tis_level == "token" else seq_on)
        metrics["sampler_drift_mean"] = _mean(jnp.abs(samp_diff), mask)
        metrics["sampler_drift_max"] = _max(jnp.abs(samp_diff), mask)

    reg = jnp.zeros_like(logp_safe)
    if ref_logp is not None:
        ref_logp = jnp.where(on, ref_logp.astype(jnp.float32), 0.0)
        metrics["kl_k3_mean"] = _mean(_k3(logp_safe, ref_logp), mask)
        if cfg.beta > 0:
            reg = reg + cfg.beta * kl_penalty(cfg, logp_safe, ref_logp)
    if entropy is not None:
        entropy = jnp.where(on, entropy.astype(jnp.float32), 0.0)
        metrics["entropy_mean"] = _mean(entropy, mask)
        if cfg.entropy_coef != 0:
            reg = reg - cfg.entropy_coef * entropy
    u = u + _seq_mean(reg, mask) if is_seq else u + reg
    loss_value = aggregate(cfg.aggregation, u, mask, normalizer)

    d = sg(logp_safe - old_logp)
    unit_w = mask if low.ndim == 2 else seq_on  # clip flags per token or per sequence
    metrics["clip_frac_low"] = _mean(low.astype(jnp.float32), unit_w)
    metrics["clip_frac_high"] = _mean(high.astype(jnp.float32), unit_w)
    metrics["ratio_mean"] = _mean(jnp.exp(d), mask)
    metrics["ratio_min"] = _min(jnp.exp(d), mask)
    metrics["ratio_max"] = _max(jnp.exp(d), mask)
    metrics["log_ratio_abs_max"] = _max(jnp.abs(d), mask)
    return loss_value, jax.tree.map(sg, metrics)


def combine_metrics(a: dict, b: dict) -> dict:
    """Merges two micro-batches' metrics exactly (sum for means, max/min for *_max/*_min)."""
    out = {}
    for name, (va, wa) in a.items():
        vb, wb = b[name]
        v = jnp.maximum(va, vb) if name.endswith("_max") else jnp.minimum(va, vb) if name.endswith("_min") else va + vb
        out[name] = (v, wa + wb)
    return out


def finalize_metrics(metrics: dict) -> dict[str, Float[Array, ""]]:
    """Plain values: weighted means, and max/min as is; 0 where nothing was counted."""
    return {
        name: jnp.where(w > 0, v if name.endswith(("_max", "_min")) else v / jnp.maximum(w, 1e-30), 0.0)
        for name, (v, w) in metrics.items()
    }
