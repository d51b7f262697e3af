"""Pallas kernels for `fused_logprobs`: Mosaic on TPU (`logprobs_mosaic`), Triton on GPU
(`logprobs_triton`), either one interpreted on CPU (`plan.interpret_as`), for tests.

The platform's kernels are chosen when the program is lowered (`_launch.per_platform`). Under a
mesh they run in a shard_map, each device on its share of the tokens with unembed replicated
(`_over_tokens`). The target's logit is a row-wise dot with its gathered unembedding column,
outside the kernels.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels import _launch, _tile, logprobs_mosaic, logprobs_triton

_INTERPRETED = {"tpu": logprobs_mosaic, "gpu": logprobs_triton}


def forward(plan, hidden, unembed, targets, mask):
    """(lse, E_p[z], z_target), each [N] float32."""
    kernels = _kernels(plan, "forward")

    def local(h, w, t, m):
        lse, ez = kernels(h, w, m)
        w_t = jnp.take(w, t, axis=0 if plan.transposed else 1)
        return lse, ez, _tile.target_logits(h, w_t, plan.inv_temp, plan.transposed)[:, 0]

    return _over_tokens(local, hidden, unembed, targets, mask)


def backward(plan, hidden, unembed, targets, mask, lse, ez, g_logp, g_ent):
    """(d hidden [N, d], d unembed in unembed's layout), float32."""
    rows = [targets, mask, lse, ez, g_logp] + ([g_ent] if g_ent is not None else [])
    return _over_tokens(_kernels(plan, "backward"), hidden, unembed, *rows, sum_last=True)


def _kernels(plan, name):
    """The `name` kernels of the platform the program is lowered for."""
    return _launch.per_platform(
        cpu=functools.partial(getattr(_INTERPRETED[plan.interpret_as], name), plan, interpret=True),
        tpu=functools.partial(getattr(logprobs_mosaic, name), plan, interpret=False),
        gpu=functools.partial(getattr(logprobs_triton, name), plan, interpret=False),
    )


def _over_tokens(local, hidden, unembed, *rows, sum_last=False):
    """`local(hidden, unembed, *rows)` on each device's share of the tokens (see `_launch`): rows
    are padded to a multiple of the devices and split over every mesh axis, and unembed is
    replicated (gathered) inside the shard_map. Every output is per row, except with `sum_last`
    the last one: a partial d unembed, summed over the devices in float32."""
    mesh, axes, devices = _launch.row_axes(hidden)
    if devices == 1:
        return local(hidden, unembed, *rows)
    n = hidden.shape[0]
    hidden, *rows = _launch.pad_rows(-(-n // devices) * devices, hidden, *rows)
    tokens = P(axes)

    def body(*args):
        out = local(*args)
        return (*out[:-1], jax.lax.psum(out[-1], axes)) if sum_last else out

    out_specs = (tokens, P()) if sum_last else (tokens,) * 3
    outs = jax.shard_map(  # check_vma=False: pallas_call outputs carry no varying-axes types
        body,
        mesh=mesh,
        in_specs=(tokens, P()) + (tokens,) * len(rows),
        out_specs=out_specs,
        check_vma=False,
    )(hidden, unembed, *rows)
    return tuple(o if spec == P() else o[:n] for o, spec in zip(outs, out_specs))
