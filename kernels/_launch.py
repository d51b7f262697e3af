"""How the Pallas kernels are launched: on the right platform and, under a mesh, on every device.

Platform: `per_platform` picks a kernel when the program is lowered, not when it is traced, so a
CPU host runs the kernels interpreted while `jax.export(..., platforms=["tpu"])` or `["cuda"]` from
the same host lowers the real Mosaic or Triton kernels (tests/test_kernels_lowering.py does).

Mesh: GSPMD cannot partition a pallas_call; under a mesh it would gather the inputs and run the
kernel replicated on every device. So the kernels split their rows over every mesh axis in a
shard_map, each device running the kernel on its own share (`row_axes`)."""

import math

import jax
import jax.numpy as jnp


def per_platform(*, cpu, tpu, gpu):
    """A function of arrays that runs `cpu` on CPU (interpreted kernels), `tpu` on TPU (Mosaic) and
    `gpu` on CUDA or ROCm GPUs (Triton). All three are traced; only the lowered platform's runs."""

    def run(*args):
        return jax.lax.platform_dependent(*args, cpu=cpu, tpu=tpu, cuda=gpu, rocm=gpu)

    return run


def row_axes(x):
    """(mesh, axis names, device count) of the mesh axes that `x`'s rows can be split over: the
    non-manual axes of the mesh it lives on (under jit with sharded inputs, or `jax.set_mesh`);
    one device off a mesh."""
    mesh = jax.typeof(x).sharding.mesh
    axes = tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    return mesh, axes, math.prod(mesh.shape[a] for a in axes)


def pad_rows(rows: int, *arrays):
    """Each array zero-padded along its first axis to `rows` (token rows to a multiple of a tile
    or of the devices; used by the chunked path too)."""
    return [jnp.pad(a, [(0, rows - a.shape[0])] + [(0, 0)] * (a.ndim - 1)) for a in arrays]
