"""The shared protocol of the studies (experiments/protocol.py): the sign test and its p-values by hand,
the paired bootstrap, verdicts of hand-built per-seed data against the null pair's floor, and the
collapse rule."""

import math
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "experiments"))

import protocol  # noqa: E402
import study  # noqa: E402


def test_sign_test_by_hand():
    assert protocol.sign_test([1.0] * 8) == 1 / 256  # every seed above
    assert protocol.sign_test([1.0] * 7 + [-1.0]) == 9 / 256  # P(X >= 7 | 8, 1/2) = (8 + 1) / 256
    assert protocol.sign_test([1.0] * 6 + [-1.0] * 2) == 37 / 256  # (28 + 8 + 1) / 256: not significant
    assert protocol.sign_test([1.0, 1.0, 0.0]) == 0.25  # a tie is dropped: 2 of 2
    assert protocol.sign_test([0.3, 0.2], target=0.25) == 0.75  # against a target: P(X >= 1 | 2, 1/2) = 3/4
    assert protocol.sign_test([]) == 1.0


def test_bootstrap_interval_is_reproducible_and_brackets_the_mean():
    q = np.array([0.1, 0.4, -0.2, 0.3, 0.0, 0.2, 0.5, 0.1])
    lo, hi = protocol.bootstrap_interval(q)
    assert (lo, hi) == protocol.bootstrap_interval(q) and lo < q.mean() < hi
    # The percentile interval of a mean of 8 resampled seeds: about mean +- 1.96 std / sqrt(8).
    half = 1.96 * q.std() / math.sqrt(q.size)
    assert lo == pytest.approx(q.mean() - half, abs=0.03) and hi == pytest.approx(q.mean() + half, abs=0.03)
    assert protocol.bootstrap_interval([2.0] * 5) == (2.0, 2.0)


def results(per_arm: dict[str, list[float]]) -> study.Results:
    """Results whose runs carry one number each ("x"), per arm, seeds in order."""
    return study.Results({arm: [study.Run(arm, s, None, [{"x": v}]) for s, v in enumerate(values)]
                          for arm, values in per_arm.items()})


def x(run):
    return run.rows[0]["x"]


NULL = ("n1", "n2")
NOISE = [0.02, -0.03, 0.01, -0.01, 0.02, 0.0, -0.02, 0.01]  # the null pair's paired differences


def test_a_difference_must_pass_the_sign_test_and_clear_the_null_floor():
    better = protocol.Claim("a beats b", source="s", paper="p", halves=(protocol.Difference("x", x, "a", "b"),))
    base = [0.5] * 8
    null = {"n1": base, "n2": list(np.add(base, NOISE))}
    floor = max(map(abs, protocol.bootstrap_interval(-np.array(NOISE))))
    big = protocol.judge(better, results({"a": [0.6] * 8, "b": base, **null}), NULL)
    assert big["verdict"] == "reproduced" and big["halves"][0]["noise_floor"] == pytest.approx(floor)
    assert big["halves"][0]["sign_test_p"] == 1 / 256 and big["halves"][0]["per_seed"] == pytest.approx([0.1] * 8)
    # Every seed ahead, but by less than an identical pair differs: inside the floor, not reproduced.
    small = protocol.judge(better, results({"a": [0.505] * 8, "b": base, **null}), NULL)
    assert small["halves"][0]["sign_test_p"] == 1 / 256 and 0.005 < floor
    assert small["verdict"] == "not_reproduced"
    # A large mean from 6 seeds of 8: the sign test fails (p = 37/256).
    six = protocol.judge(better, results({"a": [1.0] * 6 + [0.4] * 2, "b": base, **null}), NULL)
    assert six["verdict"] == "not_reproduced" and six["halves"][0]["sign_test_p"] == 37 / 256
    # Without its null pair a comparison cannot hold; without its arms a claim is not run.
    assert protocol.judge(better, results({"a": [0.6] * 8, "b": base}), NULL)["verdict"] == "not_reproduced"
    assert protocol.judge(better, results({"a": [0.6] * 8, **null}), NULL)["verdict"] == "not_run"


def test_two_halves_one_holding_is_partial_and_the_rule_says_so():
    halves = (protocol.Difference("x", x, "a", "b"), protocol.Level("x of a above 0.9", x, "a", 0.9))
    claim = protocol.Claim("two", source="s", paper="p", halves=halves)
    null = {"n1": [0.5] * 8, "n2": list(np.add(0.5, NOISE))}
    judged = protocol.judge(claim, results({"a": [0.8] * 8, "b": [0.5] * 8, **null}), NULL)
    assert [h["holds"] for h in judged["halves"]] == [True, False] and judged["verdict"] == "partial"
    assert "one, partial" in judged["rule"] and "x: a minus b above 0" in judged["rule"]
    assert judged["halves"][1]["noise_floor"] is None  # a level has no floor
    with pytest.raises(ValueError, match="one or two halves"):
        protocol.Claim("three", source="s", paper="p", halves=halves + halves[:1])


def test_a_margin_makes_a_no_worse_than_half():
    # a trails b by 0.02 on every seed: "no worse by more than 0.05" holds (excess 0.03 over a floor of
    # 0.0075), "a beats b" does not, and a margin the floor swallows (0.025: excess 0.005) does not either.
    null = {"n1": [0.5] * 8, "n2": [0.51, 0.49] * 4}
    r = results({"a": [0.48] * 8, "b": [0.5] * 8, **null})
    half = protocol.Difference("x", x, "a", "b", at_least=-0.05)
    judged = protocol.judge_half(half, r, NULL)
    assert judged["noise_floor"] == pytest.approx(0.0075) and judged["mean"] == pytest.approx(-0.02)
    assert judged["holds"] and judged["seeds_above"] == 8 and "a minus b above -0.05" in judged["half"]
    assert not protocol.judge_half(protocol.Difference("x", x, "a", "b"), r, NULL)["holds"]
    assert not protocol.judge_half(protocol.Difference("x", x, "a", "b", at_least=-0.025), r, NULL)["holds"]


def test_a_contrast_is_a_difference_of_differences_with_a_scaled_floor():
    # a loses 0.2 from a0 to a8 and b 0.05 from b0 to b8 on every seed: (a0 - a8) - (b0 - b8) = 0.15. Its
    # floor is the null pair's times sqrt((1 + 1 + 1 + 1) / 2): four runs' noise, not two.
    half = protocol.Contrast("x", x, (("a0", 1.0), ("a8", -1.0), ("b0", -1.0), ("b8", 1.0)))
    null = {"n1": [0.5] * 8, "n2": list(np.add(0.5, NOISE))}
    r = results({"a0": [0.6] * 8, "a8": [0.4] * 8, "b0": [0.7] * 8, "b8": [0.65] * 8, **null})
    judged = protocol.judge_half(half, r, NULL)
    floor = max(map(abs, protocol.bootstrap_interval(-np.array(NOISE))))
    assert judged["per_seed"] == pytest.approx([0.15] * 8) and judged["holds"]
    assert judged["noise_floor"] == pytest.approx(math.sqrt(2) * floor)
    assert half.arms == ("a0", "a8", "b0", "b8") and "x: 1 a0 - 1 a8 - 1 b0 + 1 b8 above 0" == half.describe()
    # The same losses for both: 0 on every seed, ties, p = 1; b losing more: below.
    same = results({"a0": [0.6] * 8, "a8": [0.4] * 8, "b0": [0.7] * 8, "b8": [0.5] * 8, **null})
    assert protocol.judge_half(half, same, NULL)["sign_test_p"] == 1.0
    assert not protocol.judge_half(half, results({"a0": [0.6] * 8, "a8": [0.55] * 8, "b0": [0.7] * 8,
                                                  "b8": [0.4] * 8, **null}), NULL)["holds"]
    # An excess inside the floor: not held, though every seed is above.
    small = results({"a0": [0.6] * 8, "a8": [0.4] * 8, "b0": [0.7] * 8, "b8": [0.5 + 0.5 * floor] * 8, **null})
    assert protocol.judge_half(half, small, NULL)["seeds_above"] == 8
    assert not protocol.judge_half(half, small, NULL)["holds"]
    with pytest.raises(ValueError, match="sum to 0"):
        protocol.Contrast("x", x, (("a", 1.0), ("b", -0.5)))
    with pytest.raises(ValueError, match="each arm once"):
        protocol.Contrast("x", x, (("a", 1.0), ("a", -1.0)))


def test_ratio_and_level_below():
    ratio = protocol.Ratio("x", x, "a", "b", at_least=10)
    r = results({"a": [2.0, 3.0, 4.0], "b": [0.1, 0.2, 0.3], "n1": [1.0] * 3, "n2": [1.0] * 3})
    assert ratio.values(r) == pytest.approx(np.log10([20, 15, 40 / 3]))
    assert protocol.judge_half(ratio, r, NULL)["seeds_above"] == 3 and ratio.target == 1.0
    below = protocol.Level("x", x, "a", 0.5, above=False)
    low = protocol.judge_half(below, results({"a": [0.1] * 8}), None)
    assert low["holds"] and low["seeds_below"] == 8 and low["sign_test_p"] == 1 / 256
    assert low["mean"] == pytest.approx(0.1) and low["per_seed"] == pytest.approx([0.1] * 8)  # as measured, not negated
    assert not protocol.judge_half(below, results({"a": [0.6] * 8}), None)["holds"]
    measured = protocol.judge(protocol.Claim("c", "s", "p", (below,)), results({"a": [0.1] * 7 + [0.6]}), None)["measured"]
    assert measured.startswith("x: a below 0.5: mean 0.1625") and "7 of 8 seeds below, p = 0.0352 -> holds" in measured


class Cfg:  # the two fields collapse() reads
    class train:
        steps, eval_prompts = 10, 256


def run(accuracy: list[float], reward: list[float]) -> study.Run:
    rows = [{"step": 0, "eval/accuracy_greedy": accuracy[0]}]
    rows += [{"step": i + 1, "reward/mean": r} for i, r in enumerate(reward)]
    rows += [{"step": s, "eval/accuracy_greedy": a} for s, a in zip((5, 9, 10), accuracy[1:])]
    return study.Run("a", 0, Cfg, rows)


def test_collapse_by_held_out_accuracy_or_reward_by_hand():
    rising = [0.1 * i for i in range(1, 11)]
    # Two standard errors of 256 problems at 0.5: 2 sqrt(0.25 / 256) = 0.0625. The last 20% (steps 9, 10) mean 0.42.
    below = protocol.collapse(run([0.5, 0.5, 0.44, 0.40], rising))
    assert below["held_out_below_warm_start"] and below["collapsed"] and not below["reward_below_half_peak"]
    assert below["final_accuracy"] == pytest.approx(0.42)
    assert not protocol.collapse(run([0.5, 0.5, 0.46, 0.44], rising))["collapsed"]  # 0.45 > 0.5 - 0.0625
    # The reward, averaged over 1 step (10% of 10), falls from 0.8 to 0.3 < 0.4.
    fall = protocol.collapse(run([0.5, 0.5, 0.6, 0.6], [0.2, 0.5, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.5, 0.6]))
    assert fall["reward_below_half_peak"] and fall["collapsed"] and fall["reward_peak"] == 0.8
    assert protocol.collapsed(run([0.5, 0.5, 0.6, 0.6], rising)) == 0.0
