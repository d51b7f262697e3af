"""Packing (`train.packing`): the training forwards lay several rollout rows end to end in one row of
max_prompt_len + max_new_tokens - 1 decoder inputs, instead of running every row left-padded to that
width. A completion that stops early then costs its real tokens, not the whole width.

The decoder builds its attention masks from segment ids alone (`models.decoder`), so a packed row is
just its sequences side by side, each under its own segment id, with positions restarting at 0: every
token sees exactly what it sees in its padded row, and the hidden states that predict a row's
completion are gathered back into the [batch, new] layout. Log-probs, entropies, losses, metrics and
gradients are those of the padded forward up to float rounding.

The host plans the layout (`plan`: first-fit decreasing of each row's prompt + counted completion,
within each device's share of each micro-batch, so no row leaves the device that holds it) and the
device moves the tokens (`pack`, once per rollout batch). The packed row count is static: it is picked
per step from four buckets (a quarter, half, three quarters or all of a share's rows), so a run
compiles at most four versions of each training program.

MoE models: replayed routes (`Batch.routes`, the padded rows' layout) are scattered onto the packed
tokens they belong to, and the forward's routes and router entropies are gathered back into that
layout, so routing replay (R2, R3) and the routing metrics see what the padded forward would.

Micro-batches: `train_step._micro_batches` splits the packed rows by the same interleave as the rows
(slice j holds packed rows j, j+k, ...), so `pack` writes micro-batch j's packed row p of device share
d at index d*k*P + p*k + j of the minibatch's packed rows, and the split puts it at d*P + p
(`Packing.row`).
"""

import dataclasses
import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from grpo_jax import models, sharding

BUCKETS = (0.25, 0.5, 0.75, 1.0)  # packed rows per device share of a micro-batch, as fractions of its rows


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """A minibatch's rows as the training forwards run them (`Batch.packing`)."""

    tokens: Int[Array, "packed seq_minus_1"]  # decoder inputs, the rows' real tokens end to end, 0 after
    positions: Int[Array, "packed seq_minus_1"]  # each row's own positions (0 at its first prompt token)
    segment_ids: Int[Array, "packed seq_minus_1"]  # a distinct id per row, 0 on padding
    row: Int[Array, "batch"]  # the packed row holding each row, within its micro-batch's packed rows
    first: Int[Array, "batch"]  # the column whose hidden state predicts each row's first completion token
    span: Int[Array, "batch 2"]  # the padded row's input columns [start, end) that its packed row holds


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where each row of a rollout batch goes (host numpy, the same on every process): packed row `dest`
    (within its minibatch's packed rows, before the micro-batch split), `row` (after it: `Packing.row`),
    from column `offset`, its first `length` inputs (prompt + counted completion - 1; 0: not placed, as
    it has no counted token). `rows` packed rows per device share of a micro-batch, `packed_rows` per
    minibatch."""

    dest: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    rows: int
    packed_rows: int

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.dest, self.row, self.offset, self.length


def first_fit_decreasing(sizes: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(bin, offset) of each item and the bins used: longest first, each into the first bin it fits.
    Items of size 0 take no room (bin 0, offset 0)."""
    bins, offset, room = np.zeros(len(sizes), np.int32), np.zeros(len(sizes), np.int32), []
    for i in sorted(np.flatnonzero(sizes), key=lambda i: -sizes[i]):
        b = next((b for b, free in enumerate(room) if free >= sizes[i]), len(room))
        if b == len(room):
            room.append(width)
        bins[i], offset[i] = b, width - room[b]
        room[b] -= sizes[i]
    return bins, offset, len(room)


def buckets(rows: int) -> list[int]:
    """The packed row counts a device share of `rows` rows may take."""
    return sorted({max(1, math.ceil(rows * f)) for f in BUCKETS})


def plan(prompt_lengths: np.ndarray, completion_lengths: np.ndarray, width: int, shards: int, micro_batches: int,
         minibatches: int = 1) -> Plan:
    """The packed layout of a rollout batch of rows with these real prompt lengths and counted completion
    lengths (0: no counted token), in rows of `width` inputs (max_prompt_len + max_new_tokens - 1). The
    batch splits into `minibatches` contiguous minibatches, each over `shards` devices (the `batch` rule:
    contiguous shares) and into `micro_batches` interleaved slices (`train_step._micro_batches`); each
    (minibatch, device, micro-batch) packs its own rows, and all take the smallest bucket that fits the
    fullest. A row never exceeds `width`, so the largest bucket (one packed row per row) always fits."""
    prompt_lengths, completion_lengths = np.asarray(prompt_lengths), np.asarray(completion_lengths)
    n = len(prompt_lengths)
    length = np.where(completion_lengths > 0, prompt_lengths + completion_lengths - 1, 0).astype(np.int32)
    if length.max(initial=0) > width:
        raise ValueError(f"a row of {length.max()} inputs does not fit a packed row of {width}")
    if n % (minibatches * shards * micro_batches):
        raise ValueError(f"{n} rows do not split into {minibatches} minibatches x {shards} devices x "
                         f"{micro_batches} micro-batches")
    share = n // minibatches // shards  # rows of one device in one minibatch
    local = np.arange(n) % (n // minibatches)  # index within the minibatch
    device, micro = local // share, local % micro_batches
    bins, offset, used = np.zeros(n, np.int32), np.zeros(n, np.int32), 1
    for start in range(0, n, share):  # each device share of each minibatch, then each of its micro-batches
        for j in range(micro_batches):
            members = start + j + micro_batches * np.arange(share // micro_batches)
            bins[members], offset[members], k = first_fit_decreasing(length[members], width)
            used = max(used, k)
    rows = next(b for b in buckets(share // micro_batches) if b >= used)
    dest = (device * micro_batches * rows + bins * micro_batches + micro).astype(np.int32)
    return Plan(dest, (device * rows + bins).astype(np.int32), offset, length, rows, rows * shards * micro_batches)


def pack(tokens: Int[Array, "batch seq"], positions: Int[Array, "batch seq"], segment_ids: Int[Array, "batch seq"],
         new: int, dest, row, offset, length, packed_rows: int) -> Packing:
    """A minibatch's left-padded rows (`train_step.sequences`) in the packed layout of its `Plan`
    arrays (dest, row, offset, length: `Plan.arrays`) into `Plan.packed_rows` rows. The rows
    keep their sharding: each moves within its device's share."""
    inputs = (tokens[:, :-1], positions[:, :-1], jnp.arange(1, tokens.shape[0] + 1, dtype=jnp.int32)[:, None])
    width = tokens.shape[1] - 1
    start = jnp.argmax(segment_ids > 0, axis=1)  # a row's first real (prompt) token
    cols = jnp.arange(width)
    placed = (cols >= start[:, None]) & (cols < start[:, None] + length[:, None])
    to_row = jnp.where(placed, dest[:, None], packed_rows)  # out of range: dropped
    to_col = jnp.where(placed, offset[:, None] + cols - start[:, None], 0)

    def scatter(x):
        x = jnp.broadcast_to(x, placed.shape).astype(jnp.int32)
        return jnp.zeros((packed_rows, width), jnp.int32).at[to_row, to_col].set(x, mode="drop")

    prompt = tokens.shape[1] - new - start
    return Packing(*(scatter(x) for x in inputs), row, offset + prompt - 1, jnp.stack([start, start + length], 1))


def completion_hidden(cfg: models.ModelConfig, params, packing: Packing, new: int, routes=None):
    """The final hidden states that predict each row's last `new` tokens, [batch, new, d], from one
    forward over the packed rows, and the decoder's aux (MoE models: `routes` and `router_entropy` of
    every input of the padded rows, [moe_layers, batch, seq - 1, ...], as the padded forward gives them;
    inputs the packed rows do not hold are filled from other columns and carry no weight). Columns past
    a row's counted completion hold other tokens' states: they are masked (the log-prob kernel gives
    masked tokens 0 and no gradient). `routes` [batch, moe_layers, seq - 1, k] (`Batch.routes`, the
    padded rows' layout) are replayed on the tokens they belong to."""
    width = packing.tokens.shape[1]
    shift = width - new  # a padded row's input column c sits at packed column first + c - shift
    replay = None
    if routes is not None:
        unrun = jnp.arange(routes.shape[-1], dtype=routes.dtype)  # a valid set on the slots no row holds
        replay = _to_packed(packing, jnp.moveaxis(routes, 1, 0), shift, unrun)
    hidden, aux = models.forward_with_aux(cfg, params, packing.tokens, packing.positions, packing.segment_ids, replay)
    hidden = _from_packed(packing, hidden[None], jnp.arange(new))[0]
    if "routes" in aux:
        aux = {k: _from_packed(packing, aux[k], jnp.arange(width) - shift) for k in ("routes", "router_entropy")}
    return hidden, aux


def _from_packed(packing: Packing, x, rel):
    """x [n, packed, width, ...] -> [n, batch, len(rel), ...]: row b's packed columns first[b] + rel,
    gathered within each device's block of packed rows (no row crosses devices)."""
    n, packed, width = x.shape[:3]
    shards = _batch_shards()
    cols = jnp.clip(packing.first[:, None] + rel, 0, width - 1).reshape(shards, -1, len(rel))
    rows = (packing.row % (packed // shards)).reshape(shards, -1, 1)
    blocks = x.reshape(n, shards, packed // shards, width, *x.shape[3:])
    out = jax.vmap(lambda b, r, c: b[:, r, c], in_axes=(1, 0, 0), out_axes=1)(blocks, rows, cols)
    return out.reshape(n, -1, len(rel), *x.shape[3:])


def _to_packed(packing: Packing, x, shift: int, fill):
    """x [n, batch, width, ...] in the padded rows' layout -> [n, packed, width, ...]: the inputs each
    packed row holds, scattered within each device's block (the inverse of `_from_packed`); `fill` on
    the packed slots no row holds."""
    n, batch, width = x.shape[:3]
    shards, packed = _batch_shards(), packing.tokens.shape[0]
    c = jnp.arange(width)
    held = (c >= packing.span[:, :1]) & (c < packing.span[:, 1:])
    cols = jnp.where(held, packing.first[:, None] + c - shift, width).reshape(shards, -1, width)  # width: dropped
    rows = jnp.broadcast_to((packing.row % (packed // shards))[:, None], held.shape).reshape(shards, -1, width)
    blocks = x.reshape(n, shards, batch // shards, width, *x.shape[3:])

    def scatter(b, r, c):
        return jnp.broadcast_to(fill, (n, packed // shards, width, *x.shape[3:])).at[:, r, c].set(b, mode="drop")

    out = jax.vmap(scatter, in_axes=(1, 0, 0), out_axes=1)(blocks, rows, cols)
    return out.reshape(n, packed, width, *x.shape[3:])


def _batch_shards() -> int:
    """Devices the `batch` rule splits rows over in the mesh traced under (1 without one)."""
    return sharding.batch_shards(jax.sharding.get_abstract_mesh())
