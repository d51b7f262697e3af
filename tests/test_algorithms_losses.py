"""Every registered policy loss (and every option around it) against the independent float64 NumPy
reference of grpo_jax.algorithms.reference (values, central-difference gradients, clip fractions),
and a set of hand-computed cases."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from _algorithm_cases import LMAX, aggregations_for, all_options, cfg_for, make_batch, reference_loss, run

from grpo_jax import metrics
from grpo_jax.algorithms import LOSSES, losses, normalizer, policy_loss, reference, step_stats
from grpo_jax.config import AlgorithmConfig


def check_against_reference(cfg, x):
    loss, grad, m = run(cfg, x)
    want, fractions, want_grad, _ = reference_loss(cfg, x)
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=2e-6)
    assert np.isfinite(grad).all()
    got = metrics.finalize(m)
    for name, value in fractions.items():
        np.testing.assert_allclose(got[name], value, atol=1e-6, err_msg=name)
    return got


@pytest.mark.parametrize("i, name", list(enumerate(LOSSES)))
def test_loss_matches_reference(i, name):
    """Every loss with every option around it, its aggregation taken in turn (every aggregation is
    seen with several losses; an aggregation acts on the unit losses alone, so not every pair compiles)."""
    check_against_reference(all_options(i, name), make_batch(seed=sum(map(ord, name)) % 1000))


@pytest.mark.parametrize("name", [n for n, spec in LOSSES.items() if spec.unit == "token"])
def test_token_level_advantages_match_reference(name):
    check_against_reference(cfg_for(name), make_batch(seed=3, token_adv=True))


EXTRAS = {
    "dual_clip_and_delta": dict(loss=losses.PpoClip(delta=1.3, clip_c=1.25)),
    "gspo_dual_clip": dict(loss=losses.Gspo(eps_low=0.02, eps_high=0.03, clip_c=1.02)),
    "kl_k1": dict(loss="ppo_clip", beta=0.1, kl_estimator="k1"),
    "kl_k2": dict(loss="ppo_clip", beta=0.1, kl_estimator="k2"),
    "kl_k3": dict(loss="ppo_clip", beta=0.1, kl_estimator="k3"),
    "kl_k3_sequence_loss": dict(loss="gspo", beta=0.1),
    "entropy": dict(loss="ppo_clip", entropy_coef=0.05),
    "entropy_gmpo": dict(loss="gmpo", entropy_coef=0.05),
    # 0.45: the quantile falls between two counted entropies (at a position such as (n - 1) * 0.6 = 15, float32
    # and float64 round the interpolation differently and may disagree on the token at the threshold)
    "top_entropy": dict(loss="ppo_clip", top_entropy_quantile=0.45),
    "top_entropy_clip_cov_kl": dict(loss=losses.ClipCov(**LOSSES["clip_cov"].test_params), top_entropy_quantile=0.6,
                                    beta=0.1),
    "off_policy_mask": dict(loss="ppo_clip", off_policy_threshold=0.03),
    "off_policy_mask_gspo": dict(loss="gspo", off_policy_threshold=0.03),
    **{f"tis_{level}_{mode}": dict(loss="ppo_clip", tis_level=level, tis_mode=mode, tis_cap=cap)
       for level, cap in (("token", 1.04), ("sequence", 1.04), ("geometric", 1.01))
       for mode in ("truncate", "mask", "icepop")},
    "tis_sequence_gspo": dict(loss="gspo", tis_level="sequence", tis_cap=1.05),
    "tis_geometric_gmpo_icepop": dict(loss="gmpo", tis_level="geometric", tis_mode="icepop", tis_cap=1.02),
    "tis_and_off_policy_mask": dict(loss="sapo", tis_level="token", tis_cap=1.04, off_policy_threshold=0.03),
}


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_options_match_reference(extra):
    kw = dict(EXTRAS[extra])
    check_against_reference(cfg_for(kw.pop("loss"), **kw), make_batch(seed=7, noise=0.3))


def test_correction_options_really_act():
    """The rollout-correction cases above are not vacuous: on that batch each mode zeroes or caps
    some units and the off-policy mask drops some completions."""
    x = make_batch(seed=7, noise=0.3)
    for extra in ("tis_token_mask", "tis_token_icepop", "tis_geometric_icepop", "off_policy_mask"):
        kw = dict(EXTRAS[extra])
        m = metrics.finalize(run(cfg_for(kw.pop("loss"), **kw), x)[2])
        name = "off_policy_masked_frac" if extra == "off_policy_mask" else "tis_masked_frac"
        assert 0 < m[name] < 1, (extra, m[name])


# Losses in which D also enters without an exponent, so |D| = 100 and |D| = 20 differ by design.
LINEAR_IN_D = {"kl_cov": "coef |D|", "gvpo": "beta sum_t D", "disco": "beta [mean(l^old - l) - delta]_+"}


def test_every_log_ratio_is_clamped():
    """|D| = 100 (a stale or broken l^old): exp would overflow to inf; every loss stays finite, and
    the ratios (and sampler weights) are those of the clamp |D| = 20 (old code: inf or NaN); so is the
    loss, where D enters only through exponents."""
    for name in LOSSES:
        cfg = cfg_for(name, tis_level="token" if LOSSES[name].unit == "token" else "sequence", tis_cap=1e9)
        x = make_batch(seed=1)
        x["advantages"] = -np.abs(x["advantages"])  # A < 0: the unclipped branch -rA is the active one
        for d in (100.0, -100.0):
            far, edge = dict(x), dict(x)
            far["old_logp"], edge["old_logp"] = x["logp"] - d, x["logp"] - np.sign(d) * 20.0
            far["sampler_logp"], edge["sampler_logp"] = far["old_logp"] - d, edge["old_logp"] - np.sign(d) * 20.0
            loss, grad, m = run(cfg, far)
            assert np.isfinite(loss) and np.isfinite(grad).all(), (name, d)
            edge_loss, _, edge_m = run(cfg, edge)
            for key in ("ratio_max", "ratio_min", "tis_weight_mean"):
                np.testing.assert_allclose(metrics.finalize(m)[key], metrics.finalize(edge_m)[key], rtol=1e-5)
            if name not in LINEAR_IN_D:
                np.testing.assert_allclose(loss, edge_loss, rtol=1e-5, err_msg=name)


def test_step_selections_match_reference():
    """Clip-Cov's random subset, KL-Cov's top covariance and the top-entropy tokens, decided over
    the whole batch, against the reference's sort-based selection."""
    x = make_batch(seed=11, shape=(6, 7), noise=0.1)
    x64 = {k: np.asarray(v, np.float64) for k, v in x.items()}
    # the last: a fraction larger than the candidates, so all candidates are taken
    for cfg in (cfg_for("clip_cov"), cfg_for("kl_cov", top_entropy_quantile=0.3), cfg_for("clip_cov", ratio=0.9)):
        stats = step_stats(cfg, x["logp"], x["old_logp"], x["advantages"], x["mask"], x["entropy"], x["priority"])
        want, keep = reference.step_statistics(cfg, x64["logp"], x64["old_logp"], x64["advantages"], x64["mask"],
                                               x64["entropy"], x["priority"])
        np.testing.assert_array_equal(np.asarray(stats.loss["select"]) > 0, want["select"] > 0)
        np.testing.assert_array_equal(np.asarray(stats.keep) > 0, keep)
        assert 0 < want["select"].sum() < x["mask"].sum()


# ----------------------------------------------------------------------------- hand-computed cases
def hand_loss(cfg, logp, old_logp, adv, mask, stats=None, **kw):
    logp, old_logp, mask = (jnp.asarray(v, jnp.float32) for v in (logp, old_logp, mask))
    loss, m = policy_loss(cfg, logp, old_logp, jnp.asarray(adv, jnp.float32), mask,
                          normalizer=normalizer(cfg, mask, LMAX), stats=stats, **kw)
    return float(loss), {k: float(v) for k, v in metrics.finalize(m).items()}


LN = np.log


def test_hand_ppo_clip():
    cfg = AlgorithmConfig(loss=losses.PpoClip(eps_low=0.2, eps_high=0.2), aggregation="token_mean", beta=0.0)
    # one completion, A = 2, ratios 1.5 (clipped at 1.2), 0.5 (not clipped for A > 0), 1.1
    loss, m = hand_loss(cfg, [[LN(1.5), LN(0.5), LN(1.1)]], [[0.0, 0.0, 0.0]], [2.0], [[1, 1, 1]])
    assert loss == pytest.approx((-min(1.5 * 2, 1.2 * 2) - min(0.5 * 2, 0.8 * 2) - 1.1 * 2) / 3)  # (-2.4-1-2.2)/3
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == 0
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    assert m["log_ratio_abs_max"] == pytest.approx(LN(2.0))
    assert m["loss"] == pytest.approx(loss)
    # A = -1: ratio 0.5 -> max(0.5, 0.8) * 1 = 0.8 (clipped low); 3.0 -> 3.0 without, 2.5 with dual clip c = 2.5
    loss, m = hand_loss(cfg, [[LN(0.5), LN(3.0)]], [[0.0, 0.0]], [-1.0], [[1, 1]])
    assert loss == pytest.approx((0.8 + 3.0) / 2)
    assert m["clip_frac_low"] == 0.5 and m["clip_frac_high"] == 0
    dual = dataclasses.replace(cfg, loss=losses.PpoClip(clip_c=2.5))
    loss, m = hand_loss(dual, [[LN(0.5), LN(3.0)]], [[0.0, 0.0]], [-1.0], [[1, 1]])
    assert loss == pytest.approx((0.8 + 2.5) / 2) and m["clip_frac_high"] == 0.5
    # delta = 2 caps the unclipped ratio: A = -1, r = 3 -> -min(2 * -1, 1.2 * -1) = 2; r = 1.5 is not capped
    capped = dataclasses.replace(cfg, loss=losses.PpoClip(delta=2.0))
    loss, m = hand_loss(capped, [[LN(3.0), LN(1.5)]], [[0.0, 0.0]], [-1.0], [[1, 1]])
    assert loss == pytest.approx((2.0 + 1.5) / 2) and m["delta_capped_frac"] == 0.5


def test_hand_gspo_clips_per_sequence_and_per_token():
    cfg = AlgorithmConfig.from_preset("gspo", loss=losses.Gspo(eps_low=0.1, eps_high=0.1))
    # seq 1: ratios 2 and 0.5 -> s = sqrt(2 * 0.5) = 1, A = 1 -> u = -1
    # seq 2: ratios 4 and 1 -> s = sqrt(4) = 2, A = 1 -> clipped to 1.1 -> u = -1.1
    # seq 3: one token, ratio 0.5, A = -2 -> max(0.5 * 2, 0.9 * 2) -> u = 1.8 (clipped low); seq 4 empty
    loss, m = hand_loss(cfg, [[LN(2), LN(0.5)], [LN(4), 0.0], [LN(0.5), 9.0], [5.0, 5.0]], np.zeros((4, 2)),
                        [1.0, 1.0, -2.0, 3.0], [[1, 1], [1, 1], [1, 0], [0, 0]])
    assert loss == pytest.approx((-1 - 1.1 + 1.8) / 3)
    # per sequence: 1 of 3 high, 1 of 3 low; token-weighted: 2 of 5 tokens high, 1 of 5 low
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == pytest.approx(1 / 3)
    assert m["clip_frac_high_tokens"] == pytest.approx(2 / 5) and m["clip_frac_low_tokens"] == pytest.approx(1 / 5)


def test_hand_gspo_token():
    cfg = AlgorithmConfig.from_preset("gspo_token", loss=losses.GspoToken(eps_low=0.1, eps_high=0.1))
    # s = sqrt(2 * 0.5) = 1 for both tokens; token advantages 1 and -3 -> u = -1, +3; mean over tokens
    loss, _ = hand_loss(cfg, [[LN(2), LN(0.5)]], [[0.0, 0.0]], [[1.0, -3.0]], [[1, 1]])
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
    cfg = AlgorithmConfig.from_preset("cispo", loss=losses.Cispo(eps_max=2.0))
    # r = e^1 > 2 -> weight 2; u = -2 * A * l = -2 * 1 * (-1) = 2; second token r = 1: u = -1 * 1 * (-2) = 2
    loss, m = hand_loss(cfg, [[-1.0, -2.0]], [[-2.0, -2.0]], [1.0], [[1, 1]])
    assert loss == pytest.approx((2 + 2) / 2) and m["clip_frac_high"] == 0.5


def test_hand_clip_cov_and_kl_cov():
    # Two completions, A = (2, -1), l = (-1, -2 | -1, -3), all on-policy (r = 1). Means over the 4
    # tokens: A 1/2, l -7/4: cov = (A - 1/2)(l + 7/4) = (1.125, -0.375 | -1.125, 1.875).
    logp, adv, mask = np.array([[-1.0, -2.0], [-1.0, -3.0]]), np.array([2.0, -1.0]), np.ones((2, 2))
    priority = np.array([[3, 2], [1, 0]], np.int32)
    # Clip-Cov, band (0.5, 2), fraction 0.5 -> 2 tokens; candidates: cov 1.125 and 1.875, both picked:
    # their -A r terms vanish, leaving u = (0, -2 | 1, 0) -> token mean -1/4
    cfg = AlgorithmConfig(loss=losses.ClipCov(ratio=0.5, lb=0.5, ub=2.0), aggregation="token_mean", beta=0.0)
    stats = step_stats(cfg, logp, logp, adv, mask, np.ones((2, 2)), priority)
    np.testing.assert_array_equal(stats.loss["select"], [[1, 0], [0, 1]])
    loss, m = hand_loss(cfg, logp, logp, adv, mask, stats=stats)
    assert loss == pytest.approx(-1 / 4) and m["cov_selected_frac"] == 0.5
    # fraction 0.25 -> 1 token: the candidate of lowest priority, (1, 1)
    one = dataclasses.replace(cfg, loss=losses.ClipCov(ratio=0.25, lb=0.5, ub=2.0))
    np.testing.assert_array_equal(step_stats(one, logp, logp, adv, mask, np.ones((2, 2)), priority).loss["select"],
                                  [[0, 0], [0, 1]])
    # KL-Cov, fraction 0.25 -> the largest covariance, (1, 1); with D = 0.5 there (coef 2):
    # u = -A r + coef |D| sel = (-2, -2 | 1, e^0.5 + 1)
    kl = AlgorithmConfig(loss=losses.KlCov(ratio=0.25, coef=2.0), aggregation="token_mean", beta=0.0)
    stats = step_stats(kl, logp, logp, adv, mask, np.ones((2, 2)), priority)
    np.testing.assert_array_equal(stats.loss["select"], [[0, 0], [0, 1]])
    old = np.array(logp) - np.array([[0, 0], [0, 0.5]])
    loss, _ = hand_loss(kl, logp, old, adv, mask, stats=stats)
    assert loss == pytest.approx((-2 - 2 + 1 + np.exp(0.5) + 2 * 0.5) / 4, rel=1e-6)


def test_hand_top_entropy():
    # entropies (1, 4 | 2, 3): the top half keeps >= the 0.5 quantile 2.5 -> tokens 4 and 3
    cfg = AlgorithmConfig(loss="reinforce", aggregation="token_mean", beta=0.0, top_entropy_quantile=0.5)
    logp, mask, entropy = np.array([[-1.0, -2.0], [-3.0, -4.0]]), np.ones((2, 2)), np.array([[1.0, 4.0], [2.0, 3.0]])
    stats = step_stats(cfg, logp, logp, np.ones(2), mask, entropy, np.zeros((2, 2), np.int32))
    np.testing.assert_array_equal(stats.keep, [[0, 1], [0, 1]])
    loss, m = hand_loss(cfg, logp, logp, [1.0, 1.0], mask, stats=stats, entropy=jnp.asarray(entropy))
    assert loss == pytest.approx((2 + 4) / 4) and m["top_entropy_kept_frac"] == 0.5


def test_hand_reinforce_and_every_aggregation():
    # two completions: u = -A l; seq 1: A = 1, l = (-1, -2) -> u = (1, 2); seq 2: A = 2, l = (-3, pad) -> u = 6
    logp, adv, mask = [[-1.0, -2.0], [-3.0, 7.0]], [1.0, 2.0], [[1, 1], [1, 0]]
    expected = {
        "token_mean": (1 + 2 + 6) / 3,
        "seq_mean_token_mean": ((1 + 2) / 2 + 6 / 1) / 2,
        "seq_mean_token_sum": ((1 + 2) + 6) / 2,
        "seq_mean_token_sum_norm": ((1 + 2) + 6) / (2 * LMAX),
    }
    assert set(expected) == set(aggregations_for("reinforce"))
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
    k3 = lambda x: np.exp(x) - x - 1  # x = l_ref - l = (-0.5, 1)  # noqa: E731
    assert m["kl_k3_mean"] == pytest.approx((k3(-0.5) + k3(1.0)) / 2, rel=1e-6)


@pytest.mark.parametrize("level, mode, weights", [
    # l_old - l_samp = (0.5, 0.25): token w = (e^.5, e^.25) = (1.65, 1.28); sequence e^.75 = 2.12; geometric e^.375 = 1.45
    ("token", "truncate", [1.5, np.exp(0.25)]),
    ("token", "mask", [0.0, np.exp(0.25)]),
    ("sequence", "truncate", [1.5, 1.5]),
    ("sequence", "mask", [0.0, 0.0]),
    ("geometric", "truncate", [np.exp(0.375)] * 2),
    ("geometric", "icepop", [np.exp(0.375)] * 2),
])
def test_hand_rollout_correction(level, mode, weights):
    cfg = AlgorithmConfig(loss="reinforce", aggregation="seq_mean_token_sum", beta=0.0, tis_level=level,
                          tis_mode=mode, tis_cap=1.5)
    # u = (1, 2) times the weights, summed per completion
    loss, m = hand_loss(cfg, [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [[1, 1]], sampler_logp=jnp.array([[-1.5, -2.25]]))
    assert loss == pytest.approx(1 * weights[0] + 2 * weights[1], rel=1e-6)


def test_hand_icepop_drops_small_weights_and_off_policy_masking():
    cfg = AlgorithmConfig(loss="reinforce", aggregation="token_mean", beta=0.0, tis_level="token", tis_mode="icepop",
                          tis_cap=2.0)
    # d = (-ln 3, 0, ln 1.5): w = 1/3 < 1/2 dropped, 1 kept, 1.5 kept; u = (1, 2, 3) -> (0 + 2 + 4.5) / 3
    l, samp = [[-1.0, -2.0, -3.0]], jnp.array([[-1.0 + LN(3), -2.0, -3.0 - LN(1.5)]])
    loss, m = hand_loss(cfg, l, l, [1.0], [[1, 1, 1]], sampler_logp=samp)
    assert loss == pytest.approx((0 + 2 + 1.5 * 3) / 3, rel=1e-6) and m["tis_masked_frac"] == pytest.approx(1 / 3)
    # DeepSeek-V3.2 masking, delta = 0.3: completion 1 (A < 0, mean |d| = (ln 3 + ln 1.5) / 3 = 0.50) is
    # dropped; completion 2 (A > 0, same drift) and completion 3 (A < 0, no drift) are kept
    opsm = AlgorithmConfig(loss="reinforce", aggregation="seq_mean_token_sum", beta=0.0, off_policy_threshold=0.3)
    loss, m = hand_loss(opsm, l * 3, l * 3, [-1.0, 1.0, -0.5], np.ones((3, 3)),
                        sampler_logp=jnp.concatenate([samp, samp, jnp.array(l)]))
    assert loss == pytest.approx((0 + 6 - 3) / 3, rel=1e-6) and m["off_policy_masked_frac"] == pytest.approx(1 / 3)


def test_k3_is_clamped():
    cfg = AlgorithmConfig(loss="reinforce", beta=1.0, kl_estimator="k3", aggregation="token_mean")
    x = make_batch(shape=(2, 2))
    x.update(mask=np.ones((2, 2), np.float32), advantages=np.zeros(2, np.float32))
    x["ref_logp"] = x["logp"] + np.array([[30.0, -30.0], [0.0, 1.0]], np.float32)
    loss, _, _ = run(cfg, x)
    # exp(min(30, 20)) - 30 - 1 is capped at 10; -30: e^-20 + 30 - 1 ~ 29 -> capped at 10; 0 -> 0; 1 -> e - 2
    np.testing.assert_allclose(loss, (10 + 10 + 0 + (np.e - 2)) / 4, rtol=1e-5)


def test_empty_batch_is_finite():
    x = make_batch()
    x["mask"] = np.zeros_like(x["mask"])
    for name in LOSSES:
        loss, grad, m = run(cfg_for(name), x)
        assert loss == 0.0 and not grad.any(), name
        assert all(np.isfinite(float(v)) for v in metrics.finalize(m).values()), name


def test_user_errors_before_compiling(unchecked):
    x = make_batch(shape=(2, 3))
    cfg = AlgorithmConfig.from_preset("grpo")  # beta = 0.04
    nz = normalizer(cfg, x["mask"], LMAX)
    with pytest.raises(ValueError, match="beta=0.04"):
        policy_loss(cfg, x["logp"], x["old_logp"], x["advantages"], x["mask"], normalizer=nz)
    gspo = AlgorithmConfig.from_preset("gspo")
    with pytest.raises(ValueError, match="gspo_token"):
        policy_loss(gspo, x["logp"], x["old_logp"], np.zeros((2, 3), np.float32), x["mask"], normalizer=nz)
    with pytest.raises(ValueError, match="needs sampler_logp"):
        policy_loss(dataclasses.replace(gspo, tis_level="sequence"), x["logp"], x["old_logp"], x["advantages"],
                    x["mask"], normalizer=nz)
    with pytest.raises(ValueError, match="needs stats"):
        policy_loss(cfg_for("clip_cov"), x["logp"], x["old_logp"], x["advantages"], x["mask"], normalizer=nz)
    with pytest.raises(ValueError, match="max_completion_len"):
        normalizer(cfg, x["mask"], 0)
    # beta = 0 needs no reference log-probs at all
    policy_loss(gspo, x["logp"], x["old_logp"], x["advantages"], x["mask"], normalizer=nz)


@pytest.mark.parametrize("ratio, tokens, want", [(0.29, 100, 29), (0.1, 1000, 100), (0.57, 1000, 570),
                                                 (0.01, 50, 1), (0.333, 999, 332)])
def test_covariance_selections_count_whole_products_exactly(ratio, tokens, want):
    """floor(ratio N) with ratio N a whole number picks that many tokens, where float32 (0.29 x 100 =
    29.000001) and float64 (28.999999999999996) round it to either side; the reference agrees."""
    rng = np.random.default_rng(0)
    mask = np.zeros((10, 100), np.float32)
    mask.reshape(-1)[:tokens] = 1
    logp, adv = -rng.random(mask.shape).astype(np.float32), rng.normal(size=10).astype(np.float32)
    cfg = AlgorithmConfig(loss=losses.KlCov(ratio=ratio), aggregation="token_mean", beta=0.0)
    stats = step_stats(cfg, logp, logp, adv, mask, np.ones_like(mask), np.zeros(mask.shape, np.int32))
    assert int(np.asarray(stats.loss["select"]).sum()) == want == reference.step.count(ratio, tokens)
