"""Multi-turn rollouts: the policy generates a turn, the environment (`grpo_jax.envs`) answers, its
observation's tokens go into the same KV cache, and the policy continues.

Each row keeps its whole trajectory (prompt, turns, observations) in a cache of its own, written in
place: a turn begins by encoding only the tokens new to the cache (the prompt; later the turn's last
sampled token and the observation) in one `models.extend`, then samples one token at a time
(`models.extend` of one token) until a stop id: the end token, `SamplingConfig.stop_tokens` or the
environment's `call_end`. Nothing is ever encoded twice. All rows decode together in a
`jax.lax.while_loop` that ends when every row's turn has; a row whose trajectory has ended takes no
part in later turns (its cache writes are dropped). Between turns the host decodes each row's turn,
calls `env.step` and tokenizes the observation.

A trajectory stops when the environment says done, at `env.max_turns` turns, or when the prompt's
continuation reaches `SamplingConfig.max_new_tokens` tokens (turns and observations together: the
token budget; an observation is cut so the policy keeps at least one token). The `sampling.Rollout`
lays the trajectory after the prompt: tokens of turns and observations in order, `mask` 1 on the
policy's tokens only (so observations leave the loss, the ratio, KL, entropy and every normalizer),
`logprobs` the sampler's on those, `lengths` the whole continuation, `truncated` when the budget ended
it. Row p*G + g draws token t of its continuation from the key of (rng, p, g, t), as `sampling` does:
a rerun from the same params and rng is the same trajectory.

Over several processes each process decodes, steps and tokenizes its own rows (`sharding.process_rows`);
the turns run in step, until no process has a row left.

Rows whose trajectory has ended leave the batch at the next turn: a turn decodes only the live rows
(`_turn_rows`), gathered from the cache into a batch of the live count's next power of two (at least
one row per batch device) and written back after it. Within a turn, rows that stopped wait for the
turn's longest row (their writes dropped).

`extend` attends over the row's whole cache each token (a dense cache, not the slot blocks of
`sampling`): what multi-turn tool use needs at the scale of the tests and the study.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Bool, Float, Int, Key, UInt32

from grpo_jax import distributed, envs, models, sampling, sharding
from grpo_jax.config import ModelConfig, SamplingConfig


@dataclasses.dataclass
class Turns:
    """One row's trajectory on the host: the policy's turns, the observations after them, each turn's
    reward (the last one is the final reward) and the number of policy tokens of each turn."""

    completions: list[str] = dataclasses.field(default_factory=list)
    observations: list[str] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    lengths: list[int] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> float:
        """The trajectory's return: its turns' rewards summed."""
        return float(sum(self.rewards))


def turn_table(turns: list[Turns], max_turns: int, mask: Bool[np.ndarray, "rows new"]) -> dict[str, np.ndarray]:
    """What turn-level credit reads of each row (`algorithms.turn_advantages`): "turn_rewards" and
    "turn_mask" [rows, max_turns], and "token_turns" [rows, new], the turn of each policy token (-1 on
    observations and past the end)."""
    rewards, has = np.zeros((len(turns), max_turns), np.float32), np.zeros((len(turns), max_turns), bool)
    token_turns = np.full(mask.shape, -1, np.int32)
    for b, r in enumerate(turns):
        rewards[b, : len(r.rewards)], has[b, : len(r.rewards)] = r.rewards, True
        token_turns[b, np.flatnonzero(mask[b])] = np.repeat(np.arange(len(r.lengths)), r.lengths)
    return dict(turn_rewards=rewards, turn_mask=has, token_turns=token_turns)


def stop_ids(cfg: ModelConfig, sampling_cfg: SamplingConfig, env: envs.EnvConfig, tokenizer) -> tuple[int, ...]:
    """The ids that end a turn (`sampling.stop_ids` and `env.call_end`, which must be one token),
    checked on the host before anything compiles."""
    if sampling_cfg.ignore_eos:
        raise ValueError("sampling.ignore_eos=True never ends a turn: set it False with an env")
    ids = set(sampling.stop_ids(cfg, sampling_cfg))
    if env.call_end:
        end = tokenizer.encode(env.call_end, continuation=True)
        if len(end) != 1:
            raise ValueError(f"env.call_end={env.call_end!r} is {len(end)} tokens {end} of this tokenizer; a turn "
                             "ends at one token: pick a call_end the tokenizer encodes as one token")
        ids.add(end[0])
    return tuple(sorted(ids))


def _init_cache(cfg: ModelConfig, rows: int, length: int) -> dict:
    k = (cfg.num_layers, rows, cfg.num_kv_heads, cfg.head_dim, length)
    v = (cfg.num_layers, rows, cfg.num_kv_heads, length, cfg.head_dim)
    return dict(k=jnp.zeros(k, cfg.jnp_compute_dtype), v=jnp.zeros(v, cfg.jnp_compute_dtype),
                segment_ids=jnp.zeros((rows, length), jnp.int32), written=jnp.zeros(rows, jnp.int32))


def _cache_shardings(mesh: Mesh) -> dict:
    """The cache's rows split by the `batch` rule: axis 1 of k and v (after the layers), 0 of the rest."""
    rows = NamedSharding(mesh, P(sharding.RULES["batch"]))
    layers_rows = NamedSharding(mesh, P(None, sharding.RULES["batch"]))
    return dict(k=layers_rows, v=layers_rows, segment_ids=rows, written=rows)


def _on_rows(mesh: Mesh | None, cache: dict) -> dict:
    return cache if mesh is None else jax.lax.with_sharding_constraint(cache, _cache_shardings(mesh))


_ROW_AXIS = dict(k=1, v=1, segment_ids=0, written=0)


@functools.partial(jax.jit, static_argnums=(0,))
def _take_rows(mesh: Mesh | None, cache: dict, rows: Int[Array, "sub"]) -> dict:
    """The cache of rows `rows`, a batch of their own."""
    return _on_rows(mesh, {name: jnp.take(a, rows, axis=_ROW_AXIS[name]) for name, a in cache.items()})


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1,))
def _put_rows(mesh: Mesh | None, cache: dict, sub: dict, rows: Int[Array, "sub"]) -> dict:
    """`cache` with rows `rows` replaced by `sub`'s (`_take_rows`' inverse)."""
    put = lambda a, b, axis: a.at[(slice(None),) * axis + (rows,)].set(b)  # noqa: E731
    return _on_rows(mesh, {name: put(a, sub[name], _ROW_AXIS[name]) for name, a in cache.items()})


def _turn_rows(count: Int[np.ndarray, "rows"], shards: int) -> np.ndarray:
    """This process's rows (indices into its `count`) that decode the next turn: the live ones (count > 0),
    then ended ones up to the turn's batch, the same size on every process: the most live rows of any
    process rounded up to a power of two times its `shards` (batch devices), at most all its rows.
    Empty once every process's rows have ended."""
    live = np.flatnonzero(count)
    most = max(distributed.all_gather_json(len(live)))
    if most == 0:
        return live
    size = min(len(count), shards * 2 ** math.ceil(math.log2(math.ceil(most / shards))))
    return np.sort(np.concatenate([live, np.flatnonzero(count == 0)[: size - len(live)]]))


def _feed(cfg: ModelConfig, params, cache: dict, tokens: Int[Array, "rows time"], count: Int[Array, "rows"]):
    """Encodes the first count[b] of `tokens[b]` after row b's cached tokens and writes them into the
    cache (count 0: nothing); returns the logits after each row's last new token and the cache."""
    rows, width = tokens.shape
    t = jnp.arange(width)
    new = t < count[:, None]
    hidden, (k, v) = models.extend(cfg, params, (cache["k"], cache["v"]), cache["segment_ids"], tokens,
                                   cache["written"][:, None] + t, new.astype(jnp.int32))
    places = jnp.where(new, cache["written"][:, None] + t, cache["segment_ids"].shape[1])  # past the end: dropped
    r = jnp.arange(rows)[:, None]
    cache = dict(
        k=cache["k"].at[:, r, :, :, places].set(jnp.moveaxis(k, (1, 4), (0, 1)), mode="drop"),
        v=cache["v"].at[:, r, :, places].set(jnp.moveaxis(v, (1, 3), (0, 1)), mode="drop"),
        segment_ids=cache["segment_ids"].at[r, places].set(1, mode="drop"),
        written=cache["written"] + count,
    )
    last = hidden[jnp.arange(rows), jnp.maximum(count - 1, 0)]
    return models.unembed(cfg, params, last), cache


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))
def turn(
    cfg: ModelConfig, sampling_cfg: SamplingConfig, stop: tuple[int, ...], mesh: Mesh | None, params, cache: dict,
    chunk: Int[Array, "rows time"], count: Int[Array, "rows"], keys: UInt32[Array, "rows key"],
    used: Int[Array, "rows"], room: Int[Array, "rows"],
) -> tuple[Int[Array, "rows new"], Float[Array, "rows new"], Int[Array, "rows"], dict]:
    """One turn of every row with count[b] > 0: encode its `chunk`, then draw tokens (token i of the
    continuation from fold_in(row b's key, used[b] + i); `keys`: the row keys' data) until a stop id or
    room[b] tokens. Returns the
    turn's tokens, their log-probs (tempered full distribution, as `sampling.sample`), how many, and
    the cache, which holds every token but each row's last one."""
    with sharding.activation_rules(mesh):
        params = sampling._decoding_params(cfg, params, mesh)
        rows, new = chunk.shape[0], sampling_cfg.max_new_tokens
        logits, cache = _feed(cfg, params, _on_rows(mesh, cache), chunk, count)
        out = dict(tokens=jnp.zeros((rows, new), jnp.int32), logprobs=jnp.zeros((rows, new), jnp.float32),
                   n=jnp.zeros(rows, jnp.int32))

        def draw(logits, live, out):
            step_keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(keys), used + out["n"])
            token, logprob = sampling.sample(logits, step_keys, sampling_cfg)
            at = jnp.where(live, out["n"], new)  # rows not live write nothing
            out = dict(tokens=out["tokens"].at[jnp.arange(rows), at].set(token, mode="drop"),
                       logprobs=out["logprobs"].at[jnp.arange(rows), at].set(logprob, mode="drop"),
                       n=out["n"] + live)
            return token, live & ~jnp.isin(token, jnp.asarray(stop, jnp.int32)) & (out["n"] < room), out

        def body(loop):
            token, live, out, cache = loop
            logits, cache = _feed(cfg, params, cache, token[:, None], live.astype(jnp.int32))
            return *draw(logits, live, out), _on_rows(mesh, cache)

        loop = (*draw(logits, count > 0, out), cache)
        _, _, out, cache = jax.lax.while_loop(lambda loop: jnp.any(loop[1]), body, loop)
        if mesh is not None:  # split by rows like the inputs: each process reads its own (`sharding.local_rows`)
            out = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sharding.batch_sharding(mesh, a.ndim)), out)
        return out["tokens"], out["logprobs"], out["n"], cache


def _encode(tokenizer, text: str) -> list[int]:
    """An observation's tokens; characters the tokenizer cannot encode (a char-level one raises on them)
    are dropped, so that no tool output can stop a run."""
    try:
        return tokenizer.encode(text, continuation=True)
    except ValueError:
        return _encode(tokenizer, "".join(c for c in text if _encodes(tokenizer, c)))


def _encodes(tokenizer, char: str) -> bool:
    try:
        return bool(tokenizer.encode(char, continuation=True))
    except ValueError:
        return False


def rollout(
    cfg: ModelConfig, sampling_cfg: SamplingConfig, env: envs.EnvConfig, tokenizer, mesh: Mesh | None, params,
    row_prompts: sampling.Prompts, examples: list[dict], rng: Key[Array, ""],
) -> tuple[sampling.Rollout, list[Turns]]:
    """Trajectories of `row_prompts` (one left-padded prompt per row, row p*G + g sample g of prompt
    p, as `sampling.rollout_rows`; global arrays on a mesh): the Rollout (see the module docstring) and
    the `Turns` of this process's rows (`sharding.process_rows`; every row without a mesh), whose
    examples `examples` are, in order: each process steps the environments of its own rows."""
    if row_prompts.temperatures is not None:
        raise ValueError("a multi-turn rollout samples at sampling.temperature: use a prompt sampler without "
                         "temperatures (algorithm.sampler)")
    stop = stop_ids(cfg, sampling_cfg, env, tokenizer)
    budget, g = sampling_cfg.max_new_tokens, sampling_cfg.group_size
    n, width = row_prompts.tokens.shape
    mine = np.arange(n) if mesh is None else sharding.process_rows(mesh, n)
    rows = len(mine)

    def put(tree, size=n):  # this process's rows of a `size`-row batch -> global arrays
        return jax.tree.map(jnp.asarray, tree) if mesh is None else sharding.global_batch(tree, mesh, size)

    def read(x):  # this process's rows of a global array
        return np.asarray(x) if mesh is None else sharding.local_rows(x, sharding.process_rows(mesh, x.shape[0]))

    prompts, lengths = read(row_prompts.tokens), read(row_prompts.lengths)
    keys = np.asarray(jax.random.key_data(sampling.row_keys(rng, n // g, g)))[mine]
    cache = jax.jit(functools.partial(_init_cache, cfg, n, width + budget),
                    out_shardings=None if mesh is None else _cache_shardings(mesh))()
    shards = rows * sharding.batch_shards(mesh) // n  # this process's batch devices
    chunk = np.zeros((rows, width), np.int32)  # right-aligned: a turn's new tokens come first
    for b in range(rows):
        chunk[b, : lengths[b]] = prompts[b, width - lengths[b]:]
    count = lengths.astype(np.int32)
    tokens, mask, logprobs = (np.zeros((rows, budget), d) for d in (np.int32, bool, np.float32))
    used, truncated = np.zeros(rows, np.int32), np.zeros(rows, bool)
    turns = [Turns() for _ in range(rows)]
    obs_width = 1 + env.max_observation_tokens
    for t in range(env.max_turns):
        sel = _turn_rows(count, shards)
        if not sel.size:  # every process's rows have ended
            break
        size = len(sel) * n // rows
        if size < n:
            at = put(mine[sel], size)
            sub = _take_rows(mesh, cache, at)
        else:
            sub = cache
        out, lps, n_new, sub = turn(cfg, sampling_cfg, stop, mesh, params, sub, put(chunk[sel], size),
                                    put(count[sel], size), put(keys[sel], size), put(used[sel], size),
                                    put(budget - used[sel], size))
        cache = _put_rows(mesh, cache, sub, at) if size < n else sub
        out, lps, n_new = read(out), read(lps), read(n_new)
        chunk, nxt = np.zeros((rows, obs_width), np.int32), np.zeros(rows, np.int32)
        for j, b in enumerate(sel):
            if not count[b]:
                continue
            k, u = int(n_new[j]), int(used[b])
            tokens[b, u: u + k], mask[b, u: u + k], logprobs[b, u: u + k] = out[j, :k], True, lps[j, :k]
            used[b] += k
            last = bool(t == env.max_turns - 1 or used[b] == budget)
            text, r = tokenizer.decode(out[j, :k]), turns[b]
            step = env.step(envs.State(examples[b], tuple(r.completions), tuple(r.observations), last), text)
            r.completions.append(text), r.rewards.append(float(step.reward)), r.lengths.append(k)
            truncated[b] = used[b] == budget and not step.done
            if step.done or last:
                continue
            obs = _encode(tokenizer, step.observation)[: min(env.max_observation_tokens, budget - used[b] - 1)]
            r.observations.append(step.observation)
            tokens[b, used[b]: used[b] + len(obs)] = obs
            used[b] += len(obs)
            chunk[b, : 1 + len(obs)], nxt[b] = [out[j, k - 1], *obs], 1 + len(obs)
        count = nxt
    return put(sampling.Rollout(tokens, mask, logprobs, used, truncated)), turns
