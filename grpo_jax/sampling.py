"""Rollouts: continuous batching over a fixed set of decode slots, each prompt's KV cache stored once.

`rollout` encodes each distinct prompt once (`models.prefill`), draws every row's first token from it,
and decodes the P*G rows on `SamplingConfig.decode_slots` slots in one `jax.lax.while_loop`: a slot
whose row finishes takes the next queued row, so short completions never wait for the longest. A
slot attends to its prompt's shared keys and values and to its own tokens, only as far as they are
written (`models.decode`). Every row draws from its own key, derived from (rng, prompt index, sample
index, token index), and its computation never mixes with its neighbours', so a seed gives the same
samples whatever the slots, the batch composition or the sharding.
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


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prompts:
    """Left-padded prompt token ids: row p holds its `lengths[p]` tokens at the end of the row; with
    `temperatures`, prompt p's samples are drawn (and their log-probs reported) at temperatures[p]
    instead of `SamplingConfig.temperature` (a prompt sampler's choice: `data.samplers.Choice`)."""

    tokens: Int[Array, "prompt prompt_len"]
    lengths: Int[Array, "prompt"]
    temperatures: Float[Array, "prompt"] | None = None


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
    logits: Float[Array, "batch vocab"], keys: Key[Array, "batch"], sampling_cfg: SamplingConfig,
    temperatures: Float[Array, "batch"] | None = None,
) -> tuple[Int[Array, "batch"], Float[Array, "batch"]]:
    """Draws one token per row with its own key; returns it with its tempered full-distribution log-prob.
    `temperatures`: each row's, instead of `sampling_cfg.temperature`. `sampling_cfg.logit_noise` = s
    adds s * N(0, 1) to every logit first, from the key folded with 1 (the draw reads the key itself)."""
    logits = logits.astype(jnp.float32)
    if sampling_cfg.logit_noise:
        noise = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 1), logits.shape[-1:]))(keys)
        logits = logits + sampling_cfg.logit_noise * noise
    tempered = logits / (sampling_cfg.temperature if temperatures is None else temperatures[:, None])
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
    return stop_ids(cfg, sampling_cfg)


def stop_ids(cfg: ModelConfig, sampling_cfg: SamplingConfig) -> tuple[int, ...]:
    """`ModelConfig.eos_token_id` and `SamplingConfig.stop_tokens`, checked against the vocabulary;
    none with `ignore_eos`."""
    if sampling_cfg.ignore_eos:
        return ()
    eos = cfg.eos_token_id
    ids = tuple(sorted({*((eos,) if isinstance(eos, int) else eos or ()), *sampling_cfg.stop_tokens}))
    if any(not 0 <= i < cfg.vocab_size for i in ids):
        raise ValueError(
            f"stop ids {ids} (ModelConfig.eos_token_id + SamplingConfig.stop_tokens) must lie in "
            f"[0, vocab_size={cfg.vocab_size})"
        )
    return ids


def _decoding_params(cfg: ModelConfig, params, mesh: Mesh | None):
    """The weights the decode loop reads, cast to the compute dtype and, on a mesh, gathered over fsdp
    once, before the prefill: XLA would otherwise hoist a cast and gather of each loop-invariant weight
    out of the loop as a copy of its own (measured by the memory plan of bench/scale_plan.py).
    Unrolled, every weight is loop-invariant, then sliced per layer (`models.unstack_layers`); under
    the layer scan only those outside the layer stacks are (the embeddings; cast before the gather, so
    the gathered copy is in the compute dtype), each layer's weights being sliced, cast and gathered
    inside the scan."""
    unrolled = models.layers_unrolled(cfg)
    once = {name: tree for name, tree in params.items() if unrolled or name not in models.LAYER_STACKS}
    once = jax.tree.map(lambda a: a.astype(cfg.jnp_compute_dtype), once)
    if mesh is not None:
        once = sharding.gather_over_fsdp(once, models.param_specs(cfg), mesh)
    params = {**params, **once}
    return models.unstack_layers(params) if unrolled else params


def lanes(mesh: Mesh | None, rows: int, slots: int) -> int:
    """The number of lanes of a rollout: the devices its rows are split over (1 without a mesh). Each
    lane decodes its own consecutive block of rows, on its own slots, from its own copy of their prompts."""
    n = sharding.batch_shards(mesh)
    if rows % n or slots % n:
        raise ValueError(
            f"{rows} rows and {slots} decode slots (SamplingConfig.decode_slots) must both divide over the "
            f"{n} devices of the batch mesh axes: change the batch size, decode_slots or the mesh")
    return n


def lane_prompts(num_prompts: int, group_size: int, num_lanes: int) -> np.ndarray:
    """[lanes, prefixes per lane]: the prompts each lane encodes, those of its rows (row p*G + g is
    sample g of prompt p); lanes with fewer repeat their last prompt (encoded, never read)."""
    per = num_prompts * group_size // num_lanes
    first = [d * per // group_size for d in range(num_lanes)]
    width = max(((d + 1) * per - 1) // group_size - first[d] + 1 for d in range(num_lanes))
    return np.minimum(np.asarray(first)[:, None] + np.arange(width), num_prompts - 1)


def generate(
    cfg: ModelConfig,
    params,
    prompts: Prompts,
    rng: Key[Array, ""],
    sampling_cfg: SamplingConfig,
    mesh: Mesh | None = None,
) -> Rollout:
    """`group_size` completions of every prompt, stopping at `cfg.eos_token_id` or `stop_tokens`.

    With a mesh, pass params placed by `grpo_jax.models.shard_params`; rows, slots and prompts are
    sharded by the `batch` rule (data, fsdp), kv heads by `kv_heads` (tensor). Compiled once per
    (configs, mesh, number of prompts).
    """
    stop_ids = check_prompts(cfg, prompts, sampling_cfg)
    return rollout(cfg, sampling_cfg, stop_ids, mesh, params, prompts, rng)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), static_argnames=("processor",))
def rollout(
    cfg: ModelConfig, sampling_cfg: SamplingConfig, stop_ids: tuple[int, ...], mesh: Mesh | None,
    params, prompts: Prompts, rng: Key[Array, ""], processor=None,
) -> Rollout:
    """The jitted body of `generate`, callable inside another jit; `stop_ids` from `check_prompts`.

    Continuous batching over `decode_slots` slots (all rows when 0), in lanes (`lanes`): each lane
    encodes the prompts of its rows once (`models.prefill`), draws every row's first token from them,
    and queues the rows that go on. A slot takes the next queued row of its lane when its own finishes,
    so a short completion never waits for the longest; the loop ends when the queues are empty and
    every slot is idle. A row's key (`row_keys`, then its token index) and its computation do not
    depend on the slot it runs in or on the rows beside it (`models.decode`): its tokens and log-probs
    are the same whatever its neighbours, and for another number of slots (other matmul shapes) the
    same up to float rounding.

    `processor(logits [slots, V], rows [slots], index [slots]) -> logits`, optional and static: edits
    each step's logits of the token `index` of row `rows` (global row ids) before sampling, like a
    `transformers` LogitsProcessor; bench/long_tail.py forces completion lengths with it.
    On a mesh, the model's activations are pinned by the sharding rules.
    """
    if sampling_cfg.compute_dtype is not None:  # the sampler's own precision (SamplingConfig.compute_dtype)
        cfg = dataclasses.replace(cfg, compute_dtype=sampling_cfg.compute_dtype)
    with sharding.activation_rules(mesh):
        num_prompts, width = prompts.tokens.shape
        g, steps = sampling_cfg.group_size, sampling_cfg.max_new_tokens
        n = num_prompts * g
        num_slots = min(sampling_cfg.decode_slots or n, n)
        d = lanes(mesh, n, num_slots)
        per, lane_slots = n // d, num_slots // d
        on_lanes = lambda tree: tree  # noqa: E731
        if mesh is not None:
            on_lanes = lambda tree: jax.tree.map(  # noqa: E731
                lambda a: jax.lax.with_sharding_constraint(a, sharding.batch_sharding(mesh, a.ndim)), tree)

        # every lane encodes its rows' prompts once
        params = _decoding_params(cfg, params, mesh)
        prefixes = lane_prompts(num_prompts, g, d)
        lane_tokens, lane_lengths = prompts.tokens[prefixes.ravel()], prompts.lengths[prefixes.ravel()]
        slot = jnp.arange(width, dtype=jnp.int32)
        start = width - lane_lengths[:, None]  # left padding
        valid = slot >= start
        hidden, kv, encoded = models.prefill(cfg, params, lane_tokens, jnp.maximum(slot - start, 0), valid.astype(jnp.int32))
        first_logits = models.unembed(cfg, params, hidden[:, -1])
        cache = models.init_cache(cfg, kv, valid, num_slots, max(steps - 1, 1))
        if mesh is not None:
            cache = jax.lax.with_sharding_constraint(cache, models.cache_shardings(
                cfg, mesh, num_slots, max(steps - 1, 1), *valid.shape))

        # each row: its prefix within its lane, prompt length, key; its first token from the prefill
        row = np.arange(n).reshape(d, per)
        prefix_of = jnp.asarray(row // g - prefixes[:, :1])  # [lanes, rows per lane]
        prompt_len = on_lanes(jnp.take_along_axis(lane_lengths.reshape(d, -1), prefix_of, axis=1))
        keys = on_lanes(row_keys(rng, num_prompts, g).reshape(d, per))
        temps = None if prompts.temperatures is None else on_lanes(jnp.repeat(prompts.temperatures, g).reshape(d, per))
        logits = first_logits.reshape(d, -1, first_logits.shape[-1])[jnp.arange(d)[:, None], prefix_of]
        logits = logits.reshape(n, -1)
        if processor is not None:
            logits = processor(logits, jnp.arange(n), jnp.zeros(n, jnp.int32))
        first, logprob = sample(logits, jax.vmap(jax.random.fold_in, (0, None))(keys.ravel(), 0), sampling_cfg,
                                None if temps is None else temps.ravel())
        first, logprob = on_lanes((first.reshape(d, per), logprob.reshape(d, per)))
        stopped = jnp.isin(first, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros((d, per), bool)
        queue = jnp.argsort(stopped, axis=1, stable=True)  # the rows that go on, in order
        queued = jnp.sum(~stopped, axis=1) if steps > 1 else jnp.zeros(d, jnp.int32)
        out = on_lanes(dict(
            tokens=jnp.zeros((d, per, steps), jnp.int32).at[:, :, 0].set(first),
            logprobs=jnp.zeros((d, per, steps), jnp.float32).at[:, :, 0].set(logprob),
            lengths=jnp.ones((d, per), jnp.int32), stopped=stopped,
        ))
        if "routes" in encoded:  # the experts of each completion token, recorded as it is fed (R3)
            moe, k = encoded["routes"].shape[0], encoded["routes"].shape[-1]
            out["routes"] = on_lanes(jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (d, per, moe, steps - 1, k)))

        def refill(state):  # free slots take their lane's next queued rows, in slot order
            rows, emitted, last, head = state
            free = rows == per
            rank = jnp.cumsum(free, axis=1) - 1
            take = free & (head[:, None] + rank < queued[:, None])
            new = jnp.take_along_axis(queue, jnp.clip(head[:, None] + rank, 0, per - 1), axis=1)
            return (jnp.where(take, new, rows), jnp.where(take, 1, emitted),
                    jnp.where(take, jnp.take_along_axis(first, new, axis=1), last), head + jnp.sum(take, axis=1))

        lane_of = jnp.arange(d)[:, None]

        def body(loop):
            (rows, emitted, last, head), out, cache = loop
            live = rows < per
            at = jnp.minimum(rows, per - 1)
            written = jnp.where(live, emitted - 1, 0)  # own tokens in the cache: all but the last emitted
            positions = prompt_len[lane_of, at] + emitted - 1
            hidden, cache, aux = models.decode(cfg, params, cache, last.ravel(), positions.ravel(), written.ravel(),
                                               prefix_of[lane_of, at])
            logits = models.unembed(cfg, params, hidden)
            if processor is not None:
                logits = processor(logits, (lane_of * per + at).ravel(), emitted.ravel())
            step_keys = jax.vmap(jax.random.fold_in)(keys[lane_of, at].ravel(), emitted.ravel())
            row_temps = None if temps is None else temps[lane_of, at].ravel()
            token, logprob = (a.reshape(d, lane_slots) for a in sample(logits, step_keys, sampling_cfg, row_temps))
            stop = live & jnp.isin(token, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros_like(live)
            put = jax.vmap(lambda a, r, i, x: a.at[r, i].set(x, mode="drop"))  # idle slots (row `per`) write nothing
            out = dict(out, tokens=put(out["tokens"], rows, emitted, token), logprobs=put(out["logprobs"], rows, emitted, logprob))
            if "routes" in out:  # aux routes [moe_layers, slots, 1, k] of the token fed, number emitted - 1
                fed = jnp.moveaxis(aux["routes"][:, :, 0], 0, 1).reshape(d, lane_slots, moe, k)
                out["routes"] = jax.vmap(lambda a, r, i, x: a.at[r, :, i].set(x, mode="drop"))(
                    out["routes"], rows, emitted - 1, fed)
            emitted = emitted + live
            done = live & (stop | (emitted == steps))
            ended = jnp.where(done, rows, per)
            out["lengths"] = jax.vmap(lambda a, r, x: a.at[r].set(x, mode="drop"))(out["lengths"], ended, emitted)
            out["stopped"] = jax.vmap(lambda a, r, x: a.at[r].set(x, mode="drop"))(out["stopped"], ended, stop)
            rows = jnp.where(done, per, rows)
            return on_lanes(refill((rows, emitted, token, head))), on_lanes(out), cache

        idle = jnp.full((d, lane_slots), per, jnp.int32)
        state = on_lanes(refill((idle, jnp.zeros_like(idle), jnp.zeros_like(idle), jnp.zeros(d, jnp.int32))))
        _, out, _ = jax.lax.while_loop(lambda loop: jnp.any(loop[0][0] < per), body, (state, out, cache))

        flat = jax.tree.map(lambda a: a.reshape(n, *a.shape[2:]), out)
        mask = jnp.arange(steps) < flat["lengths"][:, None]
        routes = None
        if "routes" in flat:  # [prompt, completion] without its last token: the train Batch's layout
            prompt_routes = jnp.moveaxis(encoded["routes"], 0, 1)[(lane_of * prefixes.shape[1] + prefix_of).ravel()]
            routes = jnp.concatenate([prompt_routes, flat["routes"]], axis=2)
        return on_lanes(Rollout(flat["tokens"], mask, flat["logprobs"], flat["lengths"], ~flat["stopped"], routes))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def rollout_rows(cfg, sampling_cfg, stop_ids, mesh, params, row_prompts: Prompts, rng) -> Rollout:
    """`rollout` of prompts given once per row (row p*G + g holds prompt p), so that each
    process passes only the rows it holds (`sharding.global_batch`); the G rows of a prompt still share
    one prefill. Rollouts and evaluations (`grpo_jax.evaluate`) sample with it."""
    prompts = jax.tree.map(lambda x: x[:: sampling_cfg.group_size], row_prompts)
    return rollout(cfg, sampling_cfg, stop_ids, mesh, params, prompts, rng)
