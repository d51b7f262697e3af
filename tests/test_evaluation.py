"""pass@k and the held-out metrics against brute-force enumeration and hand arithmetic."""

import itertools
import math

import numpy as np
import pytest

from grpo_jax import evaluation


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of the k-subsets of n samples (c of them correct) that hold a correct one."""
    correct = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_probability_that_k_of_the_n_samples_hold_a_correct_one(n):
    for k in range(1, n + 1):
        c = np.arange(n + 1)
        got = evaluation.pass_at_k(n, c, k)
        want = [brute_force_pass_at_k(n, ci, k) for ci in c]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got, [1 - math.comb(n - ci, k) / math.comb(n, k) for ci in c], atol=1e-12)
    np.testing.assert_allclose(evaluation.pass_at_k(n, np.arange(n + 1), 1), np.arange(n + 1) / n)  # pass@1 = avg
    with pytest.raises(ValueError, match="needs 1 <= k <= n"):
        evaluation.pass_at_k(n, [0], n + 1)


def test_pass_at_k_for_many_samples_needs_no_large_binomials():
    # C(2000, 1000) ~ 1e600 is beyond float64; exact integer binomials as the reference.
    c = np.array([0, 1, 3, 1000, 2000])
    want = [1 - math.comb(2000 - ci, 1000) / math.comb(2000, 1000) for ci in c]
    np.testing.assert_allclose(evaluation.pass_at_k(2000, c, 1000), want, rtol=1e-12)


def test_pass_ks_and_summary_by_hand():
    assert evaluation.pass_ks(1) == [] and evaluation.pass_ks(8) == [2, 4, 8] and evaluation.pass_ks(6) == [2, 4, 6]
    # 2 prompts x 4 samples: 1 and 4 correct
    correct = np.array([0, 1, 0, 0, 1, 1, 1, 1], bool)
    out = evaluation.summarize("sampled", 4, total=np.arange(8.0), lengths=np.full(8, 3), correct=correct)
    assert out["eval/accuracy_sampled"] == 5 / 8 and out["eval/reward_sampled"] == 3.5 and out["eval/length_sampled"] == 3
    assert out["eval/pass@2"] == pytest.approx((0.5 + 1.0) / 2)  # 1 - C(3,2)/C(4,2) = 1/2 for the first prompt
    assert out["eval/pass@4"] == 1.0
    assert "eval/accuracy_greedy" not in evaluation.summarize("greedy", 1, np.zeros(2), np.ones(2), None)


def test_accuracy_per_bucket_by_hand():
    # 3 prompts x 2 samples, prompt-major: prompt 0 (short) 1 of 2 right, prompt 1 (long) 2 of 2, prompt 2 (short) 0.
    correct = np.array([1, 0, 1, 1, 0, 0], bool)
    out = evaluation.summarize("sampled", 2, np.zeros(6), np.ones(6), correct, ["short", "long", "short"])
    assert out["eval/accuracy_sampled@short"] == 0.25 and out["eval/accuracy_sampled@long"] == 1.0
    assert out["eval/accuracy_sampled"] == 0.5
    assert not any(k.startswith("eval/accuracy_sampled@") for k in evaluation.summarize("sampled", 2, np.zeros(6), np.ones(6), correct))
