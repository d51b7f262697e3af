"""Long-reasoning synthetic tasks: a tiny char-level model is right only if it writes its work out.

Column addition: the completion adds column by column, least significant first, one written step per
column (its two digits, the carry in, the column total), then the sum after "#### " (what the "exact"
reward reads). Every digit of the prompt follows its column's letter (a = units; lower case in the
first operand, upper case in the second), and a step writes each digit after its label, so a model
finds it by content (the token after the label's one other occurrence), not by counting positions:

    347+825  ->  prompt "c3b4a7+C8B2A5="
                 solution "a7+A5=12;b4+B2+1=7;c3+C8=11;#### 1172"

The number of digits of a prompt has a long tail (most problems are short, a few are long), so at
one config the completion lengths spread several-fold, which sequence-level and token-level
algorithms weigh differently. `experiments/task_lengths.py` tabulates them.
"""

import dataclasses
import string

import numpy as np

from grpo_jax.data.tasks import SPLITS, SYNTHETIC_SIZE, Sources, TaskConfig, _check_split, _draw, register
from grpo_jax.metrics import EDGES_RULE, edges_increase, length_buckets

LABELS = (string.ascii_lowercase, string.ascii_uppercase)  # column letters of each operand, units first


def labelled(value: int, operand: int) -> str:
    """`value`'s digits, each after its column letter: 347 -> "c3b4a7" (operand 0), "C3B4A7" (operand 1)."""
    digits = str(value)
    return "".join(f"{letter}{d}" for letter, d in zip(LABELS[operand][len(digits) - 1::-1], digits))


def column_addition(x: int, y: int) -> tuple[str, str, str]:
    """(prompt, solution, answer) of x + y, positive integers of the same number of digits (at most 26)."""
    (xs, ys), steps, carry = (str(x)[::-1], str(y)[::-1]), [], 0
    if not (x > 0 and y > 0 and len(xs) == len(ys) <= len(LABELS[0])):
        raise ValueError(f"column_addition({x}, {y}): give two positive integers of the same number of digits, at most "
                         f"{len(LABELS[0])}")
    for i, (a, b) in enumerate(zip(xs, ys)):
        total = int(a) + int(b) + carry
        steps.append(f"{LABELS[0][i]}{a}+{LABELS[1][i]}{b}{'+1' * carry}={total};")
        carry = total // 10
    answer = str(x + y)
    return f"{labelled(x, 0)}+{labelled(y, 1)}=", "".join(steps) + f"#### {answer}", answer


@register("column_addition")
@dataclasses.dataclass(frozen=True)
class ColumnAdditionConfig(TaskConfig):
    """Two integers of n digits each, summed by written column steps (module docstring).

    n is drawn from [min_digits, max_digits] with P(n) proportional to exp(-5 (n - min_digits) /
    (max_digits - min_digits)): most prompts are short, the longest e^5 times rarer than the shortest.
    `max_digits` is the difficulty knob: it sets the length of the tail, and the long problems are
    the ones a small model fails. A completion has about 10 char tokens per digit; with the defaults,
    2000 draws have 33 to 246 tokens (with eos), p95/p5 4.2 (experiments/results/task_lengths)."""

    min_digits: int = 3
    max_digits: int = 22
    held_out_fraction: float = 0.1
    # Edges (tokens of the reference completion with eos) of the length classes: an example's "bucket"
    # is "LO-HI" (the last "LO-inf"), as train.length_buckets names the train step's buckets, and the
    # evaluation reports accuracy per bucket (grpo_jax.evaluate.held_out_metrics).
    length_buckets: tuple[int, ...] = (32, 64)

    def __post_init__(self):
        if not 1 <= self.max_digits <= len(LABELS[0]):
            raise ValueError(f"ColumnAdditionConfig.max_digits={self.max_digits} must be in [1, {len(LABELS[0])}] "
                             "(one column letter per digit); lower it")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"ColumnAdditionConfig.min_digits={self.min_digits} must be in [1, max_digits="
                             f"{self.max_digits}]; set min_digits <= max_digits")
        if not edges_increase(self.length_buckets):
            raise ValueError(f"ColumnAdditionConfig.length_buckets={self.length_buckets} {EDGES_RULE}")

    generated = True

    def digit_probabilities(self) -> np.ndarray:
        """P(n) for n = min_digits .. max_digits."""
        n = np.arange(self.min_digits, self.max_digits + 1)
        p = np.exp(-5 * (n - self.min_digits) / max(self.max_digits - self.min_digits, 1))
        return p / p.sum()

    def sources(self, seed: int) -> Sources:
        return tuple(ColumnAddition(self, split, SYNTHETIC_SIZE, seed) for split in SPLITS)


def bucket(tokens: int, edges: tuple[int, ...]) -> str:
    """The name "LO-HI" of the length class of `edges` that holds `tokens` (metrics.length_buckets)."""
    return next(name for lo, hi, name in length_buckets(edges) if lo <= tokens < hi)


class ColumnAddition:
    """`size` column-addition examples of one split: {"prompt", "answer" (the sum), "solution" (the
    completion without eos), "operands", "digits", "bucket" (its length class)}; example i is fixed
    by (config, split, seed, i)."""

    def __init__(self, config: ColumnAdditionConfig, split: str, size: int, seed: int = 0):
        _check_split(split, config.held_out_fraction, "ColumnAdditionConfig")
        self.config, self.split, self.size, self.seed = config, split, size, seed
        self.p = config.digit_probabilities()

    def __len__(self) -> int:
        return self.size

    def _make(self, rng: np.random.Generator) -> dict:
        n = self.config.min_digits + int(rng.choice(len(self.p), p=self.p))
        digits = np.concatenate([rng.integers(1, 10, (2, 1)), rng.integers(0, 10, (2, n - 1))], 1)
        x, y = (int("".join(map(str, row))) for row in digits)  # Python ints: 26 digits overflow int64
        prompt, solution, answer = column_addition(x, y)
        return {"prompt": prompt, "answer": answer, "solution": solution, "operands": [x, y], "digits": n,
                "bucket": bucket(len(solution) + 1, self.config.length_buckets)}

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return _draw(self._make, self.split, self.config.held_out_fraction, self.seed, index)
