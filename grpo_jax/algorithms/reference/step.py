"""Float64 references of the step statistics: loops over groups, rows and counted tokens.

A reference is fn(cfg, s) -> {name: per-row array}, `s` the whole step batch as numpy: s.logp,
s.old_logp, s.advantages (per token), s.mask, s.entropy, s.priority, s.tokens, s.group_size (rows
[k G, (k + 1) G) are group k). Masked entries may hold anything: only counted ones are read.
"""

import math

import numpy as np

from grpo_jax.algorithms.reference.common import exp_clamped


def _covariance(logp, adv, counted):
    """(A - mean A)(l - mean l), means over the counted tokens of the batch (verl's Clip/KL-Cov)."""
    return (adv - adv[counted].mean()) * (logp - logp[counted].mean())


def count(ratio, n):
    """max(floor(ratio n), 1), a product within a relative 1e-9 of a whole number being that number."""
    x = ratio * int(n)
    whole = round(x)
    return max(whole if abs(x - whole) <= 1e-9 * max(whole, 1) else math.floor(x), 1)


def clip_cov_select(cfg, s):
    """Clip-Cov: a random max(int(r N), 1) of the unclipped counted tokens with lb < cov < ub."""
    counted = s.mask > 0
    out = np.zeros(s.mask.shape)
    if not counted.any():
        return {"select": out}
    adv = s.advantages
    cov = _covariance(s.logp, adv, counted)
    ratio = exp_clamped(s.logp - s.old_logp)
    clipped = ((adv < 0) & (ratio < 1 - cfg.eps_low)) | ((adv > 0) & (ratio > 1 + cfg.eps_high))
    candidates = counted & ~clipped & (cov > cfg.lb) & (cov < cfg.ub)
    n = count(cfg.ratio, counted.sum())
    for _, (i, t) in sorted(zip(s.priority[candidates], zip(*np.nonzero(candidates))))[:n]:
        out[i, t] = 1.0
    return {"select": out}


def kl_cov_select(cfg, s):
    """KL-Cov: the max(int(k N), 1) counted tokens of largest covariance (ties: first in the batch)."""
    counted = s.mask > 0
    out = np.zeros(s.mask.size)
    if counted.any():
        cov = np.where(counted, _covariance(s.logp, s.advantages, counted), -np.inf).reshape(-1)
        out[np.argsort(-cov, kind="stable")[:count(cfg.ratio, counted.sum())]] = 1.0
    return {"select": out.reshape(s.mask.shape) * counted}


def entropy_keep(quantile, entropy, mask):
    """Top-entropy tokens (arXiv 2506.01939; TRL's top_entropy_quantile): entropy >= the (1 - q)
    quantile (linear interpolation) of the counted tokens' entropies."""
    counted = mask > 0
    if quantile >= 1 or not counted.any():
        return counted
    return counted & (entropy >= np.quantile(entropy[counted], 1 - quantile))


# ----------------------------------------------------------------------------- group statistics
def _groups(s):
    """[(rows of group k, its rows with >= 1 counted token)] and N / Q (completions over prompts)."""
    out = []
    for k in range(len(s.mask) // s.group_size):
        rows = list(range(k * s.group_size, (k + 1) * s.group_size))
        out.append((rows, [i for i in rows if s.mask[i].sum() > 0]))
    n = sum(len(counted) for _, counted in out)
    q = sum(len(counted) > 0 for _, counted in out)
    return out, n / max(q, 1)


def _tokens(s, i):
    return np.flatnonzero(s.mask[i] > 0)


def _mean(s, x, i):
    return x[i, _tokens(s, i)].mean()


def gvpo_stats(cfg, s):
    center, scale = np.zeros(len(s.mask)), np.zeros(len(s.mask))
    groups, share = _groups(s)
    for rows, counted in groups:
        implicit = [cfg.beta * (s.logp[i, _tokens(s, i)] - s.old_logp[i, _tokens(s, i)]).sum() for i in counted]
        for i in rows:
            center[i] = np.mean(implicit) if counted else 0.0
            scale[i] = share / (len(counted) - 1) if len(counted) >= 2 else 0.0
    return {"center": center, "scale": scale}


def disco_stats(cfg, s):
    b = len(s.mask)
    coef, offset = np.zeros(b), np.zeros(b)
    groups, share = _groups(s)

    def score(i):
        t = _tokens(s, i)
        return s.logp[i, t].mean() if cfg.score == "log_prob" else exp_clamped(s.logp[i, t] - s.old_logp[i, t]).mean()

    for _, counted in groups:
        pos = [i for i in counted if _mean(s, s.advantages, i) > 0]
        neg = [i for i in counted if _mean(s, s.advantages, i) < 0]
        if not pos or not neg:
            continue
        z = np.array([score(i) / cfg.tau for i in neg])
        w = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        log_mean_exp = math.log(np.mean(np.exp(z)))
        for i in pos:
            coef[i] = -share / len(pos)
        for j, i in enumerate(neg):
            coef[i] = share * w[j]
            offset[i] = share * w[j] * (cfg.tau * log_mean_exp - score(i))
    counted_tokens = [(i, t) for i in range(b) for t in _tokens(s, i)]
    kl = np.mean([s.old_logp[i, t] - s.logp[i, t] for i, t in counted_tokens]) if counted_tokens else 0.0
    rows = sum(len(c) for _, c in groups)
    kl_coef = cfg.beta * max(kl - cfg.delta, 0.0) * rows / max(len(counted_tokens), 1)
    return {"coef": coef, "offset": offset, "kl_coef": np.full(b, kl_coef)}


def _conflict_runs(s, rows, i, pos, neg, position):
    """The counted tokens of row i in the run of conflict tokens that `position` orders (forward:
    t; backward: distance from the row's last counted token), as a set of t."""
    def last(j):
        return _tokens(s, j)[-1]

    def token_at(j, key):  # row j's counted token at this key, or None
        t = key if position == "forward" else last(j) - key
        return s.tokens[j, t] if 0 <= t < s.mask.shape[1] and s.mask[j, t] > 0 else None

    order = _tokens(s, i) if position == "forward" else _tokens(s, i)[::-1]
    run = set()
    for t in order:
        key = t if position == "forward" else last(i) - t
        shared = [j for j in rows if j in pos or j in neg if token_at(j, key) == s.tokens[i, t]]
        if not (any(j in pos for j in shared) and any(j in neg for j in shared)):
            break
        run.add(t)
    return run


def gtpo_stats(cfg, s):
    out = np.zeros(s.mask.shape)
    groups, _ = _groups(s)
    for rows, counted in groups:
        adv = {i: _mean(s, s.advantages, i) for i in counted}
        pos, neg = {i for i in counted if adv[i] > 0}, {i for i in counted if adv[i] < 0}
        for i in counted:
            entropy = _mean(s, s.entropy, i)
            shaped = adv[i] - cfg.entropy_coef * entropy if entropy <= cfg.entropy_max else 0.0
            runs = [_conflict_runs(s, rows, i, pos, neg, p) for p in ("forward", "backward")] if adv[i] != 0 else [set(), set()]
            n_conflict = max(len(runs[0] | runs[1]), 1)
            for t in _tokens(s, i):
                weight = 1.0
                for run in runs:
                    if t in run:
                        weight *= cfg.conflict_weight if i in pos else 0.0
                out[i, t] = shaped * weight / n_conflict
    return {"advantages": out}


def egsw_stats(cfg, s):
    weight = np.zeros(len(s.mask))
    groups, _ = _groups(s)
    for _, counted in groups:
        if not counted:
            continue
        z = np.array([(_mean(s, s.advantages, i) + cfg.alpha * _mean(s, s.entropy, i)) / cfg.temperature
                      for i in counted])
        e = np.exp(z - z.max())
        weight[counted] = len(counted) * e / e.sum()
    return {"weight": weight}
