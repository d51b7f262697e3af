"""Policy losses against hand arithmetic and an independent float64 NumPy reference (values and
central-difference gradients). The reference loops over each completion's counted tokens, so masking
is by index selection, not by multiplication as in the library."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algorithms import (
    AGGREGATIONS,
    LOSSES,
    SEQUENCE_LOSSES,
    AlgorithmConfig,
    finalize_metrics,
    normalizer,
    policy_loss,
)

LMAX = 8


# ----------------------------------------------------------------------------- NumPy reference
# Each unit function gets the counted tokens of one completion: l (carries the gradient), f (the same
# values, held fixed: stop-gradient), o (old), a (advantages per token). Token losses return one value
# per token, sequence losses one value.
def np_surrogate(cfg, ratio, a):
    rho = ratio if cfg.delta is None else np.minimum(ratio, cfg.delta)
    u = -np.minimum(rho * a, np.clip(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * a)
    if cfg.clip_c is not None:
        u = np.where(a < 0, np.minimum(u, -cfg.clip_c * a), u)
    return u


def np_seq_ratio(l, o):
    """GSPO s = (pi(y) / pi_old(y)) ** (1 / |y|), from the probabilities directly."""
    return (np.prod(np.exp(l)) / np.prod(np.exp(o))) ** (1.0 / len(l))


NP_UNITS = {
    "ppo_clip": lambda cfg, l, f, o, a: np_surrogate(cfg, np.exp(l - o), a),
    "gspo": lambda cfg, l, f, o, a: np_surrogate(cfg, np_seq_ratio(l, o), a[0]),
    "gspo_token": lambda cfg, l, f, o, a: np_surrogate(cfg, np_seq_ratio(f, o) * np.exp(l - f), a),
    "gmpo": lambda cfg, l, f, o, a: -a[0] * np.exp(np.mean([
        min(d, np.clip(d, -cfg.eps_low, cfg.eps_high)) if a[0] > 0 else max(d, np.clip(d, -cfg.eps_low, cfg.eps_high))
        for d in l - o
    ])),
    "sapo": lambda cfg, l, f, o, a: np.array([
        -(4 / tau) / (1 + np.exp(-tau * (np.exp(d) - 1))) * ai
        for d, ai in zip(l - o, a)
        for tau in [cfg.tau_pos if ai > 0 else cfg.tau_neg]
    ]),
    "cispo": lambda cfg, l, f, o, a: -np.minimum(np.exp(f - o), cfg.eps_max) * a * l,
    "reinforce": lambda cfg, l, f, o, a: -a * l,
}


def np_kl(cfg, l, ref):
    if cfg.kl_estimator == "k1":
        return l - ref
    if cfg.kl_estimator == "k2":
        return (l - ref) ** 2 / 2
    x = ref - l
    return np.minimum(np.exp(np.clip(x, -20, 20)) - x - 1, 10)


def np_loss(cfg, lv, lf, old, adv, mask, ref=None, samp=None, ent=None):
    """The step loss in float64; lv carries the gradient, lf is its stop-gradient copy."""
    counted = [np.flatnonzero(mask[i] > 0) for i in range(len(mask))]
    n = sum(len(idx) > 0 for idx in counted)
    ntok = sum(len(idx) for idx in counted)
    total = 0.0
    for i, idx in enumerate(counted):
        if len(idx) == 0:
            continue
        a = adv[i, idx] if adv.ndim == 2 else np.full(len(idx), adv[i])
        u = NP_UNITS[cfg.loss](cfg, lv[i, idx], lf[i, idx], old[i, idx], a)
        if cfg.tis_level == "token":
            u = u * np.minimum(np.exp(old[i, idx] - samp[i, idx]), cfg.tis_cap)
        elif cfg.tis_level == "sequence":
            u = u * min(np.exp(np.sum(old[i, idx] - samp[i, idx])), cfg.tis_cap)
        reg = np.zeros(len(idx))
        if cfg.beta > 0:
            reg = reg + cfg.beta * np_kl(cfg, lv[i, idx], ref[i, idx])
        if cfg.entropy_coef:
            reg = reg - cfg.entropy_coef * ent[i, idx]
        u = u + (reg.mean() if cfg.loss in SEQUENCE_LOSSES else reg)
        total += {
            "seq_mean": lambda: u / n,
            "token_mean": lambda: u.sum() / ntok,
            "seq_mean_token_mean": lambda: u.mean() / n,
            "seq_mean_token_sum": lambda: u.sum() / n,
            "seq_mean_token_sum_norm": lambda: u.sum() / (n * LMAX),
        }[cfg.aggregation]()
    return total


def np_grad(cfg, logp, *args, h=1e-6, **kw):
    """Central differences in float64 over the counted tokens (masked ones stay 0)."""
    g = np.zeros_like(logp)
    for i, t in zip(*np.nonzero(args[2] > 0)):
        plus, minus = logp.copy(), logp.copy()
        plus[i, t] += h
        minus[i, t] -= h
        g[i, t] = (np_loss(cfg, plus, logp, *args, **kw) - np_loss(cfg, minus, logp, *args, **kw)) / (2 * h)
    return g


# ----------------------------------------------------------------------------- shared inputs
def make_batch(seed=0, b=5, t=6, noise=0.15, token_adv=False):
    rng = np.random.default_rng(seed)
    mask = (rng.random((b, t)) < 0.75).astype(np.float32)
    mask[0] = 0.0  # an empty completion contributes 0, never NaN
    mask[1] = 1.0
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
    return {k: v.astype(np.float32) for k, v in x.items()}


def jax_loss_and_grad(cfg, x):
    nz = normalizer(cfg, x["mask"], LMAX)
    rest = {k: v for k, v in x.items() if k != "logp"}

    def f(logp):
        return policy_loss(cfg, logp, **{k: rest[k] for k in ("old_logp", "advantages", "mask")}, normalizer=nz,
                           ref_logp=rest["ref_logp"], sampler_logp=rest["sampler_logp"], entropy=rest["entropy"])

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(x["logp"])
    return float(loss), np.asarray(grad), metrics


def check_against_numpy(cfg, x):
    x64 = {k: v.astype(np.float64) for k, v in x.items()}
    args = (x64["old_logp"], x64["advantages"], x64["mask"])
    kw = dict(ref=x64["ref_logp"], samp=x64["sampler_logp"], ent=x64["entropy"])
    loss, grad, _ = jax_loss_and_grad(cfg, x)
    want = np_loss(cfg, x64["logp"], x64["logp"], *args, **kw)
    want_grad = np_grad(cfg, x64["logp"], *args, **kw)
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-6)
    assert np.isfinite(grad).all()


def aggregations_for(loss):
    return ("seq_mean",) if loss in SEQUENCE_LOSSES else tuple(a for a in AGGREGATIONS if a != "seq_mean")


# Every registered loss x every aggregation it admits; clip ranges wide enough that both branches occur.
CASES = [(name, agg) for name in LOSSES for agg in aggregations_for(name)]


@pytest.mark.parametrize("name,agg", CASES)
def test_loss_matches_numpy_reference(name, agg):
    cfg = AlgorithmConfig(loss=name, aggregation=agg, beta=0.0, eps_low=0.1, eps_high=0.15, eps_max=1.1)
    check_against_numpy(cfg, make_batch(seed=hash((name, agg)) % 1000))


EXTRAS = {
    "dual_clip_and_delta": dict(loss="ppo_clip", aggregation="token_mean", delta=1.3, clip_c=1.25),
    "gspo_dual_clip": dict(loss="gspo", aggregation="seq_mean", eps_low=0.02, eps_high=0.03, clip_c=1.02),
    "kl_k1": dict(beta=0.1, kl_estimator="k1"),
    "kl_k2": dict(beta=0.1, kl_estimator="k2"),
    "kl_k3": dict(beta=0.1, kl_estimator="k3"),
    "kl_k3_sequence_loss": dict(loss="gspo", aggregation="seq_mean", beta=0.1),
    "entropy": dict(entropy_coef=0.05, aggregation="token_mean"),
    "entropy_gmpo": dict(loss="gmpo", aggregation="seq_mean", entropy_coef=0.05),
    "tis_token": dict(tis_level="token", tis_cap=1.02),
    "tis_sequence": dict(tis_level="sequence", tis_cap=1.05, aggregation="seq_mean_token_sum"),
    "tis_sequence_gspo": dict(loss="gspo", aggregation="seq_mean", tis_level="sequence", tis_cap=1.05),
}


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_options_match_numpy_reference(extra):
    cfg = AlgorithmConfig(**{**dict(eps_low=0.1, eps_high=0.15), **EXTRAS[extra]})
    check_against_numpy(cfg, make_batch(seed=7, noise=0.3))


@pytest.mark.parametrize("name", [n for n in LOSSES if n not in SEQUENCE_LOSSES])
def test_token_level_advantages_match_numpy_reference(name):
    cfg = AlgorithmConfig(loss=name, aggregation="token_mean", beta=0.0, eps_low=0.1, eps_high=0.15, eps_max=1.1)
    check_against_numpy(cfg, make_batch(seed=3, token_adv=True))


def test_k3_is_clamped():
    cfg = AlgorithmConfig(loss="reinforce", beta=1.0, kl_estimator="k3", aggregation="token_mean")
    x = make_batch(b=2, t=2)
    x.update(mask=np.ones((2, 2), np.float32), advantages=np.zeros(2, np.float32))
    x["ref_logp"] = x["logp"] + np.array([[30.0, -30.0], [0.0, 1.0]], np.float32)
    loss, _, _ = jax_loss_and_grad(cfg, x)
    # exp(min(30, 20)) - 30 - 1 is capped at 10; -30: e^-20 + 30 - 1 ~ 29 -> capped at 10; 0 -> 0; 1 -> e - 2
    np.testing.assert_allclose(loss, (10 + 10 + 0 + (np.e - 2)) / 4, rtol=1e-5)


# ----------------------------------------------------------------------------- hand-computed cases
def hand_loss(cfg, logp, old_logp, adv, mask, **kw):
    logp, old_logp, mask = (jnp.asarray(v, jnp.float32) for v in (logp, old_logp, mask))
    loss, metrics = policy_loss(cfg, logp, old_logp, jnp.asarray(adv, jnp.float32), mask,
                                normalizer=normalizer(cfg, mask, LMAX), **kw)
    return float(loss), {k: float(v) for k, v in finalize_metrics(metrics).items()}


LN = np.log


def test_hand_ppo_clip():
    cfg = AlgorithmConfig(loss="ppo_clip", aggregation="token_mean", beta=0.0, eps_low=0.2, eps_high=0.2)
    # one completion, A = 2, ratios 1.5 (clipped at 1.2), 0.5 (not clipped for A > 0), 1.1
    loss, m = hand_loss(cfg, [[LN(1.5), LN(0.5), LN(1.1)]], [[0.0, 0.0, 0.0]], [2.0], [[1, 1, 1]])
    assert loss == pytest.approx((-min(1.5 * 2, 1.2 * 2) - min(0.5 * 2, 0.8 * 2) - 1.1 * 2) / 3)  # (-2.4-1-2.2)/3
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == 0
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    assert m["log_ratio_abs_max"] == pytest.approx(LN(2.0))
    # A = -1: ratio 0.5 -> max(0.5, 0.8) * 1 = 0.8 (clipped low); 3.0 -> 3.0 without, 2.5 with dual clip c = 2.5
    loss, m = hand_loss(cfg, [[LN(0.5), LN(3.0)]], [[0.0, 0.0]], [-1.0], [[1, 1]])
    assert loss == pytest.approx((0.8 + 3.0) / 2)
    assert m["clip_frac_low"] == 0.5 and m["clip_frac_high"] == 0
    dual = dataclasses.replace(cfg, clip_c=2.5)
    loss, m = hand_loss(dual, [[LN(0.5), LN(3.0)]], [[0.0, 0.0]], [-1.0], [[1, 1]])
    assert loss == pytest.approx((0.8 + 2.5) / 2) and m["clip_frac_high"] == 0.5
    # delta = 2 caps the unclipped ratio: A = -1, r = 3 -> -min(2 * -1, 1.2 * -1) = 2
    capped = dataclasses.replace(cfg, delta=2.0)
    loss, _ = hand_loss(capped, [[LN(3.0)]], [[0.0]], [-1.0], [[1]])
    assert loss == pytest.approx(2.0)


def test_hand_gspo():
    cfg = AlgorithmConfig.from_preset("gspo", eps_low=0.1, eps_high=0.1)
    # seq 1: ratios 2 and 0.5 -> s = sqrt(2 * 0.5) = 1, A = 1 -> u = -1
    # seq 2: ratios 4 and 1 -> s = sqrt(4) = 2, A = 1 -> clipped to 1.1 -> u = -1.1
    # seq 3: one token, ratio 0.5, A = -2 -> max(0.5 * 2, 0.9 * 2) -> u = 1.8 (clipped low); seq 4 empty
    loss, m = hand_loss(cfg, [[LN(2), LN(0.5)], [LN(4), 0.0], [LN(0.5), 9.0], [5.0, 5.0]], np.zeros((4, 2)),
                        [1.0, 1.0, -2.0, 3.0], [[1, 1], [1, 1], [1, 0], [0, 0]])
    assert loss == pytest.approx((-1 - 1.1 + 1.8) / 3)
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == pytest.approx(1 / 3)


def test_hand_gspo_token():
    cfg = AlgorithmConfig.from_preset("gspo_token", eps_low=0.1, eps_high=0.1)
    # s = sqrt(2 * 0.5) = 1 for both tokens; token advantages 1 and -3 -> u = -1, +3; mean over tokens
    loss, m = hand_loss(cfg, [[LN(2), LN(0.5)]], [[0.0, 0.0]], [[1.0, -3.0]], [[1, 1]])
    assert loss == pytest.approx((-1 + 3) / 2)


def test_hand_gmpo():
    cfg = AlgorithmConfig.from_preset("gmpo")  # log clip [-0.4, 0.4]
    # A = 1 > 0: D = (0.6, -0.6) -> min(D, clip D) = (0.4, -0.6): rho = exp(-0.1)
    # A = -1 < 0: D = (0.6, -0.6) -> max(D, clip D) = (0.6, -0.4): rho = exp(0.1)
    loss, m = hand_loss(cfg, [[0.6, -0.6], [0.6, -0.6]], np.zeros((2, 2)), [1.0, -1.0], [[1, 1], [1, 1]])
    assert loss == pytest.approx((-np.exp(-0.1) + np.exp(0.1)) / 2)
    assert m["clip_frac_high"] == 0.25 and m["clip_frac_low"] == 0.25  # tokens: one of four each


def test_hand_sapo():
    cfg = AlgorithmConfig.from_preset("sapo")
    # r = 1: f = (4 / tau) * 1/2 -> u = -2 A / tau: A = 1, tau 1 -> -2; A = -1, tau 1.05 -> 2 / 1.05
    loss, _ = hand_loss(cfg, np.zeros((2, 1)), np.zeros((2, 1)), [1.0, -1.0], [[1], [1]])
    assert loss == pytest.approx((-2 + 2 / 1.05) / 2, abs=1e-6)


def test_hand_cispo():
    cfg = AlgorithmConfig.from_preset("cispo", eps_max=2.0)
    # r = e^1 > 2 -> weight 2; u = -2 * A * l = -2 * 1 * (-1) = 2; second token r = 1: u = -1 * 1 * (-2) = 2
    loss, m = hand_loss(cfg, [[-1.0, -2.0]], [[-2.0, -2.0]], [1.0], [[1, 1]])
    assert loss == pytest.approx((2 + 2) / 2) and m["clip_frac_high"] == 0.5


def test_hand_reinforce_and_every_aggregation():
    # two completions: u = -A l; seq 1: A = 1, l = (-1, -2) -> u = (1, 2); seq 2: A = 2, l = (-3, pad) -> u = 6
    logp, adv, mask = [[-1.0, -2.0], [-3.0, 7.0]], [1.0, 2.0], [[1, 1], [1, 0]]
    expected = {
        "token_mean": (1 + 2 + 6) / 3,
        "seq_mean_token_mean": ((1 + 2) / 2 + 6 / 1) / 2,
        "seq_mean_token_sum": ((1 + 2) + 6) / 2,
        "seq_mean_token_sum_norm": ((1 + 2) + 6) / (2 * LMAX),
    }
    assert set(expected) | {"seq_mean"} == set(AGGREGATIONS)
    for agg, want in expected.items():
        loss, _ = hand_loss(AlgorithmConfig(loss="reinforce", aggregation=agg, beta=0.0), logp, np.zeros((2, 2)), adv, mask)
        assert loss == pytest.approx(want), agg
    # seq_mean (sequence losses): gspo at r = 1, A = (1, 2): u = (-1, -2) -> mean -1.5
    loss, _ = hand_loss(AlgorithmConfig.from_preset("gspo"), logp, logp, adv, mask)
    assert loss == pytest.approx(-1.5)


def test_hand_kl_entropy_tis_and_metrics():
    cfg = AlgorithmConfig(loss="reinforce", aggregation="token_mean", beta=0.5, kl_estimator="k1", entropy_coef=0.1,
                          tis_level="token", tis_cap=2.0)
    # tokens: l = (-1, -2), A = 1 -> u = (1, 2); l_old - l_samp = (ln 3, 0) -> w = (min(3, 2), 1) = (2, 1)
    # k1 = l - l_ref = (0.5, -1) times beta 0.5 -> (0.25, -0.5); entropy (1, 2) times -0.1 -> (-0.1, -0.2)
    loss, m = hand_loss(cfg, [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [[1, 1]], ref_logp=jnp.array([[-1.5, -1.0]]),
                        sampler_logp=jnp.array([[-1.0 - LN(3), -2.0]]), entropy=jnp.array([[1.0, 2.0]]))
    assert loss == pytest.approx(((1 * 2 + 0.25 - 0.1) + (2 * 1 - 0.5 - 0.2)) / 2, rel=1e-6)
    assert m["tis_weight_mean"] == pytest.approx(1.5)
    assert m["sampler_drift_mean"] == pytest.approx(LN(3) / 2) and m["sampler_drift_max"] == pytest.approx(LN(3))
    assert m["entropy_mean"] == pytest.approx(1.5)
    k3 = lambda x: np.exp(x) - x - 1  # x = l_ref - l = (-0.5, 1)
    assert m["kl_k3_mean"] == pytest.approx((k3(-0.5) + k3(1.0)) / 2, rel=1e-6)


def test_sequence_tis_weight_is_exp_of_summed_difference():
    cfg = AlgorithmConfig(loss="reinforce", aggregation="seq_mean_token_sum", beta=0.0, tis_level="sequence", tis_cap=10.0)
    # l_old - l_samp = (0.5, 0.25) -> w = exp(0.75) for the whole completion; u = (1, 2) * w
    loss, _ = hand_loss(cfg, [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [[1, 1]], sampler_logp=jnp.array([[-1.5, -2.25]]))
    assert loss == pytest.approx(3 * np.exp(0.75), rel=1e-6)


def test_empty_batch_is_finite():
    for name in LOSSES:
        cfg = AlgorithmConfig(loss=name, aggregation=aggregations_for(name)[0], beta=0.0)
        loss, m = hand_loss(cfg, np.zeros((2, 3)), np.ones((2, 3)), [1.0, -1.0], np.zeros((2, 3)))
        assert loss == 0.0 and all(np.isfinite(v) for v in m.values()), name


def test_user_errors_before_compiling():
    x = make_batch(b=2, t=3)
    cfg = AlgorithmConfig.from_preset("grpo")  # beta = 0.04
    nz = normalizer(cfg, x["mask"], LMAX)
    with pytest.raises(ValueError, match="beta=0.04 needs ref_logp"):
        policy_loss(cfg, x["logp"], x["old_logp"], x["advantages"], x["mask"], normalizer=nz)
    gspo = AlgorithmConfig.from_preset("gspo")
    with pytest.raises(ValueError, match="gspo_token"):
        policy_loss(gspo, x["logp"], x["old_logp"], np.zeros((2, 3), np.float32), x["mask"], normalizer=nz)
    with pytest.raises(ValueError, match="tis_level"):
        policy_loss(dataclasses.replace(gspo, tis_level="sequence"), x["logp"], x["old_logp"], x["advantages"],
                    x["mask"], normalizer=nz)
    with pytest.raises(ValueError, match="max_completion_len"):
        normalizer(cfg, x["mask"], 0)
    # beta = 0 needs no reference log-probs at all
    policy_loss(gspo, x["logp"], x["old_logp"], x["advantages"], x["mask"], normalizer=nz)
