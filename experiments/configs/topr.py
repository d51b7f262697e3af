"""A variant added in one file: TOPR, Tapered Off-Policy REINFORCE (Le Roux et al., arXiv 2503.14286).

A completion with A > 0 is pushed up as in REINFORCE, with no importance weight; one with A < 0 is
pushed down with its weight truncated, min(pi / pi_old, cap), detached. The loss, its parameters, its
float64 reference and a preset are registered here; `get_config()` trains the quickstart's task with it:

    python -m grpo_jax.train --config experiments/configs/topr.py --set algorithm.loss.cap=0.5
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.algorithms import LossParams, LossTerms, loss, preset
from grpo_jax.config import AlgorithmConfig, Config

from .quickstart import get_config as quickstart


@dataclasses.dataclass(frozen=True)
class Topr(LossParams):
    """`cap`: the truncation of a negative completion's importance weight (the paper's 1)."""

    cap: float = 1.0

    def __post_init__(self):
        self.check({"cap": (self.cap > 0, "must be > 0")})


def reference(p, c):
    """Float64, one completion's counted tokens (see grpo_jax.algorithms.reference.losses)."""
    ratio = np.exp(np.clip(c.f - c.o, -20, 20))
    weight = np.where(c.a > 0, 1.0, np.minimum(ratio, p.cap))
    return -weight * c.a * c.l, None, (c.a < 0) & (ratio > p.cap)


@loss("topr", params=Topr, unit="token", ratio=True, reference=reference)
def topr(p, x):
    ratio = jnp.exp(jnp.clip(x.logp - x.old_logp, -20, 20))
    weight = jnp.where(x.advantages > 0, 1.0, jnp.minimum(jax.lax.stop_gradient(ratio), p.cap))
    return LossTerms(-weight * x.advantages * x.logp, None, (x.advantages < 0) & (ratio > p.cap))


preset("topr", "TOPR 2503.14286", beta=0.0, loss="topr", aggregation="token_mean")


def get_config() -> Config:
    cfg = quickstart()
    return dataclasses.replace(cfg, algorithm=AlgorithmConfig.from_preset("topr"),
                               train=dataclasses.replace(cfg.train, out_dir="runs/topr"))
