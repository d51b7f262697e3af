"""Property tests (hypothesis) of the policy losses over random shapes, masks and lengths.

Shapes come from a small set so the jitted functions compile a bounded number of times."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from grpo_jax.algorithms import (
    AGGREGATIONS,
    LOSSES,
    SEQUENCE_LOSSES,
    AlgorithmConfig,
    combine_metrics,
    finalize_metrics,
    normalizer,
    policy_loss,
)

LMAX = 8
SHAPES = [(1, 1), (3, 5), (6, 4)]
TOKEN_AGGS = tuple(a for a in AGGREGATIONS if a != "seq_mean")
PROPS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def aggs(name):
    return ("seq_mean",) if name in SEQUENCE_LOSSES else TOKEN_AGGS


def cfg_for(name, agg, **kw):
    return AlgorithmConfig(**{**dict(loss=name, aggregation=agg, beta=0.0, eps_low=0.1, eps_high=0.15, eps_max=1.2), **kw})


def batch(seed, shape, noise=0.2, token_adv=False, density=0.7):
    rng = np.random.default_rng(seed)
    b, t = shape
    mask = (rng.random((b, t)) < density).astype(np.float32)
    logp = -np.abs(rng.normal(1.0, 0.5, (b, t)))
    old = logp + rng.normal(0, noise, (b, t))
    x = dict(
        logp=logp, old_logp=old, mask=mask,
        advantages=rng.normal(size=(b, t) if token_adv else (b,)),
        ref_logp=logp + rng.normal(0, 0.2, (b, t)),
        sampler_logp=old + rng.normal(0, 0.05, (b, t)),
        entropy=np.abs(rng.normal(1.0, 0.5, (b, t))),
    )
    return {k: jnp.asarray(v, jnp.float32) for k, v in x.items()}


@functools.cache
def loss_fn(cfg):
    """jit(value_and_grad) of policy_loss w.r.t. logp; arguments: x (dict) and the step normalizer."""

    def f(logp, x, nz):
        return policy_loss(cfg, logp, x["old_logp"], x["advantages"], x["mask"], normalizer=nz,
                           ref_logp=x["ref_logp"], sampler_logp=x["sampler_logp"], entropy=x["entropy"])

    fn = jax.jit(jax.value_and_grad(f, has_aux=True))
    return lambda x, nz: fn(x["logp"], x, nz)


def run(cfg, x, nz=None):
    (loss, metrics), grad = loss_fn(cfg)(x, normalizer(cfg, x["mask"], LMAX) if nz is None else nz)
    return np.asarray(loss), np.asarray(grad), metrics


cases = st.sampled_from([(n, a) for n in LOSSES for a in aggs(n)])
seeds = st.integers(0, 2**31)
shapes = st.sampled_from(SHAPES)


@PROPS
@given(case=cases, seed=seeds, shape=shapes, token_adv=st.booleans())
def test_at_ratio_one_every_loss_has_the_reinforce_gradient(case, seed, shape, token_adv):
    name, agg = case
    token_adv = token_adv and name not in SEQUENCE_LOSSES
    cfg = AlgorithmConfig.from_preset("grpo", loss=name, aggregation=agg, beta=0.0)  # paper clip ranges
    x = batch(seed, shape, token_adv=token_adv)
    x["old_logp"] = x["logp"]
    # gspo / gmpo: their sequence form implies 1/L_i token weights, i.e. seq_mean_token_mean
    reinforce = dataclasses.replace(cfg, loss="reinforce", aggregation="seq_mean_token_mean" if agg == "seq_mean" else agg)
    np.testing.assert_allclose(run(cfg, x)[1], run(reinforce, x)[1], rtol=1e-5, atol=1e-7)


@PROPS
@given(seed=seeds, shape=shapes, noise=st.sampled_from([0.02, 0.1, 0.3]))
def test_gspo_token_equals_gspo_with_sequence_advantages(seed, shape, noise):
    gspo = AlgorithmConfig.from_preset("gspo", eps_low=0.03, eps_high=0.04)
    token = dataclasses.replace(gspo, loss="gspo_token", aggregation="seq_mean_token_mean")
    x = batch(seed, shape, noise=noise)
    (l1, g1, _), (l2, g2, _) = run(gspo, x), run(token, x)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-7)


OPTIONS = [dict(), dict(beta=0.1), dict(beta=0.1, kl_estimator="k2"), dict(tis_level="sequence"), dict(entropy_coef=0.1)]


@PROPS
@given(case=cases, seed=seeds, k=st.sampled_from([2, 3]), option=st.sampled_from(OPTIONS))
def test_micro_batches_accumulate_to_the_full_batch(case, seed, k, option):
    cfg = cfg_for(*case, **option)
    x = batch(seed, (6, 4))
    nz = normalizer(cfg, x["mask"], LMAX)  # once, for the whole step
    loss, grad, metrics = run(cfg, x, nz)
    parts = [run(cfg, {n: v[i : i + 6 // k] for n, v in x.items()}, nz) for i in range(0, 6, 6 // k)]
    np.testing.assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), grad, rtol=1e-5, atol=1e-7)
    combined = functools.reduce(combine_metrics, [p[2] for p in parts])
    want, got = finalize_metrics(metrics), finalize_metrics(combined)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@PROPS
@given(case=cases, seed=seeds, shape=shapes, token_adv=st.booleans())
def test_masked_tokens_never_matter(case, seed, shape, token_adv):
    name, agg = case
    token_adv = token_adv and name not in SEQUENCE_LOSSES
    cfg = cfg_for(name, agg, beta=0.1, entropy_coef=0.1, tis_level="sequence")
    x = batch(seed, shape, token_adv=token_adv)
    rng = np.random.default_rng(seed + 1)
    off = np.asarray(x["mask"]) == 0
    y = dict(x)
    for key in ("logp", "old_logp", "ref_logp", "sampler_logp", "entropy") + (("advantages",) if token_adv else ()):
        y[key] = jnp.where(off, jnp.asarray(rng.uniform(-60, 60, off.shape), jnp.float32), x[key])
    (l1, g1, m1), (l2, g2, m2) = run(cfg, x), run(cfg, y)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    np.testing.assert_allclose(g1, g2, rtol=1e-6)
    assert (g1[off] == 0).all()
    for name in m1:
        np.testing.assert_allclose(m1[name], m2[name], rtol=1e-6, err_msg=name)


def expected_clips(cfg, x, grad):
    """Units whose clipped branch is active, found independently of the flags: for the clipping
    surrogates a unit (token, or sequence for sequence losses) with A != 0 is clipped exactly when its
    gradient vanishes; cispo truncates where r > eps_max; sapo and reinforce never clip."""
    mask = np.asarray(x["mask"]) > 0
    d = np.asarray(x["logp"], np.float64) - np.asarray(x["old_logp"], np.float64)
    adv = np.broadcast_to(np.asarray(x["advantages"])[:, None], mask.shape)
    if cfg.loss in ("sapo", "reinforce"):
        return 0, 0, mask.sum()
    if cfg.loss == "cispo":
        return 0, (np.exp(d)[mask] > cfg.eps_max).sum(), mask.sum()
    zero = grad == 0
    if cfg.loss == "gspo_token":  # its ratio is the sequence ratio s_i on every token
        d = np.broadcast_to(((d * mask).sum(1) / np.maximum(mask.sum(1), 1))[:, None], d.shape)
    if cfg.loss in SEQUENCE_LOSSES and cfg.loss != "gmpo":  # clipping per sequence
        rows = mask.any(1)
        zero, d, mask = zero.all(1, where=mask)[rows], (d * mask).sum(1)[rows], rows[rows]
        adv = adv[:, 0][np.asarray(x["mask"]).any(1)]
    clipped = zero & mask
    low = clipped & (adv < 0) & (d < 0)
    return low.sum(), (clipped & ~low).sum(), mask.sum()


@PROPS
@given(name=st.sampled_from(list(LOSSES)), seed=seeds, shape=shapes, noise=st.sampled_from([0.1, 0.4]), dual=st.booleans())
def test_clip_fractions_count_exactly_the_clipped_units(name, seed, shape, noise, dual):
    agg = "seq_mean" if name in SEQUENCE_LOSSES else "token_mean"
    dual = dual and name in ("ppo_clip", "gspo", "gspo_token")
    cfg = cfg_for(name, agg, **(dict(clip_c=1.2) if dual else {}))
    x = batch(seed, shape, noise=noise)
    _, grad, metrics = run(cfg, x)
    low, high, units = expected_clips(cfg, x, grad)
    m = finalize_metrics(metrics)
    assert float(metrics["clip_frac_low"][1]) == units
    np.testing.assert_allclose(m["clip_frac_low"], low / max(units, 1), atol=1e-6)
    np.testing.assert_allclose(m["clip_frac_high"], high / max(units, 1), atol=1e-6)


@PROPS
@given(seed=seeds, length=st.integers(1, 7))
def test_gspo_ratio_is_the_length_normalized_sequence_likelihood_ratio(seed, length):
    cfg = AlgorithmConfig.from_preset("gspo", eps_low=0.999, eps_high=1e6)  # never clipped: loss = -s
    x = batch(seed, (1, 7), noise=0.5)
    x["mask"] = (jnp.arange(7) < length).astype(jnp.float32)[None]
    x["advantages"] = jnp.ones(1)
    m = np.asarray(x["mask"][0]) > 0
    p, p_old = np.exp(np.asarray(x["logp"][0], np.float64)[m]), np.exp(np.asarray(x["old_logp"][0], np.float64)[m])
    np.testing.assert_allclose(-run(cfg, x)[0], (np.prod(p) / np.prod(p_old)) ** (1 / m.sum()), rtol=1e-5)


@pytest.mark.parametrize("preset", ["gspo", "dr_grpo", "dapo"])
def test_sharded_over_devices_equals_unsharded(preset):
    cfg = AlgorithmConfig.from_preset(preset, eps_low=0.1, eps_high=0.15)
    x = batch(5, (8, 4), noise=0.3)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    sharded = {k: jax.device_put(v, rows) for k, v in x.items()}
    loss, grad, _ = run(cfg, x)
    loss_s, grad_s, _ = run(cfg, sharded)
    np.testing.assert_allclose(loss_s, loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad_s, grad, rtol=1e-6, atol=1e-8)
