"""Properties every registered policy loss must hold, checked for EVERY registered name (a new
registration is covered by default): the REINFORCE gradient at ratio 1 (or, where a loss declares
`on_policy`, REINFORCE's with the advantages it declares), exact micro-batch accumulation (losses,
gradients and metrics; the micro-batches split groups, so group statistics are exercised), masked
tokens never mattering, and clip counts equal to the float64 reference's. Inputs are a few fixed
seeds and shapes, so every case compiles once."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _algorithm_cases import (
    LMAX,
    all_options,
    cfg_for,
    make_batch,
    reference_loss,
    replace,
    rows,
    run,
    stats_for,
)
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from grpo_jax import metrics
from grpo_jax.algorithms import LOSSES, StepStats, losses, normalizer
from grpo_jax.config import AlgorithmConfig

SHAPE = (6, 6)  # make_batch's default: the jitted losses of the other test files are reused


def no_selection(x):
    """Step statistics of Clip-Cov that select no token and keep every token: the bare loss."""
    return StepStats({"select": jnp.zeros(x["mask"].shape)}, jnp.ones(x["mask"].shape))


def ratio_one(seed, token_adv):
    x = make_batch(seed, SHAPE, token_adv=token_adv)
    x["old_logp"] = x["logp"]
    return x


def on_policy_advantages(cfg, x):
    """The advantages whose REINFORCE gradient the loss must have at ratio 1: its declared
    `on_policy(params, x)` (with the step statistics of x), else x's own."""
    spec = cfg.loss.spec
    if spec.on_policy is None:
        return x["advantages"]
    mask = jnp.asarray(x["mask"])
    adv = jnp.asarray(x["advantages"])
    unit_adv = adv if spec.unit == "sequence" else (adv if adv.ndim == 2 else adv[:, None] * mask) * mask
    inputs = types.SimpleNamespace(advantages=unit_adv, mask=mask, stats=stats_for(cfg, x).loss)
    return np.asarray(spec.on_policy(cfg.loss, inputs), np.float32)


@pytest.mark.parametrize("name", list(LOSSES))
def test_at_ratio_one_every_loss_has_the_reinforce_gradient(name):
    """On-policy (l = l^old), every loss's gradient is REINFORCE's with the same aggregation
    (sequence losses: with the 1/L_i token weights of their sequence form) and the same advantages,
    or the ones its registration declares (`on_policy`: Clip-Cov drops its selected tokens, GVPO,
    DisCO, GTPO and EGSW weigh by their group statistics)."""
    token_advs = (False, True) if LOSSES[name].unit == "token" else (False,)
    for seed, token_adv in enumerate(token_advs):
        x = ratio_one(seed, token_adv)
        cfg = cfg_for(name)
        agg = "seq_mean_token_mean" if cfg.aggregation.name == "seq_mean" else cfg.aggregation
        reinforce = AlgorithmConfig(loss="reinforce", aggregation=agg, beta=0.0)
        grad = run(cfg, x)[1]
        want = run(reinforce, {**x, "advantages": on_policy_advantages(cfg, x)})[1]
        np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
        assert np.abs(grad).max() > 0


def test_gspo_token_equals_gspo_with_sequence_advantages():
    gspo = AlgorithmConfig.from_preset("gspo", loss=losses.Gspo(eps_low=0.03, eps_high=0.04))
    token = replace(gspo, loss=losses.GspoToken(eps_low=0.03, eps_high=0.04), aggregation="seq_mean_token_mean")
    for seed, noise in enumerate((0.02, 0.1, 0.3)):
        x = make_batch(seed, SHAPE, noise=noise)
        (l1, g1, _), (l2, g2, _) = run(gspo, x), run(token, x)
        np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("i, name", list(enumerate(LOSSES)))
def test_micro_batches_accumulate_to_the_full_batch(i, name):
    """Normalizer and step statistics of the whole batch, micro-batches of 2 rows (a group of 3 rows
    lies in two of them): the summed losses, the concatenated gradients and the merged metrics are
    those of the unsplit batch."""
    cfg = all_options(i, name)
    x = make_batch(i, SHAPE)
    nz, stats = normalizer(cfg, x["mask"], LMAX), stats_for(cfg, x)  # once, for the whole step
    loss, grad, m = run(cfg, x, nz, stats)
    parts = [run(cfg, rows(x, slice(j, j + 2)), nz, jax.tree.map(lambda v: v[j:j + 2], stats))
             for j in range(0, SHAPE[0], 2)]
    np.testing.assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), grad, rtol=1e-5, atol=1e-7)
    want, got = metrics.finalize(m), metrics.finalize(metrics.combine_all([p[2] for p in parts]))
    assert want.keys() == got.keys()
    for metric in want:
        np.testing.assert_allclose(got[metric], want[metric], rtol=1e-5, atol=1e-6, err_msg=metric)


@pytest.mark.parametrize("i, name", list(enumerate(LOSSES)))
def test_masked_tokens_never_matter(i, name):
    """Garbage (+-60) in every masked entry of every input changes nothing: loss, gradient (0 there),
    metrics and the step statistics."""
    token = LOSSES[name].unit == "token"
    cfg = all_options(i, name)
    for seed, token_adv in enumerate((False, True) if token else (False,)):
        x = make_batch(seed, SHAPE, token_adv=token_adv)
        rng = np.random.default_rng(seed + 1)
        off = x["mask"] == 0
        y = dict(x)
        for key in ("logp", "old_logp", "ref_logp", "sampler_logp", "entropy") + (("advantages",) if token_adv else ()):
            y[key] = np.where(off, rng.uniform(-60, 60, off.shape), x[key]).astype(np.float32)
        y["entropy"] = np.abs(y["entropy"])
        y["tokens"] = np.where(off, rng.integers(0, 3, off.shape), x["tokens"]).astype(np.int32)
        (l1, g1, m1), (l2, g2, m2) = run(cfg, x), run(cfg, y)
        np.testing.assert_allclose(l1, l2, rtol=1e-6)
        np.testing.assert_allclose(g1, g2, rtol=1e-6)
        assert (g1[off] == 0).all()
        for metric in m1:
            np.testing.assert_allclose(metrics.finalize(m1)[metric], metrics.finalize(m2)[metric], rtol=1e-6,
                                       err_msg=metric)


@pytest.mark.parametrize("name", list(LOSSES))
def test_clip_fractions_count_exactly_the_clipped_units(name):
    """Clip fractions (per clip unit and token-weighted) and their unit counts equal the float64
    reference's flags, at two noise levels and, for the clipped surrogates (Clip parameters), with dual clip."""
    duals = (None, 1.2) if issubclass(LOSSES[name].params, losses.Clip) else (None,)
    for seed, (noise, clip_c) in enumerate((n, c) for n in (0.1, 0.4) for c in duals):
        cfg = cfg_for(name, **({} if clip_c is None else dict(clip_c=clip_c)))
        x = make_batch(seed, SHAPE, noise=noise)
        _, _, m = run(cfg, x)
        _, fractions, _, units = reference_loss(cfg, x)
        got = metrics.finalize(m)
        for metric, value in fractions.items():
            np.testing.assert_allclose(got[metric], value, atol=1e-6, err_msg=metric)
        assert float(m["clip_frac_low"].weight) == units


def test_clip_flags_mark_units_whose_gradient_the_clip_removed():
    """For the clipping surrogates (independently of any reference): a unit with A != 0 is flagged
    exactly when its gradient vanishes (tokens; sequences for gspo)."""
    for name in ("ppo_clip", "gspo", "gspo_token", "gmpo", "clip_cov", "abc_grpo", "holder"):
        cfg = cfg_for(name)
        x = make_batch(0, SHAPE, noise=0.6)  # seed 0: some sequences clipped, not all
        _, grad, m = run(cfg, x, stats=no_selection(x))
        mask = x["mask"] > 0
        zero = (grad == 0) & mask
        sequence = LOSSES[name].unit == "sequence" and name != "gmpo"  # gmpo flags tokens
        if sequence or name == "gspo_token":  # gspo_token's ratio is the sequence ratio on every token
            zero = np.broadcast_to(zero.all(1, where=mask)[:, None], mask.shape) & mask
        units = mask.any(1).sum() if sequence else mask.sum()
        clipped = zero.any(1).sum() if sequence else zero.sum()
        fractions = metrics.finalize(m)
        np.testing.assert_allclose(fractions["clip_frac_low"] + fractions["clip_frac_high"], clipped / units, atol=1e-6)
        assert clipped > 0, name


def test_gspo_ratio_is_the_length_normalized_sequence_likelihood_ratio():
    cfg = AlgorithmConfig.from_preset("gspo", loss=losses.Gspo(eps_low=0.999, eps_high=1e6))  # never clipped: loss = -s
    for seed, length in enumerate((1, 4, 7)):
        x = make_batch(seed, (1, 7), noise=0.5, fixed_rows=False)
        x["mask"] = (np.arange(7) < length).astype(np.float32)[None]
        x["advantages"] = np.ones(1, np.float32)
        on = x["mask"][0] > 0
        p, p_old = np.exp(x["logp"][0].astype(np.float64)[on]), np.exp(x["old_logp"][0].astype(np.float64)[on])
        np.testing.assert_allclose(-run(cfg, x)[0], (np.prod(p) / np.prod(p_old)) ** (1 / length), rtol=1e-5)


# Every loss that decides over the whole step or over groups (a new one joins by its registration).
WHOLE_STEP = [name for name, spec in LOSSES.items() if spec.stats or spec.needs_groups]


@pytest.mark.parametrize("cfg", [
    AlgorithmConfig.from_preset("gspo", loss=losses.Gspo(eps_low=0.1, eps_high=0.15)),
    AlgorithmConfig.from_preset("dr_grpo", loss=losses.PpoClip(eps_low=0.1, eps_high=0.15)),
    AlgorithmConfig.from_preset("dapo", loss=losses.PpoClip(eps_low=0.1, eps_high=0.15)),
    cfg_for("clip_cov", top_entropy_quantile=0.5),
    *map(cfg_for, WHOLE_STEP),
], ids=["gspo", "dr_grpo", "dapo", "clip_cov_top_entropy", *WHOLE_STEP])
def test_sharded_over_devices_equals_unsharded(cfg):
    """Rows over 8 devices (normalizer and step statistics, group statistics over groups of 4 rows
    spread over devices, computed on the sharded arrays)."""
    x = make_batch(5, (8, 4), noise=0.3)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    sharded = {k: jax.device_put(jnp.asarray(v), NamedSharding(mesh, PartitionSpec("data"))) for k, v in x.items()}
    loss, grad, _ = run(cfg, x, stats=stats_for(cfg, x, group_size=4))
    loss_s, grad_s, _ = run(cfg, sharded, stats=stats_for(cfg, sharded, group_size=4))
    np.testing.assert_allclose(loss_s, loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad_s, grad, rtol=1e-6, atol=1e-8)

