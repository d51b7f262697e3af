"""Float64 references of everything around the loss (KL estimators, aggregations, rollout
correction) and of the whole `policy_loss`, with its central-difference gradient."""

import types

import numpy as np

from grpo_jax.algorithms.reference.common import LOG_RATIO_BOUND, exp_clamped
from grpo_jax.algorithms.reference.step import entropy_keep


def k1(l, ref):
    return l - ref


def k2(l, ref):
    return (l - ref) ** 2 / 2


def k3(l, ref):
    x = ref - l
    return np.minimum(np.exp(np.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)) - x - 1, 10)


# fn(params, list of per-completion unit losses, N, counted tokens, L_max) -> the step loss
def token_mean(p, units, n, ntok, lmax):
    return sum(u.sum() for u in units) / ntok


def seq_mean_token_mean(p, units, n, ntok, lmax):
    return sum(u.mean() for u in units) / n


def seq_mean_token_sum(p, units, n, ntok, lmax):
    return sum(u.sum() for u in units) / n


def seq_mean_token_sum_norm(p, units, n, ntok, lmax):
    return sum(u.sum() for u in units) / (n * lmax)


def seq_mean(p, units, n, ntok, lmax):
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
def step_statistics(cfg, logp, old_logp, advantages, mask, entropy, priority, tokens=None, group_size=None):
    """(the loss's statistics, the top-entropy keep mask), as `algorithms.step_stats` decides them."""
    spec = cfg.loss.spec
    adv = advantages if advantages.ndim == 2 else np.broadcast_to(advantages[:, None], mask.shape)
    s = types.SimpleNamespace(logp=logp, old_logp=old_logp, advantages=adv, mask=mask, entropy=entropy,
                              priority=priority, tokens=tokens, group_size=group_size)
    stats = spec.stats_reference(cfg.loss, s) if spec.stats is not None else {}
    return stats, entropy_keep(cfg.top_entropy_quantile, entropy, mask)


def policy_loss(cfg, lv, lf, old_logp, advantages, mask, ref_logp=None, sampler_logp=None, entropy=None,
                priority=None, tokens=None, group_size=None, max_completion_len=8, statistics=None):
    """(step loss, fractions, clip units) of `algorithms.policy_loss` over the whole batch, in float64;
    the fractions: clipped units and tokens, and, where rollout correction is on, the units it zeroes.

    `lv` carries the perturbation of a gradient check, `lf` the unperturbed log-probs (everything the
    library detaches is computed from lf, including the step statistics, which a caller that
    evaluates many perturbations passes once as `statistics`)."""
    from grpo_jax.algorithms.kl import KL_ESTIMATORS

    spec = cfg.loss.spec
    stats, keep = statistics or step_statistics(cfg, lf, old_logp, advantages, mask, entropy, priority, tokens,
                                                group_size)
    counted = [np.flatnonzero(mask[i] > 0) for i in range(len(mask))]
    n = sum(len(idx) > 0 for idx in counted)
    ntok = sum(len(idx) for idx in counted)
    units, clips = [], {"low": [], "high": [], "low_tokens": [], "high_tokens": [], "units": 0}
    zeroed = {"tis_masked_frac": 0.0, "off_policy_masked_frac": 0.0}  # units the correction zeroes
    for i, idx in enumerate(counted):
        if len(idx) == 0:
            continue
        a = advantages[i, idx] if advantages.ndim == 2 else np.full(len(idx), advantages[i])
        mine = {k: v[i, idx] if v.ndim == 2 else v[i] for k, v in stats.items()}
        c = types.SimpleNamespace(l=lv[i, idx], f=lf[i, idx], o=old_logp[i, idx], a=a, **mine)
        u, low, high = spec.reference(cfg.loss, c)
        per_sequence = spec.unit == "sequence" and np.ndim(low) == 0  # gmpo flags tokens
        for name, flags in (("low", low), ("high", high)):
            flags = np.zeros(len(idx), bool) if flags is None else np.asarray(flags)
            clips[name].append(flags.sum())
            clips[name + "_tokens"].append(flags.sum() * (len(idx) if per_sequence else 1))
        clips["units"] += 1 if per_sequence else len(idx)
        if spec.unit == "token":
            u = u * keep[i, idx]
        per_unit = len(idx) if spec.unit == "token" else 1  # a completion's share of the units
        if cfg.tis_level is not None:
            w = correction_weight(cfg, old_logp[i, idx] - sampler_logp[i, idx])
            u = u * w
            zeroed["tis_masked_frac"] += np.mean(np.broadcast_to(w, len(idx)) == 0) * per_unit
        if cfg.off_policy_threshold is not None:
            drift = np.mean(np.abs(old_logp[i, idx] - sampler_logp[i, idx]))
            dropped = ((a if spec.unit == "token" else a[0]) < 0) & (drift > cfg.off_policy_threshold)
            u = u * ~dropped
            zeroed["off_policy_masked_frac"] += np.mean(dropped) * per_unit
        reg = np.zeros(len(idx))
        if cfg.beta > 0:
            reg = reg + cfg.beta * KL_ESTIMATORS[cfg.kl_estimator].reference(lv[i, idx], ref_logp[i, idx])
        if cfg.entropy_coef:
            reg = reg - cfg.entropy_coef * entropy[i, idx]
        units.append(u + (reg.mean() if spec.unit == "sequence" else reg))
    loss = cfg.aggregation.spec.reference(cfg.aggregation, units, n, ntok, max_completion_len) if n else 0.0
    fractions = {
        "clip_frac_low": sum(clips["low"]) / max(clips["units"], 1),
        "clip_frac_high": sum(clips["high"]) / max(clips["units"], 1),
        "clip_frac_low_tokens": sum(clips["low_tokens"]) / max(ntok, 1),
        "clip_frac_high_tokens": sum(clips["high_tokens"]) / max(ntok, 1),
    }
    options = {"tis_masked_frac": cfg.tis_level is not None, "off_policy_masked_frac": cfg.off_policy_threshold is not None}
    fractions |= {name: count / max(ntok if spec.unit == "token" else n, 1) for name, count in zeroed.items() if options[name]}
    return loss, fractions, clips["units"]


def policy_loss_grad(cfg, logp, *args, h=1e-6, **kw):
    """d policy_loss / d logp by central differences over the counted tokens (masked ones stay 0)."""
    old_logp, advantages, mask = args[:3]
    kw["statistics"] = step_statistics(cfg, logp, old_logp, advantages, mask, kw.get("entropy"), kw.get("priority"),
                                       kw.get("tokens"), kw.get("group_size"))
    g = np.zeros_like(logp)
    for i, t in zip(*np.nonzero(mask > 0)):
        plus, minus = logp.copy(), logp.copy()
        plus[i, t] += h
        minus[i, t] -= h
        g[i, t] = (policy_loss(cfg, plus, logp, *args, **kw)[0] - policy_loss(cfg, minus, logp, *args, **kw)[0]) / (2 * h)
    return g
