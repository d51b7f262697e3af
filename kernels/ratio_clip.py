"""Fused clipped importance-ratio surrogate: a drop-in for
`grpo_jax.algorithms.ratio.clipped_surrogate` (same arguments, same outputs, same gradients).

With r = exp(x), x the log-ratio clamped to [-20, 20] (as verl and Tunix do: e^20 is already a
ratio no clip range admits, and the clamp keeps exp finite; no gradient flows through a clamped x),
rho = min(r, delta) (or r), c = clip(r, 1 - eps_low, 1 + eps_high): u = -min(rho A, c A), and with
dual clip u = -clip_c A where A < 0 and rho > clip_c.
The custom VJP keeps only (log_ratio, A) and recomputes the branch choice, so no exp/clip/select
intermediates are stored for the backward pass. Ties between the two branches (every r inside
the clip range) split the gradient half/half, as jnp.maximum's does: both halves are equal there.

Implementations: "jnp" (the math below under the custom VJP; default off TPU) and "pallas"
(one elementwise kernel per direction over [rows, 128] blocks, split over the devices under a
mesh; default on TPU, where Mosaic compiles it; Triton on GPU; interpreted on CPU).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Bool, Float

from kernels import _launch

IMPLS = ("jnp", "pallas")
LANES = 128
# Default rows of a [rows, 128] block: TPU VMEM tiles; on GPU 1024 elements, which a Triton program
# keeps in registers across its five arrays (a 256-row block would spill).
BLOCK_ROWS = {"tpu": 256, "gpu": 8}
LOG_RATIO_BOUND = 20.0  # |log-ratio| above this is clamped before exp, in every ratio of the library


def ratio_clip(
    log_ratio: Float[Array, "*units"],
    advantages: Float[Array, "*units"],
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
    clip_c: float | None = None,
    *,
    impl: str | None = None,
    block_rows: int | None = None,
) -> tuple[Float[Array, "*units"], Bool[Array, "*units"], Bool[Array, "*units"]]:
    """(u, clipped_low, clipped_high), elementwise over tokens or sequences alike; see the module
    docstring and `clipped_surrogate` for the definitions. Float32; no masking (callers pass
    log_ratio = 0 where masked). `block_rows`: a power of two (Triton's block rule); None: the
    platform's `BLOCK_ROWS`."""
    impl = impl or ("pallas" if jax.default_backend() == "tpu" else "jnp")
    if impl not in IMPLS:
        raise ValueError(f"ratio_clip: impl={impl!r}; choose one of {IMPLS}")
    if log_ratio.shape != advantages.shape:
        raise ValueError(
            f"ratio_clip: log_ratio {log_ratio.shape} and advantages {advantages.shape} must have "
            "the same shape (broadcast sequence advantages over tokens first)"
        )
    if block_rows is not None and (block_rows < 1 or block_rows & (block_rows - 1)):
        raise ValueError(f"ratio_clip: block_rows must be a power of two; got {block_rows}")
    clip = (float(eps_low), float(eps_high), delta, clip_c)
    u, low, high = _ratio_clip(clip, impl, block_rows, log_ratio.astype(jnp.float32),
                               advantages.astype(jnp.float32))
    return u, low.astype(bool), high.astype(bool)


def clamped_exp(log_ratio):
    """exp of the log-ratio clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND]: every ratio of the library."""
    return jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def _forward_math(x, a, clip):
    """(u, low, high) with the flags as int32 (kernel-friendly)."""
    eps_low, eps_high, delta, clip_c = clip
    r = clamped_exp(x)
    rho = r if delta is None else jnp.minimum(r, delta)
    c = jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high)
    u = jnp.maximum(-rho * a, -c * a)
    low = (a < 0) & (r < 1.0 - eps_low)
    high = (a > 0) & (r > 1.0 + eps_high)
    if clip_c is not None:
        dual = (a < 0) & (rho > clip_c)
        u = jnp.where(dual, -clip_c * a, u)
        high = high | dual
    return u, low.astype(jnp.int32), high.astype(jnp.int32)


def _grad_math(x, a, g, clip):
    """(d log_ratio, d advantages) given the cotangent g of u."""
    eps_low, eps_high, delta, clip_c = clip
    inside = jnp.abs(x) < LOG_RATIO_BOUND  # the clamp passes no gradient
    r = clamped_exp(x)
    rho = r if delta is None else jnp.minimum(r, delta)
    c = jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high)
    unclipped, clipped = -rho * a, -c * a
    w = jnp.where(unclipped > clipped, 1.0, jnp.where(unclipped == clipped, 0.5, 0.0))
    d_rho = r if delta is None else jnp.where(r < delta, r, 0.0)
    d_c = jnp.where((r > 1.0 - eps_low) & (r < 1.0 + eps_high), r, 0.0)
    dx = jnp.where(inside, -a * (w * d_rho + (1.0 - w) * d_c), 0.0)
    da = -(w * rho + (1.0 - w) * c)
    if clip_c is not None:
        dual = (a < 0) & (rho > clip_c)
        dx = jnp.where(dual, 0.0, dx)
        da = jnp.where(dual, -clip_c, da)
    return g * dx, g * da


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _ratio_clip(clip, impl, block_rows, x, a):
    return _elementwise(impl, block_rows, functools.partial(_forward_math, clip=clip), x, a)


def _ratio_clip_fwd(clip, impl, block_rows, x, a):
    return _ratio_clip(clip, impl, block_rows, x, a), (x, a)


def _ratio_clip_bwd(clip, impl, block_rows, residuals, cotangents):
    x, a = residuals
    g = cotangents[0]  # the flags are integer outputs: no cotangent flows through them
    return _elementwise(impl, block_rows, functools.partial(_grad_math, clip=clip), x, a, g)


_ratio_clip.defvjp(_ratio_clip_fwd, _ratio_clip_bwd)


def _elementwise(impl, block_rows, fn, *arrays):
    """fn over same-shaped arrays, either directly or as a Pallas kernel on [rows, 128] blocks
    (under a mesh, each device on its share of the rows; see `kernels._launch`)."""
    if impl == "jnp":
        return fn(*arrays)
    mesh, axes, devices = _launch.row_axes(arrays[0])
    shape, size = arrays[0].shape, arrays[0].size
    local_rows = max(-(-size // (LANES * devices)), 1)
    # Powers of two (Mosaic: == local_rows or a multiple of 8); the larger divides local_rows.
    block = {p: min(block_rows or default, pl.next_power_of_2(local_rows))
             for p, default in BLOCK_ROWS.items()}
    local_rows = -(-local_rows // max(block.values())) * max(block.values())
    padded = local_rows * devices * LANES
    blocks = [jnp.pad(x.reshape(-1), (0, padded - size)).reshape(-1, LANES) for x in arrays]
    local_shape = jax.ShapeDtypeStruct((local_rows, LANES), jnp.float32)
    outs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in jax.eval_shape(fn, *[local_shape] * len(arrays))]

    def kernel(*refs):
        results = fn(*(ref[...] for ref in refs[: len(arrays)]))
        for ref, value in zip(refs[len(arrays):], results):
            ref[...] = value

    def launch(br, **how):
        spec = pl.BlockSpec((br, LANES), lambda i: (i, 0))
        return pl.pallas_call(kernel, grid=(local_rows // br,), in_specs=[spec] * len(arrays),
                              out_specs=[spec] * len(outs), out_shape=outs, **how)

    call = _launch.per_platform(
        cpu=launch(block["tpu"], interpret=True),
        tpu=launch(block["tpu"], compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",))),
        gpu=launch(block["gpu"], compiler_params=plgpu.CompilerParams(num_warps=4)),
    )
    if devices > 1:  # check_vma=False: pallas_call outputs carry no varying-axes types
        rows = (P(axes),)
        call = jax.shard_map(call, mesh=mesh, in_specs=rows * len(arrays), out_specs=rows * len(outs),
                             check_vma=False)
    return tuple(r.reshape(-1)[:size].reshape(shape) for r in call(*blocks))
