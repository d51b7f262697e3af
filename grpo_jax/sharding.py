"""Device mesh and logical-axis sharding (MaxText style).

Model code names its axes (`batch`, `embed`, `heads`, ...); `RULES` maps each name to mesh axes.
Changing the parallelism of a run means editing `RULES` or the `MeshConfig`, never the model. The
same table shards params, optimizer state, the KV cache and, inside programs traced under
`activation_rules(mesh)`, the activations. A dimension whose mesh axis is already used by an earlier
dimension of the same array stays replicated (batch takes fsdp, so activations' embed does not);
one whose size does not divide by its mesh axes is replicated with a warning naming the rule and
the shape (e.g. 2 kv heads on tensor=4).

Over several processes (hosts), a process owns the rows of a batch that its devices hold
(`process_rows`): it builds global arrays from those rows alone (`global_batch`), reads them back from
its devices (`local_rows`) and gathers whole values only where it must (`gather`).
"""

import contextlib
import functools
import math
import warnings
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from grpo_jax.config import MeshConfig
from grpo_jax.models import ModelConfig, cache_specs, param_specs
from grpo_jax.models.decoder import is_spec

MESH_AXES = ("data", "fsdp", "tensor", "expert")

# logical axis -> mesh axis (or tuple of axes, or None = replicated). The one table.
RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
    "expert": "expert",
    "layers": None,
}


def make_mesh(cfg: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor, expert) mesh; one axis may be -1 for all remaining devices."""
    devices = jax.devices() if devices is None else devices
    shape = [getattr(cfg, a) for a in MESH_AXES]
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"MeshConfig{tuple(shape)}: sizes must be positive, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if len(devices) % known:
            raise ValueError(f"MeshConfig{tuple(shape)}: {len(devices)} devices do not divide by {known}")
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"MeshConfig{dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices, "
            f"there are {len(devices)}; set one axis to -1 to take the rest"
        )
    return jax.make_mesh(
        tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def logical_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh) -> PartitionSpec:
    """PartitionSpec for an array with these logical axis names, by `RULES` (mesh: concrete or abstract)."""
    used, out = set(), []
    for name, size in zip(axes, shape):
        mesh_axes = RULES[name] if name is not None else None
        group = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
        if not group or used & set(group):
            out.append(None)
            continue
        sizes = tuple((a, mesh.shape[a]) for a in group)
        if size % math.prod(n for _, n in sizes):
            _warn_indivisible(name, size, tuple(shape), sizes)
            out.append(None)
            continue
        used |= set(group)
        out.append(group[0] if len(group) == 1 else group)
    return PartitionSpec(*out)


@functools.cache  # once per (rule, shape): constraints are traced in every layer and step
def _warn_indivisible(rule: str, size: int, shape: tuple[int, ...], sizes: tuple[tuple[str, int], ...]) -> None:
    axes = " x ".join(f"{a}={n}" for a, n in sizes)
    warnings.warn(
        f"sharding rule {rule!r}: in an array of shape {shape}, the {rule} dimension of size {size} "
        f"does not divide over {axes}, so it is replicated; change the shape, the MeshConfig or "
        "grpo_jax.sharding.RULES",
        stacklevel=3,
    )


@contextlib.contextmanager
def activation_rules(mesh: Mesh | None):
    """Context or decorator: code traced under it (inside `jax.jit`) pins each model activation to
    its `RULES` sharding on `mesh` (`grpo_jax.models.decoder._constrain`); mesh=None: no constraints."""
    if mesh is None:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        yield


def spec_shardings(specs: Any, mesh: Mesh) -> Any:
    """A pytree of ParamSpec -> the same pytree of NamedSharding."""
    return jax.tree.map(
        lambda s: NamedSharding(mesh, logical_spec(s.axes, s.shape, mesh)), specs, is_leaf=is_spec
    )


def _names(key_path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", None)) for k in key_path)


def param_shardings(tree: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
    """NamedShardings for params or any pytree holding params-shaped subtrees (optimizer state).

    A leaf whose key path ends like a parameter's path (e.g. `...mu['layers']['q']`) and has that
    parameter's shape is sharded like it; every other leaf (step counts, scalars) is replicated.
    """
    return tree_shardings(tree, param_specs(cfg), mesh)


def gather_over_fsdp(params: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
    """`params` with every weight constrained whole over fsdp (its "embed" axis unsplit, as a matmul
    gathers it), inside a jit; other leaves (a LoRA weight's base and adapters) as they are. The
    sampler gathers its weights so once for the prefill and all its decode loops."""
    by_path = _specs_by_path(param_specs(cfg))

    def one(key_path, leaf):
        spec = _spec_of(by_path, key_path, leaf)
        if spec is None:
            return leaf
        axes = tuple(None if a == "embed" else a for a in spec.axes)
        return jax.lax.with_sharding_constraint(leaf, NamedSharding(mesh, logical_spec(axes, spec.shape, mesh)))

    return jax.tree.map_with_path(one, params)


def tree_shardings(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """`param_shardings` against any ParamSpec pytree (e.g. LoRA adapters, `grpo_jax.lora.specs`)."""
    by_path = _specs_by_path(specs)
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(key_path, leaf):
        spec = _spec_of(by_path, key_path, leaf)
        return replicated if spec is None else NamedSharding(mesh, logical_spec(spec.axes, spec.shape, mesh))

    return jax.tree.map_with_path(one, tree)


def _specs_by_path(specs: Any) -> dict:
    return {_names(p): s for p, s in jax.tree.flatten_with_path(specs, is_leaf=is_spec)[0]}


def _spec_of(by_path: dict, key_path, leaf):
    """The ParamSpec of a leaf whose key path ends like a parameter's path and has its shape, else None."""
    names = _names(key_path)
    for path, spec in by_path.items():
        if names[-len(path) :] == path and tuple(np.shape(leaf)) == spec.shape:
            return spec
    return None


def shard_params(params: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
    """Places params (or optimizer state) on the mesh by `RULES`."""
    return jax.device_put(params, param_shardings(params, cfg, mesh))


def cache_shardings(cfg: ModelConfig, mesh: Mesh, batch: int, max_len: int) -> Any:
    """NamedShardings for `models.init_cache(cfg, batch, max_len)` (batch over data+fsdp, kv heads
    over tensor)."""
    return spec_shardings(cache_specs(cfg, batch, max_len), mesh)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a [batch, ...] array: the leading axis split over the `batch` rule."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *([None] * (ndim - 1))))


def process_rows(mesh: Mesh, n: int) -> np.ndarray:
    """The rows of an n-row batch split by the `batch` rule that this process's devices hold, ascending:
    the rows it samples, scores and feeds (all of them in a one-process run; processes whose devices
    differ only along other mesh axes hold the same rows)."""
    shards = math.prod(mesh.shape[a] for a in RULES["batch"])
    if n % shards:
        raise ValueError(
            f"a batch of {n} rows does not divide over the {RULES['batch']} mesh axes ({shards} devices); "
            "change the batch size or MeshConfig"
        )
    index = batch_sharding(mesh, 1).addressable_devices_indices_map((n,))
    return np.unique(np.concatenate([np.arange(n)[i] for i in index.values()]))


def global_batch(local: Any, mesh: Mesh, size: int | None = None) -> Any:
    """Global arrays of `size` rows split by the `batch` rule from this process's rows: `local` holds
    rows `process_rows(mesh, size)`, in order, and each process passes only those. `size` defaults to
    the local rows times the process count (equal shares)."""

    def one(x):
        x = np.asarray(x)
        n = x.shape[0] * jax.process_count() if size is None else size
        rows = process_rows(mesh, n)
        if len(rows) != x.shape[0]:
            raise ValueError(f"this process holds {len(rows)} of the batch's {n} rows, but {x.shape[0]} were given")
        return jax.make_array_from_callback(
            (n, *x.shape[1:]), batch_sharding(mesh, x.ndim),
            lambda index: x[np.searchsorted(rows, np.arange(n)[index[0]])],
        )

    return jax.tree.map(one, local)


def local_rows(x: jax.Array, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` (this process's, `process_rows`) of a global array split by the `batch` rule, read
    from this process's devices into one host array."""
    out = np.empty((len(rows), *x.shape[1:]), x.dtype)
    read = set()
    for shard in x.addressable_shards:
        held = np.arange(x.shape[0])[shard.index[0]]
        if held[0] not in read:  # replicas along other mesh axes are read once
            read.add(held[0])
            out[np.searchsorted(rows, held)] = np.asarray(shard.data)
    return out


def gather(tree: Any) -> Any:
    """The whole values of global arrays as (writable) host numpy, on every process: what a process
    needs of the rows others hold (a group's rewards), what it logs, and the policy it exports. A
    collective: every process calls it."""
    return jax.tree.map(lambda x: np.array(multihost_utils.process_allgather(x, tiled=True)), tree)


__all__ = [
    "MESH_AXES",
    "RULES",
    "activation_rules",
    "batch_sharding",
    "cache_shardings",
    "gather",
    "global_batch",
    "local_rows",
    "logical_spec",
    "make_mesh",
    "param_shardings",
    "process_rows",
    "shard_params",
    "spec_shardings",
    "tree_shardings",
]
