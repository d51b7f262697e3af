"""Float64 NumPy references: a second, independent implementation of every registered variant.

Written from the formulas of docs/algorithms.md, not by calling the jnp code: loops over groups and
over each completion's counted tokens (masking by index selection, not by multiplication), products
of probabilities where the library sums log-probs, sorts where it ranks. Each registration names its
reference here (`reference=...`), and the registry-wide tests compare values, gradients (central
differences of `policy_loss`) and metrics against it for every registered name.

Conventions of the loss references: a unit reference gets one completion `c` (its counted tokens
only) and returns (u, clipped_low, clipped_high): u one value per token (token units) or one value
(sequence units); the flags per token or per sequence, or None for a loss that never clips.
`c.l` carries the perturbation of a gradient check, `c.f` holds the same log-probs fixed (what the
library stops gradients through), `c.o` the old log-probs, `c.a` the advantage per token and
`c.sel` the loss's step-level selection (Clip-Cov, KL-Cov), 0 elsewhere.
"""

import math
import types

import numpy as np

LOG_RATIO_BOUND = 20.0  # every log-ratio is clamped to +-20 before exp (verl, Tunix)


def exp_clamped(x):
    return np.exp(np.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


# ----------------------------------------------------------------------------- advantages
# fn(rewards f64[N], groups int[N], lengths[N], eps) -> advantages f64[N]; groups of >= 2.
def _by_group(fn):
    def estimate(r, groups, lengths, eps):
        out = np.zeros(len(r))
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            out[idx] = fn(r[idx], lengths[idx] if lengths is not None else None, r, eps)
        return out

    return estimate


group_std = _by_group(lambda rg, lg, r, eps: (rg - rg.mean()) / (rg.std(ddof=1) + eps))
group_mean = _by_group(lambda rg, lg, r, eps: rg - rg.mean())
rloo = _by_group(lambda rg, lg, r, eps: np.array([rg[i] - np.delete(rg, i).mean() for i in range(len(rg))]))
opo = _by_group(lambda rg, lg, r, eps: rg - (lg * rg).sum() / lg.sum())
batch_std = _by_group(lambda rg, lg, r, eps: (rg - rg.mean()) / (r.std(ddof=1) + eps))


def beta_norm(r, groups, lengths, eps):
    """BNPO (arXiv 2506.02864): rewards mapped to [0, 1] by the batch range, p = the group's mean,
    Beta(alpha, beta) fitted to the groups' p by moments, alpha = max(1 + a/3, 1) (same for beta),
    A = min(1 / pdf(p), 1e6) * (R - p)."""
    lo, hi = r.min(), r.max()
    s = (r - lo) / (hi - lo) if hi > lo else np.zeros_like(r)
    ids = np.unique(groups)
    p_of = {g: s[groups == g].mean() for g in ids}
    ps = np.array(list(p_of.values()))
    alpha = beta = 1.0
    if len(ps) > 1 and ps.var(ddof=1) > 0:
        m, v = ps.mean(), ps.var(ddof=1)
        common = m * (1 - m) / v - 1
        alpha, beta = max(1 + common * m / 3, 1.0), max(1 + common * (1 - m) / 3, 1.0)
    log_norm = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
    out = np.zeros(len(r))
    for i, g in enumerate(groups):
        p = p_of[g]
        if 0 < p < 1:  # p = 0 or 1: every reward of the group equals p, A = 0
            pdf = math.exp((alpha - 1) * math.log(p) + (beta - 1) * math.log1p(-p) - log_norm)
            out[i] = min(1 / pdf, 1e6) * (s[i] - p)
    return out


def compute_advantages(cfg, rewards, groups, lengths=None, weights=None):
    """The whole of `algorithms.compute_advantages` for rewards [N, K] and integer group ids."""
    from grpo_jax.algorithms.advantages import ADVANTAGES

    estimate = ADVANTAGES[cfg.advantage].reference
    rewards = np.asarray(rewards, np.float64).reshape(len(rewards), -1)
    w = np.ones(rewards.shape[1]) if weights is None else np.asarray(weights, np.float64)

    def zero_spread_to_zero(adv, signal):
        for g in np.unique(groups):
            if np.ptp(signal[groups == g]) == 0:
                adv[groups == g] = 0.0
        return adv

    if cfg.reward_combine == "sum_then_normalize":
        combined = rewards @ w
        adv = zero_spread_to_zero(estimate(combined, groups, lengths, cfg.adv_eps), combined)
    else:
        combined = sum(wk * zero_spread_to_zero(estimate(rewards[:, k], groups, lengths, cfg.adv_eps), rewards[:, k])
                       for k, wk in enumerate(w))
        combined = zero_spread_to_zero(combined, combined)
        adv = (combined - combined.mean()) / (combined.std(ddof=1) + cfg.adv_eps) if np.ptp(combined) > 0 else 0 * combined
        adv = zero_spread_to_zero(adv, combined)
    if cfg.gpg_scale:
        valid = np.array([np.ptp(combined[groups == g]) > 0 for g in groups])
        adv = adv * len(adv) / max(valid.sum(), 1)
    return adv


# ----------------------------------------------------------------------------- policy losses
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
    return u * (1 - c.sel), low, high


def kl_cov(cfg, c):
    return -c.a * exp_clamped(c.l - c.o) + cfg.kl_cov_coef * np.abs(c.l - c.o) * c.sel, None, None


# ----------------------------------------------------------------------------- step-level selections
# fn(cfg, logp, old_logp, advantages per token, mask, priority) -> bool [B, T], over the whole step batch
def _covariance(logp, adv, counted):
    """(A - mean A)(l - mean l), means over the counted tokens of the batch (verl's Clip/KL-Cov)."""
    return (adv - adv[counted].mean()) * (logp - logp[counted].mean())


def clip_cov_select(cfg, logp, old_logp, adv, mask, priority):
    """Clip-Cov: a random max(int(r N), 1) of the unclipped counted tokens with lb < cov < ub."""
    counted = mask > 0
    if not counted.any():
        return np.zeros(mask.shape, bool)
    cov = _covariance(logp, adv, counted)
    ratio = exp_clamped(logp - old_logp)
    clipped = ((adv < 0) & (ratio < 1 - cfg.eps_low)) | ((adv > 0) & (ratio > 1 + cfg.eps_high))
    candidates = counted & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    n = max(int(cfg.clip_cov_ratio * counted.sum()), 1)
    chosen = sorted(zip(priority[candidates], zip(*np.nonzero(candidates))))[:n]
    out = np.zeros(mask.shape, bool)
    for _, (i, t) in chosen:
        out[i, t] = True
    return out


def kl_cov_select(cfg, logp, old_logp, adv, mask, priority):
    """KL-Cov: the max(int(k N), 1) counted tokens of largest covariance (ties: first in the batch)."""
    counted = mask > 0
    if not counted.any():
        return np.zeros(mask.shape, bool)
    cov = np.where(counted, _covariance(logp, adv, counted), -np.inf).reshape(-1)
    n = max(int(cfg.kl_cov_ratio * counted.sum()), 1)
    out = np.zeros(cov.shape, bool)
    out[np.argsort(-cov, kind="stable")[:n]] = True
    return out.reshape(mask.shape) & counted


def entropy_keep(quantile, entropy, mask):
    """Top-entropy tokens (arXiv 2506.01939; TRL's top_entropy_quantile): entropy >= the (1 - q)
    quantile (linear interpolation) of the counted tokens' entropies."""
    counted = mask > 0
    if quantile >= 1 or not counted.any():
        return counted
    return counted & (entropy >= np.quantile(entropy[counted], 1 - quantile))


# ----------------------------------------------------------------------------- KL, aggregation, correction
def k1(l, ref):
    return l - ref


def k2(l, ref):
    return (l - ref) ** 2 / 2


def k3(l, ref):
    x = ref - l
    return np.minimum(np.exp(np.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)) - x - 1, 10)


# fn(list of per-completion unit losses, N, counted tokens, L_max) -> the step loss
def token_mean(units, n, ntok, lmax):
    return sum(u.sum() for u in units) / ntok


def seq_mean_token_mean(units, n, ntok, lmax):
    return sum(u.mean() for u in units) / n


def seq_mean_token_sum(units, n, ntok, lmax):
    return sum(u.sum() for u in units) / n


def seq_mean_token_sum_norm(units, n, ntok, lmax):
    return sum(u.sum() for u in units) / (n * lmax)


def seq_mean(units, n, ntok, lmax):
    return sum(float(u) for u in units) / n


def correction_weight(cfg, d):
    """Detached rollout-correction weight of one completion from d = l^old - l^samp over its counted
    tokens: per token, or one value (sequence: exp of the sum, geometric: exp of the mean)."""
    log_w = {"token": d, "sequence": np.sum(d), "geometric": np.mean(d)}[cfg.tis_level]
    w = exp_clamped(log_w)
    c = cfg.tis_cap
    if cfg.tis_mode == "truncate":
        return np.minimum(w, c)
    keep = w <= c if cfg.tis_mode == "mask" else (w >= 1 / c) & (w <= c)
    return np.where(keep, w, 0.0)


# ----------------------------------------------------------------------------- the whole policy loss
def step_selections(cfg, logp, old_logp, advantages, mask, entropy, priority):
    """(the loss's selection, the top-entropy keep mask), as `algorithms.step_stats` decides them."""
    from grpo_jax.algorithms.losses import LOSSES

    spec = LOSSES[cfg.loss]
    adv = advantages if advantages.ndim == 2 else np.broadcast_to(advantages[:, None], mask.shape)
    select = np.zeros(mask.shape, bool)
    if spec.select is not None:
        select = spec.select_reference(cfg, logp, old_logp, adv, mask, priority)
    return select, entropy_keep(cfg.top_entropy_quantile, entropy, mask)


def policy_loss(cfg, lv, lf, old_logp, advantages, mask, ref_logp=None, sampler_logp=None, entropy=None,
                priority=None, max_completion_len=8):
    """(step loss, clip fractions) of `algorithms.policy_loss` over the whole batch, in float64.

    `lv` carries the perturbation of a gradient check, `lf` the unperturbed log-probs (everything the
    library detaches is computed from lf, including the step-level selections)."""
    from grpo_jax.algorithms.aggregation import AGGREGATIONS
    from grpo_jax.algorithms.kl import KL_ESTIMATORS
    from grpo_jax.algorithms.losses import LOSSES

    spec = LOSSES[cfg.loss]
    select, keep = step_selections(cfg, lf, old_logp, advantages, mask, entropy, priority)
    counted = [np.flatnonzero(mask[i] > 0) for i in range(len(mask))]
    n = sum(len(idx) > 0 for idx in counted)
    ntok = sum(len(idx) for idx in counted)
    units, clips = [], {"low": [], "high": [], "low_tokens": [], "high_tokens": [], "units": 0}
    for i, idx in enumerate(counted):
        if len(idx) == 0:
            continue
        a = advantages[i, idx] if advantages.ndim == 2 else np.full(len(idx), advantages[i])
        c = types.SimpleNamespace(l=lv[i, idx], f=lf[i, idx], o=old_logp[i, idx], a=a, sel=select[i, idx])
        u, low, high = spec.reference(cfg, c)
        per_sequence = spec.unit == "sequence" and np.ndim(low) == 0  # gmpo flags tokens
        for name, flags in (("low", low), ("high", high)):
            flags = np.zeros(len(idx), bool) if flags is None else np.asarray(flags)
            clips[name].append(flags.sum())
            clips[name + "_tokens"].append(flags.sum() * (len(idx) if per_sequence else 1))
        clips["units"] += 1 if per_sequence else len(idx)
        if spec.unit == "token":
            u = u * keep[i, idx]
        if cfg.tis_level is not None:
            u = u * correction_weight(cfg, old_logp[i, idx] - sampler_logp[i, idx])
        if cfg.off_policy_threshold is not None:
            drift = np.mean(np.abs(old_logp[i, idx] - sampler_logp[i, idx]))
            u = u * ~((a if spec.unit == "token" else a[0]) < 0) if drift > cfg.off_policy_threshold else u
        reg = np.zeros(len(idx))
        if cfg.beta > 0:
            reg = reg + cfg.beta * KL_ESTIMATORS[cfg.kl_estimator].reference(lv[i, idx], ref_logp[i, idx])
        if cfg.entropy_coef:
            reg = reg - cfg.entropy_coef * entropy[i, idx]
        units.append(u + (reg.mean() if spec.unit == "sequence" else reg))
    loss = AGGREGATIONS[cfg.aggregation].reference(units, n, ntok, max_completion_len) if n else 0.0
    fractions = {
        "clip_frac_low": sum(clips["low"]) / max(clips["units"], 1),
        "clip_frac_high": sum(clips["high"]) / max(clips["units"], 1),
        "clip_frac_low_tokens": sum(clips["low_tokens"]) / max(ntok, 1),
        "clip_frac_high_tokens": sum(clips["high_tokens"]) / max(ntok, 1),
    }
    return loss, fractions


def policy_loss_grad(cfg, logp, *args, h=1e-6, **kw):
    """d policy_loss / d logp by central differences over the counted tokens (masked ones stay 0)."""
    mask = args[2]
    g = np.zeros_like(logp)
    for i, t in zip(*np.nonzero(mask > 0)):
        plus, minus = logp.copy(), logp.copy()
        plus[i, t] += h
        minus[i, t] -= h
        g[i, t] = (policy_loss(cfg, plus, logp, *args, **kw)[0] - policy_loss(cfg, minus, logp, *args, **kw)[0]) / (2 * h)
    return g
