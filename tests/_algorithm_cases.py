"""Shared inputs of the algorithm tests: configurations built from the registries, random batches,
the jitted policy loss and its float64 reference (`grpo_jax.algorithms.reference`).

A newly registered loss or estimator is covered by every registry-wide test without touching this
file: its registration's `test_params` are the parameter values that exercise both branches of it.
Batches hold groups of `GROUP` consecutive rows, with token ids from a vocabulary of three so that
groups share tokens (GTPO's conflicts).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    LOSSES,
    AlgorithmConfig,
    needs_step_stats,
    normalizer,
    policy_loss,
    reference,
    step_stats,
)

LMAX = 8
GROUP = 3  # completions per prompt in the test batches (rows [3k, 3k + 3) are one group)
def aggregations_for(name):
    return tuple(a for a, spec in AGGREGATIONS.items() if spec.unit == LOSSES[name].unit)


def default_aggregation(name):
    return "seq_mean" if LOSSES[name].unit == "sequence" else "token_mean"


def params_for(registry, name, **overrides):
    """The parameters of variant `name` at its registration's test values, then `overrides`."""
    spec = registry[name]
    return spec.params(**{**spec.test_params, **overrides})


CONFIG_FIELDS = {f.name for f in dataclasses.fields(AlgorithmConfig)}


def split(overrides):
    """(AlgorithmConfig fields, the part's parameters) of keyword overrides, by name."""
    return ({k: v for k, v in overrides.items() if k in CONFIG_FIELDS},
            {k: v for k, v in overrides.items() if k not in CONFIG_FIELDS})


def cfg_for(name, aggregation=None, **overrides):
    """A config of loss `name` at its test parameters (or of the loss parameters `name` as given), beta
    = 0, then `overrides`: AlgorithmConfig fields by their names, the others the loss's parameters."""
    fields, params = split(overrides)
    loss = params_for(LOSSES, name, **params) if isinstance(name, str) else dataclasses.replace(name, **params)
    return AlgorithmConfig(**{"loss": loss, "aggregation": aggregation or default_aggregation(loss.name), "beta": 0.0,
                              **fields})


# Every loss once, the aggregations of its unit taken in turn (every aggregation is seen).
CASES = [(name, aggregations_for(name)[i % len(aggregations_for(name))]) for i, name in enumerate(LOSSES)]
CORRECTIONS = [dict(tis_level="sequence"), dict(tis_level="geometric", tis_mode="icepop", tis_cap=1.05)]


def all_options(i, name):
    """Loss `name` with every option around it at once (KL, entropy bonus, rollout correction,
    off-policy masking, top-entropy selection for token losses); its aggregation, KL estimator and
    correction mode taken in turn over the losses (i: its index in LOSSES), so that every one is seen.
    The reference, micro-batch and masked-token tests share it (and its compilation)."""
    token = LOSSES[name].unit == "token"
    return cfg_for(name, CASES[i][1], beta=0.1, kl_estimator=("k3", "k2", "k1")[i % 3], entropy_coef=0.1,
                   off_policy_threshold=0.05, **CORRECTIONS[i % 2], **(dict(top_entropy_quantile=0.5) if token else {}))


def advantage_cfg(name, **overrides):
    """A config of advantage `name` at its test parameters, then `overrides`: AlgorithmConfig fields by
    their names, the others the estimator's parameters."""
    fields, params = split(overrides)
    return AlgorithmConfig(advantage=params_for(ADVANTAGES, name, **params), **fields)


def make_batch(seed=0, shape=(6, 6), noise=0.15, token_adv=False, density=0.75, fixed_rows=True):
    """float32 inputs of policy_loss; with `fixed_rows` row 0 is empty and row 1 full."""
    rng = np.random.default_rng(seed)
    b, t = shape
    mask = (rng.random((b, t)) < density).astype(np.float32)
    if fixed_rows and b > 1:
        mask[0], mask[1] = 0.0, 1.0  # an empty completion contributes 0, never NaN
    logp = -np.abs(rng.normal(1.0, 0.5, (b, t)))
    old = logp + rng.normal(0, noise, (b, t))
    x = dict(
        logp=logp,
        old_logp=old,
        advantages=rng.normal(size=(b, t) if token_adv else (b,)),
        mask=mask,
        ref_logp=logp + rng.normal(0, 0.2, (b, t)),
        sampler_logp=old + rng.normal(0, 0.05, (b, t)),
        entropy=np.abs(rng.normal(1.0, 0.5, (b, t))),
    )
    x = {k: v.astype(np.float32) for k, v in x.items()}
    x["priority"] = rng.permutation(b * t).reshape(b, t).astype(np.int32)
    x["tokens"] = rng.integers(0, 3, (b, t)).astype(np.int32)
    return x


def stats_for(cfg, x, group_size=GROUP):
    """The step statistics of batch x (None when the config needs none)."""
    if not needs_step_stats(cfg):
        return None
    return step_stats(cfg, x["logp"], x["old_logp"], x["advantages"], x["mask"], x["entropy"], x["priority"],
                      tokens=x["tokens"], group_size=group_size)


@functools.cache
def loss_and_grad(cfg):
    """jit(value_and_grad) of policy_loss w.r.t. logp: f(x, normalizer, stats) -> ((loss, metrics), grad)."""

    def f(logp, x, nz, stats):
        return policy_loss(cfg, logp, x["old_logp"], x["advantages"], x["mask"], ref_logp=x["ref_logp"],
                           sampler_logp=x["sampler_logp"], entropy=x["entropy"], normalizer=nz, stats=stats)

    fn = jax.jit(jax.value_and_grad(f, has_aux=True))
    return lambda x, nz, stats: fn(x["logp"], x, nz, stats)


def run(cfg, x, nz=None, stats="auto"):
    """(loss, grad, metrics) as numpy / Metric; normalizer and stats of x itself unless given."""
    x = {k: jnp.asarray(v) for k, v in x.items()}
    nz = normalizer(cfg, x["mask"], LMAX) if nz is None else nz
    stats = stats_for(cfg, x) if isinstance(stats, str) else stats
    (loss, metrics), grad = loss_and_grad(cfg)(x, nz, stats)
    return np.asarray(loss), np.asarray(grad), metrics


def reference_loss(cfg, x, group_size=GROUP):
    """(loss, fractions (clipped; zeroed by rollout correction), gradient, clip units) of the float64
    reference on the same inputs."""
    x64 = {k: np.asarray(v, np.float64) if k not in ("priority", "tokens") else np.asarray(v) for k, v in x.items()}
    args = (x64["old_logp"], x64["advantages"], x64["mask"])
    kw = dict(ref_logp=x64["ref_logp"], sampler_logp=x64["sampler_logp"], entropy=x64["entropy"],
              priority=x64["priority"], tokens=x64["tokens"], group_size=group_size, max_completion_len=LMAX)
    loss, fractions, units = reference.policy_loss(cfg, x64["logp"], x64["logp"], *args, **kw)
    return loss, fractions, reference.policy_loss_grad(cfg, x64["logp"], *args, **kw), units


def rows(x, index):
    """The rows `index` of every input (a micro-batch)."""
    return {k: v[index] for k, v in x.items()}


def replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)
