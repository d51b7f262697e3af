"""A fully fused RL step for tasks whose reward is a jnp function of token ids.

Sampling, reward, advantages, l^old and all `num_iterations x minibatches` updates run as ONE
jitted program: no host round trip, no decode of text, no reward processes. It applies when the
reward can be written on token ids, e.g. exact match of the arithmetic task's answer; the host loop
(`trainer.py`) is the general path. Data-side options that need the host (dynamic sampling) are
not available here and are rejected.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int, Key

from grpo_jax import algorithms, sampling, sharding
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import Config


def exact_match_reward(
    completions: Int[Array, "batch new"],
    mask: Bool[Array, "batch new"],
    answers: Int[Array, "batch answer"],
) -> Float[Array, "batch"]:
    """1.0 where the completion is exactly the answer tokens (answer ids, then eos, then 0 padding)."""
    width = answers.shape[1]
    if width > completions.shape[1]:
        raise ValueError(
            f"answers are {width} tokens but completions only {completions.shape[1]}: raise "
            "sampling.max_new_tokens"
        )
    same = jnp.where(answers > 0, completions[:, :width] == answers, ~mask[:, :width])
    return (jnp.all(same, axis=1) & ~mask[:, width:].any(axis=1)).astype(jnp.float32)


def rl_step(
    cfg: Config,
    optimizer: optax.GradientTransformation,
    mesh,
    stop_ids: tuple[int, ...],
    state: ts.TrainState,
    prompts: sampling.Prompts,
    answers: Int[Array, "prompt answer"],
    rng: Key[Array, ""],
) -> tuple[ts.TrainState, dict[str, Float[Array, ""]]]:
    """Samples G completions per prompt, rewards them, and runs every inner update of one RL step."""
    alg, g = cfg.algorithm, cfg.sampling.group_size
    rows = prompts.tokens.shape[0] * g
    k = cfg.train.minibatches
    rollout = sampling.rollout(cfg.model, cfg.sampling, stop_ids, mesh, state.params, prompts, rng)
    rewards = exact_match_reward(rollout.tokens, rollout.mask, jnp.repeat(answers, g, axis=0))
    mask = rollout.mask.astype(jnp.float32)
    if alg.mask_truncated:
        mask = mask * ~rollout.truncated[:, None]
    advantages = algorithms.compute_advantages(alg, rewards, group_size=g, lengths=mask.sum(1).astype(jnp.int32))
    tokens, positions, segment_ids = ts.sequences(
        jnp.repeat(prompts.tokens, g, axis=0), jnp.repeat(prompts.lengths, g), rollout.tokens
    )
    old_logp, _ = ts.completion_logprobs(
        cfg.model, cfg.sampling.temperature, state.params, tokens, positions, segment_ids, mask, False
    )
    batch = ts.Batch(tokens, positions, segment_ids, mask, jax.lax.stop_gradient(old_logp), rollout.logprobs, advantages)
    minibatches = jax.tree.map(lambda x: x.reshape(k, rows // k, *x.shape[1:]), batch)

    def update(state, j):
        return ts.train_step(cfg, optimizer, state, None, jax.tree.map(lambda x: x[j], minibatches))

    state, metrics = jax.lax.scan(update, state, jnp.tile(jnp.arange(k), alg.num_iterations))
    grouped = rewards.reshape(-1, g)
    return state, {
        **metrics_lib.finalize(metrics_lib.reduce_stacked(metrics)),  # updates merged by their weights
        "reward/mean": rewards.mean(),
        "accuracy": rewards.mean(),
        "groups/zero_variance_frac": jnp.mean(grouped.max(1) == grouped.min(1)),
        "completion/length_mean": rollout.lengths.mean(),
    }


def jit_rl_step(cfg: Config, optimizer: optax.GradientTransformation, mesh, state_sharding):
    """`rl_step` under one jit (the state is donated), behind the sampler's host-side prompt checks.

    Options that need the host or a reference model are rejected here, before compiling.
    """
    alg = cfg.algorithm
    ts.check(cfg)
    if alg.dynamic_sampling or alg.beta > 0 or alg.overlong_buffer_frac or cfg.lora.rank:
        raise ValueError(
            "the fused rl_step supports neither algorithm.dynamic_sampling, beta > 0, overlong shaping nor "
            "LoRA (they need the host loop or frozen params): use grpo_jax.trainer"
        )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    compiled = {}

    def step(state, prompts, answers, rng):
        stop_ids = sampling.check_prompts(cfg.model, prompts, cfg.sampling)
        if stop_ids not in compiled:
            compiled[stop_ids] = jax.jit(
                functools.partial(sharding.activation_rules(mesh)(rl_step), cfg, optimizer, mesh, stop_ids),
                in_shardings=(state_sharding, replicated, replicated, replicated),
                out_shardings=(state_sharding, replicated),
                donate_argnums=0,
            )
        return compiled[stop_ids](state, prompts, answers, rng)

    return step
