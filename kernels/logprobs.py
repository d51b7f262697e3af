"""Log-probabilities (and entropies) of target tokens without materializing [N, V] logits.

In GRPO training the largest tensor is the [tokens, vocab] logits (Qwen's vocabulary 151,936 at
8k tokens: ~5 GB in float32, twice that with its gradient). `fused_logprobs` computes
log softmax(hidden @ unembed / T)[target] and the entropy tile by tile with an online
log-sum-exp; its custom VJP recomputes the tiles, so memory is O(N d + d V) instead of O(N V).

Implementations (`impl`):
  "naive"   full logits, plain autodiff: the reference, `logprobs_reference`.
  "chunked" jnp scans over token and vocabulary chunks (default on CPU and GPU).
  "pallas"  Pallas kernels: Mosaic on TPU (the default there), Triton on GPU, either one
            interpreted on CPU for tests (`interpret_as`). On a mesh they run per device on a
            shard of the tokens, unembed replicated (a shard_map). See kernels/logprobs_pallas.py.

Tied embeddings: pass the [V, d] embedding table itself with `transposed=True`; nothing is copied.
(Passing `embed.T` with transposed=False is also correct, but the chunked path then holds a [d, V]
copy: XLA materializes the transpose before its loops; tests/test_kernels_logprobs.py checks both.)
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from kernels import _launch, _tile, logprobs_pallas

IMPLS = ("naive", "chunked", "pallas")
CHUNKED_TILE = 2048


def logprobs_reference(
    hidden: Float[Array, "N d"],
    unembed: Float[Array, "d V"] | Float[Array, "V d"],
    targets: Int[Array, "N"],
    temperature: float,
    mask: Bool[Array, "N"],
    transposed: bool = False,
) -> tuple[Float[Array, "N"], Float[Array, "N"]]:
    """Full-logits (log-prob, entropy); the reference every fused path is tested against."""
    z = _tile.logits(hidden, unembed, 1.0 / temperature, transposed)
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[:, None], axis=-1)[:, 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return jnp.where(mask, logp, 0.0), jnp.where(mask, ent, 0.0)


def fused_logprobs(
    hidden: Float[Array, "N d"],
    unembed: Float[Array, "d V"] | Float[Array, "V d"],
    targets: Int[Array, "N"],
    temperature: float,
    *,
    mask: Bool[Array, "N"] | Float[Array, "N"] | None = None,
    return_entropy: bool = False,
    impl: str | None = None,
    transposed: bool = False,
    token_tile: int | None = None,
    vocab_tile: int | None = None,
    interpret_as: str | None = None,
) -> Float[Array, "N"] | tuple[Float[Array, "N"], Float[Array, "N"]]:
    """log p(targets) under softmax(hidden @ unembed / temperature), float32 [N]; with
    `return_entropy`, also the entropy of each row's distribution [N]. Both differentiate w.r.t.
    hidden and unembed. Masked rows (mask 0 / False) give 0 and get zero gradient; their
    targets are ignored and token tiles with no counted row are skipped. `temperature` is a
    Python float (the sampling config's), static under jit. `transposed=True` means unembed is
    [V, d] (a tied embedding table, passed as is). Tiles are clipped to N and V; neither needs
    to be a multiple of its tile; None picks the implementation's default (token x vocab):
    "chunked" 2048 x 2048 (big dots run near peak speed on CPU), Mosaic 256 x 2048 (blocks that
    fit in TPU VMEM), Triton 64 x 256. Pallas tiles are powers of two, the token tile >= 16 and
    the vocab tile >= 128 (Mosaic's block rules). `interpret_as` ("tpu" or "gpu", only with
    impl="pallas"; default "tpu") picks the kernels that CPU interprets; a TPU or GPU always
    runs its own."""
    impl = impl or ("pallas" if jax.default_backend() == "tpu" else "chunked")
    _check(hidden, unembed, targets, temperature, mask, impl, transposed, token_tile, vocab_tile,
           interpret_as)
    if impl == "chunked":
        token_tile, vocab_tile = token_tile or CHUNKED_TILE, vocab_tile or CHUNKED_TILE
    # Mixed inputs meet in their common dtype on every path, as XLA's dot does it; Triton's dot takes no
    # mixed operands. The narrower one is cast: bf16 activations against float32 weights (bf16 compute,
    # float32 params) cost an O(N d) cast; a bf16 table against float32 activations is copied whole.
    dtype = jnp.result_type(hidden, unembed)
    hidden, unembed = hidden.astype(dtype), unembed.astype(dtype)
    mask = jnp.ones(targets.shape, bool) if mask is None else mask.astype(bool)
    targets = jnp.where(mask, targets, 0)
    if impl == "naive":
        logp, ent = logprobs_reference(hidden, unembed, targets, temperature, mask, transposed)
    else:
        plan = _Plan(
            impl=impl,
            inv_temp=1.0 / temperature,
            token_tile=token_tile,
            vocab_tile=vocab_tile,
            transposed=transposed,
            entropy=return_entropy,
            interpret_as=interpret_as or "tpu",
        )
        logp, ent = _fused(plan, hidden, unembed, targets, mask)
    return (logp, ent) if return_entropy else logp


def _check(hidden, unembed, targets, temperature, mask, impl, transposed, token_tile, vocab_tile,
           interpret_as):
    """User errors, raised before anything compiles."""
    if impl not in IMPLS:
        raise ValueError(f"fused_logprobs: impl={impl!r}; choose one of {IMPLS}")
    if hidden.ndim != 2 or unembed.ndim != 2:
        raise ValueError(
            f"fused_logprobs: hidden must be [N, d] and unembed [d, V] (or [V, d] with "
            f"transposed=True); got {hidden.shape} and {unembed.shape}: flatten batch and seq first"
        )
    d = unembed.shape[1] if transposed else unembed.shape[0]
    if hidden.shape[1] != d:
        hint = "" if transposed else " (a tied [V, d] embedding table needs transposed=True)"
        raise ValueError(
            f"fused_logprobs: hidden {hidden.shape} and unembed {unembed.shape} disagree on "
            f"d_model{hint}"
        )
    if targets.shape != hidden.shape[:1] or not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(
            f"fused_logprobs: targets must be integer [N={hidden.shape[0]}]; got {targets.dtype}"
            f"{targets.shape}"
        )
    if mask is not None and mask.shape != targets.shape:
        raise ValueError(f"fused_logprobs: mask {mask.shape} must match targets {targets.shape}")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(
            f"fused_logprobs: temperature must be a positive Python float; got {temperature!r}"
        )
    for name, tile, least in (("token_tile", token_tile, 16), ("vocab_tile", vocab_tile, 128)):
        if tile is None:
            continue
        if impl == "naive":
            raise ValueError(f"fused_logprobs: impl='naive' has no tiles; drop {name}={tile}")
        if impl == "pallas" and (tile < least or tile & (tile - 1)):
            raise ValueError(f"fused_logprobs: with impl='pallas', {name} must be a power of two "
                             f">= {least}; got {tile}")
        if tile < 1:
            raise ValueError(f"fused_logprobs: {name} must be >= 1; got {tile}")
    if interpret_as is not None and (impl != "pallas" or interpret_as not in ("tpu", "gpu")):
        raise ValueError(f"fused_logprobs: interpret_as={interpret_as!r} needs impl='pallas' and "
                         "one of 'tpu', 'gpu'")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one fused call (hashable: a custom_vjp nondiff argument)."""

    impl: str
    inv_temp: float
    token_tile: int | None  # None: the Pallas kernels' own default
    vocab_tile: int | None
    transposed: bool
    entropy: bool
    interpret_as: str  # whose Pallas kernels CPU interprets: "tpu" or "gpu"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plan, hidden, unembed, targets, mask):
    return _fused_fwd(plan, hidden, unembed, targets, mask)[0]


def _fused_fwd(plan, hidden, unembed, targets, mask):
    lse, ez, zt = _forward_fn(plan)(plan, hidden, unembed, targets, mask)
    logp = jnp.where(mask, zt - lse, 0.0)
    ent = jnp.where(mask, lse - ez, 0.0)
    return (logp, ent), (hidden, unembed, targets, mask, lse, ez)


def _fused_bwd(plan, residuals, cotangents):
    hidden, unembed, targets, mask, lse, ez = residuals
    g_logp, g_ent = (jnp.where(mask, g, 0.0).astype(jnp.float32) for g in cotangents)
    g_ent = g_ent if plan.entropy else None
    dh, dw = _backward_fn(plan)(plan, hidden, unembed, targets, mask, lse, ez, g_logp, g_ent)
    return dh.astype(hidden.dtype), dw.astype(unembed.dtype), None, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _forward_fn(plan):
    return logprobs_pallas.forward if plan.impl == "pallas" else _chunked_forward


def _backward_fn(plan):
    return logprobs_pallas.backward if plan.impl == "pallas" else _chunked_backward


# ----------------------------------------------------------------------------- chunked jnp path
# Vocabulary chunks are never padded (that would copy unembed): a scan runs over the V // tv full
# chunks, then the last V % tv columns are one more, smaller chunk. Token rows are padded
# (O(N d), cheap) and token chunks whose rows are all masked are skipped.


def _bits(x):
    """16-bit float matrices enter the loops as raw bits: XLA:CPU (no bf16 dot) would otherwise
    widen the whole loop-carried [d, V] matrix to float32, a hidden copy. Free on every backend."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype.itemsize == 2 else x


def _unbits(x, dtype):
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def _over_vocab(plan, w_bits, tv, step, carry):
    """carry = step(carry, w chunk as bits, its first column) over every vocabulary chunk."""
    axis = 0 if plan.transposed else 1
    v = w_bits.shape[axis]

    def body(c, j):
        return step(c, jax.lax.dynamic_slice_in_dim(w_bits, j * tv, tv, axis), j * tv), None

    carry, _ = jax.lax.scan(body, carry, jnp.arange(v // tv))
    if v % tv:
        rest = v - v % tv
        carry = step(carry, jax.lax.slice_in_dim(w_bits, rest, v, axis=axis), rest)
    return carry


def _tiles(plan, hidden, unembed):
    n, v = hidden.shape[0], unembed.shape[0 if plan.transposed else 1]
    tn, tv = min(plan.token_tile, n), min(plan.vocab_tile, v)
    return tn, tv, -(-n // tn)


def _rows(tn, nt, *arrays):
    """Pad rows to nt * tn and split them into [nt, tn, ...] chunks."""
    return [a.reshape(nt, tn, *a.shape[1:]) for a in _launch.pad_rows(nt * tn, *arrays)]


def _chunked_forward(plan, hidden, unembed, targets, mask):
    tn, tv, nt = _tiles(plan, hidden, unembed)
    w_bits = _bits(unembed)

    def token_chunk(args):
        h, t, m = args

        def compute():
            def step(stats, w, start):
                z = _tile.logits(h, _unbits(w, unembed.dtype), plan.inv_temp, plan.transposed)
                return _tile.update_stats(stats, z)

            stats = _over_vocab(plan, w_bits, tv, step, _tile.init_stats(tn))
            w_t = _unbits(jnp.take(w_bits, t, axis=0 if plan.transposed else 1), unembed.dtype)
            z_t = _tile.target_logits(h, w_t, plan.inv_temp, plan.transposed)
            return *_tile.finish_stats(stats), z_t

        return jax.lax.cond(m.any(), compute, lambda: (jnp.zeros((tn, 1), jnp.float32),) * 3)

    outs = jax.lax.map(token_chunk, _rows(tn, nt, hidden, targets, mask))
    return tuple(o.reshape(-1)[: hidden.shape[0]] for o in outs)


def _chunked_backward(plan, hidden, unembed, targets, mask, lse, ez, g_logp, g_ent):
    """Outer loop over vocabulary chunks (each gradient chunk of unembed is summed over all
    tokens in float32 and written once), inner loop over token chunks. d unembed is formed as
    [d, tv] = h^T @ dz from hidden chunks transposed once up front (O(N d)): XLA:CPU runs a dot
    that contracts its operands' leading axes (h^T @ dz from h) slower (bench/README.md,
    `logprobs.py`)."""
    tn, tv, nt = _tiles(plan, hidden, unembed)
    per_row = [targets, mask, lse, ez, g_logp] + ([g_ent] if g_ent is not None else [])
    rows = _rows(tn, nt, hidden, *(a[:, None] for a in per_row))
    rows.insert(1, jnp.swapaxes(rows[0], 1, 2))  # [nt, d, tn]
    vaxis = 0 if plan.transposed else 1

    def vocab_step(carry, w, start):
        dh, dw = carry  # dw: raw bits of d unembed, like unembed's
        w = _unbits(w, unembed.dtype)
        size = w.shape[vaxis]
        cols = start + jnp.arange(size)

        def token_step(dw_chunk, row):
            h, h_t, t, m, lse_c, ez_c, gl, *ge = row

            def compute():
                z = _tile.logits(h, w, plan.inv_temp, plan.transposed)
                g_ent = ge[0] if ge else None
                dz = _tile.dlogits(z, lse_c, ez_c, gl, g_ent, None, cols == t, plan.inv_temp)
                dw_rows = jnp.dot(h_t, dz.astype(h.dtype), preferred_element_type=jnp.float32)
                return _tile.grad_hidden(dz, w, plan.transposed), dw_rows

            def skip():
                return jnp.zeros(h.shape, jnp.float32), jnp.zeros(dw_chunk.shape, jnp.float32)

            dh_rows, dw_rows = jax.lax.cond(m.any(), compute, skip)
            return dw_chunk + dw_rows, dh_rows

        dw_chunk, dh_parts = jax.lax.scan(
            token_step, jnp.zeros((hidden.shape[1], size), jnp.float32), rows
        )
        dw_chunk = _bits((dw_chunk.T if plan.transposed else dw_chunk).astype(unembed.dtype))
        return dh + dh_parts, jax.lax.dynamic_update_slice_in_dim(dw, dw_chunk, start, vaxis)

    init = (jnp.zeros((nt, tn, hidden.shape[1]), jnp.float32), _bits(jnp.zeros_like(unembed)))
    dh, dw = _over_vocab(plan, _bits(unembed), tv, vocab_step, init)
    return dh.reshape(nt * tn, -1)[: hidden.shape[0]], _unbits(dw, unembed.dtype)
