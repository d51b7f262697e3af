"""Device mesh and logical-axis sharding (MaxText style).

Model code names its axes (`batch`, `embed`, `heads`, ...); `RULES` maps each name to mesh axes.
Changing the parallelism of a run means editing `RULES` or the `MeshConfig`, never the model. The
same table shards params, optimizer state, the KV cache and, inside programs traced under
`activation_rules(mesh)`, the activations. A dimension whose mesh axis is already used by an earlier
dimension of the same array stays replicated (batch takes fsdp, so activations' embed does not);
one whose size does not divide by its mesh axes is replicated with a warning naming the rule and
the shape (e.g. 2 kv heads on tensor=4).

Arrays to shard are described by pytrees of `ParamSpec` (shape + logical axes): the model's
(`grpo_jax.models.param_specs`, `cache_specs`, and `models.param_shardings` etc. built on them), the
LoRA adapters' (`grpo_jax.lora.specs`). This module knows axes, rules and meshes only: it imports
neither the models nor the run config (a mesh is made from any object with the `MESH_AXES` sizes,
such as `grpo_jax.config.MeshConfig`), so the dependency runs one way, models -> sharding.

`check_replicated` is the sharding tolerance (MaxText's `assert_params_sufficiently_sharded`): the
share of a train state's bytes left whole on every device of a mesh that splits weights warns, naming
the largest such leaves, and above `MeshConfig.max_replicated_fraction` fails.

Over several processes (hosts), a process owns the rows of a batch that its devices hold
(`process_rows`): it builds global arrays from those rows alone (`global_batch`), reads them back from
its devices (`local_rows`) and gathers whole values only where it must (`gather`).
"""

import contextlib
import functools
import math
import warnings
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")
# The mesh axes that split weights (params, optimizer state) by `RULES`; `data` keeps a whole copy of
# them by design, so a mesh of data alone leaves nothing to check in `check_replicated`.
WEIGHT_AXES = ("fsdp", "tensor", "expert")

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


class ParamSpec(NamedTuple):
    """Shape and logical axis names of one parameter (sharding rules map the names to mesh axes)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]


def is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


@runtime_checkable
class MeshShape(Protocol):
    """What `make_mesh` reads of a mesh config (`grpo_jax.config.MeshConfig`): a size per mesh axis."""

    data: int
    fsdp: int
    tensor: int
    expert: int


def make_mesh(cfg: MeshShape, devices: list[jax.Device] | None = None) -> Mesh:
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


def split_devices(sampler: int) -> tuple[Mesh | None, list[jax.Device]]:
    """(the sampler's mesh, the trainer's devices) for `sampler` devices of the sampler's own (0: no
    sampler mesh, every device the trainer's). Every process gives its first sampler / process_count
    local devices to the sampler, so both sides hold rows on every process and the sets are disjoint.
    The sampler mesh splits rows only (data = sampler): each of its devices holds the whole weights."""
    devices = jax.devices()
    if not sampler:
        return None, devices
    per, rest = divmod(sampler, jax.process_count())
    if rest or per >= jax.local_device_count():
        raise ValueError(
            f"mesh.sampler={sampler}: the sampler takes as many devices on each of the {jax.process_count()} "
            f"processes and leaves the trainer at least one of each process's {jax.local_device_count()}; choose "
            "such a count (0: the sampler shares the trainer's mesh)")
    mine = [d for p in range(jax.process_count()) for d in [d for d in devices if d.process_index == p][:per]]
    mesh = jax.make_mesh((sampler, 1, 1, 1), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=mine)
    return mesh, [d for d in devices if d not in mine]


@functools.cache
def _replicated(mesh: Mesh):
    """A program that all-gathers an array onto every device of `mesh`."""
    return jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec()))


def to_mesh(tree: Any, shardings: Any) -> Any:
    """`tree`'s arrays moved to `shardings` on another device set (between the sampler's mesh and the
    trainer's). In one process, jax.device_put. Over several, JAX moves arrays between device sets
    across hosts only on TPU, so each process copies what it holds: arrays whose rows split by the
    `batch` rule go through the host (both meshes give each process the same rows: `split_devices`),
    and arrays whole on every target device (params on the sampler's mesh, which splits rows only) are
    all-gathered on their devices and copied from a local replica."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, target):
        if target.is_fully_replicated:
            whole = _replicated(x.sharding.mesh)(x)
            local = whole.addressable_shards[0].data
            return jax.make_array_from_single_device_arrays(
                x.shape, target, [jax.device_put(local, d) for d in target.addressable_devices])
        rows = process_rows(x.sharding.mesh, x.shape[0])
        if target.spec[:1] != (RULES["batch"],) or not np.array_equal(rows, process_rows(target.mesh, x.shape[0])):
            raise ValueError(f"cannot move an array of shape {x.shape} to {target} across processes: only rows that "
                             "stay on their process, or arrays whole on every target device, move")
        return global_batch(local_rows(x, rows), target.mesh, x.shape[0])

    return jax.tree.map(one, tree, shardings)


def logical_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh) -> PartitionSpec:
    """PartitionSpec for an array with these logical axis names, by `RULES` (mesh: concrete or abstract)."""
    used, out = set(), []
    for name, size in zip(axes, shape):
        group = _group(name)
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


def gather_over_fsdp(params: Any, specs: Any, mesh: Mesh) -> Any:
    """`params` with every leaf that has a ParamSpec among `specs` (`tree_shardings`' matching)
    constrained whole over fsdp (its "embed" axis unsplit, as a matmul gathers it), inside a jit;
    other leaves (a LoRA weight's base and adapters) as they are. The sampler gathers its weights so
    once for the prefill and all its decode loops."""
    by_path = _specs_by_path(specs)

    def one(key_path, leaf):
        spec = _spec_of(by_path, key_path, leaf)
        if spec is None:
            return leaf
        axes = tuple(None if a == "embed" else a for a in spec.axes)
        return jax.lax.with_sharding_constraint(leaf, NamedSharding(mesh, logical_spec(axes, spec.shape, mesh)))

    return jax.tree.map_with_path(one, params)


def tree_shardings(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """NamedShardings for a pytree holding `specs`-shaped subtrees (params, optimizer state; the model's
    `models.param_specs`, LoRA adapters' `grpo_jax.lora.specs`).

    A leaf whose key path ends like a spec's path (e.g. `...mu['layers']['q']`) and has that spec's
    shape is sharded like it; every other leaf (step counts, scalars) is replicated, and
    `check_replicated` reports those that could have been split.
    """
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
    return _match(by_path, key_path, leaf)[1]


def _match(by_path: dict, key_path, leaf) -> tuple:
    """(the parameter's path, its ParamSpec) for a leaf whose key path ends like that path and has its
    shape, else (None, None)."""
    names = _names(key_path)
    for path, spec in by_path.items():
        if names[-len(path) :] == path and tuple(np.shape(leaf)) == spec.shape:
            return path, spec
    return None, None


def shard(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """Places a pytree (params, optimizer state) on the mesh by `tree_shardings`."""
    return jax.device_put(tree, tree_shardings(tree, specs, mesh))


def check_replicated(tree: Any, specs: Any, mesh: Mesh, max_fraction: float, what: str = "the train state") -> float:
    """The sharding tolerance (MaxText's `assert_params_sufficiently_sharded`) of `tree` placed by
    `tree_shardings(tree, specs, mesh)`: the fraction of its bytes that stays whole on every device
    although it could be split over the mesh's weight axes (`WEIGHT_AXES` of size > 1).

    A leaf counts when it is fully replicated and either matches no spec (an optimizer-state leaf of
    a shape no parameter has) with a dimension that the weight devices divide, or matches one whose
    rules name a weight axis of size > 1 that its shape does not divide (2 kv heads on tensor=4). Leaves
    the rules replicate on purpose (norm scales: no axis maps to a weight axis) and scalars (step
    counts) do not count. Above 0 it warns once, naming the largest such leaves and what to change;
    above `max_fraction` (`MeshConfig.max_replicated_fraction`) it raises ValueError. Returns the
    fraction (0 on a mesh whose weight axes are all 1: `data` replicates weights by design).
    """
    weight = {a: mesh.shape[a] for a in WEIGHT_AXES if mesh.shape.get(a, 1) > 1}
    n = math.prod(weight.values())
    leaves = jax.tree.flatten_with_path(tree)[0]
    total = sum(_nbytes(x) for _, x in leaves)
    if n == 1 or not total:
        return 0.0
    by_path = _specs_by_path(specs)
    found: dict[str, list] = {}  # what -> [bytes, leaves, why]: a parameter's leaves (params, moments) together
    for key_path, leaf in leaves:
        shape = tuple(np.shape(leaf))
        path, spec = _match(by_path, key_path, leaf)
        if spec is None:
            if any(d % n == 0 for d in shape):
                why = (f"shape {shape} matches no ParamSpec (by the end of its key path and its shape), so it is "
                       "replicated: give it one")
                found.setdefault(jax.tree_util.keystr(key_path), [0, 0, why])
                found[jax.tree_util.keystr(key_path)][:2] = [_nbytes(leaf), 1]
            continue
        if not NamedSharding(mesh, logical_spec(spec.axes, spec.shape, mesh)).is_fully_replicated:
            continue  # split over some mesh axis
        rules = []
        for name, size in zip(spec.axes, spec.shape):
            group = set(_group(name)) & set(weight)
            if group:
                axes = "x".join(f"{a}={weight[a]}" for a in _group(name) if a in group)
                rules.append(f"rule {name!r} -> {axes} does not divide {size}" if size % math.prod(weight[a] for a in group)
                             else f"rule {name!r} -> {axes}: the axis is taken by an earlier dimension")
        if rules:
            entry = found.setdefault("/".join(map(str, path)), [0, 0, f"shape {spec.shape}: {'; '.join(rules)}"])
            entry[0] += _nbytes(leaf)
            entry[1] += 1
    if not found:
        return 0.0
    fraction = sum(b for b, _, _ in found.values()) / total
    ranked = sorted(found.items(), key=lambda item: -item[1][0])
    largest = "; ".join(f"{what} ({b} bytes in {k} leaves, {why})" for what, (b, k, why) in ranked[:3])
    more = f"; and {len(ranked) - 3} more" if len(ranked) > 3 else ""
    mesh_text = ", ".join(f"{a}={size}" for a, size in mesh.shape.items())
    message = (f"{fraction:.1%} of {what}'s {total} bytes stays whole on every device of the mesh ({mesh_text}) "
               f"though it could be split over {'x'.join(weight)}, the largest: {largest}{more}. Change "
               "grpo_jax.sharding.RULES, the MeshConfig or the model's shape")
    if fraction > max_fraction:
        raise ValueError(f"{message}; this is above MeshConfig.max_replicated_fraction={max_fraction} (set it "
                         "higher, up to 1, to run so anyway)")
    _warn_once(f"{message} (within MeshConfig.max_replicated_fraction={max_fraction})")
    return fraction


def _group(name: str | None) -> tuple[str, ...]:
    """The mesh axes a logical axis maps to by `RULES`."""
    axes = RULES[name] if name is not None else None
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def _nbytes(x) -> int:
    return math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=4)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a [batch, ...] array: the leading axis split over the `batch` rule."""
    return NamedSharding(mesh, PartitionSpec(RULES["batch"], *([None] * (ndim - 1))))


def batch_shards(mesh) -> int:
    """The devices the `batch` rule splits rows over: of a Mesh or AbstractMesh; 1 without one (None or empty)."""
    return 1 if mesh is None or mesh.empty else math.prod(mesh.shape.get(a, 1) for a in RULES["batch"])


def process_rows(mesh: Mesh, n: int) -> np.ndarray:
    """The rows of an n-row batch split by the `batch` rule that this process's devices hold, ascending:
    the rows it samples, scores and feeds (all of them in a one-process run; processes whose devices
    differ only along other mesh axes hold the same rows)."""
    shards = batch_shards(mesh)
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
    "MeshShape",
    "ParamSpec",
    "RULES",
    "WEIGHT_AXES",
    "activation_rules",
    "batch_shards",
    "batch_sharding",
    "check_replicated",
    "gather",
    "gather_over_fsdp",
    "global_batch",
    "is_spec",
    "local_rows",
    "logical_spec",
    "make_mesh",
    "process_rows",
    "shard",
    "spec_shardings",
    "split_devices",
    "to_mesh",
    "tree_shardings",
]
