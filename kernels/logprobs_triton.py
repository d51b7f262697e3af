"""Pallas Triton kernels for `fused_logprobs` (GPU; see `logprobs_pallas` for how they are launched).

Triton runs a grid's programs concurrently, so no program may accumulate into an output block that
another program also writes (the Mosaic kernels' pattern). Each program owns its outputs and loops
inside the kernel instead:
  forward    one program per token tile, looping over vocab tiles (online stats in registers);
  d hidden   one program per token tile, looping over vocab tiles;
  d unembed  one program per vocab tile, looping over token tiles.
Triton's tensors have power-of-two shapes and d_model rarely is one (576, 896, 3584): each logits
tile is summed over d in `K_TILE` slices, and the gradients are added slice by slice into the
program's own float32 rows (columns) of the output. Loads past d or V are masked, so nothing is
padded or copied except the token rows (O(N d)).

A token tile with no counted row does no work: its loops run `_counted` (1 if any row of the tile is
counted, else 0) times their length. Not `jnp.any` (Triton lowers no reduce_or), not `jnp.where` of two
trip counts (Pallas lowers that select to i1, which no loop bound verifies as), and not `lax.cond` /
`pl.when` (on jax 0.11.2 a cond in these kernels failed XLA's Triton compile: "operand does not dominate
this use"); a loop of 0 or 1 trips is the conditional.
Tiles: of the four measured on an H100 (bench/README.md, `gpu.py`), 64 tokens x 256 vocabulary with 8
warps ran fastest (10% ahead of 64 x 128 x 4); none comes near the chunked path, the GPU default.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels import _launch, _tile

TOKEN_TILE, VOCAB_TILE, K_TILE = 64, 256, 64
NUM_WARPS, NUM_STAGES = 8, 3
MIN_TILE = 16  # Triton's dot needs every dimension >= 16


def _pow2_tile(tile, size):
    """The tile, shrunk to the smallest power of two >= size (and >= MIN_TILE) for small arrays."""
    return max(MIN_TILE, min(tile, pl.next_power_of_2(size)))


class _Geometry:
    def __init__(self, plan, hidden, unembed):
        self.n, self.d = hidden.shape
        self.v = unembed.shape[0 if plan.transposed else 1]
        self.tn = _pow2_tile(plan.token_tile or TOKEN_TILE, self.n)
        self.tv = _pow2_tile(plan.vocab_tile or VOCAB_TILE, self.v)
        self.tk = _pow2_tile(K_TILE, self.d)
        self.nt, self.nv, self.nk = (-(-size // t) for size, t in
                                     ((self.n, self.tn), (self.v, self.tv), (self.d, self.tk)))


def _call(kernel, grid, out_shape, interpret):
    params = None if interpret else plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return pl.pallas_call(kernel, grid=grid, out_shape=out_shape, interpret=interpret,
                          compiler_params=params)


def _view(ref, r0, rn, r_end, c0, cn, c_end):
    """(ref[r0:r0+rn, c0:c0+cn], mask of the entries inside [r_end, c_end])."""
    rows = r0 + jax.lax.broadcasted_iota(jnp.int32, (rn, cn), 0)
    cols = c0 + jax.lax.broadcasted_iota(jnp.int32, (rn, cn), 1)
    return ref.at[pl.ds(r0, rn), pl.ds(c0, cn)], (rows < r_end) & (cols < c_end)


def _load(view_mask):
    view, mask = view_mask
    return plgpu.load(view, mask=mask, other=0)


def _add(view_mask, value):
    view, mask = view_mask
    plgpu.store(view, plgpu.load(view, mask=mask, other=0.0) + value, mask=mask)


def _h(g, ref, r0, k):
    return _view(ref, r0, g.tn, g.nt * g.tn, k * g.tk, g.tk, g.d)  # rows are padded to nt * tn


def _w(plan, g, ref, k, c0):
    """Slice k of vocab tile c0.. of unembed (or of its gradient), in unembed's layout."""
    if plan.transposed:
        return _view(ref, c0, g.tv, g.v, k * g.tk, g.tk, g.d)
    return _view(ref, k * g.tk, g.tk, g.d, c0, g.tv, g.v)


def _logits(plan, g, h_ref, w_ref, r0, c0):
    """[tn, tv] float32 logits of rows r0.. against vocab columns c0.., summed over d slices."""

    def k_step(k, z):
        h, w = _load(_h(g, h_ref, r0, k)), _load(_w(plan, g, w_ref, k, c0))
        return z + _tile.logits(h, w, 1.0, plan.transposed)

    z = jax.lax.fori_loop(0, g.nk, k_step, jnp.zeros((g.tn, g.tv), jnp.float32))
    return z * plan.inv_temp


def _columns(g, c0):
    return c0 + jax.lax.broadcasted_iota(jnp.int32, (1, g.tv), 1)


def _counted(g, m_ref, r0):
    """int32 1 if any row of the token tile at r0 is counted (`m_ref` holds 0 / 1), else 0."""
    return jnp.max(m_ref[pl.ds(r0, g.tn)])


def _rows(g, r0, *refs):
    """Each per-row input of the token tile at r0, as [tn, 1]."""
    return [ref[pl.ds(r0, g.tn)][:, None] for ref in refs]


def forward(plan, hidden, unembed, mask, *, interpret):
    """(lse, E_p[z]), each [N] float32, 0 on masked rows."""
    g = _Geometry(plan, hidden, unembed)
    h, m = _launch.pad_rows(g.nt * g.tn, hidden, mask.astype(jnp.int32))

    def kernel(h_ref, w_ref, m_ref, lse_ref, ez_ref):
        r0 = pl.program_id(0) * g.tn

        def vocab_step(j, stats):
            z = _logits(plan, g, h_ref, w_ref, r0, j * g.tv)
            return _tile.update_stats(stats, z, _columns(g, j * g.tv) < g.v)

        stats = jax.lax.fori_loop(0, g.nv * _counted(g, m_ref, r0), vocab_step, _tile.init_stats(g.tn))
        for ref, value in zip((lse_ref, ez_ref), _tile.finish_stats(stats)):
            ref[pl.ds(r0, g.tn)] = jnp.where(m_ref[pl.ds(r0, g.tn)] > 0, value[:, 0], 0.0)

    rows = jax.ShapeDtypeStruct((g.nt * g.tn,), jnp.float32)
    lse, ez = _call(kernel, (g.nt,), [rows, rows], interpret)(h, unembed, m)
    return lse[: g.n], ez[: g.n]


def backward(plan, hidden, unembed, targets, mask, lse, ez, g_logp, *g_ent, interpret):
    """(d hidden [N, d], d unembed in unembed's layout), float32; `g_ent` only with entropy."""
    g = _Geometry(plan, hidden, unembed)
    per_row = [targets.astype(jnp.int32), mask.astype(jnp.int32), lse, ez, g_logp, *g_ent]
    h, *rows = _launch.pad_rows(g.nt * g.tn, hidden, *per_row)

    def dlogits(h_ref, w_ref, row_refs, r0, c0):
        t, _, lse, ez, g_logp, *g_ent = _rows(g, r0, *row_refs)
        z = _logits(plan, g, h_ref, w_ref, r0, c0)
        cols = _columns(g, c0)
        return _tile.dlogits(z, lse, ez, g_logp, g_ent[0] if g_ent else None, cols < g.v,
                             cols == t, plan.inv_temp)

    def dh_kernel(h_ref, w_ref, *refs):
        *row_refs, dh_ref = refs
        r0 = pl.program_id(0) * g.tn

        def zero(k, _):
            view, mask = _h(g, dh_ref, r0, k)
            plgpu.store(view, jnp.zeros((g.tn, g.tk), jnp.float32), mask=mask)

        def vocab_step(j, _):
            dz = dlogits(h_ref, w_ref, row_refs, r0, j * g.tv)

            def k_step(k, _):
                w = _load(_w(plan, g, w_ref, k, j * g.tv))
                _add(_h(g, dh_ref, r0, k), _tile.grad_hidden(dz, w, plan.transposed))

            jax.lax.fori_loop(0, g.nk, k_step, None)

        jax.lax.fori_loop(0, g.nk, zero, None)
        jax.lax.fori_loop(0, g.nv * _counted(g, row_refs[1], r0), vocab_step, None)

    def dw_kernel(h_ref, w_ref, *refs):
        *row_refs, dw_ref = refs
        c0 = pl.program_id(0) * g.tv

        def zero(k, _):
            view, mask = _w(plan, g, dw_ref, k, c0)
            plgpu.store(view, jnp.zeros(view.shape, jnp.float32), mask=mask)

        def token_step(i, _):
            def counted_tile(_, __):
                dz = dlogits(h_ref, w_ref, row_refs, i * g.tn, c0)

                def k_step(k, _):
                    h = _load(_h(g, h_ref, i * g.tn, k))
                    _add(_w(plan, g, dw_ref, k, c0), _tile.grad_unembed(h, dz, plan.transposed))

                jax.lax.fori_loop(0, g.nk, k_step, None)

            jax.lax.fori_loop(0, _counted(g, row_refs[1], i * g.tn), counted_tile, None)

        jax.lax.fori_loop(0, g.nk, zero, None)
        jax.lax.fori_loop(0, g.nt, token_step, None)

    dh = _call(dh_kernel, (g.nt,), jax.ShapeDtypeStruct((g.nt * g.tn, g.d), jnp.float32),
               interpret)(h, unembed, *rows)
    dw = _call(dw_kernel, (g.nv,), jax.ShapeDtypeStruct(unembed.shape, jnp.float32),
               interpret)(h, unembed, *rows)
    return dh[: g.n], dw
