"""Float64 references of the advantage estimators and of `compute_advantages`: loops over groups.

An estimator reference is fn(params, rewards f64[N], groups int[N], lengths[N] or None) -> f64[N]."""

import math
import warnings

import numpy as np


def _by_group(fn):
    """An estimator that only looks at each group: fn(cfg, rewards of the group, their lengths)."""

    def estimate(cfg, r, groups, lengths):
        out = np.zeros(len(r))
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            out[idx] = fn(cfg, r[idx], lengths[idx] if lengths is not None else None)
        return out

    return estimate


group_std = _by_group(lambda cfg, rg, lg: (rg - rg.mean()) / (rg.std(ddof=1) + cfg.eps))
group_mean = _by_group(lambda cfg, rg, lg: rg - rg.mean())
rloo = _by_group(lambda cfg, rg, lg: np.array([rg[i] - np.delete(rg, i).mean() for i in range(len(rg))]))
opo = _by_group(lambda cfg, rg, lg: rg - (lg * rg).sum() / lg.sum())


def turn_advantages(cfg, turn_rewards, turn_mask, group_ids):
    """GTPO's turn-level credit in float64 (see `advantages.turn_advantages`): each turn's discounted
    return summed term by term; the estimator's reference over every (group, turn) unit at once; 0 on
    units whose returns are all equal or reached by one trajectory."""
    n, turns = turn_rewards.shape
    rows, units, returns = [], [], []
    for i in range(n):
        for j in range(turns):
            if turn_mask[i, j]:
                rows.append((i, j))
                units.append(int(group_ids[i]) * turns + j)
                returns.append(sum(cfg.turn_discount ** (k - j) * float(turn_rewards[i, k])
                                   for k in range(j, turns) if turn_mask[i, k]))
    units, returns = np.unique(units, return_inverse=True)[1], np.array(returns)
    with warnings.catch_warnings():  # a unit of one trajectory has no spread (nan), and gets 0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        adv = cfg.advantage.spec.reference(cfg.advantage, returns, units, None)
    out = np.zeros((n, turns))
    for (i, j), u, a in zip(rows, units, adv):
        same = returns[units == u]
        out[i, j] = a if same.max() > same.min() else 0.0
    return out


def batch_std(cfg, r, groups, lengths):
    return group_mean(cfg, r, groups, lengths) / (r.std(ddof=1) + cfg.eps)


def spo(cfg, r, groups, lengths):
    """SPO: (r - mean) / (std + eps) over the whole batch, groups ignored; 0 where the batch has no spread."""
    return (r - r.mean()) / (r.std(ddof=1) + cfg.eps) if r.max() > r.min() else np.zeros(len(r))


def reinforce_pp(cfg, r, groups, lengths):
    """REINFORCE++-baseline: group-centred rewards, whitened over every counted token of the batch
    (the token list built explicitly: completion i contributes L_i copies of its value)."""
    c = group_mean(cfg, r, groups, lengths)
    tokens = np.repeat(c, lengths.astype(int))
    if len(tokens) < 2 or tokens.std() == 0:
        return np.zeros(len(r))
    return (c - tokens.mean()) / (tokens.std(ddof=1) + cfg.eps)


def beta_norm(cfg, r, groups, lengths):
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


@_by_group
def ngrpo(cfg, rg, lg):
    """NGRPO: the group's statistics over its rewards and the virtual maximum-reward samples."""
    padded = np.concatenate([rg, np.full(cfg.virtual_samples, cfg.max_reward)])
    return (rg - padded.mean()) / (padded.std(ddof=1) + cfg.eps)


@_by_group
def gapo(cfg, rg, lg):
    """GAPO: slide a window of ceil(f G) over the sorted rewards, keep the narrowest (the first on
    ties), Q = its median; scale sqrt(sum (R - Q)^2 / (G - 1))."""
    ordered = sorted(rg)
    m = max(math.ceil(cfg.fraction * len(rg) - 1e-6), 1)
    widths = [ordered[s + m - 1] - ordered[s] for s in range(len(rg) - m + 1)]
    best = widths.index(min(widths))
    q = float(np.median(ordered[best:best + m]))
    return (rg - q) / (math.sqrt(((rg - q) ** 2).sum() / (len(rg) - 1)) + cfg.eps)


@_by_group
def noise_aware(cfg, rg, lg):
    """S-GRPO: group_std times w*(G, k, p) of the authors' `group_weight`."""
    p, q = cfg.noise_rate, (rg > 0).mean()
    t = min(max((q - p) / (1 - 2 * p), 0.0), 1.0)
    w = (1 - 2 * p) * t * (1 - t) / (math.sqrt(q * (1 - q) + 1e-8) * math.sqrt(t * (1 - t) + 1e-8))
    return w * (rg - rg.mean()) / (rg.std(ddof=1) + cfg.eps)


@_by_group
def pass_at_k(cfg, rg, lg):
    """Pass@k analytical advantages, with binomial coefficients (math.comb)."""
    n, c, k = len(rg), int((rg > 0).sum()), cfg.k
    rho = 1 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(rho * (1 - rho))
    wrong = 1 - rho - (math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1) if n - c >= 1 else 0.0)
    return np.where(rg > 0, 1 - rho, wrong) / (sigma + cfg.eps)


def unlikeliness_scale(beta_rank, logprobs, groups):
    """1 - beta_rank * rank / G per completion, rank its place in its group sorted by ascending mean
    log-prob (a stable sort: ties by position), as the authors' double argsort."""
    out = np.ones(len(logprobs))
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        rank = np.empty(len(idx))
        rank[np.argsort(logprobs[idx], kind="stable")] = np.arange(len(idx))
        out[idx] = 1 - beta_rank * rank / len(idx)
    return out


def compute_advantages(cfg, rewards, groups, lengths=None, weights=None, sampler_logprobs=None):
    """The whole of `algorithms.compute_advantages` for rewards [N, K] and integer group ids."""
    spec = cfg.advantage.spec
    rewards = np.asarray(rewards, np.float64).reshape(len(rewards), -1)
    if cfg.unlikeliness:
        rewards = rewards * unlikeliness_scale(cfg.unlikeliness, np.asarray(sampler_logprobs, np.float64), groups)[:, None]
    w = np.ones(rewards.shape[1]) if weights is None else np.asarray(weights, np.float64)

    def zero_spread_to_zero(adv, signal):
        if spec.learns_from_uniform_groups:
            return adv
        for g in np.unique(groups):
            if np.ptp(signal[groups == g]) == 0:
                adv[groups == g] = 0.0
        return adv

    def estimate(r):
        return zero_spread_to_zero(spec.reference(cfg.advantage, r, groups, lengths), r)

    if cfg.reward_combine == "sum_then_normalize":
        combined = rewards @ w
        adv = estimate(combined)
    else:
        combined = sum(wk * estimate(rewards[:, k]) for k, wk in enumerate(w))
        combined = adv = zero_spread_to_zero(combined, combined)
        if cfg.reward_combine == "normalize_then_sum":
            adv = (combined - combined.mean()) / (combined.std(ddof=1) + 1e-6) if np.ptp(combined) > 0 else 0 * combined
            adv = zero_spread_to_zero(adv, combined)
    if cfg.gpg_scale:
        valid = np.array([np.ptp(combined[groups == g]) > 0 for g in groups])
        adv = adv * len(adv) / max(valid.sum(), 1)
    return adv
