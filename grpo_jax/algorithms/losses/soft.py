"""Losses without PPO's hard min: GMPO's log-space clip inside a geometric mean, soft gates (SAPO per
token, SSPO inside the sequence ratio), CISPO's detached truncated weight, and plain REINFORCE."""

import jax
import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import LossTerms, loss, sg
from grpo_jax.algorithms.ratio import clamped_exp


@loss("gmpo", unit="sequence", ratio=True, fields=("eps_low", "eps_high"), reference=reference.gmpo)
def gmpo(cfg, x):
    """GMPO: per-token log-space clip with the sign rule, then u_i = -A_i exp(mean_t D~).

    Its clip flags are per token, where the clip acts (clipped tokens carry no gradient).
    """
    d = x.logp - x.old_logp
    a = x.advantages[:, None]
    d_clip = jnp.where(a > 0, jnp.minimum(d, cfg.eps_high), jnp.maximum(d, -cfg.eps_low))
    u = -x.advantages * clamped_exp(x.seq_mean(d_clip))
    return LossTerms(u, (a < 0) & (d < -cfg.eps_low), (a > 0) & (d > cfg.eps_high))


def _tau(cfg, adv):
    return jnp.where(adv > 0, cfg.tau_pos, cfg.tau_neg)


@loss("sapo", unit="token", ratio=True, fields=("tau_pos", "tau_neg"), reference=reference.sapo)
def sapo(cfg, x):
    """SAPO: soft gate f(r) = (4/tau) sigmoid(tau (r - 1)), slope 1 at r = 1; tau by the sign of A."""
    tau = _tau(cfg, x.advantages)
    return LossTerms(-4.0 / tau * jax.nn.sigmoid(tau * (clamped_exp(x.logp - x.old_logp) - 1.0)) * x.advantages)


@loss("sspo", unit="sequence", ratio=True, fields=("tau_pos", "tau_neg"), reference=reference.sspo)
def sspo(cfg, x):
    """SSPO (arXiv 2602.19327; abstract-level reading, see docs/algorithms.md): SAPO's soft gate on
    every token ratio, aggregated by a geometric mean into the sequence weight:
    u_i = -A_i exp(mean_t log f(r_t)), f(r) = (4/tau) sigmoid(tau (r - 1)), tau by the sign of A_i."""
    tau = _tau(cfg, x.advantages)[:, None]
    log_gate = jnp.log(4.0 / tau) + jax.nn.log_sigmoid(tau * (clamped_exp(x.logp - x.old_logp) - 1.0))
    return LossTerms(-x.advantages * jnp.exp(x.seq_mean(log_gate)))


@loss("cispo", unit="token", ratio=True, fields=("eps_max",), reference=reference.cispo)
def cispo(cfg, x):
    """CISPO: REINFORCE weighted by the detached truncated ratio min(r, eps_max)."""
    ratio = clamped_exp(x.logp - x.old_logp)
    return LossTerms(-sg(jnp.minimum(ratio, cfg.eps_max)) * x.advantages * x.logp, None, ratio > cfg.eps_max)


@loss("reinforce", unit="token", ratio=False, reference=reference.reinforce)
def reinforce(cfg, x):
    """REINFORCE with the given (baseline-subtracted) advantages; no ratio: exactly on-policy."""
    return LossTerms(-x.advantages * x.logp)
