"""Hugging Face checkpoints in and out: config.json + safetensors (one file or sharded with an index).

Safetensors files are read and written by the `safetensors` library (its numpy API, bfloat16 through
ml_dtypes). Loading streams: each parameter is assembled layer by layer inside
`jax.make_array_from_callback`, every device shard reads only the layers it holds, and a read copies
one tensor out of the library's memory map. Names, shapes, dtypes and file integrity are all
checked from the headers before any data is read. Saving writes files of at most `max_shard_bytes`
with an index, as `transformers` does, so host memory holds one file's tensors at a time.
"""

import hashlib
import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from grpo_jax.models.config import DTYPES, ModelConfig
from grpo_jax.models.decoder import Params, param_specs
from grpo_jax.sharding import ParamSpec, is_spec, spec_shardings

_ST_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32")  # safetensors dtype names we read
MAX_SHARD_BYTES = 5 * 2**30  # the size of one safetensors file written (transformers' default, 5 GB)


def _hf_layout(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, Callable, Callable]]:
    """Our leaf path -> (HF tensor name with {i} layer / {e} expert, HF->ours, ours->HF) per layer."""
    d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    same = lambda w: w  # noqa: E731
    tr = lambda w: w.T  # noqa: E731

    def proj(n):  # [n*hd, d] <-> [d, n, hd]
        return lambda w: w.T.reshape(d, n, hd), lambda w: w.reshape(d, n * hd).T

    def bias(n):
        return lambda w: w.reshape(n, hd), lambda w: w.reshape(n * hd)

    attn, mlp = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    return {
        ("embed",): ("model.embed_tokens.weight", same, same),
        ("final_norm",): ("model.norm.weight", same, same),
        ("lm_head",): ("lm_head.weight", tr, tr),
        ("layers", "attn_norm"): ("model.layers.{i}.input_layernorm.weight", same, same),
        ("layers", "mlp_norm"): ("model.layers.{i}.post_attention_layernorm.weight", same, same),
        ("layers", "q"): (attn + "q_proj.weight", *proj(h)),
        ("layers", "k"): (attn + "k_proj.weight", *proj(k)),
        ("layers", "v"): (attn + "v_proj.weight", *proj(k)),
        ("layers", "o"): (
            attn + "o_proj.weight",
            lambda w: w.T.reshape(h, hd, d),
            lambda w: w.reshape(h * hd, d).T,
        ),
        ("layers", "q_bias"): (attn + "q_proj.bias", *bias(h)),
        ("layers", "k_bias"): (attn + "k_proj.bias", *bias(k)),
        ("layers", "v_bias"): (attn + "v_proj.bias", *bias(k)),
        ("layers", "q_norm"): (attn + "q_norm.weight", same, same),
        ("layers", "k_norm"): (attn + "k_norm.weight", same, same),
        ("mlp", "gate"): (mlp + "gate_proj.weight", tr, tr),
        ("mlp", "up"): (mlp + "up_proj.weight", tr, tr),
        ("mlp", "down"): (mlp + "down_proj.weight", tr, tr),
        ("moe", "router"): (mlp + "gate.weight", tr, tr),
        ("moe", "gate"): (mlp + "experts.{e}.gate_proj.weight", tr, tr),
        ("moe", "up"): (mlp + "experts.{e}.up_proj.weight", tr, tr),
        ("moe", "down"): (mlp + "experts.{e}.down_proj.weight", tr, tr),
    }


def _stacked(path: tuple[str, ...]) -> bool:
    """Leaves under these keys carry a leading layer axis."""
    return path[0] in ("layers", "mlp", "moe")


def _tensor_names(cfg: ModelConfig, path: tuple[str, ...], template: str) -> list[list[str]]:
    """HF names making up one of our leaves: [stacked layer][expert] (one name when not stacked)."""
    kinds = cfg.moe_layers
    layer_ids = {
        "layers": range(cfg.num_layers),
        "mlp": [i for i, m in enumerate(kinds) if not m],
        "moe": [i for i, m in enumerate(kinds) if m],
    }.get(path[0], [None])
    experts = range(cfg.num_experts) if "{e}" in template else [None]
    return [[template.format(i=i, e=e) for e in experts] for i in layer_ids]


class _Leaf(NamedTuple):
    path: tuple[str, ...]
    spec: ParamSpec
    hf_shape: tuple[int, ...]  # of one HF tensor
    names: list[list[str]]  # [stacked layer][expert]
    to_ours: Callable
    to_hf: Callable
    experts: bool  # one HF tensor per expert, stacked on our axis after the layer axis


def _leaves(cfg: ModelConfig) -> tuple[list[_Leaf], Any]:
    """Every parameter with its HF tensors, in params-tree order, and the params treedef."""
    layout = _hf_layout(cfg)
    flat, treedef = jax.tree.flatten_with_path(param_specs(cfg), is_leaf=is_spec)
    out = []
    for key_path, spec in flat:
        path = tuple(k.key for k in key_path)
        template, to_ours, to_hf = layout[path]
        names = _tensor_names(cfg, path, template)
        inner = spec.shape[1:] if _stacked(path) else spec.shape
        inner = inner[1:] if "{e}" in template else inner
        hf_shape = jax.eval_shape(to_hf, jax.ShapeDtypeStruct(inner, jnp.float32)).shape
        out.append(_Leaf(path, spec, hf_shape, names, to_ours, to_hf, "{e}" in template))
    return out, treedef


# ----------------------------------------------------------------------------- safetensors files
def _index(path: pathlib.Path) -> dict[str, tuple[pathlib.Path, tuple[int, ...]]]:
    """Tensor name -> (file, shape) over all safetensors files of a directory, from their headers."""
    index_file = path / "model.safetensors.index.json"
    if index_file.exists():
        files = sorted({path / f for f in json.loads(index_file.read_text())["weight_map"].values()})
        for f in files:
            if not f.exists():
                raise FileNotFoundError(f"{f} is listed in {index_file} but does not exist")
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in {path}")
    tensors = {}
    for f in files:
        try:
            with safetensors.safe_open(f, "np") as st:
                for name in st.keys():
                    entry = st.get_slice(name)
                    if entry.get_dtype() not in _ST_DTYPES:
                        raise ValueError(f"{f}: tensor {name} has dtype {entry.get_dtype()}, not a float type")
                    tensors[name] = (f, tuple(entry.get_shape()))
        except safetensors.SafetensorError as e:
            raise ValueError(f"{f} is truncated or not a safetensors file ({e}): re-download or re-export it") from None
    return tensors


def _read(tensors, name: str) -> np.ndarray:
    with safetensors.safe_open(tensors[name][0], "np") as st:
        return st.get_tensor(name)


def _parse_dtype(dtype) -> str:
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"load_hf: dtype={dtype!r} is not understood; use one of {DTYPES}")
    return name


def load_hf(
    path: str | pathlib.Path, dtype="float32", mesh: jax.sharding.Mesh | None = None, **overrides
) -> tuple[ModelConfig, Params]:
    """Loads a local HF directory into (ModelConfig, params) with parameters in `dtype`.

    Given a mesh, each parameter is created directly with its sharding from `grpo_jax.sharding`.
    `overrides` set ModelConfig run fields (compute_dtype defaults to `dtype`, remat, attention).
    """
    path = pathlib.Path(path)
    dtype = _parse_dtype(dtype)
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{config_file} not found: load_hf needs a Hugging Face model directory")
    run = {"dtype": dtype, "compute_dtype": dtype, **overrides}
    try:
        cfg = ModelConfig.from_hf(json.loads(config_file.read_text()), **run)
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON ({e.msg}, line {e.lineno})") from None
    except KeyError as e:
        raise ValueError(f"{config_file}: required field {e} is missing") from None
    except ValueError as e:
        raise ValueError(f"{config_file}: {str(e).removeprefix('config.json: ')}") from None
    tensors = _index(path)
    leaves, treedef = _leaves(cfg)
    for leaf in leaves:  # validate everything before reading any data
        for name in (n for row in leaf.names for n in row):
            if name not in tensors:
                raise ValueError(f"{path}: tensor {name} is missing (expected shape {leaf.hf_shape})")
            got = tensors[name][1]
            if got != leaf.hf_shape:
                raise ValueError(
                    f"{tensors[name][0]}: tensor {name} has shape {got}, expected {leaf.hf_shape} "
                    "from config.json"
                )
    if mesh is None:
        shardings = [jax.sharding.SingleDeviceSharding(jax.devices()[0])] * len(leaves)
    else:
        shardings = jax.tree.leaves(spec_shardings(param_specs(cfg), mesh))
    arrays = [_load_leaf(tensors, leaf, s, cfg.jnp_dtype) for leaf, s in zip(leaves, shardings)]
    return cfg, jax.tree.unflatten(treedef, arrays)


def _load_leaf(tensors, leaf: _Leaf, sharding, dtype) -> jax.Array:
    stacked = _stacked(leaf.path)
    blocks: dict[tuple[int, int], np.ndarray] = {}  # one read per distinct layer range

    def read(name):
        w = np.asarray(_read(tensors, name), np.float32)
        bad = w.size - np.isfinite(w).sum()
        if bad:
            raise ValueError(f"{tensors[name][0]}: tensor {name} holds {bad} non-finite value(s) (NaN or inf): the "
                             "checkpoint is damaged, or was saved from a run that diverged; load a finite one")
        return leaf.to_ours(w)

    def layer(row):
        ws = [read(n) for n in row]
        return np.stack(ws) if leaf.experts else ws[0]

    def callback(index):
        if not stacked:
            return layer(leaf.names[0]).astype(dtype)[index]
        lo, hi, _ = index[0].indices(leaf.spec.shape[0])
        if (lo, hi) not in blocks:
            blocks[(lo, hi)] = np.stack([layer(r) for r in leaf.names[lo:hi]]).astype(dtype)
        return blocks[(lo, hi)][(slice(None),) + tuple(index[1:])]

    return jax.make_array_from_callback(leaf.spec.shape, sharding, callback)


def fingerprint(path: str | pathlib.Path, samples: int = 256, block: int = 4096) -> str:
    """A SHA-256 that tells one HF directory's weights from another's without reading them whole:
    config.json, and per safetensors file its size and `samples` evenly spaced blocks of `block` bytes
    (the first holds the header: names, shapes, offsets). Two fine-tunes of one architecture differ in
    nearly every block."""
    path = pathlib.Path(path)
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for file in sorted(path.glob("*.safetensors")):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            for offset in sorted({size * i // samples for i in range(samples)}):
                f.seek(offset)
                digest.update(f.read(block))
    return digest.hexdigest()


def save_hf(cfg: ModelConfig, params: Params, path: str | pathlib.Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """Writes config.json and model.safetensors (in `cfg.dtype`) that `transformers` loads; a model over
    `max_shard_bytes` goes into numbered files with a model.safetensors.index.json."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    leaves, treedef = _leaves(cfg)
    arrays = treedef.flatten_up_to(params)
    dtype = np.dtype(cfg.jnp_dtype)
    shards, size = [[]], 0  # [(leaf, array)] per file, in order
    for leaf, array in zip(leaves, arrays):
        if tuple(array.shape) != leaf.spec.shape:
            raise ValueError(
                f"save_hf: params{list(leaf.path)} has shape {tuple(array.shape)}, "
                f"expected {leaf.spec.shape}"
            )
        nbytes = int(np.prod(leaf.spec.shape)) * dtype.itemsize
        if size and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((leaf, array))
        size += nbytes
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)  # an earlier export's files, which a loader would read too
    weight_map = {}
    for name, shard in zip(names, shards):
        tensors = {}
        for leaf, array in shard:
            for j, row in enumerate(leaf.names):
                w = np.asarray(array[j] if _stacked(leaf.path) else array, np.float32)
                for e, hf_name in enumerate(row):
                    tensors[hf_name] = np.ascontiguousarray(leaf.to_hf(w[e] if leaf.experts else w)).astype(dtype)
        safetensors.numpy.save_file(tensors, path / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    if len(names) > 1:
        total = sum(int(np.prod(leaf.spec.shape)) for leaf in leaves) * dtype.itemsize
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
