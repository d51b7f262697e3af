"""Reward functions and their registry.

A reward function is `fn(prompt, completion, example, **kwargs) -> float`, a plain module-level
function (it is pickled by reference into the worker processes of `scoring.score`). `example` is the
task's dict ("answer" always; "numbers"/"target" for countdown). Length-based terms receive
`completion_len` (tokens) from `score` and their limit is bound by `RewardConfig.functions`.
Adding a reward is one function and one line in `REWARDS`. (DAPO's overlong shaping is part of the
algorithm: `AlgorithmConfig.overlong_buffer_frac`, applied by the trainer.)
"""

import dataclasses
import functools
import math
from collections.abc import Callable

from grpo_jax.rewards import answers

RewardFn = Callable[..., float]


def exact_match(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the extracted answer is the reference string exactly (after stripping whitespace)."""
    return float(answers.extract_answer(completion) == example["answer"].strip())


def math_equal(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the extracted answer equals the reference numerically or symbolically."""
    return float(answers.answers_match(answers.extract_answer(completion), example["answer"]))


def answer_format(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the completion marks its final answer (\\boxed{}, <answer></answer> or "#### ")."""
    return float(answers.marked_answer(completion) is not None)


def countdown(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the final expression uses each given number exactly once and equals the target.

    The expression is the last <answer>...</answer> if present, else the last line; a trailing
    "= target" is allowed."""
    marked = answers.marked_answer(completion)
    lines = completion.strip().splitlines()
    expression = (marked if marked is not None else lines[-1] if lines else "").split("=")[0]
    try:
        value, used = answers.evaluate(expression)
    except (ValueError, ZeroDivisionError):
        return 0.0
    return float(sorted(used) == sorted(example["numbers"]) and value == example["target"])


def length_penalty(prompt: str, completion: str, example: dict, *, completion_len: int, max_len: int, **_) -> float:
    """-L / L_max: a linear cost on length (its weight sets the strength)."""
    return -completion_len / max_len


ON_FAILURE = ("drop_group", "zero")

REWARDS: dict[str, RewardFn] = {
    "exact": exact_match,
    "math": math_equal,
    "format": answer_format,
    "countdown": countdown,
    "length": length_penalty,
}


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Which rewards a run uses and how they are run. `weights[k]` multiplies `names[k]`; the
    algorithm combines them (sum then normalize, or normalize then sum). `num_workers` processes
    score in parallel. A call that raises, takes longer than `timeout_s` or returns a non-finite
    number (nan, inf, or beyond float32) is a failure: counted per reward, and by `on_failure` its
    group is dropped from the update ("drop_group") or the call scores 0 ("zero")."""

    names: tuple[str, ...] = ("math",)
    weights: tuple[float, ...] = (1.0,)
    timeout_s: float = 5.0
    num_workers: int = 2
    on_failure: str = "drop_group"

    def __post_init__(self):
        unknown = [n for n in self.names if n not in REWARDS]
        if unknown:
            raise ValueError(f"RewardConfig.names: unknown reward(s) {unknown}; choose from {sorted(REWARDS)}")
        if len(self.weights) != len(self.names):
            raise ValueError(
                f"RewardConfig.weights has {len(self.weights)} entries for {len(self.names)} names; give one weight per name"
            )
        if not 0 < self.timeout_s < math.inf or self.num_workers < 1:
            raise ValueError("RewardConfig.timeout_s must be finite and > 0 and RewardConfig.num_workers >= 1")
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"RewardConfig.weights={self.weights} must be finite")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"RewardConfig.on_failure={self.on_failure!r}: use one of {ON_FAILURE}")

    def functions(self, max_len: int) -> tuple[RewardFn, ...]:
        """The reward functions, with the length limit `max_len` (SamplingConfig.max_new_tokens) bound."""
        return tuple(functools.partial(REWARDS[n], max_len=max_len) if n == "length" else REWARDS[n] for n in self.names)
