"""Losses without PPO's hard min: GMPO's log-space clip inside a geometric mean, soft gates (SAPO per
token, SSPO inside the sequence ratio), CISPO's detached truncated weight, and plain REINFORCE."""

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import LossParams, LossTerms, loss, sg
from grpo_jax.algorithms.ratio import clamped_exp


@dataclasses.dataclass(frozen=True)
class Gmpo(LossParams):
    """Log-space clips of the token log-ratios: [-eps_low, eps_high] (the paper's (e^-0.4, e^0.4))."""

    eps_low: float = 0.4
    eps_high: float = 0.4

    def __post_init__(self):
        self.check({"eps_low": (self.eps_low >= 0, "must be >= 0 (a log-space clip)"),
                    "eps_high": (self.eps_high >= 0, "must be >= 0 (a log-space clip)")})


@loss("gmpo", params=Gmpo, unit="sequence", ratio=True, reference=reference.gmpo,
      test_params=dict(eps_low=0.1, eps_high=0.15))
def gmpo(p, x):
    """GMPO: per-token log-space clip with the sign rule, then u_i = -A_i exp(mean_t D~).

    Its clip flags are per token, where the clip acts (clipped tokens carry no gradient).
    """
    d = x.logp - x.old_logp
    a = x.advantages[:, None]
    d_clip = jnp.where(a > 0, jnp.minimum(d, p.eps_high), jnp.maximum(d, -p.eps_low))
    u = -x.advantages * clamped_exp(x.seq_mean(d_clip))
    return LossTerms(u, (a < 0) & (d < -p.eps_low), (a > 0) & (d > p.eps_high))


def _tau(p, adv):
    return jnp.where(adv > 0, p.tau_pos, p.tau_neg)


@dataclasses.dataclass(frozen=True)
class Sapo(LossParams):
    """The soft gate's temperatures for A > 0 (tau_pos) and A <= 0 (tau_neg)."""

    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self):
        self.check({"tau_pos": (self.tau_pos > 0, "must be > 0"), "tau_neg": (self.tau_neg > 0, "must be > 0")})


@dataclasses.dataclass(frozen=True)
class Sspo(Sapo):
    """SAPO's temperatures, inside the sequence ratio."""


@loss("sapo", params=Sapo, unit="token", ratio=True, reference=reference.sapo)
def sapo(p, x):
    """SAPO: soft gate f(r) = (4/tau) sigmoid(tau (r - 1)), slope 1 at r = 1; tau by the sign of A."""
    tau = _tau(p, x.advantages)
    return LossTerms(-4.0 / tau * jax.nn.sigmoid(tau * (clamped_exp(x.logp - x.old_logp) - 1.0)) * x.advantages)


@loss("sspo", params=Sspo, unit="sequence", ratio=True, reference=reference.sspo)
def sspo(p, x):
    """SSPO (arXiv 2602.19327; abstract-level reading, see docs/algorithms.md): SAPO's soft gate on
    every token ratio, aggregated by a geometric mean into the sequence weight:
    u_i = -A_i exp(mean_t log f(r_t)), f(r) = (4/tau) sigmoid(tau (r - 1)), tau by the sign of A_i."""
    tau = _tau(p, x.advantages)[:, None]
    log_gate = jnp.log(4.0 / tau) + jax.nn.log_sigmoid(tau * (clamped_exp(x.logp - x.old_logp) - 1.0))
    return LossTerms(-x.advantages * jnp.exp(x.seq_mean(log_gate)))


@dataclasses.dataclass(frozen=True)
class Cispo(LossParams):
    """`eps_max`: the cap of the detached importance weight."""

    eps_max: float = 5.0

    def __post_init__(self):
        self.check({"eps_max": (self.eps_max > 0, "must be > 0")})


@loss("cispo", params=Cispo, unit="token", ratio=True, reference=reference.cispo, test_params=dict(eps_max=1.1))
def cispo(p, x):
    """CISPO: REINFORCE weighted by the detached truncated ratio min(r, eps_max)."""
    ratio = clamped_exp(x.logp - x.old_logp)
    return LossTerms(-sg(jnp.minimum(ratio, p.eps_max)) * x.advantages * x.logp, None, ratio > p.eps_max)


@loss("reinforce", unit="token", ratio=False, reference=reference.reinforce)
def reinforce(p, x):
    """REINFORCE with the given (baseline-subtracted) advantages; no ratio: exactly on-policy."""
    return LossTerms(-x.advantages * x.logp)
