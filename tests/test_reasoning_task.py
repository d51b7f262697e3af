"""The column-addition task (grpo_jax/data/reasoning.py): hand-written cases, every written step
recomputed with Python ints, the split, the reward, the tokenizer and the length distribution."""

import pathlib
import re

import numpy as np
import pytest

from grpo_jax import data
from grpo_jax.config import Config, override
from grpo_jax.data.reasoning import column_addition
from grpo_jax.rewards import functions

STEP = re.compile(r"([a-z])(\d)\+([A-Z])(\d)(?:\+(\d))?=(\d+);")


def check_solution(example: dict) -> None:
    """Recomputes every step of a solution from the operands, independently of the task's code."""
    x, y = example["operands"]
    steps, answer = example["solution"].split("#### ")
    parsed = STEP.findall(steps)
    assert "".join(m.group(0) for m in STEP.finditer(steps)) == steps and len(parsed) == len(str(x)) == len(str(y))
    carry, units = 0, []
    for i, (low, a, up, b, carry_in, total) in enumerate(parsed):
        assert low == "abcdefghijklmnopqrstuvwxyz"[i] and up == low.upper()
        assert int(a) == x // 10**i % 10 and int(b) == y // 10**i % 10  # column i of each operand
        assert int(carry_in or 0) == carry and carry_in != "0"  # a carry is written only when there is one
        assert int(total) == int(a) + int(b) + carry
        carry, units = int(total) // 10, [int(total) % 10, *units]
    assert answer == example["answer"] == str(x + y) == str(carry or "") + "".join(map(str, units))
    letters = "abcdefghijklmnopqrstuvwxyz"[len(str(x)) - 1::-1]  # most significant first, as written
    assert example["prompt"] == "".join(c + d for c, d in zip(letters, str(x))) + "+" + "".join(
        c.upper() + d for c, d in zip(letters, str(y))) + "="


def test_hand_written_examples():
    assert column_addition(347, 825) == ("c3b4a7+C8B2A5=", "a7+A5=12;b4+B2+1=7;c3+C8=11;#### 1172", "1172")
    assert column_addition(12, 34) == ("b1a2+B3A4=", "a2+A4=6;b1+B3=4;#### 46", "46")
    assert column_addition(99, 11) == ("b9a9+B1A1=", "a9+A1=10;b9+B1+1=11;#### 110", "110")
    assert column_addition(5, 4) == ("a5+A4=", "a5+A4=9;#### 9", "9")
    for x, y in ((347, 825), (12, 34), (99, 11), (5, 4), (99999, 10001)):
        prompt, solution, answer = column_addition(x, y)
        check_solution({"prompt": prompt, "solution": solution, "answer": answer, "operands": [x, y]})
    with pytest.raises(ValueError, match="same number of digits"):
        column_addition(347, 85)


def test_every_step_is_right_and_examples_are_deterministic():
    def draw(seed):
        task = data.ColumnAddition(data.ColumnAdditionConfig(), "train", 300, seed=seed)
        return [task[i] for i in range(300)]

    examples = draw(3)
    for e in examples:
        check_solution(e)
        assert e["digits"] == len(str(e["operands"][0])) and 3 <= e["digits"] <= 22
        tokens = len(e["solution"]) + 1  # a char per token, and eos
        assert e["bucket"] == ("0-32" if tokens < 32 else "32-64" if tokens < 64 else "64-inf")
    assert {e["bucket"] for e in examples} == {"32-64", "64-inf"}  # 3 digits need 37 tokens
    assert examples == draw(3) and [e["prompt"] for e in examples] != [e["prompt"] for e in draw(4)]
    with pytest.raises(IndexError):
        data.ColumnAddition(data.ColumnAdditionConfig(), "train", 300)[300]


def test_train_and_held_out_never_overlap():
    """One-digit problems (81 of them, 99% of the draws), so random splits would collide many times."""
    cfg = data.ColumnAdditionConfig(min_digits=1, max_digits=2, held_out_fraction=0.3)
    def prompts(split, size, seed):
        source = data.ColumnAddition(cfg, split, size, seed)
        return {source[i]["prompt"] for i in range(size)}

    train, held_out = prompts("train", 800, 0) | prompts("train", 800, 1), prompts("held_out", 300, 0)
    assert train and held_out and not train & held_out
    one_digit = {f"a{a}+A{b}=" for a in range(1, 10) for b in range(1, 10)}
    assert (train | held_out) & one_digit == one_digit


def test_exact_reward_and_tokenizer():
    tok = data.CharTokenizer()
    task = data.ColumnAddition(data.ColumnAdditionConfig(), "held_out", 50, seed=0)
    for i in range(50):
        e = task[i]
        text = e["prompt"] + e["solution"]
        assert tok.decode(tok.encode(text)) == text
        assert functions.exact_match(e["prompt"], e["solution"], e) == 1.0
        digit = len(e["solution"]) - 1 - i % len(e["answer"])  # one digit of the final answer changed
        wrong = e["solution"][:digit] + str((int(e["solution"][digit]) + 1) % 10) + e["solution"][digit + 1:]
        assert functions.exact_match(e["prompt"], wrong, e) == 0.0


def test_lengths_have_a_long_tail():
    task = data.ColumnAddition(data.ColumnAdditionConfig(), "train", 500, seed=0)
    lengths = np.array([len(task[i]["solution"]) + 1 for i in range(500)])  # char tokens, with eos
    p5, p95 = np.percentile(lengths, [5, 95])
    assert 30 <= lengths.min() and lengths.max() <= 272 and 30 <= p5 <= 40 and p95 / p5 >= 4
    p = data.ColumnAdditionConfig(min_digits=2, max_digits=12).digit_probabilities()
    assert p.sum() == pytest.approx(1) and np.all(np.diff(p) < 0) and p[-1] / p[0] == pytest.approx(np.exp(-5))
    assert data.ColumnAdditionConfig(min_digits=5, max_digits=5).digit_probabilities().tolist() == [1.0]


def test_the_long_addition_config_fits_its_longest_problem():
    from grpo_jax.train import load_config

    cfg = load_config(pathlib.Path(__file__).parents[1] / "experiments" / "configs" / "long_addition.py")
    n, s = cfg.task.max_digits, cfg.sampling
    longest = "9" * n
    prompt, solution, _ = column_addition(int(longest), int(longest))  # every column carries: the longest solution
    assert cfg.task == data.ColumnAdditionConfig(min_digits=cfg.task.min_digits, max_digits=n)
    assert len(solution) + 1 <= s.max_new_tokens and len(prompt) + 1 <= s.max_prompt_len
    assert s.max_prompt_len + s.max_new_tokens <= cfg.model.max_position_embeddings and cfg.reward.names == ("exact",)


def test_config_errors_and_registration():
    with pytest.raises(ValueError, match="max_digits=27"):
        data.ColumnAdditionConfig(max_digits=27)
    with pytest.raises(ValueError, match="min_digits=0"):
        data.ColumnAdditionConfig(min_digits=0)
    with pytest.raises(ValueError, match="min_digits=9 must be in \\[1, max_digits=8\\]"):
        data.ColumnAdditionConfig(min_digits=9, max_digits=8)
    for edges in ((0, 5), (64, 32)):
        with pytest.raises(ValueError, match="length_buckets=.* must be increasing positive token counts"):
            data.ColumnAdditionConfig(length_buckets=edges)
    with pytest.raises(ValueError, match="held_out_fraction"):
        data.ColumnAddition(data.ColumnAdditionConfig(held_out_fraction=1.0), "train", 4)
    with pytest.raises(ValueError, match="split"):
        data.ColumnAddition(data.ColumnAdditionConfig(), "test", 4)
    cfg = override(Config(model_path="m"), ["task=column_addition", "task.max_digits=8"])
    assert cfg.task == data.ColumnAdditionConfig(max_digits=8) and data.task_name(cfg.task) == "column_addition"
