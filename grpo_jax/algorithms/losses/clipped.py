"""Clipped importance-ratio surrogates: the PPO/GRPO token clip, GSPO's sequence ratio, and the
variants that change which ratio is clipped or where its bounds lie."""

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import SURROGATE, SURROGATE_FIELDS, LossTerms, loss, sg, surrogate
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric
from kernels.ratio_clip import LOG_RATIO_BOUND


@loss("ppo_clip", unit="token", reference=reference.ppo_clip, **SURROGATE)
def ppo_clip(cfg, x):
    """GRPO/DAPO/Dr. GRPO token surrogate, optional `delta` cap and dual clip `clip_c`."""
    return surrogate(cfg, x, x.logp - x.old_logp, x.advantages)


@loss("gspo", unit="sequence", reference=reference.gspo, **SURROGATE)
def gspo(cfg, x):
    """GSPO (arXiv 2507.18071): clip the sequence ratio s_i = exp(mean_t D); gradient flows through s_i."""
    return surrogate(cfg, x, x.seq_mean(x.logp - x.old_logp), x.advantages)


def _token_sequence_log_ratio(x):
    """log rho_{i,t} = sg(log s_i) + l - sg(l): the value of GSPO's sequence ratio, d rho / d l_t = rho."""
    return sg(x.seq_mean(x.logp - x.old_logp))[:, None] + x.logp - sg(x.logp)


@loss("gspo_token", unit="token", reference=reference.gspo_token, **SURROGATE)
def gspo_token(cfg, x):
    """GSPO-token: rho = sg(s_i) exp(l - sg(l)) has the value of s_i and d rho / d l_t = s_i per token."""
    return surrogate(cfg, x, _token_sequence_log_ratio(x), x.advantages)


@loss("holder", unit="sequence", reference=reference.holder, fields=(*SURROGATE_FIELDS, "holder_p"),
      ratio=True, kernel="ratio_clip")
def holder(cfg, x):
    """HolderPO (arXiv 2605.12058): the sequence ratio is the Holder (power) mean of the token ratios,
    M_p = (mean_t r^p)^(1/p) (p = 0: the geometric mean, GSPO's s_i), clipped per sequence as GSPO.
    Computed in log space: log M_p = (logsumexp_t(p D) - log L) / p, D clamped to +-20 first."""
    d = jnp.clip(x.logp - x.old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if cfg.holder_p == 0:
        log_ratio = x.seq_mean(d)
    else:
        p, on = cfg.holder_p, x.mask > 0
        row = on.any(-1)
        top = sg(jnp.max(jnp.where(on, p * d, -jnp.inf), axis=-1))  # stabilizer; -inf-free below
        top = jnp.where(row, top, 0.0)
        total = jnp.exp(jnp.where(on, p * d - top[:, None], -jnp.inf)).sum(-1)
        log_mean = top + jnp.log(jnp.where(row, total, 1.0)) - jnp.log(jnp.maximum(x.mask.sum(-1), 1.0))
        log_ratio = jnp.where(row, log_mean / p, 0.0)
    return surrogate(cfg, x, log_ratio, x.advantages)


@loss("abc_grpo", unit="token", ratio=True, reference=reference.abc_grpo,
      fields=("eps_low", "eps_high", "neg_eps_low", "neg_eps_high"))
def abc_grpo(cfg, x):
    """ABC-GRPO (arXiv 2601.03895, Eq. 8): u = -clip(r, 1 - eps_low, 1 + eps_high) A for A > 0 and
    -clip(r, 1 - neg_eps_low, 1 + neg_eps_high) A for A <= 0: unconditional bounds in all four
    (sign A, r) quadrants, no min; outside its bounds a token carries no gradient."""
    ratio = clamped_exp(x.logp - x.old_logp)
    pos = x.advantages > 0
    lo = jnp.where(pos, 1.0 - cfg.eps_low, 1.0 - cfg.neg_eps_low)
    hi = jnp.where(pos, 1.0 + cfg.eps_high, 1.0 + cfg.neg_eps_high)
    active = x.advantages != 0
    return LossTerms(-jnp.clip(ratio, lo, hi) * x.advantages, active & (ratio < lo), active & (ratio > hi))


@loss("dhpo", unit="token", ratio=True, reference=reference.dhpo,
      fields=("eps_low", "eps_high", "seq_eps_low", "seq_eps_high", "dhpo_alpha"))
def dhpo(cfg, x):
    """DHPO, averaged mixing (arXiv 2601.05607; abstract-level reading, see docs/algorithms.md): the
    token ratio r and the sequence ratio (GSPO-token's rho) are each clipped in their own trust
    region, then mixed with weight alpha: rho = a r + (1 - a) rho_seq, rho~ = a clip(r) + (1 - a)
    clip_seq(rho_seq); u = -min(rho A, rho~ A). Flags: the clipped mix is the active branch."""
    a = cfg.dhpo_alpha
    r = clamped_exp(x.logp - x.old_logp)
    s = clamped_exp(_token_sequence_log_ratio(x))
    mixed = a * r + (1 - a) * s
    clipped = (a * jnp.clip(r, 1 - cfg.eps_low, 1 + cfg.eps_high)
               + (1 - a) * jnp.clip(s, 1 - cfg.seq_eps_low, 1 + cfg.seq_eps_high))
    adv = x.advantages
    u = jnp.maximum(-mixed * adv, -clipped * adv)
    return LossTerms(u, (adv < 0) & (clipped > mixed), (adv > 0) & (clipped < mixed))


@loss("llds", unit="token", reference=reference.llds, fields=(*SURROGATE_FIELDS, "llds_coef"), ratio=True,
      kernel="ratio_clip")
def llds(cfg, x):
    """GRPO + LLDS (arXiv 2512.04220, Eq. 5, as its public reimplementations read it): the PPO
    surrogate plus llds_coef * max(0, l^old - l) on the tokens whose likelihood fell, only in
    completions whose whole likelihood fell (sum_t D < 0) and whose advantage is >= 0 (the gate is
    detached)."""
    d = x.logp - x.old_logp
    terms = surrogate(cfg, x, d, x.advantages)
    adv = x.advantages if x.advantages.ndim == 1 else x.seq_mean(x.advantages)
    gate = sg(((d * x.mask).sum(-1) < 0) & (adv >= 0)).astype(jnp.float32)[:, None]
    penalty = cfg.llds_coef * gate * jnp.maximum(-d, 0.0)
    metrics = {**terms.metrics, "llds_active_frac": Metric.mean(gate * (d < 0), x.mask)}
    return LossTerms(terms.u + penalty, terms.clipped_low, terms.clipped_high, metrics)
