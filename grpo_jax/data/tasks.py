"""Tasks by name, and the synthetic ones generated on the fly: arithmetic (the quickstart) and countdown.

A task kind is a frozen dataclass config registered under a name (`@register("name")`), whose
`sources(seed)` gives (training examples, held-out examples or None: no evaluation). Examples are
dicts with at least "prompt" (and "answer" for the answer-checking rewards); a `Source` is anything
with len and getitem (what grain reads). `Config.task` holds one such config; in a config file write
`task=CountdownConfig(...)`, on the command line `--set task=countdown --set task.max_number=50`.

Synthetic tasks: example i is a pure function of (config, split, seed, i). The train / held-out split
is decided by a hash of the problem itself, not by the seed, so no held-out problem can appear in
training under any seed or size.
"""

import dataclasses
import hashlib
import typing

import numpy as np

from grpo_jax.registry import Registry
from grpo_jax.rewards.answers import evaluate

SPLITS = ("train", "held_out")
SYNTHETIC_SIZE = 1_000_000  # synthetic tasks draw example i lazily; this only bounds the index


@typing.runtime_checkable
class Source(typing.Protocol):
    """Random-access examples, what grain reads: a list, a generated task, a TFDS data source."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict: ...


Sources = tuple[Source, Source | None]  # (training examples, held-out examples or None)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The base of every task config. A subclass is a frozen dataclass of the task's options,
    registered with `@register(name)`, that defines `sources`."""

    generated = False  # examples drawn lazily without end: their prompts are checked as they are drawn

    @classmethod
    def from_name(cls, name: str) -> "TaskConfig":
        """The registered task `name` with its default options (what `--set task=NAME` builds)."""
        return TASKS[name]()

    def sources(self, seed: int) -> Sources:
        """(training examples, held-out examples or None) for a run of this `seed`."""
        raise NotImplementedError(f"{type(self).__name__} must define sources(seed)")

    def describe(self, split: str) -> str:
        """Where the examples of `split` ("train" or "held_out") come from, for error messages."""
        return f"the {split} examples of task {task_name(self)!r}"


TASKS: Registry[type[TaskConfig]] = Registry("task")


def register(name: str):
    """Class decorator: a TaskConfig subclass becomes task `name` (for configs and `--set task=name`)."""
    def add(cls: type) -> type:
        if not (dataclasses.is_dataclass(cls) and issubclass(cls, TaskConfig)):
            raise TypeError(f"data.register({name!r}): {cls.__name__} must be a frozen dataclass subclassing data.TaskConfig")
        return TASKS.add(name, cls)

    return add


def task_name(task: TaskConfig) -> str:
    """The registered name of a task config's class."""
    return next((n for n, cls in TASKS.items() if cls is type(task)), type(task).__name__)


@register("examples")
@dataclasses.dataclass(frozen=True)
class Examples(TaskConfig):
    """Examples passed in code: `Trainer(cfg, examples=..., held_out=...)` or `run.train(...)`.
    `label` names them in the run's config, so a resume refuses a run of other examples."""

    label: str = ""

    def sources(self, seed: int) -> Sources:
        raise ValueError("Config.task=data.Examples(): pass the examples in code, Trainer(cfg, examples=[...], "
                         "held_out=[...]) or run.train(cfg, examples=..., held_out=...)")


def _is_held_out(problem: str, fraction: float) -> bool:
    digest = hashlib.sha256(problem.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def _check_split(split: str, held_out_fraction: float, owner: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"{owner}: split={split!r}; choose from {SPLITS}")
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"{owner}.held_out_fraction={held_out_fraction} must be strictly between 0 and 1")


def _draw(make, split: str, held_out_fraction: float, seed: int, index: int) -> dict:
    """Rejection-sample example `index` of `split`: deterministic in (seed, index)."""
    for attempt in range(10_000):
        example = make(np.random.default_rng((seed, index, attempt)))
        if example is not None and _is_held_out(example["prompt"], held_out_fraction) == (split == "held_out"):
            return example
    raise ValueError(f"no {split} example found in 10000 draws: the problem space is too small for this split")


@register("arithmetic")
@dataclasses.dataclass(frozen=True)
class ArithmeticConfig(TaskConfig):
    """`num_operands` integers in [min_value, max_value] joined by `operators` (from "+-*"), with the
    usual precedence. Prompt "12+7=", answer "19". Two 1-digit operands with "+-" (the default) is
    a few-minute task for a tiny char-level model on CPU."""

    num_operands: int = 2
    min_value: int = 0
    max_value: int = 9
    operators: str = "+-"
    held_out_fraction: float = 0.1

    def __post_init__(self):
        if self.num_operands < 2 or self.min_value > self.max_value:
            raise ValueError("ArithmeticConfig needs num_operands >= 2 and min_value <= max_value")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"ArithmeticConfig.operators={self.operators!r}: use a non-empty subset of '+-*'")

    generated = True

    def sources(self, seed: int) -> Sources:
        return tuple(Arithmetic(self, split, SYNTHETIC_SIZE, seed) for split in SPLITS)


class Arithmetic:
    """`size` arithmetic examples of one split; example i is fixed by (config, split, seed, i)."""

    def __init__(self, config: ArithmeticConfig, split: str, size: int, seed: int = 0):
        _check_split(split, config.held_out_fraction, "ArithmeticConfig")
        self.config, self.split, self.size, self.seed = config, split, size, seed

    def __len__(self) -> int:
        return self.size

    def _make(self, rng: np.random.Generator) -> dict:
        c = self.config
        values = rng.integers(c.min_value, c.max_value + 1, c.num_operands)
        ops = rng.choice(list(c.operators), c.num_operands - 1)
        terms = [str(v) if v >= 0 else f"({v})" for v in values]
        expression = terms[0] + "".join(op + t for op, t in zip(ops, terms[1:]))
        value, _ = evaluate(expression)
        return {"prompt": f"{expression}=", "answer": str(int(value))}

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return _draw(self._make, self.split, self.config.held_out_fraction, self.seed, index)


@register("countdown")
@dataclasses.dataclass(frozen=True)
class CountdownConfig(TaskConfig):
    """Countdown: reach `target` with each of `num_numbers` numbers in [1, max_number] used exactly
    once and + - * /. Targets are built from a random expression over the numbers, so every problem
    is solvable; they are integers in [1, max_target]."""

    num_numbers: int = 3
    max_number: int = 20
    max_target: int = 100
    held_out_fraction: float = 0.1

    def __post_init__(self):
        if self.num_numbers < 2 or self.max_number < 1 or self.max_target < 1:
            raise ValueError("CountdownConfig needs num_numbers >= 2, max_number >= 1 and max_target >= 1")

    generated = True

    def sources(self, seed: int) -> Sources:
        return tuple(Countdown(self, split, SYNTHETIC_SIZE, seed) for split in SPLITS)


class Countdown:
    """`size` countdown examples of one split: {"prompt", "answer" (the target), "numbers", "target",
    "solution" (one expression that reaches it)}."""

    def __init__(self, config: CountdownConfig, split: str, size: int, seed: int = 0):
        _check_split(split, config.held_out_fraction, "CountdownConfig")
        self.config, self.split, self.size, self.seed = config, split, size, seed

    def __len__(self) -> int:
        return self.size

    def _make(self, rng: np.random.Generator) -> dict | None:
        c = self.config
        numbers = [int(v) for v in rng.integers(1, c.max_number + 1, c.num_numbers)]
        order = rng.permutation(c.num_numbers)
        solution = str(numbers[order[0]])
        for i in order[1:]:
            solution = f"({solution}{rng.choice(list('+-*/'))}{numbers[i]})"
        solution = solution[1:-1]
        value, _ = evaluate(solution)
        if value.denominator != 1 or not 1 <= value <= c.max_target:
            return None
        target = int(value)
        prompt = (
            f"Using the numbers {sorted(numbers)}, each exactly once, and + - * / with parentheses, "
            f"write an expression equal to {target}. Put it in <answer></answer>."
        )
        return {"prompt": prompt, "answer": str(target), "numbers": sorted(numbers), "target": target, "solution": solution}

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return _draw(self._make, self.split, self.config.held_out_fraction, self.seed, index)
