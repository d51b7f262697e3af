"""Mosaic TPU kernels for `fused_logprobs` (see `logprobs_pallas` for how they are launched).

Forward: grid (token tiles, vocab tiles); the three online stats of a token tile stay resident in
its output block while the vocab axis (innermost, "arbitrary") streams tiles of unembed.
Backward: two kernels recompute the logits tiles: one sums d hidden over the vocab axis, the
other sums d unembed over the token axis, each into a float32 block that stays resident.
Token rows are padded to the tile (O(N d)); the vocabulary is not (that would copy unembed):
columns past V in the last tile are masked, and their unembed entries zeroed before use.
Accumulating in revisited output blocks is TPU (and interpreter) semantics: the Triton kernels
for GPU are laid out differently (`logprobs_triton`).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import _launch, _tile

TOKEN_TILE, VOCAB_TILE = 256, 2048  # a [256, d] hidden block and a [d, 2048] unembed block in VMEM


def _call(kernel, grid, in_specs, out_specs, out_shape, semantics, interpret):
    params = None if interpret else pltpu.CompilerParams(dimension_semantics=semantics)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=params,
    )


def _geometry(plan, hidden, unembed):
    n, v = hidden.shape[0], unembed.shape[0 if plan.transposed else 1]
    tn, tv = min(plan.token_tile or TOKEN_TILE, n), min(plan.vocab_tile or VOCAB_TILE, v)
    return tn, tv, -(-n // tn), -(-v // tv), v


def _w_spec(plan, d, tv, index):
    """BlockSpec of a vocab tile of unembed; `index(*grid_ids)` gives its vocab-tile number."""
    if plan.transposed:
        return pl.BlockSpec((tv, d), lambda *g: (index(*g), 0))
    return pl.BlockSpec((d, tv), lambda *g: (0, index(*g)))


def _columns(j, tn, tv, v):
    cols = j * tv + jax.lax.broadcasted_iota(jnp.int32, (tn, tv), 1)
    return cols, cols < v


def _valid_w(plan, w, j, tv, v):
    """Zero the entries of a vocab tile past V (the padding of the last tile is undefined)."""
    axis = 0 if plan.transposed else 1
    ids = j * tv + jax.lax.broadcasted_iota(jnp.int32, w.shape, axis)
    return jnp.where(ids < v, w, jnp.zeros_like(w))


def forward(plan, hidden, unembed, mask, *, interpret):
    """(lse, E_p[z]), each [N] float32, 0 on masked rows."""
    tn, tv, nt, nv, v = _geometry(plan, hidden, unembed)
    d = hidden.shape[1]
    h, m = _launch.pad_rows(nt * tn, hidden, mask[:, None].astype(jnp.int32))

    def kernel(h_ref, w_ref, m_ref, *stat_refs):
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            for ref, init in zip(stat_refs, _tile.init_stats(tn)):
                ref[...] = init

        @pl.when(jnp.any(m_ref[...] != 0))
        def _():
            z = _tile.logits(h_ref[...], w_ref[...], plan.inv_temp, plan.transposed)
            stats = tuple(ref[...] for ref in stat_refs)
            new = _tile.update_stats(stats, z, _columns(j, tn, tv, v)[1])
            for ref, value in zip(stat_refs, new):
                ref[...] = value

    row = pl.BlockSpec((tn, 1), lambda i, j: (i, 0))
    stats = _call(
        kernel,
        grid=(nt, nv),
        in_specs=[pl.BlockSpec((tn, d), lambda i, j: (i, 0)), _w_spec(plan, d, tv, lambda i, j: j)]
        + [row],
        out_specs=[row] * 3,
        out_shape=[jax.ShapeDtypeStruct((nt * tn, 1), jnp.float32)] * 3,
        semantics=("parallel", "arbitrary"),
        interpret=interpret,
    )(h, unembed, m)
    # Fully masked tiles keep their initial stats (m = NEG, s = 0): make them finite zeros.
    return tuple(jnp.where(m != 0, x, 0.0)[: hidden.shape[0], 0] for x in _tile.finish_stats(stats))


def backward(plan, hidden, unembed, targets, mask, lse, ez, g_logp, *g_ent, interpret):
    """(d hidden [N, d], d unembed in unembed's layout), float32; `g_ent` only with entropy."""
    tn, tv, nt, nv, v = _geometry(plan, hidden, unembed)
    d = hidden.shape[1]
    per_row = [targets.astype(jnp.int32), mask.astype(jnp.int32), lse, ez, g_logp, *g_ent]
    h, *rows = _launch.pad_rows(nt * tn, hidden, *(a[:, None] for a in per_row))

    def dlogits(h_ref, w, row_refs, j):
        t_ref, m_ref, lse_ref, ez_ref, gl_ref, *ge_ref = row_refs
        z = _tile.logits(h_ref[...], w, plan.inv_temp, plan.transposed)
        cols, valid = _columns(j, tn, tv, v)
        g_ent_tile = ge_ref[0][...] if ge_ref else None
        return _tile.dlogits(
            z, lse_ref[...], ez_ref[...], gl_ref[...], g_ent_tile, valid, cols == t_ref[...],
            plan.inv_temp,
        )

    def dh_kernel(h_ref, w_ref, *refs):
        *row_refs, dh_ref = refs
        j = pl.program_id(1)

        @pl.when(j == 0)
        def _():
            dh_ref[...] = jnp.zeros_like(dh_ref)

        @pl.when(jnp.any(row_refs[1][...] != 0))
        def _():
            w = _valid_w(plan, w_ref[...], j, tv, v)
            dz = dlogits(h_ref, w, row_refs, j)
            dh_ref[...] += _tile.grad_hidden(dz, w, plan.transposed)

    def dw_kernel(h_ref, w_ref, *refs):
        *row_refs, dw_ref = refs
        j, i = pl.program_id(0), pl.program_id(1)

        @pl.when(i == 0)
        def _():
            dw_ref[...] = jnp.zeros_like(dw_ref)

        @pl.when(jnp.any(row_refs[1][...] != 0))
        def _():
            dz = dlogits(h_ref, w_ref[...], row_refs, j)
            dw_ref[...] += _tile.grad_unembed(h_ref[...], dz, plan.transposed)

    # dh: grid (token tile i, vocab tile j), vocab innermost.
    row = pl.BlockSpec((tn, 1), lambda i, j: (i, 0))
    dh = _call(
        dh_kernel,
        grid=(nt, nv),
        in_specs=[pl.BlockSpec((tn, d), lambda i, j: (i, 0)), _w_spec(plan, d, tv, lambda i, j: j)]
        + [row] * len(rows),
        out_specs=pl.BlockSpec((tn, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((nt * tn, d), jnp.float32),
        semantics=("parallel", "arbitrary"),
        interpret=interpret,
    )(h, unembed, *rows)

    # d unembed: grid (vocab tile j, token tile i), tokens innermost.
    row = pl.BlockSpec((tn, 1), lambda j, i: (i, 0))
    dw_spec = _w_spec(plan, d, tv, lambda j, i: j)
    dw = _call(
        dw_kernel,
        grid=(nv, nt),
        in_specs=[pl.BlockSpec((tn, d), lambda j, i: (i, 0)), dw_spec] + [row] * len(rows),
        out_specs=dw_spec,
        out_shape=jax.ShapeDtypeStruct(unembed.shape, jnp.float32),
        semantics=("parallel", "arbitrary"),
        interpret=interpret,
    )(h, unembed, *rows)
    return dh[: hidden.shape[0]], dw
