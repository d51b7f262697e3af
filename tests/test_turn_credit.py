"""Turn-level credit (GTPO's discounted turn returns, algorithm.turn_discount): against its float64
reference and a hand-computed case; one-turn trajectories get trajectory-level advantages."""

import numpy as np
import pytest

from grpo_jax import algorithms
from grpo_jax.algorithms import reference
from grpo_jax.algorithms.config import AlgorithmConfig

ESTIMATORS = sorted(n for n, s in algorithms.ADVANTAGES.items()
                    if not (s.needs_lengths or s.learns_from_uniform_groups or s.min_group_size))


def table(seed, n=12, turns=4, group=4):
    """Ragged trajectories: row i has 1..turns turns (a prefix), rewards in {0, 0.5, 1}, groups of `group`."""
    rng = np.random.default_rng(seed)
    mask = np.arange(turns) < rng.integers(1, turns + 1, (n, 1))
    return rng.choice([0.0, 0.5, 1.0], (n, turns)).astype(np.float32), mask, np.repeat(np.arange(n // group), group)


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_turn_advantages_match_the_float64_reference(name, gamma):
    params = algorithms.ADVANTAGES[name].params(**algorithms.ADVANTAGES[name].test_params)
    cfg = AlgorithmConfig.from_preset("gtpo_turn", advantage=params, turn_discount=gamma)
    for seed in range(3):
        rewards, mask, groups = table(seed)
        got = algorithms.turn_advantages(cfg, rewards, mask, groups)
        np.testing.assert_allclose(got, reference.turn_advantages(cfg, rewards, mask, groups), rtol=1e-5, atol=1e-5)
        assert not got[~mask].any()


def test_a_hand_computed_group():
    """Two trajectories, gamma 0.5: rewards (0, 1) and (1): returns (0.5, 1) and (1). Turn 0: 0.5 against
    1, group_std -+0.25 / std(0.5, 1) = -+1/sqrt(2); turn 1 is reached by one trajectory alone: 0."""
    cfg = AlgorithmConfig.from_preset("gtpo_turn", turn_discount=0.5)
    got = algorithms.turn_advantages(cfg, np.array([[0.0, 1.0], [1.0, 7.0]], np.float32),
                                     np.array([[True, True], [True, False]]), np.array([0, 0]))
    s = 0.25 / np.sqrt(0.125)
    np.testing.assert_allclose(got, [[-s / (1 + 1e-6 / np.sqrt(0.125)), 0.0], [s / (1 + 1e-6 / np.sqrt(0.125)), 0.0]],
                               rtol=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_one_turn_trajectories_get_trajectory_level_advantages(name):
    params = algorithms.ADVANTAGES[name].params(**algorithms.ADVANTAGES[name].test_params)
    cfg = AlgorithmConfig.from_preset("gtpo_turn", advantage=params)
    rewards, _, groups = table(0, turns=1)
    got = algorithms.turn_advantages(cfg, rewards, np.ones_like(rewards, bool), groups)[:, 0]
    np.testing.assert_allclose(got, algorithms.compute_advantages(cfg, rewards[:, 0], group_ids=groups), rtol=1e-6,
                               atol=1e-7)


def test_turn_credit_needs_a_token_loss_and_returns_alone():
    with pytest.raises(ValueError, match="turn_discount=0.9 gives each turn's tokens their own advantage: it needs a token "
                                         "loss \\(not 'gspo'\\)"):
        AlgorithmConfig.from_preset("gtpo_turn", loss="gspo", aggregation="seq_mean")
    with pytest.raises(ValueError, match="not 'opo' if it reads lengths"):
        AlgorithmConfig.from_preset("gtpo_turn", advantage="opo")
    with pytest.raises(ValueError, match=r"turn_discount=1.5 must lie in \[0, 1\]"):
        AlgorithmConfig.from_preset("gtpo_turn", turn_discount=1.5)
