"""A fully fused RL step for tasks whose reward is a jnp function of the completion tokens.

Sampling, reward, advantages, l^old and all `num_iterations x minibatches` updates run as ONE
jitted program: no host round trip, no decode of text, no reward processes. It applies when the
reward can be written in jnp on the completion tokens and per-prompt answer data, e.g. `TextMatch`
(the arithmetic task's exact answer, compared as text); the host loop (`trainer.py`) is the general
path. Data-side options that need the host (dynamic sampling, `train.packing`'s layout plan) are not
available here and are rejected. MoE routing replay works as in the trainer (R3 replays the routes the
in-program sampler recorded).
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key, PyTree

from grpo_jax import algorithms, sampling, sharding
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import Config


@dataclasses.dataclass(frozen=True, eq=False)
class TextMatch:
    """Reward 1.0 where a completion's text is the answer string: stop tokens dropped, surrounding
    whitespace stripped (the host reward "exact" on an answer that is a plain string, e.g. the
    arithmetic task's).

    Texts, not token ids, are compared: a BPE tokenizer may write "42" as one token or as "4" "2", and
    either is a match. `chars[i]` holds the text of token id i (its first `width` bytes), `lengths[i]`
    its byte count (0 for special tokens, `width` + 1 when longer than any answer); on device a
    completion's bytes are laid end to end and compared with the answer's. Built once per tokenizer
    with `from_tokenizer`; `answers` encodes a prompt batch's answers for `rl_step`.
    """

    chars: np.ndarray  # [vocab, width] uint8
    lengths: np.ndarray  # [vocab] int32

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int, width: int = 16) -> "TextMatch":
        texts = [tokenizer.decode([i]).encode() if i < tokenizer.vocab_size else b"" for i in range(vocab_size)]
        chars = np.zeros((vocab_size, width), np.uint8)
        for i, t in enumerate(texts):
            chars[i, : len(t[:width])] = np.frombuffer(t[:width], np.uint8)
        return cls(chars, np.asarray([min(len(t), width + 1) for t in texts], np.int32))

    def answers(self, texts: list[str]) -> dict[str, Int[Array, "prompt ..."]]:
        """Per-prompt answer data (host side): bytes of each stripped answer, zero-padded, and its length."""
        width = self.chars.shape[1]
        encoded = [t.strip().encode() for t in texts]
        too_long = [t for t in encoded if len(t) > width]
        if too_long:
            raise ValueError(f"answer {too_long[0]!r} is longer than TextMatch width={width}: build it with a larger width")
        chars = np.zeros((len(texts), width), np.uint8)
        for i, t in enumerate(encoded):
            chars[i, : len(t)] = np.frombuffer(t, np.uint8)
        return {"chars": jnp.asarray(chars, jnp.int32), "length": jnp.asarray([len(t) for t in encoded], jnp.int32)}

    def __call__(self, completions: Int[Array, "batch new"], mask: Bool[Array, "batch new"],
                 answers: dict[str, Array]) -> Float[Array, "batch"]:
        batch, new = completions.shape
        width = self.chars.shape[1]
        lengths = jnp.where(mask, jnp.asarray(self.lengths)[completions], 0)  # [B, new]
        starts = jnp.cumsum(lengths, axis=1) - lengths
        total = lengths.sum(1)
        # Lay each token's bytes at its offset in a [B, new * width + 1] text (the last slot catches the rest).
        span = new * width
        slot = starts[:, :, None] + jnp.arange(width)
        keep = (jnp.arange(width) < lengths[:, :, None]) & (slot < span)
        text = jnp.zeros((batch, span + 1), jnp.int32).at[
            jnp.arange(batch)[:, None, None], jnp.where(keep, slot, span)
        ].set(jnp.asarray(self.chars, jnp.int32)[completions])
        text = text[:, :span]
        position = jnp.arange(span)
        solid = (position < total[:, None]) & ~jnp.isin(text, jnp.asarray([32, 9, 10, 13]))  # not whitespace
        first = jnp.argmax(solid, axis=1)
        last = span - jnp.argmax(solid[:, ::-1], axis=1)
        got = jnp.take_along_axis(text, jnp.minimum(first[:, None] + jnp.arange(width), span - 1), axis=1)
        same = (got == answers["chars"]) | (jnp.arange(width) >= answers["length"][:, None])
        fits = (last - first == answers["length"]) & solid.any(1) & (lengths <= width).all(1)
        return (same.all(1) & fits).astype(jnp.float32)


Reward = Callable[[Int[Array, "batch new"], Bool[Array, "batch new"], PyTree], Float[Array, "batch"]]


def rl_step(
    cfg: Config,
    optimizer: optax.GradientTransformation,
    mesh,
    stop_ids: tuple[int, ...],
    reward: Reward,
    state: ts.TrainState,
    prompts: sampling.Prompts,
    answers: PyTree,
    rng: Key[Array, ""],
) -> tuple[ts.TrainState, dict[str, Float[Array, ""]]]:
    """Samples G completions per prompt, rewards them, and runs every inner update of one RL step.

    `reward(completions, mask, answers)` is a jnp function giving one float per completion; `answers`
    is any pytree of per-prompt arrays (leading axis: prompt), handed to it repeated G times per prompt
    (e.g. `TextMatch`, or a reward that checks a number, a format, a program's output on device)."""
    alg, g = cfg.algorithm, cfg.sampling.group_size
    rows = prompts.tokens.shape[0] * g
    k = cfg.train.minibatches
    rollout = sampling.rollout(cfg.model, cfg.sampling, stop_ids, mesh, state.params, prompts, rng)
    rewards = reward(rollout.tokens, rollout.mask, jax.tree.map(lambda a: jnp.repeat(a, g, axis=0), answers))
    mask = rollout.mask.astype(jnp.float32)
    if alg.mask_truncated:
        mask = mask * ~rollout.truncated[:, None]
    advantages = algorithms.compute_advantages(alg, rewards, group_size=g, lengths=mask.sum(1).astype(jnp.int32))
    tokens, positions, segment_ids = ts.sequences(
        jnp.repeat(prompts.tokens, g, axis=0), jnp.repeat(prompts.lengths, g), rollout.tokens
    )
    old_logp = routes = None  # on-policy: the update takes sg(l) from its own forward
    if not ts.on_policy(cfg):
        sampler_routes = rollout.routes if alg.routing_replay == "sampler" else None
        old_logp, routes = ts.old_logprobs(
            cfg.model, cfg.sampling.temperature, state.params, tokens, positions, segment_ids, mask, sampler_routes,
            group=ts.prefix_group(cfg),
        )
        old_logp = jax.lax.stop_gradient(old_logp)
    batch = ts.Batch(tokens, positions, segment_ids, mask, old_logp, rollout.logprobs, advantages, routes)
    minibatches = jax.tree.map(lambda x: x.reshape(k, rows // k, *x.shape[1:]), batch)

    def update(state, j):
        return ts.train_step(cfg, optimizer, state, None, jax.tree.map(lambda x: x[j], minibatches))

    if k * alg.num_iterations == 1:  # one update: no loop (a loop carries and copies the whole state)
        state, metrics = ts.train_step(cfg, optimizer, state, None, batch)
    else:
        state, metrics = jax.lax.scan(update, state, jnp.tile(jnp.arange(k), alg.num_iterations))
        metrics = metrics_lib.reduce_stacked(metrics)  # updates merged by their weights
    grouped = rewards.reshape(-1, g)
    return state, {
        **metrics_lib.finalize(metrics),
        "reward/mean": rewards.mean(),
        "accuracy": rewards.mean(),
        "groups/zero_variance_frac": jnp.mean(grouped.max(1) == grouped.min(1)),
        "completion/length_mean": rollout.lengths.mean(),
    }


def jit_rl_step(cfg: Config, optimizer: optax.GradientTransformation, mesh, state_sharding, reward: Reward):
    """`rl_step` with `reward` under one jit (the state is donated), behind the sampler's host-side
    prompt checks. Call it as step(state, prompts, answers, rng).

    Options that need the host or a reference model are rejected here, before compiling.
    """
    alg = cfg.algorithm
    ts.check(cfg)
    if alg.dynamic_sampling or alg.beta > 0 or alg.overlong_buffer_frac or cfg.lora.rank:
        raise ValueError(
            "the fused rl_step supports neither algorithm.dynamic_sampling, beta > 0, overlong shaping nor "
            "LoRA (they need the host loop or frozen params): use grpo_jax.trainer"
        )
    if cfg.train.packing:
        raise ValueError(
            "train.packing=True: the packed layout is planned on the host from each rollout batch's lengths "
            "(grpo_jax.packing), and the fused rl_step has no host between sampling and training; set "
            "train.packing=False, or use grpo_jax.trainer"
        )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    compiled = {}

    def step(state, prompts, answers, rng):
        stop_ids = sampling.check_prompts(cfg.model, prompts, cfg.sampling)
        if stop_ids not in compiled:
            compiled[stop_ids] = jax.jit(
                functools.partial(sharding.activation_rules(mesh)(rl_step), cfg, optimizer, mesh, stop_ids, reward),
                in_shardings=(state_sharding, replicated, replicated, replicated),
                out_shardings=(state_sharding, replicated),
                donate_argnums=0,
            )
        return compiled[stop_ids](state, prompts, answers, rng)

    return step
