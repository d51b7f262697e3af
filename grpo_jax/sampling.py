"""Rollouts: jitted prefill + decode over a KV cache; the G samples of a prompt share its prefill.

`generate` prefills each distinct prompt once, repeats its cache G times along the batch and decodes the
P*G rows in `jax.lax.while_loop`s that exit as soon as every row has emitted a stop token: one loop per
segment of the new tokens, each over a cache grown to the slots that segment can reach. Every
row draws from its own key, derived from (rng, prompt index, sample index, step), so a seed gives the
same samples whatever the batch composition or the sharding.
"""

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int, Key

from grpo_jax import models, sharding
from grpo_jax.config import ModelConfig, SamplingConfig
from grpo_jax.models.decoder import Cache


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prompts:
    """Left-padded prompt token ids: row p holds its `lengths[p]` tokens at the end of the row."""

    tokens: Int[Array, "prompt prompt_len"]
    lengths: Int[Array, "prompt"]


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
    """Completions, group-major: row p*G + g is sample g of prompt p.

    `logprobs[b, t]` is log softmax(logits / temperature)[tokens[b, t]]: the tempered FULL distribution,
    before top-k / top-p truncation, because that is what the trainer recomputes as l^old from
    logits / temperature; under truncation it is not the density the token was drawn from. `mask` is 1 on
    the completion tokens, the stop token included; `tokens` and `logprobs` are 0 past the mask.
    `truncated` is the finish reason: True when a row hit `max_new_tokens` without a stop token.
    `routes` (MoE models; None otherwise): the experts the sampler routed each token to, per MoE
    layer, for the row [left-padded prompt, completion] without its last token (the train Batch's
    layout; the last token is never run): prompt tokens from the prefill, completion tokens from
    decoding (routing replay R3); slots never run hold experts 0..k-1.
    """

    tokens: Int[Array, "batch new"]
    mask: Bool[Array, "batch new"]
    logprobs: Float[Array, "batch new"]
    lengths: Int[Array, "batch"]
    truncated: Bool[Array, "batch"]
    routes: Int[Array, "batch moe_layers seq_minus_1 k"] | None = None


def pad_prompts(token_lists: list[list[int]], sampling_cfg: SamplingConfig) -> Prompts:
    """Left-pads token id lists to `sampling_cfg.max_prompt_len` (host side, checked before compiling)."""
    width = sampling_cfg.max_prompt_len
    for i, ids in enumerate(token_lists):
        if not ids:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token (e.g. a BOS id)")
        if len(ids) > width:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens > SamplingConfig.max_prompt_len={width}: "
                "raise max_prompt_len or truncate the prompt"
            )
    tokens = [[0] * (width - len(ids)) + list(ids) for ids in token_lists]
    return Prompts(jnp.asarray(tokens, jnp.int32), jnp.asarray([len(ids) for ids in token_lists], jnp.int32))


def row_keys(rng: Key[Array, ""], num_prompts: int, group_size: int) -> Key[Array, "batch"]:
    """One key per (prompt, sample) row, group-major; independent of how many rows are drawn at once."""
    prompt_idx = jnp.repeat(jnp.arange(num_prompts), group_size)
    sample_idx = jnp.tile(jnp.arange(group_size), num_prompts)
    return jax.vmap(lambda p, g: jax.random.fold_in(jax.random.fold_in(rng, p), g))(prompt_idx, sample_idx)


def truncate(
    logits: Float[Array, "batch vocab"], sampling_cfg: SamplingConfig
) -> Float[Array, "batch vocab"]:
    """Top-k, then top-p on the top-k renormalized distribution (the `transformers` order); dropped -> -inf.

    Ties at a cut-off are kept. Top-p keeps the smallest prefix of the sorted distribution whose mass
    reaches `top_p`: a token is kept when the mass strictly above it is below `top_p`.
    """
    k, p = sampling_cfg.top_k, sampling_cfg.top_p
    if k == 0 and p == 1.0:
        return logits
    top = jax.lax.top_k(logits, k or logits.shape[-1])[0]  # sorted, descending
    cutoff = top[:, -1:]
    if p < 1.0:
        probs = jax.nn.softmax(top, axis=-1)
        mass_above = jnp.cumsum(probs, axis=-1) - probs
        keep = jnp.sum(mass_above < p, axis=-1, keepdims=True)  # >= 1: the top token is always kept
        cutoff = jnp.take_along_axis(top, keep - 1, axis=-1)
    return jnp.where(logits < cutoff, -jnp.inf, logits)


def sample(
    logits: Float[Array, "batch vocab"], keys: Key[Array, "batch"], sampling_cfg: SamplingConfig
) -> tuple[Int[Array, "batch"], Float[Array, "batch"]]:
    """Draws one token per row with its own key; returns it with its tempered full-distribution log-prob."""
    tempered = logits.astype(jnp.float32) / sampling_cfg.temperature
    top = jnp.max(tempered, axis=-1, keepdims=True)
    if sampling_cfg.greedy:
        tokens = _argmax(tempered)
    else:
        uniform = 1.0 - jax.vmap(jax.random.uniform)(keys)  # in (0, 1]
        tokens = _inverse_cdf(jnp.exp(truncate(tempered, sampling_cfg) - top), uniform)
    log_z = jnp.log(jnp.sum(jnp.exp(tempered - top), axis=-1))
    logprobs = jnp.take_along_axis(tempered - top, tokens[:, None], axis=-1)[:, 0] - log_z
    return tokens.astype(jnp.int32), logprobs


_BLOCK = 128


def _inverse_cdf(weights: Float[Array, "batch vocab"], uniform: Float[Array, "batch"]) -> Int[Array, "batch"]:
    """The token where the cumulative weight first reaches uniform * total: an exact draw from one uniform.

    One uniform per row instead of a Gumbel per vocabulary entry (the random bits dominated a CPU step),
    and two levels (blocks of 128, then inside the chosen block) instead of a cumsum over the vocabulary.
    """
    batch, vocab = weights.shape
    blocks = jnp.pad(weights, ((0, 0), (0, -vocab % _BLOCK))).reshape(batch, -1, _BLOCK)
    mass = jnp.sum(blocks, axis=-1)
    cum = jnp.cumsum(mass, axis=-1)
    target = uniform * cum[:, -1]
    block = _first_reaching(cum, mass, target)
    inner = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
    before = jnp.take_along_axis(cum - mass, block[:, None], axis=1)[:, 0]
    return block * _BLOCK + _first_reaching(jnp.cumsum(inner, axis=-1), inner, target - before)


def _argmax(x: Float[Array, "batch vocab"]) -> Int[Array, "batch"]:
    """`jnp.argmax(x, -1)` (first maximum, NaN counts as one) in two levels: the first block of 128 holding
    the maximum, then the first maximum inside it. XLA:CPU vectorizes the blocks' max but not argmax's
    reduce of (value, index) pairs, which at a large vocabulary is a large share of greedy decoding
    (bench/README.md: "Greedy decoding: argmax in two levels").

    The last vocab % 128 entries are one more block, read back as the last 128 entries: the entries it
    shares with the block before are then below its maximum, or that block would have been first.
    """
    batch, vocab = x.shape
    size = min(_BLOCK, vocab)
    full = vocab - vocab % size
    best = jnp.max(x[:, :full].reshape(batch, -1, size), axis=-1)
    if full < vocab:
        best = jnp.concatenate([best, jnp.max(x[:, full:], axis=-1, keepdims=True)], axis=-1)
    start = jnp.minimum(jnp.argmax(best, axis=-1) * size, vocab - size)
    block = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size))(x, start)
    return start + jnp.argmax(block, axis=-1)


def _first_reaching(cum, weights, target):
    """First index with positive weight whose cumulative weight reaches target (clamped so one always does).

    Rounding can leave the target a hair above the last cumulative value; never picks a zero-weight entry.
    """
    last = jnp.max(jnp.where(weights > 0, cum, -jnp.inf), axis=-1)
    return jnp.argmax((cum >= jnp.minimum(target, last)[:, None]) & (weights > 0), axis=-1)


def segment_ends(sampling_cfg: SamplingConfig) -> tuple[int, ...]:
    """Where the decode loop's segments end, in new tokens: `cache_segments` equal parts of
    `max_new_tokens`, fewer where a part would be shorter than `MIN_SEGMENT` tokens."""
    steps = sampling_cfg.max_new_tokens
    n = max(1, min(sampling_cfg.cache_segments, steps // MIN_SEGMENT))
    return tuple(-(-steps * (i + 1) // n) for i in range(n))


MIN_SEGMENT = 32  # shorter segments save less attention than their compile and cache copies cost


def decode(
    step,
    carry,
    logits: Float[Array, "batch vocab"],
    keys: Key[Array, "batch"],
    stop_ids: tuple[int, ...],
    sampling_cfg: SamplingConfig,
    grow=lambda carry, end: carry,
) -> tuple[Rollout, object]:
    """Samples up to `max_new_tokens` per row; `step(carry, tokens, t) -> (logits, carry)` feeds token t.

    `logits` are those for the first new token (from the prefill). The loop stops as soon as every row
    has emitted one of `stop_ids`; finished rows keep running in lock-step (static shapes) but their
    outputs are masked. It runs in segments (`segment_ends`); `grow(carry, end)` prepares the carry
    for a segment that feeds tokens up to `end - 2` (the sampler grows its KV cache, so that a step
    attends to the slots its segment can have written, not to the final length). Returns the
    rollout and the final carry.
    """
    batch, steps = keys.shape[0], sampling_cfg.max_new_tokens
    stop = jnp.asarray(stop_ids, jnp.int32)

    def emit(state, logits, t):
        tokens, logprobs, lengths, done = state
        token, logprob = sample(logits, jax.vmap(jax.random.fold_in, (0, None))(keys, t), sampling_cfg)
        live = ~done
        tokens = tokens.at[:, t].set(jnp.where(live, token, 0))
        logprobs = logprobs.at[:, t].set(jnp.where(live, logprob, 0.0))
        stopped = live & jnp.isin(token, stop) if stop_ids else jnp.zeros_like(live)  # () with ignore_eos
        return (tokens, logprobs, lengths + live, done | stopped), token

    out = (jnp.zeros((batch, steps), jnp.int32), jnp.zeros((batch, steps), jnp.float32),
           jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool))
    out, token = emit(out, logits, 0)

    def body(loop):
        t, out, token, carry = loop
        logits, carry = step(carry, token, t - 1)
        out, token = emit(out, logits, t)
        return t + 1, out, token, carry

    loop = (jnp.int32(1), out, token, carry)
    for end in segment_ends(sampling_cfg):
        def cond(loop, end=end):
            t, (_, _, _, done), _, _ = loop
            return (t < end) & ~jnp.all(done)

        loop = jax.lax.while_loop(cond, body, (*loop[:3], grow(loop[3], end)))
    _, (tokens, logprobs, lengths, done), _, carry = loop
    mask = jnp.arange(steps) < lengths[:, None]
    return Rollout(tokens, mask, logprobs, lengths, ~done), carry


def generate(
    cfg: ModelConfig,
    params,
    prompts: Prompts,
    rng: Key[Array, ""],
    sampling_cfg: SamplingConfig,
    mesh: Mesh | None = None,
) -> Rollout:
    """`group_size` completions of every prompt, stopping at `cfg.eos_token_id` or `stop_tokens`.

    With a mesh, pass params placed by `grpo_jax.models.shard_params`; rows and the KV cache are
    sharded by the `batch` rule (data, fsdp), kv heads by `kv_heads` (tensor). Compiled once per
    (configs, mesh, number of prompts). The cache is allocated inside the program, so XLA updates it
    in place across decode steps; params are only read (the trainer keeps them, so no donation).
    """
    stop_ids = check_prompts(cfg, prompts, sampling_cfg)
    return rollout(cfg, sampling_cfg, stop_ids, mesh, params, prompts, rng)


def check_prompts(cfg: ModelConfig, prompts: Prompts, sampling_cfg: SamplingConfig) -> tuple[int, ...]:
    """Host-side errors before compiling (prompt width and lengths, stop ids); returns the stop ids
    (none with `ignore_eos`).

    `generate` = `check_prompts` + `rollout`; a caller that jits more than sampling runs this on the
    host and passes the stop ids, which are static, to `rollout`.
    """
    width = prompts.tokens.shape[1]
    if width != sampling_cfg.max_prompt_len:
        raise ValueError(
            f"prompts are {width} tokens wide but SamplingConfig.max_prompt_len="
            f"{sampling_cfg.max_prompt_len}: build them with grpo_jax.sampling.pad_prompts"
        )
    lengths = np.asarray(prompts.lengths)
    if (lengths < 1).any():
        raise ValueError(f"prompt {int(np.argmax(lengths < 1))} is empty: every prompt needs a token")
    if (lengths > width).any():
        raise ValueError(
            f"prompt {int(np.argmax(lengths > width))} claims {lengths.max()} tokens > "
            f"SamplingConfig.max_prompt_len={width}: raise max_prompt_len or truncate the prompt"
        )
    if sampling_cfg.ignore_eos:
        return ()
    eos = cfg.eos_token_id
    stop_ids = tuple(sorted({*((eos,) if isinstance(eos, int) else eos or ()), *sampling_cfg.stop_tokens}))
    if any(not 0 <= i < cfg.vocab_size for i in stop_ids):
        raise ValueError(
            f"stop ids {stop_ids} (ModelConfig.eos_token_id + SamplingConfig.stop_tokens) must lie in "
            f"[0, vocab_size={cfg.vocab_size})"
        )
    return stop_ids


def prefill(
    cfg: ModelConfig, params, prompts: Prompts, group_size: int, cache_len: int
) -> tuple[Float[Array, "batch vocab"], Cache]:
    """Runs each distinct prompt once, then repeats its cache and next-token logits `group_size` times."""
    width = prompts.tokens.shape[1]
    slot = jnp.arange(width, dtype=jnp.int32)
    start = width - prompts.lengths[:, None]  # left padding
    segment_ids = (slot >= start).astype(jnp.int32)
    positions = jnp.maximum(slot - start, 0)
    cache = models.init_cache(cfg, prompts.tokens.shape[0], cache_len)
    hidden, cache, _ = models.extend(cfg, params, prompts.tokens, positions, segment_ids, cache, 0)
    logits = models.unembed(cfg, params, hidden[:, -1])
    return jnp.repeat(logits, group_size, axis=0), models.repeat_cache(cfg, cache, group_size)


def decode_step(
    cfg: ModelConfig, params, cache: Cache, tokens: Int[Array, "batch"],
    positions: Int[Array, "batch"], index: Int[Array, ""],
) -> tuple[Float[Array, "batch vocab"], Cache]:
    """Feeds one token per row at cache slot `index`; returns the logits of the next one."""
    ones = jnp.ones_like(tokens)[:, None]
    hidden, cache, _ = models.extend(cfg, params, tokens[:, None], positions[:, None], ones, cache, index)
    return models.unembed(cfg, params, hidden[:, 0]), cache


def _decoding_params(cfg: ModelConfig, params, mesh: Mesh | None):
    """The weights the decode loops read, cast to the compute dtype and, on a mesh, gathered over fsdp
    once, before the prefill: XLA hoists a loop's cast and gathers of a loop-invariant weight out of it,
    a copy per decode loop (one loop per segment of a growing cache: unrolled, a copy of every weight
    per segment, measured by the memory plan of bench/scale_plan.py). Unrolled, every weight is
    loop-invariant, then sliced per layer (`models.unstack_layers`); under the layer scan only those
    outside the layer stacks are (the embeddings; cast before the gather, so the gathered copy is in
    the compute dtype), each layer's weights being sliced, cast and gathered inside the scan."""
    unrolled = models.layers_unrolled(cfg)
    once = {name: tree for name, tree in params.items() if unrolled or name not in models.LAYER_STACKS}
    once = jax.tree.map(lambda a: a.astype(cfg.jnp_compute_dtype), once)
    if mesh is not None:
        once = sharding.gather_over_fsdp(once, models.param_specs(cfg), mesh)
    params = {**params, **once}
    return models.unstack_layers(params) if unrolled else params


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def rollout(
    cfg: ModelConfig, sampling_cfg: SamplingConfig, stop_ids: tuple[int, ...], mesh: Mesh | None,
    params, prompts: Prompts, rng: Key[Array, ""],
) -> Rollout:
    """The jitted body of `generate`, callable inside another jit; `stop_ids` from `check_prompts`.
    On a mesh, the model's activations are pinned by the sharding rules."""
    with sharding.activation_rules(mesh):
        width, group = prompts.tokens.shape[1], sampling_cfg.group_size
        params = _decoding_params(cfg, params, mesh)
        logits, cache = prefill(cfg, params, prompts, group, width)
        lengths = jnp.repeat(prompts.lengths, group)
        shard = rows = lambda x: x  # noqa: E731
        if mesh is not None:  # fix the layouts of the cache and the rows through the loop
            shard = lambda cache: jax.lax.with_sharding_constraint(  # noqa: E731
                cache, models.cache_shardings(cfg, mesh, lengths.shape[0], cache["segment_ids"].shape[1]))
            rows = lambda tree: jax.tree.map(  # noqa: E731
                lambda a: jax.lax.with_sharding_constraint(a, sharding.batch_sharding(mesh, a.ndim)), tree)

        def step(cache, tokens, t):  # token t of the completion sits at slot width + t, position length + t
            logits, cache = decode_step(cfg, params, cache, tokens, lengths + t, width + t)
            return rows(logits), shard(cache)

        keys = row_keys(rng, prompts.tokens.shape[0], group)
        def grow(cache, end):  # a segment feeding tokens up to end - 2 writes slots up to width + end - 2
            return shard(models.grow_cache(cfg, cache, width + end - 1))

        out, cache = decode(step, cache, rows(logits), keys, stop_ids, sampling_cfg, grow)
        if "routes" in cache:  # slot s holds token s of [prompt, completion]: the Batch layout
            out = dataclasses.replace(out, routes=jnp.moveaxis(cache["routes"], 1, 0))
        return rows(out)
