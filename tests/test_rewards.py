"""Rewards against hand-computed cases, and the timeout / exception paths of `score`."""

import os
import time

import numpy as np
import pytest

from grpo_jax.config import RewardConfig
from grpo_jax.rewards import REWARDS, score
from grpo_jax.rewards import answers, functions, scoring


# Module-level so the spawned reward workers can unpickle them by reference.
def sleepy_reward(prompt, completion, example, **_):
    time.sleep(60)
    return 1.0


def failing_reward(prompt, completion, example, **_):
    raise RuntimeError("boom")


def dying_reward(prompt, completion, example, **_):
    os._exit(1)  # like a segfault in a native library


def pid_reward(prompt, completion, example, **_):
    return float(os.getpid())


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),  # the last one, braces balanced
        ("Total: 1,000 + 234\n#### 1,234", "1,234"),
        ("<think>2+2</think><answer> 4 </answer>", "4"),
        ("It was 4 - 11 = -7 degrees", "-7"),  # fallback: the last number
        ("half, 1/2, so 3.5.", "3.5"),
        ("no digits here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_answer(text, expected):
    assert answers.extract_answer(text) == expected


@pytest.mark.parametrize(
    "predicted, reference, equal",
    [
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{-3}{4}", "-0.75", True),
        ("1,234", "1234", True),
        ("$18.00", "18", True),
        ("-7", "-7", True),
        ("7", "-7", False),
        ("0.33", "1/3", False),  # exact: no rounding of plain numbers
        ("5\\sqrt{2}", "\\sqrt{50}", True),  # symbolic, through math-verify
        ("(x+2)(x-3)", "x^2 - x - 6", True),
        ("x^2 + x - 6", "x^2 - x - 6", False),
        (None, "3", False),
        ("", "3", False),
    ],
)
def test_answers_match(predicted, reference, equal):
    assert answers.answers_match(predicted, reference) is equal


def test_evaluate_is_exact_and_safe():
    assert answers.evaluate("(13+11)*2 - 6/4") == (pytest.approx(46.5), [13, 11, 2, 6, 4])
    assert answers.evaluate("1/3 + 1/3 + 1/3")[0] == 1  # Fractions, not floats
    for bad in ["__import__('os').system('true')", "2**100", "1.5+1", "x+1", "1+", "9" * 300]:
        with pytest.raises(ValueError):
            answers.evaluate(bad)
    with pytest.raises(ZeroDivisionError):
        answers.evaluate("1/(2-2)")


GSM = {"answer": "1234"}
HALF = {"answer": "0.5"}


@pytest.mark.parametrize(
    "fn, completion, example, expected",
    [
        (functions.exact_match, "#### 1234", GSM, 1.0),
        (functions.exact_match, "#### 1,234", GSM, 0.0),  # exact means exact
        (functions.math_equal, "#### 1,234", GSM, 1.0),
        (functions.math_equal, "so \\boxed{\\frac{1}{2}}", HALF, 1.0),
        (functions.math_equal, "I think 1/2", HALF, 1.0),  # unmarked: the last number
        (functions.math_equal, "1/2 of 8 is 4", HALF, 0.0),
        (functions.math_equal, "#### 1235", GSM, 0.0),
        (functions.math_equal, "the result is -7", {"answer": "-7"}, 1.0),
        (functions.answer_format, "#### 3", GSM, 1.0),
        (functions.answer_format, "<answer>3</answer>", GSM, 1.0),
        (functions.answer_format, "it is 3", GSM, 0.0),
    ],
)
def test_answer_rewards(fn, completion, example, expected):
    assert fn("q", completion, example) == expected


COUNTDOWN = {"answer": "22", "numbers": [3, 5, 7], "target": 22}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3*5+7</answer>", 1.0),
        ("<think>try</think>\n<answer>(7+5)*3-14</answer>", 0.0),  # 14 is not given
        ("7 + 5 * 3 = 22", 1.0),  # last line, "= target" allowed
        ("<answer>3*5+7+3</answer>", 0.0),  # 3 used twice
        ("<answer>5*3+7-0</answer>", 0.0),  # 0 is not given
        ("<answer>3*5*7</answer>", 0.0),  # uses the numbers, misses the target
        ("<answer>(7-5)*(3+8)</answer>", 0.0),
        ("<answer>7/(5-5)</answer>", 0.0),  # division by zero scores 0, no exception
        ("<answer>__import__('os')</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_reward(completion, expected):
    assert functions.countdown("q", completion, COUNTDOWN) == expected


def test_countdown_reward_fractions():
    example = {"answer": "24", "numbers": [1, 3, 4, 6], "target": 24}
    assert functions.countdown("q", "<answer>6/(1-3/4)</answer>", example) == 1.0


def test_length_penalty():
    assert functions.length_penalty("q", "c", {}, completion_len=8, max_len=32) == -0.25


def test_reward_config_binds_limits_and_validates():
    cfg = RewardConfig(names=("math", "length"), weights=(1.0, 0.1))
    math_reward, length_reward = cfg.rewards(max_len=16)
    assert math_reward is REWARDS["math"] and math_reward.correctness and not length_reward.correctness
    assert length_reward.fn("q", "c", {}, completion_len=4) == -0.25
    with pytest.raises(ValueError, match="unknown reward"):
        RewardConfig(names=("mathh",)).rewards(16)
    with pytest.raises(ValueError, match="one weight per name"):
        RewardConfig(names=("math", "format"), weights=(1.0,))
    with pytest.raises(ValueError, match="unknown reward"):  # DAPO overlong shaping is algorithm.overlong_*
        RewardConfig(names=("overlong",), weights=(1.0,)).rewards(16)


def test_score_shapes_values_and_metrics():
    cfg = RewardConfig(names=("math", "format", "length"), weights=(1.0, 0.5, 1.0))
    completions = ["\\boxed{\\frac{1}{2}}", "#### 1,234", "maybe 7"]
    examples = [HALF, GSM, {"answer": "-7"}]
    rewards, _, metrics = score(
        [r.fn for r in cfg.rewards(max_len=16)], cfg.weights, ["q"] * 3, completions, examples, completion_lens=[3, 14, 20]
    )
    assert rewards.dtype == np.float32 and rewards.shape == (3, 3)
    # length: -L / L_max = -3/16, -14/16, -20/16
    np.testing.assert_array_equal(rewards, [[1, 1, -0.1875], [1, 1, -0.875], [0, 0, -1.25]])
    assert metrics["reward/math_equal/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/length_penalty/mean"] == pytest.approx(-37 / 48)
    assert metrics["reward/total_mean"] == pytest.approx((1.3125 + 0.625 - 1.25) / 3)
    assert metrics["reward/errors"] == metrics["reward/timeouts"] == 0


def test_score_counts_exceptions_and_bad_inputs():
    fns = (REWARDS["exact"].fn, failing_reward, lambda *a, **k: 1.0)  # a lambda cannot be pickled
    rewards, _, metrics = score(fns, (1.0, 1.0, 1.0), ["q"] * 2, ["#### 1234", "#### 1"], [GSM, GSM])
    np.testing.assert_array_equal(rewards, [[1, 0, 0], [0, 0, 0]])
    assert metrics["reward/failing_reward/errors"] == 2
    assert metrics["reward/<lambda>/errors"] == 2
    assert metrics["reward/errors"] == 4 and metrics["reward/timeouts"] == 0
    rewards, _, metrics = score((dying_reward, REWARDS["exact"].fn), (1.0, 1.0), ["q"], ["#### 1234"], [GSM])
    np.testing.assert_array_equal(rewards, [[0, 1]])
    assert metrics["reward/dying_reward/errors"] == 1
    assert all(w.process.is_alive() for w in scoring._POOLS[2].workers)  # the dead worker was replaced
    with pytest.raises(ValueError, match="one entry per completion"):
        score(fns, (1.0, 1.0, 1.0), ["q"], ["a", "b"], [GSM, GSM])
    with pytest.raises(ValueError, match="weights"):
        score(fns, (1.0,), ["q"], ["a"], [GSM])


def test_score_timeout_kills_the_worker_and_goes_on():
    score((pid_reward,), (1.0,), ["q"], ["c"], [GSM])  # make sure the default pool is up
    before = {w.process.pid for w in scoring._POOLS[2].workers}
    start = time.monotonic()
    rewards, _, metrics = score(
        (sleepy_reward, REWARDS["exact"].fn), (1.0, 1.0), ["q"] * 2, ["#### 1234", "#### 9"], [GSM, GSM], timeout_s=1.0
    )
    assert time.monotonic() - start < 20  # not the 60 s the reward wanted
    np.testing.assert_array_equal(rewards, [[0, 1], [0, 0]])
    assert metrics["reward/sleepy_reward/timeouts"] == 2 and metrics["reward/timeouts"] == 2
    assert metrics["reward/errors"] == 0
    after = {w.process.pid for w in scoring._POOLS[2].workers}
    assert not before & after  # both sleeping workers were replaced...
    assert not any(os.path.exists(f"/proc/{pid}") for pid in before)  # ...killed and reaped
    # and the replacements serve (their first job unpickles this test module, imports and all: seconds on a
    # loaded machine, so a generous timeout; this call is about who answers, not how fast)
    rewards, _, _ = score((pid_reward,), (1.0,), ["q"] * 4, ["c"] * 4, [GSM] * 4, timeout_s=120.0)
    assert set(rewards[:, 0].astype(int)) <= after


# -- one's own rewards: registered, or passed in code; scored in this process -------------------------

def test_register_adds_a_reward_and_refuses_a_taken_name(monkeypatch):
    fresh = type(REWARDS)("reward", REWARDS.entry, REWARDS.how)  # a fresh registry, left as it was after
    monkeypatch.setattr(functions, "REWARDS", fresh)

    @functions.register("shout", correctness=True)
    def shout(prompt, completion, example, **_):
        return float(completion.isupper())

    (reward,) = RewardConfig(names=("shout",), weights=(1.0,)).rewards(8)
    assert reward.fn is shout and reward.correctness
    with pytest.raises(ValueError, match="reward 'shout' is already registered"):
        functions.register("shout")(lambda *a, **k: 0.0)
    with pytest.raises(TypeError, match=r"reward 'plain': <function .*> is not a grpo_jax.rewards.functions.Reward; "
                                        r"register a function with @rewards.register\(name\)"):
        functions.REWARDS["plain"] = lambda prompt, completion, example, **_: 1.0  # failed at run time before
    assert "plain" not in functions.REWARDS


def test_rewards_passed_in_code_sit_beside_the_registered():
    def close(prompt, completion, example, **_):
        return 1.0 - abs(len(completion) - 3) / 3

    cfg = RewardConfig(names=("exact", "close"), weights=(1.0, 0.5))
    exact, mine = cfg.rewards(8, given={"close": close})
    assert exact is REWARDS["exact"] and mine.fn is close and not mine.correctness
    assert cfg.rewards(8, given={"close": functions.Reward(close, correctness=True)})[1].correctness
    with pytest.raises(ValueError, match=r"rewards \['exact'\] are passed in code and registered too"):
        cfg.rewards(8, given={"close": close, "exact": close})
    with pytest.raises(ValueError, match=r"rewards \['spare'\] are passed in code but not in RewardConfig.names"):
        cfg.rewards(8, given={"close": close, "spare": close})


def test_score_in_process_matches_the_workers_and_counts_failures():
    fns = (REWARDS["exact"].fn, failing_reward, lambda prompt, completion, example, **_: float(len(completion)))
    args = ((1.0, 1.0, 1.0), ["q"] * 2, ["#### 1234", "#### 1"], [GSM, GSM])
    here, failed, metrics = score(fns, *args, num_workers=0)
    np.testing.assert_array_equal(here, [[1, 0, 9], [0, 0, 6]])  # the lambda runs here: no pickling
    np.testing.assert_array_equal(failed, [[0, 1, 0], [0, 1, 0]])
    assert metrics["reward/failing_reward/errors"] == 2
    workers, _, _ = score(fns[:2], (1.0, 1.0), *args[1:], num_workers=1)
    np.testing.assert_array_equal(workers, here[:, :2])


def test_an_overrunning_call_in_process_is_a_timeout_once_it_returns():
    def slow(prompt, completion, example, **_):
        time.sleep(0.3)
        return 1.0

    rewards, failed, metrics = score((slow,), (1.0,), ["q"], ["c"], [GSM], timeout_s=0.1, num_workers=0)
    assert failed.all() and rewards[0, 0] == 0 and metrics["reward/slow/timeouts"] == 1


def test_a_regex_reward_never_imports_math_verify():
    """math-verify (~170 MB) is imported only for a symbolic comparison: exact match, format and
    countdown never pay for it, in this process or in a worker."""
    import subprocess
    import sys

    script = r"""
import sys
from grpo_jax.rewards import REWARDS, score
fns = [REWARDS[n].fn for n in ("exact", "format", "countdown")]
ex = {"answer": "7", "numbers": [3, 4], "target": 7}
r, _, _ = score(fns, (1.0,) * 3, ["q"], ["<answer>3+4</answer>"], [ex], num_workers=0)
assert r.tolist() == [[0.0, 1.0, 1.0]], r
assert "math_verify" not in sys.modules
assert REWARDS["math"].fn("q", "1/2", {"answer": "0.5"}) == 1.0 and "math_verify" not in sys.modules
assert REWARDS["math"].fn("q", "\\boxed{\\sqrt{4}}", {"answer": "2"}) == 1.0 and "math_verify" in sys.modules
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def worker_has_math_verify(prompt, completion, example, **_):
    import sys

    return float("math_verify" in sys.modules)


def test_a_worker_scoring_exact_match_does_not_import_math_verify():
    rewards, _, _ = score((REWARDS["exact"].fn, worker_has_math_verify), (1.0, 1.0), ["q"], ["#### 1234"], [GSM],
                          num_workers=3)  # a pool of its own: no earlier call has run math-verify in it
    np.testing.assert_array_equal(rewards, [[1, 0]])


def test_check_sendable_names_what_a_worker_cannot_load():
    scoring.check_sendable({"exact": REWARDS["exact"].fn, "sleepy": sleepy_reward})
    with pytest.raises(ValueError, match="reward 'mine' .*cannot be loaded by a reward worker process: set "
                                         "reward.num_workers=0"):
        scoring.check_sendable({"mine": lambda prompt, completion, example, **_: 0.0})


def test_label_noise_flips_binary_correctness_at_its_rate():
    """Each returned correctness label flips (0 <-> 1) where its draw is below p: 20000 draws flip at
    p = 0.2 within 4.5 binomial standard deviations; other rewards and failed calls stay as scored."""
    rng = np.random.default_rng(0)
    n, p = 20000, 0.2
    rewards = np.stack([(rng.random(n) < 0.3), -rng.random(n)], 1).astype(np.float32)  # (exact, length)
    status = np.zeros((n, 2), np.int8)
    status[:100, 0] = 1  # failed calls score 0 and are never flipped
    rewards[:100, 0] = 0.0
    uniform = rng.random((n, 2))
    out, flipped = scoring.flip_labels(rewards, status, (True, False), p, uniform)
    want = (uniform[:, 0] < p) & (np.arange(n) >= 100)
    np.testing.assert_array_equal(flipped[:, 0], want)
    assert not flipped[:, 1].any() and (out[:, 1] == rewards[:, 1]).all()
    np.testing.assert_array_equal(out[:, 0], np.where(want, 1 - rewards[:, 0], rewards[:, 0]))
    assert abs(want[100:].mean() - p) < 4.5 * np.sqrt(p * (1 - p) / (n - 100))
    with pytest.raises(ValueError, match="flips binary correctness rewards, but one scored 0.5"):
        scoring.flip_labels(np.full((2, 1), 0.5, np.float32), np.zeros((2, 1), np.int8), (True,), p, uniform[:2, :1])
    for bad in (0.5, -0.1):
        with pytest.raises(ValueError, match=f"RewardConfig.label_noise={bad} must lie in"):
            RewardConfig(label_noise=bad)
