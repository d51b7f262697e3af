"""Multi-turn environments: the protocol, the registry, and the tool environments built in.

An environment is a frozen dataclass of its options subclassing `EnvConfig`, registered with
`@register(name)` (a fork adds one in one file; `Config.env` holds it, `--set env=NAME` picks one).
`reset(example)` gives the initial prompt text; after each turn of the policy (generated until
`call_end` or the end token, `grpo_jax.multi_turn`) `step(state, completion)` gives
(observation, reward, done): the observation's tokens are appended to the trajectory, masked out of
the loss, and the policy continues. The last turn's reward is the final reward (`State.last`: the
turn limit or the token budget ends the trajectory whatever `done` says, and its observation is
dropped); the trajectory's return is the sum of its turns' rewards (`multi_turn.Turns`), the reward
named "env" (`RewardConfig.names`), which a run with an environment uses.

`step` is a function of the state, which the sampler builds from the example and the turns so far:
an environment keeps nothing between calls, so a rerun replays it exactly. A tool that fails (an
error, a timeout, a malformed call) answers with an observation saying so: it never raises.

Light on purpose, like `grpo_jax.registry`: reward workers import the tools (`python.run`).
"""

import dataclasses
import re
from typing import NamedTuple

from grpo_jax.registry import Registry
from grpo_jax.rewards.answers import answers_match, extract_answer
from grpo_jax.rewards.functions import register as register_reward


@dataclasses.dataclass(frozen=True)
class State:
    """What `step` sees: the example, the turns before this one (the policy's texts and the
    observations that followed them) and whether this turn is the trajectory's last."""

    example: dict
    completions: tuple[str, ...] = ()
    observations: tuple[str, ...] = ()
    last: bool = False

    @property
    def turn(self) -> int:
        return len(self.completions)


class Step(NamedTuple):
    observation: str
    reward: float
    done: bool


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The base of every environment. `max_turns`: turns of the policy at most; `call_end`: the text
    that ends a turn before the end token (a tool call's close; it must be one token of the
    tokenizer, checked before compiling; "" ends turns at the end token only);
    `max_observation_tokens`: an observation is cut to its first so many tokens."""

    max_turns: int = 4
    call_end: str = ""
    max_observation_tokens: int = 32

    def __post_init__(self):
        if self.max_turns < 1 or self.max_observation_tokens < 1:
            raise ValueError(f"{type(self).__name__}: max_turns={self.max_turns} and max_observation_tokens="
                             f"{self.max_observation_tokens} must be >= 1 (env.max_turns, env.max_observation_tokens)")

    @classmethod
    def from_name(cls, name: str) -> "EnvConfig":
        """The registered environment `name` with its default options (what `--set env=NAME` builds)."""
        return ENVS[name]()

    @property
    def name(self) -> str:
        return next((n for n, c in ENVS.items() if c is type(self)), type(self).__name__)

    def reset(self, example: dict) -> str:
        return example["prompt"]

    def step(self, state: State, completion: str) -> Step:
        raise NotImplementedError(f"{type(self).__name__} must define step(state, completion)")


ENVS: Registry[type[EnvConfig]] = Registry("environment")


def register(name: str):
    """Class decorator: an EnvConfig subclass becomes environment `name` (`Config.env`, `--set env=name`)."""
    def add(cls: type) -> type:
        if not (dataclasses.is_dataclass(cls) and issubclass(cls, EnvConfig)):
            raise TypeError(f"envs.register({name!r}): {cls.__name__} must be a frozen dataclass subclassing envs.EnvConfig")
        return ENVS.add(name, cls)

    return add


@dataclasses.dataclass(frozen=True)
class ToolEnv(EnvConfig):
    """A turn that ends with `call_end` is a tool call: the text after its last `call_start` goes to
    `call`, whose answer is the observation, with reward `call_reward` (a turn-level reward, as GTPO's,
    arXiv 2511.14846; 0 by default: the return is the outcome alone), or the error it raised, reward 0.
    Any other turn is the answer: reward 1 if its last number (or marked answer) equals
    example["answer"], else 0; done."""

    call_start: str = "["
    call_end: str = "]"
    call_reward: float = 0.0

    def call(self, query: str) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define call(query)")

    def step(self, state: State, completion: str) -> Step:
        if not completion.endswith(self.call_end) or state.last:
            return Step("", float(answers_match(extract_answer(completion), str(state.example["answer"]))), True)
        head, start, query = completion[: -len(self.call_end)].rpartition(self.call_start)
        if not start:
            return Step(f"error: no {self.call_start}", 0.0, False)
        try:
            return Step(self.call(query.strip()), self.call_reward, False)
        except Exception as e:  # noqa: BLE001 (a tool's failure is what the policy sees, never a crash)
            return Step(f"error: {_plain(f'{type(e).__name__}: {e}')}", 0.0, False)


@register_reward("env")
def env(prompt: str, completion: str, example: dict, **_) -> float:
    """The reward of a run with an environment (`Config.env`): the trajectory's return, which the
    trainer puts in the row's example."""
    return example["env_return"]


def _plain(text: str) -> str:
    """An error message short and in plain characters (a char-level tokenizer encodes it)."""
    return re.sub(r"[^0-9A-Za-z +\-*/=().,:']", " ", text)[:60]


from grpo_jax.envs import calculator, python, retrieval  # noqa: E402,F401  (the built-ins register themselves)
