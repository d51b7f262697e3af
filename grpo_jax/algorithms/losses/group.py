"""Losses whose unit loss depends on the other completions of its group: GVPO's group-centred
implicit reward, DisCO's positive-vs-negative scores and KL constraint, GTPO's conflict tokens, EGSW's
group softmax weights.

Their group-level (and batch-level) quantities are step statistics: computed once per update over
the whole optimizer-step batch by `step_stats`, detached, one value per row (or token), split with
the rows, so a group spread over micro-batches and devices gives exactly the unsplit loss. Values
that vary with the policy are taken at the current parameters and detached where the authors' code
detaches them (GVPO's group mean, DisCO's softmax weights and constraint coefficient).
"""

import dataclasses

import jax.numpy as jnp

from grpo_jax.algorithms import reference
from grpo_jax.algorithms.losses.base import CLIP_TEST, SURROGATE, Clip, LossParams, LossTerms, loss, surrogate
from grpo_jax.algorithms.ratio import clamped_exp
from grpo_jax.metrics import Metric


def _prompts_share(s, counted):
    """N / Q: completions over prompts (both with >= 1 counted token) of the step, so that the
    seq_mean aggregation (1/N) sum_i u_i of per-completion shares is a mean over prompts."""
    return counted.sum() / jnp.maximum((counted.sum(-1) > 0).sum(), 1)


def _softmax_over(z, members):
    """Softmax of z over the members of each group ([groups, G]); 0 for the others."""
    any_member = members.any(-1, keepdims=True)
    top = jnp.where(any_member, jnp.max(jnp.where(members, z, -jnp.inf), -1, keepdims=True), 0.0)
    e = jnp.exp(jnp.where(members, z - top, -jnp.inf))
    total = e.sum(-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0), top[:, 0] + jnp.log(jnp.where(total > 0, total, 1.0))[:, 0]


# ----------------------------------------------------------------------------- GVPO
@dataclasses.dataclass(frozen=True)
class Gvpo(LossParams):
    """`beta`: the KL coefficient of the implicit reward."""

    beta: float = 0.1

    def __post_init__(self):
        self.check({"beta": (self.beta > 0, "must be > 0")})


def gvpo_stats(p, s):
    counted = s.grouped(s.counted.astype(jnp.float32))
    seq_log_ratio = s.grouped((s.logp - s.old_logp).sum(-1))
    size = counted.sum(-1)
    center = p.beta * (seq_log_ratio * counted).sum(-1) / jnp.maximum(size, 1.0)
    scale = jnp.where(size >= 2, _prompts_share(s, counted) / jnp.maximum(size - 1.0, 1.0), 0.0)
    return {"center": s.per_row(center), "scale": s.per_row(scale)}


@loss("gvpo", params=Gvpo, unit="sequence", ratio=True, reference=reference.gvpo,
      stats=gvpo_stats, stats_reference=reference.gvpo_stats, needs_groups=True,
      on_policy=lambda p, x: (x.stats["scale"] * p.beta * x.advantages * x.mask.sum(-1))[:, None] * x.mask)
def gvpo(p, x):
    """GVPO (arXiv 2504.19599; the authors' `compute_policy_loss_gvpo`): regress the group-centred
    implicit reward beta (log pi(y_i) - log pi_old(y_i)) onto the centred reward A_i (use group_mean
    advantages): u_i = 1/2 (beta (S_i - mean_g S) - A_i)^2 / (G - 1), S_i = sum_t D, the group mean
    detached as the authors do (its gradient vanishes anyway when A is centred); averaged over prompts.
    Its gradient is the KL-constrained optimum's weight times grad log pi(y_i), no importance ratio."""
    seq_log_ratio = (x.logp - x.old_logp).sum(-1)
    residual = p.beta * seq_log_ratio - x.stats["center"] - x.advantages
    return LossTerms(0.5 * x.stats["scale"] * residual ** 2)


# ----------------------------------------------------------------------------- DisCO
DISCO_SCORES = ("log_prob", "ratio")


@dataclasses.dataclass(frozen=True)
class Disco(LossParams):
    """The scoring function `score` (log_prob: Log-L, ratio: L-ratio), the temperature `tau` of the
    log-mean-exp over the negatives, the KL budget `delta` and its penalty coefficient `beta`."""

    score: str = "log_prob"
    tau: float = 10.0
    delta: float = 1e-4
    beta: float = 1e3

    def __post_init__(self):
        self.check({"score": (self.score in DISCO_SCORES, f"is unknown; known: {', '.join(DISCO_SCORES)}"),
                    "tau": (self.tau > 0, "must be > 0"), "delta": (self.delta >= 0, "must be >= 0"),
                    "beta": (self.beta >= 0, "must be >= 0")})


def disco_score(p, logp, old_logp, mask):
    """The scoring function: the mean token log-likelihood (log_prob) or likelihood ratio (ratio)."""
    x = logp if p.score == "log_prob" else clamped_exp(logp - old_logp)
    return (x * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def disco_stats(p, s):
    counted = s.grouped(s.counted)
    adv = s.grouped(s.seq_mean(s.advantages))
    pos, neg = counted & (adv > 0), counted & (adv < 0)
    n_pos = pos.sum(-1, keepdims=True)
    valid = (n_pos > 0) & neg.any(-1, keepdims=True)
    score = s.grouped(disco_score(p, s.logp, s.old_logp, s.mask))
    w, log_sum = _softmax_over(score / p.tau, neg)
    log_mean_exp = log_sum - jnp.log(jnp.maximum(neg.sum(-1), 1))
    share = _prompts_share(s, counted)
    coef = share * jnp.where(valid, jnp.where(pos, -1.0 / jnp.maximum(n_pos, 1), w), 0.0)
    offset = share * jnp.where(valid & neg, w * (p.tau * log_mean_exp[:, None] - score), 0.0)
    tokens = jnp.maximum(s.mask.sum(), 1.0)
    kl = ((s.old_logp - s.logp) * s.mask).sum() / tokens
    kl_coef = p.beta * jnp.maximum(kl - p.delta, 0.0) * s.counted.sum() / tokens
    return {"coef": s.per_row(coef), "offset": s.per_row(offset),
            "kl_coef": jnp.broadcast_to(kl_coef, s.counted.shape)}


@loss("disco", params=Disco, unit="sequence", ratio=True, reference=reference.disco, test_params=dict(beta=10.0),
      stats=disco_stats, stats_reference=reference.disco_stats, needs_groups=True,
      on_policy=lambda p, x: -x.stats["coef"][:, None] * x.mask)
def disco(p, x):
    """DisCO (arXiv 2505.12366; the authors' `compute_policy_loss_disco_*`): per prompt with both
    kinds, -(mean of the positives' scores - tau log mean_neg exp(score / tau)) (positives: A > 0,
    negatives: A < 0), averaged over the step's prompts, plus the constraint sg(beta [K - delta]_+) K
    on K = mean over the step's tokens of l^old - l (the authors' "kl"). The log-mean-exp enters through
    its detached softmax weights (same gradient, value kept); no clipping, no min."""
    score = disco_score(p, x.logp, x.old_logp, x.mask)
    drift = (x.old_logp - x.logp) * x.mask
    u = x.stats["coef"] * score + x.stats["offset"] + x.stats["kl_coef"] * drift.sum(-1)
    return LossTerms(u, metrics={"disco_kl": Metric.mean(x.old_logp - x.logp, x.mask)})


# ----------------------------------------------------------------------------- GTPO
def _conflict_run(tokens, on, pos, neg):
    """[groups, G, T]: the token at t is a conflict token (the same token at the same position in a
    positive and in a negative completion of the group), and so is every counted token before it."""
    same = (tokens[:, :, None, :] == tokens[:, None, :, :]) & on[:, None, :, :]  # [q, i, j, t]
    raw = (same & pos[:, None, :, None]).any(2) & (same & neg[:, None, :, None]).any(2) & on
    return (jnp.cumsum(on & ~raw, axis=-1) == 0) & on


def _from_end(x, last):
    """x[i, last_i - t] (False/0 past the row's start): positions counted from each row's last token."""
    index = last[:, None] - jnp.arange(x.shape[1])[None, :]
    return jnp.where(index >= 0, jnp.take_along_axis(x, jnp.maximum(index, 0), axis=1), 0).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Gtpo(LossParams):
    """The weight of a positive completion's conflict tokens, and the entropy filter: completions whose
    mean entropy exceeds `entropy_max` get A = 0, the others A - entropy_coef * their mean entropy."""

    conflict_weight: float = 2.0
    entropy_max: float = 0.7
    entropy_coef: float = 0.1

    def __post_init__(self):
        self.check({"conflict_weight": (self.conflict_weight >= 0, "must be >= 0"),
                    "entropy_max": (self.entropy_max >= 0, "must be >= 0")})


def gtpo_stats(p, s):
    on = s.mask > 0
    adv = s.seq_mean(s.advantages)
    pos, neg = s.grouped(adv > 0), s.grouped(adv < 0)
    last = jnp.where(on.any(-1), on.shape[1] - 1 - jnp.argmax(on[:, ::-1], axis=-1), -1)
    forward = s.per_row(_conflict_run(s.grouped(s.tokens), s.grouped(on), pos, neg))
    backward = _from_end(s.per_row(_conflict_run(s.grouped(_from_end(s.tokens, last)),
                                                 s.grouped(_from_end(on, last)), pos, neg)), last)
    positive = (adv > 0)[:, None]
    weight = jnp.ones_like(s.mask)
    for conflict in (forward, backward):
        weight = weight * jnp.where(conflict, jnp.where(positive, p.conflict_weight, 0.0), 1.0)
    active = (adv != 0)[:, None]
    n_conflict = jnp.maximum(((forward | backward) & on & active).sum(-1), 1)
    entropy = s.seq_mean(s.entropy)
    shaped = jnp.where(entropy <= p.entropy_max, adv - p.entropy_coef * entropy, 0.0)
    return {"advantages": shaped[:, None] * jnp.where(active, weight, 1.0) * s.mask / n_conflict[:, None]}


@loss("gtpo", params=Gtpo, unit="token", ratio=False, reference=reference.gtpo, test_params=dict(entropy_max=1.1),
      stats=gtpo_stats, stats_reference=reference.gtpo_stats, needs_groups=True,
      on_policy=lambda p, x: x.stats["advantages"])
def gtpo(p, x):
    """GTPO, trajectory form (arXiv 2508.03772; the authors' `gtpo_training.py`): REINFORCE on
    per-token advantages built over the group. Conflict tokens: the leading (and, aligned at the end,
    trailing) run of tokens that a positive and a negative completion share at the same position; a
    positive completion's get weight conflict_weight (per run: x w^2 in both), a negative
    completion's 0 (no update); every active completion's weights are divided by its count of conflict
    tokens. Entropy filter: completions whose mean token entropy exceeds entropy_max get 0, the
    others A - entropy_coef * entropy. No importance ratio (the authors' ratio is exp(l - sg(l)))."""
    return LossTerms(-x.stats["advantages"] * x.logp)


# ----------------------------------------------------------------------------- EGSW
@dataclasses.dataclass(frozen=True)
class Egsw(Clip):
    """The PPO clip, the entropy's weight `alpha` in the sequence-weight logits and their softmax
    temperature."""

    alpha: float = 1.0
    temperature: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        self.check({"temperature": (self.temperature > 0, "must be > 0")})


def egsw_stats(p, s):
    counted = s.grouped(s.counted)
    z = (s.grouped(s.seq_mean(s.advantages)) + p.alpha * s.grouped(s.seq_mean(s.entropy))) / p.temperature
    w, _ = _softmax_over(z, counted)
    return {"weight": s.per_row(counted.sum(-1, keepdims=True) * w)}


@loss("egsw", params=Egsw, unit="token", reference=reference.egsw,
      test_params=dict(CLIP_TEST, alpha=0.5, temperature=0.7),
      stats=egsw_stats, stats_reference=reference.egsw_stats, needs_groups=True,
      on_policy=lambda p, x: x.advantages * x.stats["weight"][:, None], **SURROGATE)
def egsw(p, x):
    """EGSW, trajectory-wise (arXiv 2503.22456; from the paper's formula as its summaries state it):
    the PPO surrogate of completion i times G softmax_g((A_i + alpha H_i) / temperature),
    H_i its mean token entropy: high-advantage, high-entropy completions weigh more (weights sum to G)."""
    terms = surrogate(p, x, x.logp - x.old_logp, x.advantages)
    return LossTerms(terms.u * x.stats["weight"][:, None], terms.clipped_low, terms.clipped_high, terms.metrics)
