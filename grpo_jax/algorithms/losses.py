"""Policy losses: the registry, and every loss of docs/algorithms.md as one function.

A loss is `fn(cfg, x: LossInputs) -> LossTerms`, registered with `@loss(name, ...)` which declares
everything the rest of the code must know about it (see `LossSpec`): its unit (token: u is
[batch, seq]; sequence: u is [batch]), whether it has an importance ratio (then it may run several
updates per rollout batch), the AlgorithmConfig fields it reads, its fused-kernel path, its float64
reference and, for losses that decide over the whole optimizer-step batch, a `select` function run
once per update by `step_stats`. Masking, KL, entropy, rollout correction, top-entropy selection
and aggregation are applied around it once, by `policy_loss`.

In `x`, D = logp - old_logp is 0 where mask = 0 (both are zeroed there), so padding never produces
inf/NaN and never reaches a value or a gradient; every ratio goes through `clamped_exp`.
"""

import dataclasses
from typing import TYPE_CHECKING, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

import kernels
from grpo_jax.algorithms import reference
from grpo_jax.algorithms.aggregation import UNITS, seq_mean_over_tokens
from grpo_jax.algorithms.ratio import clamped_exp, clipped_surrogate
from grpo_jax.algorithms.registry import Registry
from grpo_jax.metrics import Metric

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

sg = jax.lax.stop_gradient
KERNELS = (None, "ratio_clip")


@dataclasses.dataclass(frozen=True)
class LossInputs:
    """One micro-batch as a loss sees it (float32; masked entries of logp/old_logp are 0)."""

    logp: Float[ArrayLike, "batch seq"]  # carries the gradient
    old_logp: Float[ArrayLike, "batch seq"]
    advantages: Float[ArrayLike, "batch seq"] | Float[ArrayLike, " batch"]  # per token (0 where masked) or per sequence
    mask: Float[ArrayLike, "batch seq"]
    select: Float[ArrayLike, "batch seq"]  # the loss's step-level selection (0 unless it declares `select`)

    def seq_mean(self, x):
        """(1/L_i) sum_t m x per completion."""
        return seq_mean_over_tokens(x, self.mask)

    def unit_weight(self, like):
        """Weights of the units of `like`: the mask for [batch, seq], non-empty completions for [batch]."""
        return self.mask if like.ndim == 2 else (self.mask.sum(-1) > 0).astype(jnp.float32)


class LossTerms(NamedTuple):
    u: Float[Array, "..."]  # unit losses, [batch, seq] or [batch]
    clipped_low: Bool[Array, "..."] | None = None  # None: the loss never clips
    clipped_high: Bool[Array, "..."] | None = None
    metrics: dict | None = None  # extra diagnostics, {name: Metric}


@dataclasses.dataclass(frozen=True)
class LossSpec:
    fn: Callable[["AlgorithmConfig", LossInputs], LossTerms]
    unit: str  # "token" or "sequence"
    ratio: bool  # has an importance ratio: may run num_iterations > 1 and minibatches > 1
    clip_fields: tuple[str, ...]  # the AlgorithmConfig fields it reads (the others must stay default)
    kernel: str | None  # "ratio_clip": runs through kernels.ratio_clip, as AlgorithmConfig.ratio_impl picks
    reference: Callable  # float64 unit reference, see algorithms.reference
    select: Callable | None = None  # step-level token selection: needs step statistics (step_stats)
    select_reference: Callable | None = None


LOSSES: Registry[LossSpec] = Registry("loss")


def loss(name: str, *, unit: str, ratio: bool, reference: Callable, clip_fields: tuple[str, ...] = (),
         kernel: str | None = None, select: Callable | None = None, select_reference: Callable | None = None):
    """Registers a policy loss under `name` (the value of `AlgorithmConfig.loss`); see `LossSpec`."""
    if unit not in UNITS:
        raise ValueError(f"loss {name!r}: unit={unit!r}; choose one of {UNITS}")
    if kernel not in KERNELS:
        raise ValueError(f"loss {name!r}: kernel={kernel!r}; choose one of {KERNELS}")
    if (select is None) != (select_reference is None):
        raise ValueError(f"loss {name!r}: a step-level `select` needs its float64 `select_reference` (and vice versa)")

    def register(fn):
        LOSSES.add(name, LossSpec(fn, unit, ratio, tuple(clip_fields), kernel, reference, select, select_reference))
        return fn

    return register


def _surrogate(cfg, x: LossInputs, log_ratio, adv) -> LossTerms:
    """The clipped surrogate through `cfg.ratio_impl`: the fused kernel (`kernels.ratio_clip`, same
    values and gradients) or the jnp reference it replaces; counts the units capped by `delta`."""
    if cfg.ratio_impl == "reference":
        u, low, high = clipped_surrogate(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c)
    else:
        impl = None if cfg.ratio_impl == "auto" else cfg.ratio_impl
        u, low, high = kernels.ratio_clip(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c, impl=impl)
    metrics = {}
    if cfg.delta is not None:
        capped = clamped_exp(sg(log_ratio)) > cfg.delta
        metrics["delta_capped_frac"] = Metric.mean(capped, x.unit_weight(log_ratio))
    return LossTerms(u, low, high, metrics)


SURROGATE = dict(ratio=True, clip_fields=("eps_low", "eps_high", "delta", "clip_c"), kernel="ratio_clip")


@loss("ppo_clip", unit="token", reference=reference.ppo_clip, **SURROGATE)
def ppo_clip(cfg, x):
    """GRPO/DAPO/Dr. GRPO token surrogate, optional `delta` cap and dual clip `clip_c`."""
    return _surrogate(cfg, x, x.logp - x.old_logp, x.advantages)


@loss("gspo", unit="sequence", reference=reference.gspo, **SURROGATE)
def gspo(cfg, x):
    """GSPO (arXiv 2507.18071): clip the sequence ratio s_i = exp(mean_t D); gradient flows through s_i."""
    return _surrogate(cfg, x, x.seq_mean(x.logp - x.old_logp), x.advantages)


@loss("gspo_token", unit="token", reference=reference.gspo_token, **SURROGATE)
def gspo_token(cfg, x):
    """GSPO-token: rho = sg(s_i) exp(l - sg(l)) has the value of s_i and d rho / d l_t = s_i per token."""
    log_rho = sg(x.seq_mean(x.logp - x.old_logp))[:, None] + x.logp - sg(x.logp)
    return _surrogate(cfg, x, log_rho, x.advantages)


@loss("gmpo", unit="sequence", ratio=True, clip_fields=("eps_low", "eps_high"), reference=reference.gmpo)
def gmpo(cfg, x):
    """GMPO: per-token log-space clip with the sign rule, then u_i = -A_i exp(mean_t D~).

    Its clip flags are per token, where the clip acts (clipped tokens carry no gradient).
    """
    d = x.logp - x.old_logp
    a = x.advantages[:, None]
    d_clip = jnp.where(a > 0, jnp.minimum(d, cfg.eps_high), jnp.maximum(d, -cfg.eps_low))
    u = -x.advantages * clamped_exp(x.seq_mean(d_clip))
    return LossTerms(u, (a < 0) & (d < -cfg.eps_low), (a > 0) & (d > cfg.eps_high))


@loss("sapo", unit="token", ratio=True, clip_fields=("tau_pos", "tau_neg"), reference=reference.sapo)
def sapo(cfg, x):
    """SAPO: soft gate f(r) = (4/tau) sigmoid(tau (r - 1)), slope 1 at r = 1; tau by the sign of A."""
    tau = jnp.where(x.advantages > 0, cfg.tau_pos, cfg.tau_neg)
    return LossTerms(-4.0 / tau * jax.nn.sigmoid(tau * (clamped_exp(x.logp - x.old_logp) - 1.0)) * x.advantages)


@loss("cispo", unit="token", ratio=True, clip_fields=("eps_max",), reference=reference.cispo)
def cispo(cfg, x):
    """CISPO: REINFORCE weighted by the detached truncated ratio min(r, eps_max)."""
    ratio = clamped_exp(x.logp - x.old_logp)
    return LossTerms(-sg(jnp.minimum(ratio, cfg.eps_max)) * x.advantages * x.logp, None, ratio > cfg.eps_max)


@loss("reinforce", unit="token", ratio=False, reference=reference.reinforce)
def reinforce(cfg, x):
    """REINFORCE with the given (baseline-subtracted) advantages; no ratio: exactly on-policy."""
    return LossTerms(-x.advantages * x.logp)


# ----------------------------------------------------------------------------- covariance losses
# "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617), as verl implements them
# (verl/trainer/ppo/core_algos.py: compute_policy_loss_clip_cov / _kl_cov): the token covariance
# cov = (A - mean A)(l - mean l) over the counted tokens of the whole step batch decides which
# tokens are restricted. The decision is taken once per update by `step_stats` (exact under
# micro-batching and sharding, where verl takes it per micro-batch).
def _covariance(logp, adv, mask):
    n = jnp.maximum(mask.sum(), 1.0)
    return (adv - (adv * mask).sum() / n) * (logp - (logp * mask).sum() / n)


def _count(fraction, mask):
    """max(floor(fraction * counted tokens), 1) (the relative slack absorbs float32 rounding)."""
    return jnp.maximum(jnp.floor(fraction * mask.sum() * (1 + 1e-6)), 1.0)


def _first(key, eligible, n):
    """The n eligible tokens of smallest key (ties: first in the batch's row-major order)."""
    order = jnp.lexsort((key.reshape(-1), ~eligible.reshape(-1)))
    rank = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
    return eligible & (rank.reshape(eligible.shape) < n)


def clip_cov_select(cfg, logp, old_logp, adv, mask, priority):
    """Clip-Cov: a random max(int(r N), 1) of the counted tokens that the PPO clip leaves unclipped and
    whose covariance lies in (clip_cov_lb, clip_cov_ub); `priority` (a random permutation) picks them."""
    counted = mask > 0
    ratio = clamped_exp(logp - old_logp)
    clipped = ((adv < 0) & (ratio < 1 - cfg.eps_low)) | ((adv > 0) & (ratio > 1 + cfg.eps_high))
    cov = _covariance(logp, adv, mask)
    candidates = counted & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    return _first(priority, candidates, _count(cfg.clip_cov_ratio, mask))


def kl_cov_select(cfg, logp, old_logp, adv, mask, priority):
    """KL-Cov: the max(int(k N), 1) counted tokens of largest covariance."""
    return _first(-_covariance(logp, adv, mask), mask > 0, _count(cfg.kl_cov_ratio, mask))


def _selected_frac(x):
    return {"cov_selected_frac": Metric.mean(x.select, x.mask)}


@loss("clip_cov", unit="token", ratio=True, kernel="ratio_clip", reference=reference.clip_cov,
      clip_fields=("eps_low", "eps_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
      select=clip_cov_select, select_reference=reference.clip_cov_select)
def clip_cov(cfg, x):
    """Clip-Cov: the PPO surrogate with the selected high-covariance tokens' loss and gradient removed."""
    terms = _surrogate(cfg, x, x.logp - x.old_logp, x.advantages)
    return LossTerms(terms.u * (1.0 - x.select), terms.clipped_low, terms.clipped_high,
                     {**terms.metrics, **_selected_frac(x)})


@loss("kl_cov", unit="token", ratio=True, reference=reference.kl_cov, clip_fields=("kl_cov_ratio", "kl_cov_coef"),
      select=kl_cov_select, select_reference=reference.kl_cov_select)
def kl_cov(cfg, x):
    """KL-Cov: -A r, plus kl_cov_coef |D| on the selected tokens (no clip)."""
    d = x.logp - x.old_logp
    u = -x.advantages * clamped_exp(d) + cfg.kl_cov_coef * jnp.abs(d) * x.select
    return LossTerms(u, metrics=_selected_frac(x))
