"""Clipped importance-ratio surrogates: the PPO/GRPO token clip, GSPO's sequence ratio, and the
variants that change which ratio is clipped or where its bounds lie."""

import dataclasses

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import (
    CLIP_TEST, SURROGATE, Clip, LossParams, LossTerms, loss, ratio_bounds, sg, surrogate,
)
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric
from kernels.ratio_clip import LOG_RATIO_BOUND


@dataclasses.dataclass(frozen=True)
class PpoClip(Clip):
    """GRPO's token clip (DeepSeekMath's 0.2)."""


@dataclasses.dataclass(frozen=True)
class Gspo(Clip):
    """GSPO's sequence-ratio clip: the paper's range (arXiv 2507.18071, sec. 5.1)."""

    eps_low: float = 3e-4
    eps_high: float = 4e-4


@dataclasses.dataclass(frozen=True)
class GspoToken(Gspo):
    """GSPO-token: GSPO's range."""


@loss("ppo_clip", params=PpoClip, unit="token", reference=reference.ppo_clip, test_params=CLIP_TEST, **SURROGATE)
def ppo_clip(p, x):
    """GRPO/DAPO/Dr. GRPO token surrogate, optional `delta` cap and dual clip `clip_c`."""
    return surrogate(p, x, x.logp - x.old_logp, x.advantages)


@loss("gspo", params=Gspo, unit="sequence", reference=reference.gspo, test_params=CLIP_TEST, **SURROGATE)
def gspo(p, x):
    """GSPO (arXiv 2507.18071): clip the sequence ratio s_i = exp(mean_t D); gradient flows through s_i."""
    return surrogate(p, x, x.seq_mean(x.logp - x.old_logp), x.advantages)


def _token_sequence_log_ratio(x):
    """log rho_{i,t} = sg(log s_i) + l - sg(l): the value of GSPO's sequence ratio, d rho / d l_t = rho."""
    return sg(x.seq_mean(x.logp - x.old_logp))[:, None] + x.logp - sg(x.logp)


@loss("gspo_token", params=GspoToken, unit="token", reference=reference.gspo_token, test_params=CLIP_TEST,
      **SURROGATE)
def gspo_token(p, x):
    """GSPO-token: rho = sg(s_i) exp(l - sg(l)) has the value of s_i and d rho / d l_t = s_i per token."""
    return surrogate(p, x, _token_sequence_log_ratio(x), x.advantages)


@dataclasses.dataclass(frozen=True)
class Holder(Clip):
    """`p`: the exponent of the power mean of the token ratios (0: the geometric mean, GSPO's)."""

    p: float = 1.0


@loss("holder", params=Holder, unit="sequence", reference=reference.holder, test_params=dict(CLIP_TEST, p=2.0),
      **SURROGATE)
def holder(p, x):
    """HolderPO (arXiv 2605.12058): the sequence ratio is the Holder (power) mean of the token ratios,
    M_p = (mean_t r^p)^(1/p) (p = 0: the geometric mean, GSPO's s_i), clipped per sequence as GSPO.
    Computed in log space: log M_p = (logsumexp_t(p D) - log L) / p, D clamped to +-20 first."""
    d = jnp.clip(x.logp - x.old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if p.p == 0:
        log_ratio = x.seq_mean(d)
    else:
        power, on = p.p, x.mask > 0
        row = on.any(-1)
        top = sg(jnp.max(jnp.where(on, power * d, -jnp.inf), axis=-1))  # stabilizer; -inf-free below
        top = jnp.where(row, top, 0.0)
        total = jnp.exp(jnp.where(on, power * d - top[:, None], -jnp.inf)).sum(-1)
        log_mean = top + jnp.log(jnp.where(row, total, 1.0)) - jnp.log(jnp.maximum(x.mask.sum(-1), 1.0))
        log_ratio = jnp.where(row, log_mean / power, 0.0)
    return surrogate(p, x, log_ratio, x.advantages)


@dataclasses.dataclass(frozen=True)
class AbcGrpo(LossParams):
    """The ratio bounds for A > 0 (eps_low, eps_high) and for A <= 0 (neg_eps_low, neg_eps_high)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    neg_eps_low: float = 0.2
    neg_eps_high: float = 0.2

    def __post_init__(self):
        self.check({**ratio_bounds(self), **ratio_bounds(self, "neg_eps_low", "neg_eps_high")})


@loss("abc_grpo", params=AbcGrpo, unit="token", ratio=True, reference=reference.abc_grpo,
      test_params=dict(CLIP_TEST, neg_eps_low=0.05, neg_eps_high=0.12))
def abc_grpo(p, x):
    """ABC-GRPO (arXiv 2601.03895, Eq. 8): u = -clip(r, 1 - eps_low, 1 + eps_high) A for A > 0 and
    -clip(r, 1 - neg_eps_low, 1 + neg_eps_high) A for A <= 0: unconditional bounds in all four
    (sign A, r) quadrants, no min; outside its bounds a token carries no gradient."""
    ratio = clamped_exp(x.logp - x.old_logp)
    pos = x.advantages > 0
    lo = jnp.where(pos, 1.0 - p.eps_low, 1.0 - p.neg_eps_low)
    hi = jnp.where(pos, 1.0 + p.eps_high, 1.0 + p.neg_eps_high)
    active = x.advantages != 0
    return LossTerms(-jnp.clip(ratio, lo, hi) * x.advantages, active & (ratio < lo), active & (ratio > hi))


@dataclasses.dataclass(frozen=True)
class Dhpo(LossParams):
    """The token ratio's clip (eps_low, eps_high), the sequence ratio's (seq_eps_low, seq_eps_high:
    GSPO's range) and `alpha`, the token ratio's weight in the mix (0.5: averaged mixing)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    seq_eps_low: float = 3e-4
    seq_eps_high: float = 4e-4
    alpha: float = 0.5

    def __post_init__(self):
        self.check({
            **ratio_bounds(self), **ratio_bounds(self, "seq_eps_low", "seq_eps_high"),
            "alpha": (0 <= self.alpha <= 1, "must lie in [0, 1] (1: token ratio only, 0: sequence ratio only)"),
        })


@loss("dhpo", params=Dhpo, unit="token", ratio=True, reference=reference.dhpo,
      test_params=dict(CLIP_TEST, seq_eps_low=0.03, seq_eps_high=0.04))
def dhpo(p, x):
    """DHPO, averaged mixing (arXiv 2601.05607; abstract-level reading, see docs/algorithms.md): the
    token ratio r and the sequence ratio (GSPO-token's rho) are each clipped in their own trust
    region, then mixed with weight alpha: rho = a r + (1 - a) rho_seq, rho~ = a clip(r) + (1 - a)
    clip_seq(rho_seq); u = -min(rho A, rho~ A). Flags: the clipped mix is the active branch."""
    a = p.alpha
    r = clamped_exp(x.logp - x.old_logp)
    s = clamped_exp(_token_sequence_log_ratio(x))
    mixed = a * r + (1 - a) * s
    clipped = (a * jnp.clip(r, 1 - p.eps_low, 1 + p.eps_high)
               + (1 - a) * jnp.clip(s, 1 - p.seq_eps_low, 1 + p.seq_eps_high))
    adv = x.advantages
    u = jnp.maximum(-mixed * adv, -clipped * adv)
    return LossTerms(u, (adv < 0) & (clipped > mixed), (adv > 0) & (clipped < mixed))


@dataclasses.dataclass(frozen=True)
class Llds(Clip):
    """`coef`: the weight of the likelihood-preserving penalty."""

    coef: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        self.check({"coef": (self.coef >= 0, "must be >= 0")})


@loss("llds", params=Llds, unit="token", reference=reference.llds, test_params=dict(CLIP_TEST, coef=0.5), **SURROGATE)
def llds(p, x):
    """GRPO + LLDS (arXiv 2512.04220, Eq. 5, as its public reimplementations read it): the PPO
    surrogate plus coef * max(0, l^old - l) on the tokens whose likelihood fell, only in
    completions whose whole likelihood fell (sum_t D < 0) and whose advantage is >= 0 (the gate is
    detached)."""
    d = x.logp - x.old_logp
    terms = surrogate(p, x, d, x.advantages)
    adv = x.advantages if x.advantages.ndim == 1 else x.seq_mean(x.advantages)
    gate = sg(((d * x.mask).sum(-1) < 0) & (adv >= 0)).astype(jnp.float32)[:, None]
    penalty = p.coef * gate * jnp.maximum(-d, 0.0)
    metrics = {**terms.metrics, "llds_active_frac": Metric.mean(gate * (d < 0), x.mask)}
    return LossTerms(terms.u + penalty, terms.clipped_low, terms.clipped_high, metrics)
