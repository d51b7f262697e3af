"""Reward functions and their registry.

A reward function is `fn(prompt, completion, example, **kwargs) -> float`. `example` is the task's
dict ("answer" always; "numbers"/"target" for countdown). Length-based terms receive
`completion_len` (tokens) from `score` and their limit is bound by `RewardConfig.rewards`. Adding a
reward is one function under `@register("name")` (a fork does it in its own module or config file),
or a callable passed in code: `Trainer(cfg, rewards={"name": fn})`. Scored in worker processes
(`RewardConfig.num_workers` > 0) a function is pickled by reference: it must be module-level in an
importable module. (DAPO's overlong shaping is part of the algorithm:
`AlgorithmConfig.overlong_buffer_frac`, applied by the trainer.)
"""

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping

from grpo_jax.registry import Registry
from grpo_jax.rewards import answers

RewardFn = Callable[..., float]


@dataclasses.dataclass(frozen=True)
class Reward:
    """A reward function and what the trainer must know about it: `correctness` rewards score 1 for
    a correct answer and 0 otherwise; the first one of a run is its "accuracy" (and pass@k)."""

    fn: RewardFn
    correctness: bool = False
    # The fields of an example that fn reads, with their types (e.g. (("answer", str),)): every example
    # of a run is checked against them before it compiles (`example_problem`); one fn cannot read would
    # fail every call.
    reads: tuple[tuple[str, type], ...] = ()


def check_signature(name: str, fn: RewardFn) -> None:
    """Raises unless `fn` keeps the reward contract, fn(prompt, completion, example, **kwargs): `score`
    passes keyword arguments (completion_len) that a reward without **kwargs would fail every call on."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or extension callable without a signature: not checkable
        return
    label = f"reward {name!r}: {getattr(fn, '__qualname__', type(fn).__name__)}{signature}"
    fix = "define it as fn(prompt, completion, example, **kwargs) (grpo_jax.rewards.functions)"
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        raise TypeError(f"{label} takes no **kwargs, but every reward is called with keyword arguments "
                        f"(completion_len=...); {fix}")
    try:
        signature.bind("prompt", "completion", {}, completion_len=1)
    except TypeError as e:
        raise TypeError(f"{label} cannot be called as fn(prompt, completion, example, **kwargs) ({e}); {fix}") from None


def example_problem(name: str, reward: Reward, example: Mapping) -> str | None:
    """Why `reward` (named `name`) cannot read `example` (its `Reward.reads`), or None."""
    for key, kind in reward.reads:
        if key not in example:
            return f"has no {key!r}, which reward {name!r} reads; add it to every example"
        if not isinstance(example[key], kind):
            return (f"has {key}={example[key]!r} of type {type(example[key]).__name__}, but reward {name!r} compares "
                    f"a {kind.__name__} {key}; give every example's {key!r} as a {kind.__name__} (e.g. {kind.__name__}(...))")
    return None


REWARDS: Registry[Reward] = Registry(
    "reward", Reward, "register a function with @rewards.register(name), or set rewards.Reward(fn)")


def register(name: str, *, correctness: bool = False,
             reads: tuple[tuple[str, type], ...] = ()) -> Callable[[RewardFn], RewardFn]:
    """Decorator: `fn` becomes reward `name` (for `RewardConfig.names`); returns `fn` unchanged. `reads`:
    the example fields it reads and their types (`Reward.reads`)."""
    def add(fn: RewardFn) -> RewardFn:
        REWARDS.add(name, Reward(fn, correctness, reads))
        return fn

    return add


@register("exact", correctness=True, reads=(("answer", str),))
def exact_match(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the extracted answer is the reference string exactly (after stripping whitespace)."""
    return float(answers.extract_answer(completion) == example["answer"].strip())


@register("math", correctness=True, reads=(("answer", str),))
def math_equal(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the extracted answer equals the reference numerically or symbolically."""
    return float(answers.answers_match(answers.extract_answer(completion), example["answer"]))


@register("format")
def answer_format(prompt: str, completion: str, example: dict, **_) -> float:
    """1 if the completion marks its final answer (\\boxed{}, <answer></answer> or "#### ")."""
    return float(answers.marked_answer(completion) is not None)


@register("countdown", correctness=True)
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


@register("length")
def length_penalty(prompt: str, completion: str, example: dict, *, completion_len: int, max_len: int, **_) -> float:
    """-L / L_max: a linear cost on length (its weight sets the strength)."""
    return -completion_len / max_len


ON_FAILURE = ("drop_group", "zero")

@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Which rewards a run uses and how they are run. `names` are registered rewards or ones passed to
    the Trainer in code; `weights[k]` multiplies `names[k]`; the algorithm combines them (sum then
    normalize, or normalize then sum). `num_workers` processes score in parallel, each call killed
    after `timeout_s`; 0 scores in the trainer's process (no import or pickling cost, for fast
    rewards such as a regex; a call cannot be stopped there: one that overruns `timeout_s` counts as
    a timeout once it returns). A call that raises, times out or returns a non-finite number (nan,
    inf, or beyond float32) is a failure: counted per reward, and by `on_failure` its group is
    dropped from the update ("drop_group") or the call scores 0 ("zero"). `label_noise` = p > 0 flips
    each returned correctness reward (0 <-> 1) with probability p before anything reads it (noisy-verifier
    studies: S-GRPO 2508.05928), seeded by the run's sampling key; logged as reward/label_flip_frac, and the
    training rows' accuracy on the true labels as accuracy_clean (accuracy counts the flipped ones)."""

    names: tuple[str, ...] = ("math",)
    weights: tuple[float, ...] = (1.0,)
    timeout_s: float = 5.0
    num_workers: int = 2
    on_failure: str = "drop_group"
    label_noise: float = 0.0

    def __post_init__(self):
        if len(self.weights) != len(self.names):
            raise ValueError(
                f"RewardConfig.weights has {len(self.weights)} entries for {len(self.names)} names; give one weight per name"
            )
        if not 0 < self.timeout_s < math.inf or self.num_workers < 0:
            raise ValueError("RewardConfig.timeout_s must be finite and > 0 and RewardConfig.num_workers >= 0 "
                             "(0: score in the trainer's process)")
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"RewardConfig.weights={self.weights} must be finite")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"RewardConfig.on_failure={self.on_failure!r}: use one of {ON_FAILURE}")
        if not 0 <= self.label_noise < 0.5:
            raise ValueError(f"RewardConfig.label_noise={self.label_noise} must lie in [0, 0.5) (a flip probability; "
                             "0.5 leaves no signal)")

    def rewards(self, max_len: int, given: Mapping[str, RewardFn | Reward] | None = None) -> tuple[Reward, ...]:
        """The rewards of `names`, from `given` (callables passed in code) or the registry, with the
        length limit `max_len` (SamplingConfig.max_new_tokens) bound."""
        given = {n: r if isinstance(r, Reward) else Reward(r) for n, r in (given or {}).items()}
        clash = sorted(set(given) & set(REWARDS))
        if clash:
            raise ValueError(f"rewards {clash} are passed in code and registered too; rename the ones passed in code")
        unknown = [n for n in self.names if n not in given and n not in REWARDS]
        if unknown:
            raise ValueError(f"RewardConfig.names: unknown reward(s) {unknown}; choose from {sorted(REWARDS)}, "
                             "register one (@rewards.register) or pass it in code (Trainer(cfg, rewards={name: fn}))")
        unused = sorted(set(given) - set(self.names))
        if unused:
            raise ValueError(f"rewards {unused} are passed in code but not in RewardConfig.names={self.names}")
        out = [given[n] if n in given else REWARDS[n] for n in self.names]
        out = [dataclasses.replace(r, fn=functools.partial(r.fn, max_len=max_len)) if n == "length" else r
               for n, r in zip(self.names, out)]
        for n, r in zip(self.names, out):
            check_signature(n, r.fn)
        return tuple(out)
