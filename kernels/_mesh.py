"""Pallas kernels on a mesh. GSPMD cannot partition a pallas_call: under a mesh it would gather the
inputs and run the kernel replicated on every device. So the kernels split their rows over every
mesh axis in a shard_map, each device running the kernel on its own share."""

import math

import jax


def row_axes(x):
    """(mesh, axis names, device count) of the mesh axes that `x`'s rows can be split over: the
    non-manual axes of the mesh it lives on (under jit with sharded inputs, or `jax.set_mesh`);
    one device off a mesh."""
    mesh = jax.typeof(x).sharding.mesh
    axes = tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    return mesh, axes, math.prod(mesh.shape[a] for a in axes)
