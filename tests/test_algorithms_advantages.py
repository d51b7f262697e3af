"""Every registered advantage estimator against hand arithmetic and the float64 reference of
grpo_jax.algorithms.reference (a loop over groups); zero-spread groups get exactly 0, or, for an
estimator that declares `learns_from_uniform_groups` (NGRPO), what its reference gives."""

import math

import jax
import numpy as np
import pytest
from _algorithm_cases import advantage_cfg as cfg

from grpo_jax.algorithms import ADVANTAGES, compute_advantages, distinct_per_group, overlong_penalty, reference


def random_rewards(seed, n_groups=4, g=3, k=1):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, (n_groups * g, k)).astype(np.float64) * 0.5 + rng.normal(0, 0.1, (n_groups * g, k)) * (rng.random((n_groups * g, k)) < 0.5)
    rewards[:g] = 1.0  # one group with zero reward variance
    lengths = rng.integers(1, 20, n_groups * g)
    return rewards.astype(np.float32), lengths


# How rewards combine is the same code for every estimator: each estimator is checked alone and with
# one of these combinations, taken in turn (every combination is seen with several estimators).
COMBINATIONS = [(None, dict(gpg_scale=True)), ((1.0, 0.5), dict()), ((1.0, 0.5), dict(reward_combine="normalize_then_sum")),
                ((1.0, 0.5), dict(reward_combine="normalize_each"))]


@pytest.mark.parametrize("name, weights, options", [
    case for i, name in enumerate(ADVANTAGES) for case in ((name, None, {}), (name, *COMBINATIONS[i % len(COMBINATIONS)]))])
def test_estimators_match_numpy(name, weights, options):
    c = cfg(name, **options)
    k = len(weights or (1,))
    rewards, lengths = random_rewards(sum(map(ord, name + str(weights) + str(options))) % 1000, k=k)
    groups = np.arange(len(rewards)) // 3
    got = compute_advantages(c, rewards if k > 1 else rewards[:, 0], group_size=3, lengths=lengths, reward_weights=weights)
    want = reference.compute_advantages(c, rewards.astype(np.float64), groups, lengths, weights)
    assert got.dtype == np.float32 and got.shape == (len(rewards),)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", list(ADVANTAGES))
def test_group_ids_equal_the_layout(name):
    rewards, lengths = random_rewards(1)
    rewards = rewards[:, 0]
    perm = np.random.default_rng(0).permutation(len(rewards))
    layout = compute_advantages(cfg(name), rewards, group_size=3, lengths=lengths)
    ids = (np.arange(len(rewards)) // 3)[perm] * 2  # any ids in [0, N), any order
    by_ids = compute_advantages(cfg(name), rewards[perm], group_ids=ids, lengths=lengths[perm])
    np.testing.assert_allclose(by_ids, np.asarray(layout)[perm], rtol=1e-6, atol=1e-6)
    jitted = jax.jit(lambda r, i, l: compute_advantages(cfg(name), r, group_ids=i, lengths=l))
    np.testing.assert_allclose(jitted(rewards[perm], ids, lengths[perm]), by_ids, rtol=1e-6, atol=1e-6)


def test_hand_numbers():
    r = np.array([1.0, 2.0, 3.0, 0.0, 0.0, 0.0], np.float32)
    adv = lambda name, **kw: np.asarray(compute_advantages(cfg(name, **kw), r, group_size=3, lengths=np.array([1, 2, 3, 4, 4, 4])))
    # group 1: mean 2, std (ddof 1) = sqrt((1 + 0 + 1) / 2) = 1; group 2: all equal -> 0
    np.testing.assert_allclose(adv("group_std"), [-1, 0, 1, 0, 0, 0], atol=1e-5)
    np.testing.assert_allclose(adv("group_mean"), [-1, 0, 1, 0, 0, 0], atol=1e-6)
    # rloo: 1 - (2 + 3) / 2 = -1.5, 2 - (1 + 3) / 2 = 0, 3 - 1.5 = 1.5
    np.testing.assert_allclose(adv("rloo"), [-1.5, 0, 1.5, 0, 0, 0], atol=1e-6)
    # opo: baseline (1*1 + 2*2 + 3*3) / (1 + 2 + 3) = 14 / 6
    np.testing.assert_allclose(adv("opo"), [1 - 14 / 6, 2 - 14 / 6, 3 - 14 / 6, 0, 0, 0], atol=1e-6)
    # batch_std: batch mean 1, squared deviations 0 + 1 + 4 + 1 + 1 + 1 = 8, std = sqrt(8 / 5)
    np.testing.assert_allclose(adv("batch_std"), np.array([-1, 0, 1, 0, 0, 0]) / np.sqrt(8 / 5), atol=1e-5)
    # gpg_scale: N = 6, N_valid = 3 (group 2 has equal rewards) -> x2
    np.testing.assert_allclose(adv("group_mean", gpg_scale=True), [-2, 0, 2, 0, 0, 0], atol=1e-6)


def test_hand_two_reward_functions():
    # rewards (R1, R2) in one group of 2: (1, 0) and (0, 2), weights (1, 0.5)
    r = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    # sum_then_normalize: R = (1, 1) -> group_mean gives (0, 0)
    c = cfg("group_mean")
    np.testing.assert_allclose(compute_advantages(c, r, group_size=2, reward_weights=(1.0, 0.5)), [0, 0], atol=1e-6)
    # normalize_then_sum (GDPO): per column group_mean -> (0.5, -0.5) and (-1, 1); weighted sum
    # (0.5 - 0.5, -0.5 + 0.5) = (0, 0) -> standardized (0, 0); with weights (1, 0.25): (0.25, -0.25),
    # batch std (ddof 1) = sqrt(2 * 0.0625) -> (1, -1) / sqrt(2)
    c = cfg("group_mean", reward_combine="normalize_then_sum")
    np.testing.assert_allclose(
        compute_advantages(c, r, group_size=2, reward_weights=(1.0, 0.25)), np.array([1, -1]) / np.sqrt(2), atol=1e-5
    )


def test_user_errors():
    r = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="group_size=1"):
        compute_advantages(cfg("group_std"), r, group_size=1)
    with pytest.raises(ValueError, match=r"group\(s\) \[1, 2\] hold fewer than 2 completions"):
        compute_advantages(cfg("rloo"), r, group_ids=np.array([0, 0, 1, 2]))
    with pytest.raises(ValueError, match="exactly one of"):
        compute_advantages(cfg("rloo"), r)
    with pytest.raises(ValueError, match="do not split"):
        compute_advantages(cfg("rloo"), r, group_size=3)
    with pytest.raises(KeyError, match="unknown advantage 'grpo'"):
        ADVANTAGES["grpo"]
    with pytest.raises(ValueError, match="needs lengths"):
        compute_advantages(cfg("opo"), r, group_size=2)
    with pytest.raises(ValueError, match="reward_weights"):
        compute_advantages(cfg("rloo"), r, group_size=2, reward_weights=(1.0, 2.0))


@pytest.mark.parametrize(
    "frac, kappa, expected",  # L_max = 16, B = 0.25 * 16 = 4: the ramp is (12, 16]
    [(0.25, 1.0, [0, 0, -0.25, -0.5, -1, -1]), (0.25, 2.0, [0, 0, -0.5, -1, -2, -2]),
     (0.01, 1.0, [0, 0, 0, 0, -1, -1])],  # B = max(int(0.16), 1) = 1: the ramp is (15, 16]
)
def test_overlong_penalty_is_dapos(frac, kappa, expected):
    lengths = np.array([0, 12, 13, 14, 16, 20])
    c = cfg("group_std", overlong_buffer_frac=frac, overlong_kappa=kappa)
    np.testing.assert_allclose(overlong_penalty(c, lengths, 16), expected, atol=1e-7)


@pytest.mark.parametrize("name", list(ADVANTAGES))
@pytest.mark.parametrize("combine", ["sum_then_normalize", "normalize_then_sum"])
def test_zero_spread_groups_get_exactly_zero(name, combine):
    """Rewards equal within a group but not dyadic (0.7, 0.3) leave a float32 residue in R - mean;
    every estimator must give exactly 0 there (the old code gave |A| = 0.056 to eight 0.7s with
    group_std, and 0.91 after normalize_then_sum's batch standardization of residues). An estimator
    that declares `learns_from_uniform_groups` gives them its reference's non-zero advantages instead."""
    c = cfg(name, reward_combine=combine)
    rewards = np.array([[0.7, 0.3]] * 8 + [[0.3, 0.7]] * 8, np.float32)  # two groups of 8, each constant
    cols, weights = (rewards, (1.0, 0.3)) if combine == "normalize_then_sum" else (rewards[:, 0], None)
    adv = np.asarray(compute_advantages(c, cols, group_size=8, lengths=np.arange(1, 17), reward_weights=weights))
    mixed = rewards.copy()
    mixed[8:12] = [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    if ADVANTAGES[name].learns_from_uniform_groups:
        cols = mixed if combine == "normalize_then_sum" else mixed[:, 0]  # (a constant group next to a varied one)
        adv = np.asarray(compute_advantages(c, cols, group_size=8, reward_weights=weights))
        want = reference.compute_advantages(c, cols.astype(np.float64), np.arange(16) // 8, None, weights)
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
        assert (adv[:8] != 0).all()
        return
    assert (adv == 0).all(), adv
    # next to an informative group, a zero-spread group still gets exactly 0
    cols = mixed if combine == "normalize_then_sum" else mixed[:, 0]
    adv = np.asarray(compute_advantages(c, cols, group_size=8, lengths=np.arange(1, 17), reward_weights=weights))
    assert (adv[:8] == 0).all() and (adv[8:] != 0).any(), adv


def test_gpg_scale_counts_groups_by_the_combined_reward():
    """Two reward columns that vary within a group but sum to a constant: the combined reward has no
    spread, so the group is not valid for N / N_valid (the old code counted it, from the columns)."""
    c = cfg("group_mean", gpg_scale=True)
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]], np.float32)  # group 2: (1, 0) vs (0, 0)
    adv = compute_advantages(c, rewards, group_size=2, reward_weights=(1.0, 1.0))
    # group 1 combined (1, 1): A = 0; group 2 combined (1, 0): A = (0.5, -0.5) x N / N_valid = 4 / 2
    np.testing.assert_allclose(adv, [0, 0, 1.0, -1.0], atol=1e-6)


def test_beta_norm_by_hand():
    """BNPO: four groups of two with 0/1 rewards; group means p = (0.5, 0.5, 1, 0): m = 1/2,
    var (ddof 1) = (0 + 0 + 1/4 + 1/4) / 3 = 1/6, m (1 - m) / var - 1 = 1/2, a = b = 1/4 ->
    alpha = beta = 1 + 1/12; A = (R - p) / pdf(p) for the groups with spread, 0 for the others."""
    rewards = np.array([1, 0, 0, 1, 1, 1, 0, 0], np.float32)
    adv = np.asarray(compute_advantages(cfg("beta_norm"), rewards, group_size=2))
    alpha = 1 + 1 / 12
    pdf = 0.5 ** (alpha - 1) * 0.5 ** (alpha - 1) / math.exp(2 * math.lgamma(alpha) - math.lgamma(2 * alpha))
    np.testing.assert_allclose(adv, np.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / pdf, rtol=1e-5)
    # one group (no fit: uniform density): A = R - p
    np.testing.assert_allclose(compute_advantages(cfg("beta_norm"), rewards[:2], group_size=2), [0.5, -0.5], rtol=1e-5)
    # rewards outside [0, 1] are mapped by the batch range first: (3, 1) -> (1, 0)
    np.testing.assert_allclose(compute_advantages(cfg("beta_norm"), np.array([3.0, 1.0]), group_size=2), [0.5, -0.5],
                               rtol=1e-5)


def test_ngrpo_by_hand():
    """A virtual sample of reward 1 joins each group's statistics: all wrong (0, 0, 0) -> mean 1/4,
    std (ddof 1) sqrt(3/16 + 9/16) / sqrt(3) = 1/2 -> A = -1/2 each (GRPO: 0); all right (1, 1, 1) ->
    exactly 0; (1, 0, 0) -> mean 1/2, std sqrt(1/3) -> +-sqrt(3)/2."""
    r = np.array([0, 0, 0, 1, 1, 1, 1, 0, 0], np.float32)
    np.testing.assert_allclose(compute_advantages(cfg("ngrpo"), r, group_size=3),
                               [-0.5] * 3 + [0] * 3 + [math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2], atol=1e-5)
    two = compute_advantages(cfg("ngrpo", virtual_samples=2, max_reward=2.0), r[:3], group_size=3)
    np.testing.assert_allclose(two, [-0.8 / math.sqrt(4.8 / 4)] * 3, rtol=1e-5)  # mean 4/5, var (3 * .64 + 2 * 1.44) / 4


def test_gapo_by_hand():
    """G = 5, fraction 0.6 -> windows of 3 over the sorted (0, 0.1, 0.2, 0.9, 5): widths 0.2, 0.8, 4.8 ->
    the first, median Q = 0.1 (the group mean 1.24 is dragged by the outlier 5); scale
    sqrt(sum (R - Q)^2 / 4). Ties keep the lowest window: (0, 1, 2, 3) with fraction 0.5 -> Q = 0.5."""
    r = np.array([0.9, 0.0, 5.0, 0.2, 0.1], np.float32)
    q, scale = 0.1, math.sqrt(((r.astype(np.float64) - 0.1) ** 2).sum() / 4)
    np.testing.assert_allclose(compute_advantages(cfg("gapo"), r, group_size=5), (r - q) / scale, rtol=1e-5)
    ties = np.array([3.0, 0.0, 2.0, 1.0], np.float32)
    np.testing.assert_allclose(compute_advantages(cfg("gapo", fraction=0.5), ties, group_size=4),
                               (ties - 0.5) / math.sqrt(((ties - 0.5) ** 2).sum() / 3), rtol=1e-5)


def test_noise_aware_by_hand():
    """S-GRPO with p = 0.1 on groups of 4: k = 2 -> q = 1/2 = t, w = 0.8 * 0.25 / (0.5 * 0.5) = 0.8
    (group_std scaled by 0.8); k = 1 -> q = 1/4, t = 0.15 / 0.8 = 0.1875,
    w = 0.8 t (1 - t) / (sqrt(3/16) sqrt(t (1 - t))): a lone success is trusted less."""
    r = np.array([1, 1, 0, 0, 1, 0, 0, 0], np.float32)
    grpo = np.asarray(compute_advantages(cfg("group_std"), r, group_size=4))
    t = 0.15 / 0.8
    w1 = 0.8 * t * (1 - t) / (math.sqrt(3 / 16 + 1e-8) * math.sqrt(t * (1 - t) + 1e-8))
    w2 = 0.8 * 0.25 / (math.sqrt(0.25 + 1e-8) * math.sqrt(0.25 + 1e-8))
    np.testing.assert_allclose(compute_advantages(cfg("noise_aware"), r, group_size=4),
                               grpo * np.array([w2] * 4 + [w1] * 4), rtol=1e-5)


def test_reinforce_pp_by_hand():
    """Group-centred rewards (1/2, -1/2 | 1/2, -1/2) whitened over the tokens, lengths (1, 3, 1, 1):
    the 6 tokens (1/2, -1/2 x3, 1/2, -1/2) have mean -1/6, deviations 2/3 (x2) and -1/3 (x4), std
    (ddof 1) sqrt((8/9 + 4/9) / 5) = sqrt(4/15): the longer wrong answer shifts every advantage."""
    r = np.array([1, 0, 1, 0], np.float32)
    std = math.sqrt(4 / 15)
    np.testing.assert_allclose(compute_advantages(cfg("reinforce_pp"), r, group_size=2, lengths=np.array([1, 3, 1, 1])),
                               np.array([2 / 3, -1 / 3, 2 / 3, -1 / 3]) / std, rtol=1e-5)


def test_pass_at_k_by_hand():
    """G = 4, c = 1, k = 2: rho = 1 - C(3, 2) / C(4, 2) = 1/2, sigma = 1/2; the correct one gets
    (1 - 1/2) / (1/2) = 1, a wrong one (1 - 1/2 - C(2, 1) / C(3, 1)) / (1/2) = -1/3. k = 1 is GRPO with
    the population std."""
    r = np.array([1, 0, 0, 0], np.float32)
    np.testing.assert_allclose(compute_advantages(cfg("pass_at_k", k=2), r, group_size=4), [1, -1 / 3, -1 / 3, -1 / 3],
                               rtol=1e-5)
    one = compute_advantages(cfg("pass_at_k", k=1), r, group_size=4)
    np.testing.assert_allclose(one, (r - 0.25) / r.std(), rtol=1e-5)
    with pytest.raises(ValueError, match="k=4.* needs at least 4 completions"):
        compute_advantages(cfg("pass_at_k", k=4), r[:3], group_size=3)


def test_normalize_each_is_the_sum_of_per_reward_advantages():
    """MO-GRPO: (R1, R2) = (1, 0), (0, 10), (0, 0) in one group: group_std of each column, summed with
    the weights, no batch standardization (GDPO's normalize_then_sum would standardize the sum)."""
    r = np.array([[1.0, 0.0], [0.0, 10.0], [0.0, 0.0]], np.float32)
    per = [np.asarray(compute_advantages(cfg("group_std"), r[:, k], group_size=3)) for k in range(2)]
    np.testing.assert_allclose(compute_advantages(cfg("group_std", reward_combine="normalize_each"), r, group_size=3,
                                                  reward_weights=(1.0, 0.5)), per[0] + 0.5 * per[1], rtol=1e-5, atol=1e-6)
    assert abs(per[1]).max() == pytest.approx(abs(per[0]).max(), rel=1e-5)  # the scale of R2 no longer dominates


def test_unlikeliness_by_hand():
    """Rewarding the Unlikely: reward * (1 - beta_rank * rank / G), rank ascending by mean log-prob in
    the group, ties by position. Group A (G = 4): log-probs (-0.5, -2, -1, -0.5) rank (2, 0, 1, 3), so
    rewards (1, 1, 0, 1) become (0.875, 1, 0, 0.8125); group B (G = 3, all correct): ranks (2, 0, 1),
    rewards (5/6, 1, 11/12): the likeliest is rewarded least, and the uniform group learns."""
    c = cfg("group_mean", unlikeliness=0.25)
    r = np.array([1, 1, 0, 1, 1, 1, 1], np.float32)
    lp = np.array([-0.5, -2.0, -1.0, -0.5, -1.0, -3.0, -2.0], np.float32)
    ids = np.array([0, 0, 0, 0, 4, 4, 4])
    a, b = np.array([0.875, 1, 0, 0.8125]), np.array([10, 12, 11]) / 12
    want = np.concatenate([a - a.mean(), b - b.mean()])
    np.testing.assert_allclose(compute_advantages(c, r, group_ids=ids, sampler_logprobs=lp), want, atol=1e-6)
    np.testing.assert_allclose(reference.compute_advantages(c, r, ids, sampler_logprobs=lp), want, atol=1e-12)
    with pytest.raises(ValueError, match="pass sampler_logprobs="):
        compute_advantages(c, r, group_ids=ids)


@pytest.mark.parametrize("name, weights, options", [
    ("group_std", None, {}), ("rloo", (1.0, 0.5), dict(reward_combine="normalize_each")),
    ("group_std", (1.0, 0.5), dict(reward_combine="normalize_then_sum", gpg_scale=True))])
def test_unlikeliness_matches_numpy(name, weights, options):
    """Against the float64 reference (a stable argsort per group), through a jit with permuted group ids;
    unlikeliness=0 ignores the log-probs: bit-identical to passing none."""
    rng = np.random.default_rng(3)
    k = len(weights or (1,))
    rewards = (rng.random((12, k)) < 0.6).astype(np.float32)
    lp = np.round(rng.normal(-1, 0.5, 12), 1).astype(np.float32)  # rounded: ties within groups
    perm = rng.permutation(12)
    ids = (np.arange(12) // 4)[perm] * 3
    cols = rewards[perm] if k > 1 else rewards[perm, 0]
    c = cfg(name, unlikeliness=0.3, **options)
    got = jax.jit(lambda r, i, l: compute_advantages(c, r, group_ids=i, reward_weights=weights, sampler_logprobs=l))(
        cols, ids, lp[perm])
    want = reference.compute_advantages(c, rewards[perm].astype(np.float64), ids, None, weights, lp[perm])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    off = cfg(name, **options)
    assert (np.asarray(compute_advantages(off, cols, group_ids=ids, reward_weights=weights, sampler_logprobs=lp[perm]))
            == np.asarray(compute_advantages(off, cols, group_ids=ids, reward_weights=weights))).all()


def test_distinct_per_group_counts_the_outcomes_a_combination_merges():
    """Group 1 scores (1, 0), (0, 1), (0, 1), (0, 0): 3 reward combinations; summed first, (1, 0) and (0, 1)
    share one advantage (2 values), normalized each they do not (group_std per column: (1.5, -0.5, -0.5,
    -0.5) + (-0.866, 0.866, 0.866, -0.866): 3 values). Group 2 is all (1, 1): 1 and 1 (all 0)."""
    r = np.array([[1, 0], [0, 1], [0, 1], [0, 0]] + [[1, 1]] * 4, np.float32)
    for combine, values in (("sum_then_normalize", 1.5), ("normalize_each", 2.0)):
        adv = np.asarray(compute_advantages(cfg("group_std", reward_combine=combine), r, group_size=4, reward_weights=(1.0, 1.0)))
        assert distinct_per_group(r, adv, 4) == (2.0, values), combine
    assert distinct_per_group(r[:4], np.array([0.5, 0.5 + 1e-7, 0.2, -1.0]), 4) == (3.0, 3.0)  # rounding: one value
