"""Float64 unit references of the policy losses.

A unit reference gets one completion `c` (its counted tokens only) and returns (u, clipped_low,
clipped_high): u one value per token (token units) or one value (sequence units); the flags per
token or per sequence, or None for a loss that never clips. `c.l` carries the perturbation of a
gradient check, `c.f` holds the same log-probs fixed (what the library stops gradients through),
`c.o` the old log-probs, `c.a` the advantage per token, and the loss's step statistics (computed by
its reference in `reference.step`) are attributes too: this completion's value, or its counted
tokens' values (`c.select` for Clip-Cov and KL-Cov, `c.scale` and `c.center` for GVPO, ...).
"""

import math

import numpy as np

from grpo_jax.algorithms.reference.common import LOG_RATIO_BOUND, exp_clamped


def _surrogate(cfg, ratio, a):
    rho = ratio if cfg.delta is None else np.minimum(ratio, cfg.delta)
    u = -np.minimum(rho * a, np.clip(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * a)
    low = (a < 0) & (ratio < 1 - cfg.eps_low)
    high = (a > 0) & (ratio > 1 + cfg.eps_high)
    if cfg.clip_c is not None:
        dual = (a < 0) & (rho > cfg.clip_c)
        u = np.where(a < 0, np.minimum(u, -cfg.clip_c * a), u)
        high = high | dual
    return u, low, high


def _sequence_ratio(l, o):
    """GSPO s = (pi(y) / pi_old(y)) ** (1 / |y|), from the probabilities directly."""
    s = (np.prod(np.exp(l)) / np.prod(np.exp(o))) ** (1.0 / len(l))
    return np.clip(s, math.exp(-LOG_RATIO_BOUND), math.exp(LOG_RATIO_BOUND))


def ppo_clip(cfg, c):
    return _surrogate(cfg, exp_clamped(c.l - c.o), c.a)


def gspo(cfg, c):
    return _surrogate(cfg, _sequence_ratio(c.l, c.o), c.a[0])


def gspo_token(cfg, c):
    return _surrogate(cfg, exp_clamped(np.log(_sequence_ratio(c.f, c.o)) + c.l - c.f), c.a)


def gmpo(cfg, c):
    a = c.a[0]
    d = c.l - c.o
    lo, hi = -cfg.eps_low, cfg.eps_high
    d_clip = [min(x, np.clip(x, lo, hi)) if a > 0 else max(x, np.clip(x, lo, hi)) for x in d]
    flags_low, flags_high = (a < 0) & (d < lo), (a > 0) & (d > hi)
    return -a * exp_clamped(np.mean(d_clip)), flags_low, flags_high


def sapo(cfg, c):
    u = []
    for d, a in zip(c.l - c.o, c.a):
        tau = cfg.tau_pos if a > 0 else cfg.tau_neg
        u.append(-(4 / tau) / (1 + np.exp(-tau * (exp_clamped(d) - 1))) * a)
    return np.array(u), None, None


def cispo(cfg, c):
    ratio = exp_clamped(c.f - c.o)
    return -np.minimum(ratio, cfg.eps_max) * c.a * c.l, np.zeros(len(c.l), bool), ratio > cfg.eps_max


def reinforce(cfg, c):
    return -c.a * c.l, None, None


def clip_cov(cfg, c):
    u, low, high = _surrogate(cfg, exp_clamped(c.l - c.o), c.a)
    return u * (1 - c.select), low, high


def kl_cov(cfg, c):
    return -c.a * exp_clamped(c.l - c.o) + cfg.coef * np.abs(c.l - c.o) * c.select, None, None


def holder(cfg, c):
    """The Holder mean of the token ratios, (mean r^p)^(1/p), as a sequence ratio under GSPO's clip."""
    r = exp_clamped(c.l - c.o)
    p = cfg.p
    ratio = np.exp(np.mean(np.log(r))) if p == 0 else np.mean(r ** p) ** (1 / p)
    return _surrogate(cfg, float(np.clip(ratio, math.exp(-LOG_RATIO_BOUND), math.exp(LOG_RATIO_BOUND))), c.a[0])


def abc_grpo(cfg, c):
    r = exp_clamped(c.l - c.o)
    lo = np.where(c.a > 0, 1 - cfg.eps_low, 1 - cfg.neg_eps_low)
    hi = np.where(c.a > 0, 1 + cfg.eps_high, 1 + cfg.neg_eps_high)
    return -np.clip(r, lo, hi) * c.a, (c.a != 0) & (r < lo), (c.a != 0) & (r > hi)


def dhpo(cfg, c):
    a, alpha = c.a, cfg.alpha
    r = exp_clamped(c.l - c.o)
    s = exp_clamped(np.log(_sequence_ratio(c.f, c.o)) + c.l - c.f)
    mixed = alpha * r + (1 - alpha) * s
    clipped = (alpha * np.clip(r, 1 - cfg.eps_low, 1 + cfg.eps_high)
               + (1 - alpha) * np.clip(s, 1 - cfg.seq_eps_low, 1 + cfg.seq_eps_high))
    return -np.minimum(mixed * a, clipped * a), (a < 0) & (clipped > mixed), (a > 0) & (clipped < mixed)


def llds(cfg, c):
    u, low, high = _surrogate(cfg, exp_clamped(c.l - c.o), c.a)
    gate = (c.f - c.o).sum() < 0 and c.a.mean() >= 0
    return u + (cfg.coef * np.maximum(c.o - c.l, 0) if gate else 0), low, high


def sspo(cfg, c):
    """The geometric mean of SAPO's gates as the product's L-th root."""
    a = c.a[0]
    tau = cfg.tau_pos if a > 0 else cfg.tau_neg
    gates = (4 / tau) / (1 + np.exp(-tau * (exp_clamped(c.l - c.o) - 1)))
    return -a * np.prod(gates) ** (1 / len(gates)), None, None


def gvpo(cfg, c):
    return 0.5 * c.scale * (cfg.beta * np.sum(c.l - c.o) - c.center - c.a[0]) ** 2, None, None


def disco(cfg, c):
    score = np.mean(c.l) if cfg.score == "log_prob" else np.mean(exp_clamped(c.l - c.o))
    return c.coef * score + c.offset + c.kl_coef * np.sum(c.o - c.l), None, None


def gtpo(cfg, c):
    return -c.advantages * c.l, None, None


def egsw(cfg, c):
    u, low, high = _surrogate(cfg, exp_clamped(c.l - c.o), c.a)
    return u * c.weight, low, high
