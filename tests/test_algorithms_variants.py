"""The loss variants by hand (numbers worked out in the comments, independent of both
implementations) and as the losses they generalize, at the parameter values where they reduce."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from _algorithm_cases import LMAX, cfg_for, make_batch, run

from grpo_jax import metrics
from grpo_jax.algorithms import losses, normalizer, policy_loss, step_stats
from grpo_jax.config import AlgorithmConfig

LN = np.log


def hand_loss(cfg, logp, old_logp, adv, mask, entropy=None, tokens=None, group_size=2):
    """(loss, finalized metrics, step statistics) of policy_loss on a hand-made batch."""
    logp, old_logp, mask = (jnp.asarray(v, jnp.float32) for v in (logp, old_logp, mask))
    adv = jnp.asarray(adv, jnp.float32)
    entropy = jnp.zeros_like(mask) if entropy is None else jnp.asarray(entropy, jnp.float32)
    tokens = jnp.zeros(mask.shape, jnp.int32) if tokens is None else jnp.asarray(tokens, jnp.int32)
    stats = step_stats(cfg, logp, old_logp, adv, mask, entropy, jnp.zeros(mask.shape, jnp.int32), tokens=tokens,
                       group_size=group_size)
    loss, m = policy_loss(cfg, logp, old_logp, adv, mask, normalizer=normalizer(cfg, mask, LMAX), stats=stats)
    return float(loss), {k: float(v) for k, v in metrics.finalize(m).items()}, stats.loss


@pytest.mark.parametrize("variant, fields, generalized", [
    ("holder", dict(p=0.0), "gspo"),  # the power mean at p = 0 is the geometric mean
    ("dhpo", dict(alpha=1.0), "ppo_clip"),  # the token branch alone
    ("dhpo", dict(alpha=0.0, seq_eps_low=0.1, seq_eps_high=0.15), "gspo_token"),  # the sequence branch alone
    ("egsw", dict(alpha=0.0, temperature=1e6), "ppo_clip"),  # uniform weights
    ("llds", dict(coef=0.0), "ppo_clip"),
])
def test_variants_reduce_to_what_they_generalize(variant, fields, generalized):
    x = make_batch(seed=4, noise=0.3)
    (l1, g1, _), (l2, g2, _) = run(cfg_for(variant, **fields), x), run(cfg_for(generalized), x)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-7)


def test_hand_holder_power_means():
    """Token ratios 2 and 1/2, A = 1, a clip range wide enough not to act: the loss is -M_p:
    p = 1 arithmetic 5/4, p = 0 geometric 1, p = -1 harmonic 2 / (1/2 + 2) = 4/5, p = 2 sqrt(17/8)."""
    for p, mean in ((1.0, 1.25), (0.0, 1.0), (-1.0, 0.8), (2.0, math.sqrt(17 / 8))):
        cfg = AlgorithmConfig(loss=losses.Holder(p=p, eps_low=0.9, eps_high=9.0), aggregation="seq_mean", beta=0.0)
        loss, _, _ = hand_loss(cfg, [[LN(2), LN(0.5)]], [[0.0, 0.0]], [1.0], [[1, 1]], group_size=1)
        assert loss == pytest.approx(-mean, rel=1e-6), p


def test_hand_abc_grpo_bounds_every_quadrant():
    """eps 0.2 everywhere. A = 1: ratios 1.5 -> 1.2 (as PPO), 0.5 -> 0.8 (PPO keeps 0.5: its blind
    spot), 1.1 -> 1.1; A = -1: 3.0 -> 1.2 (PPO keeps 3: unbounded), 0.5 -> 0.8 (as PPO)."""
    cfg = AlgorithmConfig(loss="abc_grpo", aggregation="token_mean", beta=0.0)
    loss, m, _ = hand_loss(cfg, [[LN(1.5), LN(0.5), LN(1.1)], [LN(3.0), LN(0.5), 0.0]], np.zeros((2, 3)), [1.0, -1.0],
                           [[1, 1, 1], [1, 1, 0]], group_size=1)
    assert loss == pytest.approx((-1.2 - 0.8 - 1.1 + 1.2 + 0.8) / 5, rel=1e-6)
    assert m["clip_frac_high"] == pytest.approx(2 / 5) and m["clip_frac_low"] == pytest.approx(2 / 5)


def test_hand_sspo_is_the_geometric_mean_of_sapo_gates():
    """A = 1, tau = 1, ratios 1 and e: gates 4 sigmoid(0) = 2 and 4 sigmoid(e - 1); u = -sqrt(product)."""
    cfg = AlgorithmConfig(loss="sspo", aggregation="seq_mean", beta=0.0)
    loss, _, _ = hand_loss(cfg, [[0.0, 1.0]], [[0.0, 0.0]], [1.0], [[1, 1]], group_size=1)
    assert loss == pytest.approx(-math.sqrt(2 * 4 / (1 + math.exp(-(math.e - 1)))), rel=1e-6)


def test_hand_llds_penalizes_only_falling_likelihoods_of_non_negative_completions():
    """coef 0.5, wide clip. Completion 1 (A = 1, D = (-0.5, 0.2), sum < 0): penalty 0.5 * 0.5 on its
    first token; completion 2 (A = 1, D = (0.5, -0.2), sum > 0) and 3 (A = -1, D = (-0.5, 0.2)): none."""
    cfg = AlgorithmConfig(loss=losses.Llds(eps_low=0.9, eps_high=9.0, coef=0.5), aggregation="token_mean", beta=0.0)
    d = np.array([[-0.5, 0.2], [0.5, -0.2], [-0.5, 0.2]])
    loss, m, _ = hand_loss(cfg, d, np.zeros((3, 2)), [1.0, 1.0, -1.0], np.ones((3, 2)), group_size=1)
    surrogate = -np.exp(d[0]).sum() - np.exp(d[1]).sum() + np.exp(d[2]).sum()
    assert loss == pytest.approx((surrogate + 0.25) / 6, rel=1e-6)
    assert m["llds_active_frac"] == pytest.approx(1 / 6)


def test_hand_gvpo():
    """One group of two, beta = 0.1, S = sum_t D = (1, -1) (mean 0), A = (1/2, -1/2):
    loss = (1/Q) (1/(G - 1)) sum_i 1/2 (beta S_i - A_i)^2 = 1/2 ((0.1 - 0.5)^2 + (-0.1 + 0.5)^2) = 0.16;
    a second group of one completion contributes 0 (and counts as a prompt: Q = 2, loss 0.08)."""
    cfg = AlgorithmConfig.from_preset("gvpo")
    old = np.array([[-1.5, -1.5], [-1.5, -1.5]])
    logp = old + np.array([[0.5, 0.5], [-0.25, -0.75]])
    loss, _, stats = hand_loss(cfg, logp, old, [0.5, -0.5], np.ones((2, 2)))
    assert loss == pytest.approx(0.16, rel=1e-5)
    loss, _, _ = hand_loss(cfg, np.concatenate([logp, logp]), np.concatenate([old, old]), [0.5, -0.5, 0.3, 0.0],
                           np.array([[1, 1], [1, 1], [1, 1], [0, 0]]))
    assert loss == pytest.approx(0.08, rel=1e-5)


def test_hand_disco():
    """One group: A = (1, -1, -1), one token each, log-likelihood scores s = l = (-1, -2, -3), tau = 10:
    J = s_+ - tau log((e^(-0.2) + e^(-0.3)) / 2); loss = -J. With l^old = l + 0.01 the step's KL
    mean(l^old - l) = 0.01 exceeds delta = 1e-4: + sg(beta (0.01 - 1e-4)) * 0.01."""
    cfg = AlgorithmConfig.from_preset("disco")
    logp = np.array([[-1.0], [-2.0], [-3.0]])
    j = -1 - 10 * math.log((math.exp(-0.2) + math.exp(-0.3)) / 2)
    loss, m, _ = hand_loss(cfg, logp, logp, [1.0, -1.0, -1.0], np.ones((3, 1)), group_size=3)
    assert loss == pytest.approx(-j, rel=1e-6)
    loss, m, _ = hand_loss(cfg, logp, logp + 0.01, [1.0, -1.0, -1.0], np.ones((3, 1)), group_size=3)
    assert loss == pytest.approx(-j + 1e3 * (0.01 - 1e-4) * 0.01, rel=1e-4)
    assert m["disco_kl"] == pytest.approx(0.01, rel=1e-4)
    # a group with positives only (or negatives only) is not discriminative: 0
    assert hand_loss(cfg, logp, logp, [1.0, 1.0, 0.0], np.ones((3, 1)), group_size=3)[0] == 0.0


def test_hand_gtpo_conflict_tokens():
    """A group of three, entropies 0.5 (A - 0.1 * 0.5). Tokens: positive (5, 7, 9, 2), negative (5, 7, 4, 2),
    positive (6, 7, 4, 2). A token conflicts where a positive AND a negative completion hold it at the
    same position; a run is the leading stretch of conflicts. Forward: row 1 {0, 1} (its 9 is in no
    negative), row 2 {0, 1, 2, 3} (its 4 is also in the positive row 3), row 3 {} (starts with 6).
    Backward (aligned at the end, here the same lengths): row 1 {3}, row 2 all, row 3 {3, 2, 1}.
    Weights: positive rows x2 per run holding the token, negative rows 0; each row / its count of
    conflict tokens (rows 1, 2, 3: 3, 4, 3)."""
    cfg = AlgorithmConfig.from_preset("gtpo")
    tokens = [[5, 7, 9, 2], [5, 7, 4, 2], [6, 7, 4, 2]]
    _, _, stats = hand_loss(cfg, -np.ones((3, 4)), -np.ones((3, 4)), [1.0, -1.0, 1.0], np.ones((3, 4)),
                            entropy=np.full((3, 4), 0.5), tokens=tokens, group_size=3)
    pos, neg = 1 - 0.05, -1 - 0.05
    want = [
        np.array([2, 2, 1, 2]) * pos / 3,  # forward {0, 1}, backward {3}: three conflict tokens
        np.array([0, 0, 0, 0]) * neg / 4,  # all four conflict: a negative completion's are skipped
        np.array([1, 2, 2, 2]) * pos / 3,  # backward {1, 2, 3}
    ]
    np.testing.assert_allclose(stats["advantages"], want, rtol=1e-6)
    # the entropy filter: a completion above entropy_max gets 0
    _, _, stats = hand_loss(cfg, -np.ones((3, 4)), -np.ones((3, 4)), [1.0, -1.0, 1.0], np.ones((3, 4)),
                            entropy=np.full((3, 4), 0.9), tokens=tokens, group_size=3)
    assert (np.asarray(stats["advantages"]) == 0).all()


def test_hand_egsw_weights():
    """A = (1, -1), mean entropies (0.5, 1.5), alpha = 1, P = 1: logits (1.5, 0.5) -> weights
    2 softmax = (2e / (e + 1), 2 / (e + 1)); on-policy the loss is -(1/2)(w_1 A_1 + w_2 A_2)."""
    cfg = AlgorithmConfig.from_preset("egsw")
    loss, _, stats = hand_loss(cfg, -np.ones((2, 1)), -np.ones((2, 1)), [1.0, -1.0], np.ones((2, 1)),
                               entropy=[[0.5], [1.5]])
    w = np.array([2 * math.e, 2]) / (math.e + 1)
    np.testing.assert_allclose(stats["weight"], w, rtol=1e-6)
    assert loss == pytest.approx(-(w[0] - w[1]) / 2, rel=1e-6)
