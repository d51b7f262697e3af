"""Prompt samplers: which examples of the train source each rollout round draws, and how many samples
each gets, from per-prompt state updated with every round's results.

A sampler is a frozen dataclass of its parameters (`algorithm.sampler`), registered with
`@sampler(name)`, whose methods are pure functions of host numpy:

- `init(size) -> state`: the state of a source of `size` examples, {name: float32 or int32 array};
  it is saved in the checkpoint (as arrays), so a resumed run takes the same decisions;
- `choose(state, draw) -> Choice`: the round's prompts (indices into the source; a prompt may come
  once) and the samples of each (multiples of `sampling.group_size`, summing to
  `train.prompts_per_step * group_size`: shapes never change). Randomness comes from `draw.rng()`,
  seeded by (train.seed, rounds drawn before), never from a global generator;
- `update(state, results) -> state`: after each round, from its `Results` (every process's rows,
  gathered), so every process holds the same state and takes the same decisions;
- registered with `baseline=True`, `baseline(state, indices)`: each prompt's expected reward, which the
  trainer subtracts from its samples' rewards before the advantage estimator (SPO's value tracker);
- registered with `drift=True`, `observe(state, drift)`: after each step, how far its updates moved
  the policy (the mean |log pi_new - log pi_old| over the step's counted tokens);
- registered with `replays=True`: the trainer keeps each prompt's last group of samples (tokens,
  sampler log-probs, rewards; `Draw.stored` says whose: `replay_store`), and `Choice.replay` trains on a
  stored group once more, as a group of its own (its advantages its own), off-policy: the rollout
  correction (algorithm.tis_level) weighs it by the ratio of the policy to the one that sampled it;
  registered with `reuse=True` as well, only groups with a correct answer are kept, and a fresh group
  with none takes the prompt's stored correct answer in place of its last sample (AR3PO).

The default `uniform` is the shuffle of `data.batches` (a new permutation of the source each epoch, cut
into consecutive batches), stateless. A fork adds a sampler in one file: a class and its line.
"""

import dataclasses
import functools
import os

import grain
import numpy as np

from grpo_jax.registry import Params, Registry

State = dict[str, np.ndarray]
STATE_DTYPES = (np.float32, np.int32)  # what a checkpoint holds exactly without jax's x64 mode


@dataclasses.dataclass(frozen=True)
class Draw:
    """What a sampler knows of the round it chooses for."""

    size: int  # examples in the train source
    prompts: int  # train.prompts_per_step: prompt slots of a round
    group_size: int  # sampling.group_size: samples per slot
    seed: int  # train.seed
    position: int  # rounds drawn before this one (the run's data position)
    temperature: float = 1.0  # sampling.temperature
    stored: np.ndarray | None = None  # bool [size], samplers with replays: prompts whose last group is kept

    def rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.position])


@dataclasses.dataclass(frozen=True)
class Choice:
    indices: np.ndarray  # int [k]: examples of the train source
    samples: np.ndarray  # int [k]: samples of each, multiples of group_size; sum = prompts * group_size
    # float [k]: each prompt's sampling temperature (its samples' log-probs are reported under it, so
    # the rollout correction, algorithm.tis_level, sees the difference); None: sampling.temperature
    temperatures: np.ndarray | None = None
    # int [k], samplers with replays: 1 where the prompt's stored group is trained on again, as one more
    # slot (its fresh slots, samples // group_size, may then be 0); fresh and replayed slots sum to prompts
    replay: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Results:
    """One round's outcome per chosen prompt (the order of `Choice.indices`), over the samples whose
    rewards are usable (`rewards.usable_groups`)."""

    indices: np.ndarray  # int [k]
    trials: np.ndarray  # int [k]: usable samples
    successes: np.ndarray  # int [k]: correct ones among them
    rewards: np.ndarray  # float [k]: the sum of their weighted total rewards


@dataclasses.dataclass(frozen=True)
class Sampler:
    params: type  # its parameter dataclass (a SamplerParams): the value of AlgorithmConfig.sampler
    # Its state learns from correctness (`Results`): the task needs a correctness reward.
    needs_correctness: bool
    # It may give a prompt more than group_size samples (the prompt's slots form one group).
    allocates: bool
    baseline: bool  # it defines baseline(state, indices)
    drift: bool  # it defines observe(state, drift)
    replays: bool  # it may replay each prompt's stored last group (Choice.replay)
    reuse: bool  # the store keeps groups with a correct answer, lent to fresh groups with none


SAMPLERS: Registry[Sampler] = Registry("sampler")


class SamplerParams(Params):
    """Base of a sampler's parameters (`AlgorithmConfig.sampler`)."""

    registry, path = SAMPLERS, "algorithm.sampler"

    def init(self, size: int) -> State:
        return {}

    def choose(self, state: State, draw: Draw) -> Choice:
        raise NotImplementedError(f"sampler {self.name!r} must define choose(state, draw)")

    def update(self, state: State, results: Results) -> State:
        return state

    def baseline(self, state: State, indices: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"sampler {self.name!r} is registered with baseline=True: define baseline(state, indices)")

    def observe(self, state: State, drift: float) -> State:
        raise NotImplementedError(f"sampler {self.name!r} is registered with drift=True: define observe(state, drift)")


def sampler(name: str, *, needs_correctness: bool = False, allocates: bool = False, baseline: bool = False,
            drift: bool = False, replays: bool = False, reuse: bool = False):
    """Class decorator: registers the sampler `name` (a frozen dataclass subclassing SamplerParams)."""
    def register(cls):
        SAMPLERS.add(name, Sampler(SAMPLERS.params_class(name, cls, SamplerParams, cls.__module__), needs_correctness,
                                   allocates or replays or reuse, baseline, drift, replays or reuse, reuse))
        return cls

    return register


def checked(params: SamplerParams, choice: Choice, draw: Draw) -> Choice:
    """`choice` as int arrays, or an error naming the sampler and what it got wrong."""
    indices, samples = np.asarray(choice.indices), np.asarray(choice.samples)
    where = f"sampler {params.name!r} (algorithm.sampler) at data position {draw.position}"
    if indices.ndim != 1 or indices.size == 0 or samples.shape != indices.shape:
        raise ValueError(f"{where} chose {indices.size} prompts with samples of shape {samples.shape}: a choice is at "
                         "least one prompt index, with one sample count each; fix its choose()")
    if not (np.issubdtype(indices.dtype, np.integer) and np.issubdtype(samples.dtype, np.integer)):
        raise ValueError(f"{where} chose indices of {indices.dtype} and samples of {samples.dtype}: both must be "
                         "integers; fix its choose()")
    bad = indices[(indices < 0) | (indices >= draw.size)]
    if bad.size:
        raise ValueError(f"{where} chose prompt index {int(bad[0])}, outside the train source's {draw.size} examples "
                         f"[0, {draw.size}); fix its choose()")
    g, rows = draw.group_size, draw.prompts * draw.group_size
    replay = np.zeros(len(indices), np.int64) if choice.replay is None else np.asarray(choice.replay)
    if replay.shape != indices.shape or not set(np.unique(replay).tolist()) <= {0, 1}:
        raise ValueError(f"{where} gave replay {replay.tolist()}: one 0 or 1 per prompt; fix its choose()")
    if replay.any() and not params.spec.replays:
        raise ValueError(f"{where} replays stored groups, but it is registered without replays=True; register it with "
                         "replays=True")
    if replay.any() and (draw.stored is None or not draw.stored[indices[replay > 0]].all()):
        raise ValueError(f"{where} replays prompt {int(indices[replay > 0][0])}, which has no stored group "
                         "(Draw.stored); fix its choose()")
    fresh = samples + replay * g
    if (samples < 0).any() or (samples % g).any() or (fresh < g).any() or fresh.sum() != rows:
        raise ValueError(f"{where} gave samples {samples.tolist()}: each must be a positive multiple of "
                         f"sampling.group_size={g} (or 0 where it replays), and with the replayed groups they must sum "
                         f"to train.prompts_per_step * group_size = {rows}; fix its choose()")
    if not params.spec.allocates and (samples != g).any():
        raise ValueError(f"{where} gave a prompt {int(samples.max())} samples, but it is registered without "
                         f"allocates=True (every prompt gets sampling.group_size={g}); register it with allocates=True")
    temperatures = choice.temperatures
    if temperatures is not None:
        from grpo_jax.config import MIN_TEMPERATURE  # (config imports this module)

        temperatures = np.asarray(temperatures, np.float32)
        if temperatures.shape != indices.shape or not (np.isfinite(temperatures) & (temperatures >= MIN_TEMPERATURE)).all():
            raise ValueError(f"{where} gave temperatures {temperatures.tolist()}: one per prompt, finite and >= "
                             f"{MIN_TEMPERATURE}; fix its choose()")
    return Choice(indices.astype(np.int64), samples.astype(np.int64), temperatures, replay)


def check_state(params: SamplerParams, state: State) -> State:
    """`state` unchanged, or an error: a checkpoint stores float32 and int32 arrays exactly."""
    for key, value in state.items():
        if not isinstance(value, np.ndarray) or value.dtype not in STATE_DTYPES:
            raise TypeError(f"sampler {params.name!r}: state[{key!r}] is {type(value).__name__} "
                            f"{getattr(value, 'dtype', '')}; a sampler's state holds numpy float32 or int32 arrays, "
                            "which a checkpoint stores exactly")
    return state


class Picked:
    """The examples `indices` of `source`, random access, each read only when indexed (so that a process
    reads just the examples of its own rows)."""

    def __init__(self, source, indices: np.ndarray):
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        return self.source[int(self.indices[i])]


STORE_FRACTION = 0.25  # of the host's memory, at most, for the stored groups of a sampler with replays


def host_memory() -> int:
    """Bytes of this host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def replay_store(params: SamplerParams, size: int, group_size: int, max_new_tokens: int, rewards: int) -> State:
    """The last group of samples of each of `size` prompts (tokens, sampler log-probs, lengths, finish
    reasons, raw rewards; `stored` 1 once a prompt has one), or an error with the estimate where that
    would take more than STORE_FRACTION of the host's memory."""
    need = size * group_size * (8 * max_new_tokens + 8 + 4 * rewards) + 4 * size
    if need > STORE_FRACTION * host_memory():
        raise ValueError(f"algorithm.sampler={params.name!r} keeps each prompt's last group: {size} prompts x "
                         f"sampling.group_size={group_size} x sampling.max_new_tokens={max_new_tokens} tokens need about "
                         f"{need / 2**30:.2f} GiB of host memory, more than {STORE_FRACTION:.0%} of this host's "
                         f"{host_memory() / 2**30:.1f} GiB: train on a smaller source (a file task), lower max_new_tokens "
                         "or group_size, or use a sampler without replays")
    g, t = (size, group_size), (size, group_size, max_new_tokens)
    return {"tokens": np.zeros(t, np.int32), "logprobs": np.zeros(t, np.float32), "lengths": np.zeros(g, np.int32),
            "truncated": np.zeros(g, np.int32), "rewards": np.zeros((*g, rewards), np.float32),
            "stored": np.zeros(size, np.int32)}


@functools.cache
def _shuffled(size: int, seed: int) -> grain.MapDataset:
    return grain.MapDataset.range(size).shuffle(seed=seed).repeat(None)


def batch_indices(size: int, batch_size: int, seed: int, position: int) -> np.ndarray:
    """The examples of batch `position` of a source of `size`: each epoch a new permutation (by `seed`),
    cut into consecutive batches (which cross epoch boundaries)."""
    shuffled = _shuffled(size, seed)
    return np.array([shuffled[i] for i in range(position * batch_size, (position + 1) * batch_size)], np.int64)


@sampler("uniform")
@dataclasses.dataclass(frozen=True)
class Uniform(SamplerParams):
    """Every example once per epoch, in a new random order each epoch (no state)."""

    def choose(self, state, draw):
        indices = batch_indices(draw.size, draw.prompts, draw.seed, draw.position)
        return Choice(indices, np.full(draw.prompts, draw.group_size))
