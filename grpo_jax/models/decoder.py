"""The decoder (Llama, Qwen2/2.5, Qwen3, Qwen3-MoE) as pure functions of (config, params, inputs).

One code path (`_decoder`): `forward` runs whole rows, `prefill` encodes prompts and returns their keys
and values, and `decode` feeds one token per decoding slot against a prompt stored once and the slot's
own tokens (`init_cache`). Attention masks are built from segment ids and places, never from positions,
so left padding (segment 0) and packing (several segment ids in one row) need nothing special; RoPE
uses the positions given. Layers of one kind (dense or MoE) are stacked; `ModelConfig.layer_loop` runs
them under one `jax.lax.scan` ("scan": the program's size and compile time do not grow with depth,
and on a mesh each layer's weights are gathered inside the loop, one layer at a time) or unrolled
("unrolled"). "auto", the default, picks by backend: the scan on TPU and GPU (the accelerator
layout), unrolled on CPU except training under remat; `layers_unrolled` states the rule and why, and
bench/README.md measures both. Decoding under the scan carries the slots' cache stacked over layers;
unrolled, each layer reads and writes its own buffers.
"""

import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

import kernels
from kernels._launch import per_platform
from grpo_jax.models.config import ModelConfig
from grpo_jax.sharding import ParamSpec, is_spec, logical_spec, spec_shardings, tree_shardings
from grpo_jax.typecheck import checked

Params = dict[str, Any]
Cache = dict[str, Any]  # see init_cache


def param_specs(cfg: ModelConfig) -> Params:
    """The params pytree as ParamSpecs: the single source for init, checkpoint I/O and sharding."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n_moe = sum(cfg.moe_layers)
    n_dense = cfg.num_layers - n_moe
    L = cfg.num_layers
    layers = {
        "attn_norm": ParamSpec((L, d), ("layers", None)),
        "q": ParamSpec((L, d, h, hd), ("layers", "embed", "heads", None)),
        "k": ParamSpec((L, d, kv, hd), ("layers", "embed", "kv_heads", None)),
        "v": ParamSpec((L, d, kv, hd), ("layers", "embed", "kv_heads", None)),
        "o": ParamSpec((L, h, hd, d), ("layers", "heads", None, "embed")),
        "mlp_norm": ParamSpec((L, d), ("layers", None)),
    }
    if cfg.qkv_bias:
        layers["q_bias"] = ParamSpec((L, h, hd), ("layers", "heads", None))
        layers["k_bias"] = ParamSpec((L, kv, hd), ("layers", "kv_heads", None))
        layers["v_bias"] = ParamSpec((L, kv, hd), ("layers", "kv_heads", None))
    if cfg.qk_norm:
        layers["q_norm"] = ParamSpec((L, hd), ("layers", None))
        layers["k_norm"] = ParamSpec((L, hd), ("layers", None))
    specs = {"embed": ParamSpec((v, d), ("vocab", "embed")), "layers": layers}
    if n_dense:
        specs["mlp"] = {
            "gate": ParamSpec((n_dense, d, f), ("layers", "embed", "mlp")),
            "up": ParamSpec((n_dense, d, f), ("layers", "embed", "mlp")),
            "down": ParamSpec((n_dense, f, d), ("layers", "mlp", "embed")),
        }
    if n_moe:
        e, fe = cfg.num_experts, cfg.moe_intermediate_size
        specs["moe"] = {
            "router": ParamSpec((n_moe, d, e), ("layers", "embed", None)),
            "gate": ParamSpec((n_moe, e, d, fe), ("layers", "expert", "embed", "mlp")),
            "up": ParamSpec((n_moe, e, d, fe), ("layers", "expert", "embed", "mlp")),
            "down": ParamSpec((n_moe, e, fe, d), ("layers", "expert", "mlp", "embed")),
        }
    specs["final_norm"] = ParamSpec((d,), (None,))
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((d, v), ("embed", "vocab"))
    return specs


def cache_specs(cfg: ModelConfig, slots: int, max_len: int, prefixes: int, prompt_len: int) -> Cache:
    """The decoding cache (`init_cache`) as ParamSpecs (same role as `param_specs`).

    - "prefix_k" [prefixes, kv_heads, head_dim, prompt_len], "prefix_v" [prefixes, kv_heads, prompt_len,
      head_dim]: the keys and values of the prompts, written once by `prefill` and then only read. A slot
      continues one of them, so the G samples of a prompt store it once.
    - "prefix_valid" [prefixes, prompt_len]: False on a prompt's left padding.
    - "k", "v": each slot's own `max_len` tokens, written in place one per decode step, as `slot_blocks`
      separate buffers of a block of tokens each, k [slots, kv_heads, head_dim, block] and v [slots,
      kv_heads, block, head_dim]: a step reads only the blocks written, each where it lies (XLA:CPU
      copies a slice of a buffer before a matmul reads it). A single kv head is stored without its
      unit axis: XLA:CPU would otherwise run each step's in-place write twice, on two copies.

    They follow the layer loop (`layers_unrolled`): unrolled, per layer (k and v: per layer, a list of
    blocks); scanned, stacked over layers (k and v: a list of blocks, each [layers, ...], carried
    through the scan; the prefix a scan input)."""
    own = (slots, cfg.num_kv_heads) if cfg.num_kv_heads > 1 else (slots,)
    axes = ("batch", "kv_heads")[: len(own)]
    blocks, size = slot_blocks(max_len)
    shared = (prefixes, cfg.num_kv_heads)
    specs = {
        "k": [ParamSpec((*own, cfg.head_dim, size), (*axes, None, "seq"))] * blocks,
        "v": [ParamSpec((*own, size, cfg.head_dim), (*axes, "seq", None))] * blocks,
        "prefix_k": ParamSpec((*shared, cfg.head_dim, prompt_len), ("batch", "kv_heads", None, "seq")),
        "prefix_v": ParamSpec((*shared, prompt_len, cfg.head_dim), ("batch", "kv_heads", "seq", None)),
    }
    if layers_unrolled(cfg):
        specs = {name: [s] * cfg.num_layers for name, s in specs.items()}
    else:
        stack = lambda s: ParamSpec((cfg.num_layers, *s.shape), ("layers", *s.axes))  # noqa: E731
        specs = {name: jax.tree.map(stack, s, is_leaf=is_spec) for name, s in specs.items()}
    specs["prefix_valid"] = ParamSpec((prefixes, prompt_len), ("batch", "seq"))
    return specs


SLOT_BLOCK = 256  # the fewest own tokens of a slot cache block; a slot cache has at most MAX_SLOT_BLOCKS
MAX_SLOT_BLOCKS = 16  # blocks: each is a branch of every layer's attention (program size)


def slot_blocks(max_len: int) -> tuple[int, int]:
    """(blocks, tokens per block) of a slot cache for `max_len` own tokens: one block up to
    `SLOT_BLOCK`, then blocks of `SLOT_BLOCK`, larger beyond `MAX_SLOT_BLOCKS` of them."""
    size = min(max_len, max(SLOT_BLOCK, -(-max_len // MAX_SLOT_BLOCKS)))
    return -(-max_len // size), size


def param_shardings(tree: Any, cfg: ModelConfig, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings for params or any pytree holding params-shaped subtrees (optimizer state), by
    `sharding.tree_shardings` against `param_specs(cfg)`: a leaf whose key path ends like a parameter's
    and has its shape is sharded like it; every other leaf (step counts, scalars) is replicated."""
    return tree_shardings(tree, param_specs(cfg), mesh)


def shard_params(params: Any, cfg: ModelConfig, mesh: jax.sharding.Mesh) -> Any:
    """Places params (or optimizer state) on the mesh by the sharding rules."""
    return jax.device_put(params, param_shardings(params, cfg, mesh))


def cache_shardings(cfg: ModelConfig, mesh: jax.sharding.Mesh, *shape: int) -> Cache:
    """NamedShardings for a cache of `cache_specs(cfg, *shape)` (slots and prefixes over data+fsdp, kv
    heads over tensor)."""
    return spec_shardings(cache_specs(cfg, *shape), mesh)


def init(cfg: ModelConfig, rng: jax.Array) -> Params:
    """A from-scratch model: N(0, 0.02) matrices, unit norm scales, zero biases, in `cfg.dtype`.

    All matrices come from one normal draw, sliced: XLA compiles one RNG kernel instead of one per
    parameter shape (each a slow compile on CPU)."""
    leaves, treedef = jax.tree.flatten_with_path(param_specs(cfg), is_leaf=is_spec)
    names = [path[-1].key for path, _ in leaves]
    random = [not n.endswith(("norm", "bias")) for n in names]
    sizes = [math.prod(s.shape) if r else 0 for (_, s), r in zip(leaves, random)]
    flat = 0.02 * jax.random.normal(rng, (sum(sizes),), jnp.float32)
    chunks = jnp.split(flat, np.cumsum(sizes)[:-1])
    out = []
    for (_, spec), name, chunk in zip(leaves, names, chunks):
        if name.endswith("norm"):
            out.append(jnp.ones(spec.shape, cfg.dtype))
        elif name.endswith("bias"):
            out.append(jnp.zeros(spec.shape, cfg.dtype))
        else:
            out.append(chunk.reshape(spec.shape).astype(cfg.dtype))
    return jax.tree.unflatten(treedef, out)


def init_cache(cfg: ModelConfig, prefix_kv: tuple[Array, Array], prefix_valid: Bool[Array, "prefixes prompt_len"],
               slots: int, max_len: int) -> Cache:
    """The decoding cache (`cache_specs`) of prompts encoded by `prefill` (`prefix_kv`, stacked over
    layers) for `slots` rows of up to `max_len` own tokens each, their blocks empty, in the compute dtype."""
    k, v = (a.astype(cfg.jnp_compute_dtype) for a in prefix_kv)
    specs = cache_specs(cfg, slots, max_len, *prefix_valid.shape)
    zeros = lambda s: jnp.zeros(s.shape, cfg.compute_dtype)  # noqa: E731
    cache = {name: jax.tree.map(zeros, specs[name], is_leaf=is_spec) for name in ("k", "v")}
    cache["prefix_k"], cache["prefix_v"] = (list(a) if layers_unrolled(cfg) else a for a in (k, v))
    cache["prefix_valid"] = prefix_valid
    return cache


def positions_from_segments(segment_ids: Int[Array, "batch seq"]) -> Int[Array, "batch seq"]:
    """Position of each token within its segment (0 at each segment start; left padding is one segment)."""
    t = jnp.arange(segment_ids.shape[-1], dtype=jnp.int32)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    return t - jax.lax.cummax(jnp.where(starts, t, 0), axis=1)


# ----------------------------------------------------------------------------- attention kernels
def _xla_attention(q, k, v, mask):
    """Grouped-query softmax attention in the operands' dtype with float32 logits and softmax.

    Keys come as [B, K, H, S] and values as [B, K, S, H], the cache layout: per (row, kv head) both
    products are plain [G*T, H] @ [H, S] and [G*T, S] @ [S, H] matmuls on the cache as it lies. The
    keys' transposed layout matters for decoding (T = 1): XLA:CPU's batched matmul is much faster with
    the contracted axis leading, and [B, S, K, H] would need the whole cache transposed each step."""
    b, t, n, hd = q.shape
    kv, g = k.shape[1], n // k.shape[1]
    qg = q.reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, hd)
    logits = jnp.einsum("bkqh,bkhs->bkqs", qg, k, preferred_element_type=jnp.float32) / math.sqrt(hd)
    logits = jnp.where(jnp.tile(mask, (1, 1, g, 1)), logits, jnp.finfo(jnp.float32).min)
    out = jnp.einsum("bkqs,bksh->bkqh", jax.nn.softmax(logits, axis=-1).astype(v.dtype), v)
    return out.reshape(b, kv, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, n, hd).astype(q.dtype)


def _dot_product_attention(q, k, v, mask):
    """`jax.nn.dot_product_attention` on [B, S, K, H] keys and values: the library's path (and the
    one to adapt for cuDNN flash attention on GPU). Decoding pays a transpose of the cache per
    layer and step, so "xla" stays the default."""
    return jax.nn.dot_product_attention(q, k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3), mask=mask)


def _reference_attention(q, k, v, mask):
    """Plain float32 softmax attention, kv heads repeated up to the query heads; the yardstick for kernels."""
    g = q.shape[2] // k.shape[1]
    k, v = (jnp.repeat(a.astype(jnp.float32), g, axis=1) for a in (k, v))  # [B, N, H, S], [B, N, S, H]
    logits = jnp.einsum("btnh,bnhs->bnts", q.astype(jnp.float32), k) / math.sqrt(q.shape[-1])
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return jnp.einsum("bnts,bnsh->btnh", jax.nn.softmax(logits, axis=-1), v).astype(q.dtype)


# (q [B,T,N,H], k [B,K,H,S], v [B,K,S,H], mask [B,1,T,S] bool) -> [B,T,N,H]; add a kernel here.
ATTENTION: dict[str, Callable] = {
    "xla": _xla_attention, "dot_product": _dot_product_attention, "reference": _reference_attention,
}


# ----------------------------------------------------------------------------- building blocks
def _dense(x, w, n_in: int = 1):
    """x [b, t, *in] @ w [*in, *out] -> [b, t, *out] as ONE 2-D matmul over the flattened rows.

    Written as an einsum over (b, t), the weight gradient contracts two axes, and XLA:CPU's dot
    canonicalization then transposes the [b*t, out] cotangent (a strided copy, fused with the
    elementwise backward before it) ahead of each weight-gradient matmul: with flat rows it is one
    [in, b*t] @ [b*t, out] dot that reads both operands as they lie (bench/README.md, "train")."""
    if hasattr(w, "dense"):  # a grpo_jax.lora.LoraWeight: the frozen weight plus a low-rank adapter
        return w.dense(x, n_in)
    b, t = x.shape[:2]
    fan_in = math.prod(w.shape[:n_in])
    y = jnp.dot(x.reshape(b * t, fan_in), w.reshape(fan_in, -1))
    return y.reshape(b, t, *w.shape[n_in:])


def _rms_norm(x, w, eps):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def _inv_freq(cfg: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies (static), with Llama 3 rescaling when configured."""
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    s = cfg.rope_scaling
    if s is not None:
        wavelen = 2 * np.pi / inv
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def _rope(x, positions, inv_freq):
    """Rotate-half RoPE (the HF layout), computed in float32."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
    cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _attention(cfg, p, x, positions, segment_ids, k_segment_ids, index, prefix=None, kv=None, layer=None, slots=None):
    """Self-attention of T new tokens; returns (output, the slots' cache, this layer's k and v of the
    T tokens in the cache layout).

    Without `slots`, the T tokens attend causally among themselves, after `prefix` (this layer's k and v
    of `index` earlier tokens, read-only) when given. With `slots` (decoding, T = 1), `kv` is this layer's
    slot cache (or with `layer` every layer's, stacked), `prefix` this layer's prompts: the token's key
    and value are written at its slot's next place, and it attends to its prompt and its slot's tokens
    (`_slot_attention`)."""
    q = _constrain(_dense(x, p["q"]), ("batch", "seq", "heads", None))
    k = _constrain(_dense(x, p["k"]), ("batch", "seq", "kv_heads", None))
    v = _constrain(_dense(x, p["v"]), ("batch", "seq", "kv_heads", None))
    if cfg.qkv_bias:
        q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
    if cfg.qk_norm:
        q = _rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = _rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    inv_freq = _inv_freq(cfg)
    q, k = _rope(q, positions, inv_freq), _rope(k, positions, inv_freq)
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # the cache layout (see _xla_attention)
    own = (k, v)
    if slots is not None:
        size = kv[1][0].shape[-2]  # tokens per block
        kv = ([_write_slots(b, k[..., 0], slots.written - i * size, -1, layer) for i, b in enumerate(kv[0])],
              [_write_slots(b, v[:, :, 0], slots.written - i * size, -2, layer) for i, b in enumerate(kv[1])])
        out = _decode_attention(cfg, q, prefix, kv, layer, slots)
    else:
        if prefix is not None:
            k, v = jnp.concatenate([prefix[0], k], axis=3), jnp.concatenate([prefix[1], v], axis=2)
        q_slot = index + jnp.arange(x.shape[1])
        k_slot = jnp.arange(v.shape[2])
        mask = (
            (segment_ids[:, :, None] == k_segment_ids[:, None, :])
            & (k_segment_ids[:, None, :] != 0)
            & (q_slot[:, None] >= k_slot[None, :])
        )
        out = ATTENTION[cfg.attention](q, k.astype(q.dtype), v.astype(q.dtype), mask[:, None])
    out = _constrain(out, ("batch", "seq", "heads", None))
    return _dense(out, p["o"], 2), kv, own


def _write_slots(buffer, new, written, seq_axis: int, layer=None):
    """`buffer` (a block of a slot cache's k or v, or stacked over layers) with slot s's `new` [slots,
    kv_heads, head_dim] written in place at its place `written[s]` along `seq_axis` (in layer `layer`'s
    slice when stacked); a place outside the block writes nothing."""
    unit = buffer.ndim == 3 + (layer is not None)  # one kv head, stored without its axis (cache_specs)
    new = (new[:, 0] if unit else new).astype(buffer.dtype)
    seq = seq_axis % buffer.ndim
    index = [slice(None)] * buffer.ndim
    start = 0 if layer is None else 1
    if layer is not None:
        index[0] = layer
    index[start] = jnp.arange(new.shape[0])
    index[seq] = jnp.where(written < 0, buffer.shape[seq], written)  # .at wraps negative indices: make them out of range
    return buffer.at[tuple(index)].set(new, mode="drop")


class _Slots(NamedTuple):
    """What `_slot_attention` reads besides the keys and values: see `decode`; `blocks`: how many of
    the slot cache's blocks hold a written token."""

    prompt: Int[Array, "lanes lane_slots"]
    written: Int[Array, "slots"]
    prefix_valid: Bool[Array, "prefixes prompt_len"]
    blocks: Int[Array, ""]


def _slot_attention(q, prefix, own, slots: _Slots):
    """One query per slot against its prompt's keys (`prefix`, gathered per slot) and its own keys (`own`:
    the slot cache's blocks): softmax attention computed online, over the prompt and then the blocks
    that hold a written token, the others skipped (`jax.lax.cond`). A block past a slot's written
    places adds exactly nothing to it, so a slot's output does not depend on the other slots. Logits,
    softmax and accumulation in float32, as in `_xla_attention`."""
    s, _, n, hd = q.shape
    lanes = slots.prompt.shape[0]
    pk, pv = prefix
    kv = pk.shape[1]
    qg = q.reshape(s, kv, n // kv, hd)
    scale = 1.0 / math.sqrt(hd)

    def mine(a):  # [lanes * prefixes_per_lane, ...] -> the prompt of each slot, [slots, ...]; lane-local
        a = a.reshape(lanes, -1, *a.shape[1:])
        return jax.vmap(lambda a, i: a[i])(a, slots.prompt).reshape(s, *a.shape[2:])

    def add(state, keys, values, valid):  # the online softmax's update with keys [s, k, hd, w], values [s, k, w, hd]
        if keys.ndim == 3:  # one kv head, stored without its axis
            keys, values = keys[:, None], values[:, None]
        x = jnp.einsum("skgh,skhw->skgw", qg, keys.astype(q.dtype), preferred_element_type=jnp.float32) * scale
        x = jnp.where(valid[:, None, None, :], x, -jnp.inf)
        top, total, acc = state
        new_top = jnp.maximum(top, jnp.max(x, axis=-1, keepdims=True))
        p = jnp.exp(x - new_top)  # masked: exp(-inf) = 0; a block all masked leaves the state as it was
        shrink = jnp.exp(top - new_top)
        acc = acc * shrink + jnp.einsum("skgw,skwh->skgh", p.astype(q.dtype), values.astype(q.dtype),
                                        preferred_element_type=jnp.float32)
        return new_top, total * shrink + jnp.sum(p, axis=-1, keepdims=True), acc

    empty = jnp.full((*qg.shape[:3], 1), -jnp.inf), jnp.zeros((*qg.shape[:3], 1)), jnp.zeros(qg.shape)
    state = add(empty, mine(pk), mine(pv), mine(slots.prefix_valid))  # a prompt has a token: finite
    size = own[1][0].shape[-2]
    for i, (keys, values) in enumerate(zip(*own)):
        valid = i * size + jnp.arange(size) <= slots.written[:, None]
        block = functools.partial(add, keys=keys, values=values, valid=valid)
        state = block(state) if i == 0 else jax.lax.cond(i < slots.blocks, block, lambda state: state, state)
    _, total, acc = state
    return (acc / total).reshape(s, 1, n, hd).astype(q.dtype)


def _decode_attention(cfg, q, prefix, kv, layer, slots: _Slots):
    """A decode step's attention (`_attention` with slots) by `cfg.decode_attention`: the plain jnp
    `_slot_attention`, or the Pallas TPU kernel `kernels.slot_attention` (each slot reads only its own
    written blocks; interpreted on CPU). "auto": the kernel on TPU, the plain path elsewhere. Under a
    mesh the kernel runs per device in a shard_map laid out as the cache is (`cache_specs`)."""
    def plain():
        return _slot_attention(q, prefix, kv if layer is None else tuple([b[layer] for b in blocks] for blocks in kv),
                               slots)

    if cfg.decode_attention == "xla":
        return plain()
    if cfg.decode_attention == "pallas" and jax.default_backend() not in ("cpu", "tpu"):
        raise ValueError(f"ModelConfig.decode_attention='pallas' is a TPU kernel (interpreted on CPU); on "
                         f"{jax.default_backend()} use 'auto' or 'xla'")
    s, _, n, hd = q.shape
    kv_heads = prefix[0].shape[1]
    unit = kv[0][0].ndim == 3 + (layer is not None)  # one kv head: its own blocks stored without the axis
    args = (q.reshape(s, kv_heads, n // kv_heads, hd), *prefix, slots.prefix_valid, slots.prompt, *kv,
            slots.written, jnp.zeros((), jnp.int32) if layer is None else layer)

    def kernel(interpret: bool):
        def run(q, pk, pv, valid, prompt, k, v, written, layer_):
            return kernels.slot_attention(q, pk, pv, valid, prompt, k, v, written, None if layer is None else layer_,
                                          interpret=interpret)

        mesh = jax.sharding.get_abstract_mesh()
        if not mesh.empty:
            heads = (None, "heads") if unit else ("kv_heads", None)
            lead = () if layer is None else ("layers",)
            own = (*lead, "batch") if unit else (*lead, "batch", "kv_heads")
            axes = (("batch", *heads, None), ("batch", "kv_heads", None, "seq"), ("batch", "kv_heads", "seq", None),
                    ("batch", "seq"), ("batch", None),
                    [(*own, None, "seq")] * len(kv[0]), [(*own, "seq", None)] * len(kv[1]), ("batch",), ())
            specs = jax.tree.map(lambda a, x: logical_spec(a, x.shape, mesh), axes, args,
                                 is_leaf=lambda a: isinstance(a, tuple) and all(isinstance(n, str | None) for n in a))
            run = jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)
        return run(*args).reshape(s, 1, n, hd)

    if cfg.decode_attention == "pallas":
        return per_platform(cpu=lambda: kernel(True), tpu=lambda: kernel(False), gpu=plain)()
    return per_platform(cpu=plain, tpu=lambda: kernel(False), gpu=plain)()


def _mlp(p, x):
    h = _constrain(jax.nn.silu(_dense(x, p["gate"])) * _dense(x, p["up"]), ("batch", "seq", "mlp"))
    return _dense(h, p["down"])


def _moe(cfg, p, x, routes=None):
    """Softmax top-k routing over SwiGLU experts. Returns (output, router logits in float32, the
    router's own top-k experts [B, T, k], router entropy [B, T]).

    Routing replay (`routes` [B, T, k], e.g. recorded under the old policy): the replayed experts
    replace the router's top-k set, and their gate weights are the current router's probabilities
    of that set (normalized as the model normalizes its top-k), so the router still gets gradients."""
    router_logits = jnp.einsum("btd,de->bte", x, p["router"], preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(router_logits, axis=-1)
    top_p, top_i = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    used = top_i if routes is None else routes
    if routes is not None:
        top_p = jnp.take_along_axis(probs, routes, axis=-1)
    if cfg.norm_topk_prob:
        top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    entropy = -jnp.sum(probs * jax.nn.log_softmax(router_logits, axis=-1), axis=-1)
    return MOE[cfg.moe_impl](p, x, top_p.astype(x.dtype), used), router_logits, top_i, entropy


def _experts_dense(p, x, top_p, top_i):
    """Every expert on every token, unselected ones weighted 0: exact, simple, expert-shardable;
    costs num_experts / top_k times the routed FLOPs."""
    weights = jnp.sum(jax.nn.one_hot(top_i, p["gate"].shape[0], dtype=x.dtype) * top_p[..., None], axis=-2)
    gate = jnp.einsum("btd,edf->btef", x, p["gate"])
    up = jnp.einsum("btd,edf->btef", x, p["up"])
    h = _constrain(jax.nn.silu(gate) * up * weights[..., None], ("batch", "seq", "expert", "mlp"))
    return jnp.einsum("btef,efd->btd", h, p["down"])


def _experts_ragged(p, x, top_p, top_i):
    """Only the routed (token, expert) pairs: sorted by expert and run with `jax.lax.ragged_dot`.
    FLOPs scale with top_k, not num_experts (single-device or replicated experts)."""
    b, t, d = x.shape
    k = top_i.shape[-1]
    experts = top_i.reshape(-1)
    order = jnp.argsort(experts, stable=True)
    sizes = jnp.bincount(experts, length=p["gate"].shape[0]).astype(jnp.int32)
    xs = x.reshape(-1, d)[order // k]
    h = jax.nn.silu(jax.lax.ragged_dot(xs, p["gate"], sizes)) * jax.lax.ragged_dot(xs, p["up"], sizes)
    ys = jax.lax.ragged_dot(h, p["down"], sizes)[jnp.argsort(order)].reshape(b, t, k, d)
    return jnp.einsum("btkd,btk->btd", ys, top_p)


# (expert params, x [B,T,d], top_p [B,T,k], top_i [B,T,k]) -> [B,T,d]; ModelConfig.moe_impl picks.
MOE: dict[str, Callable] = {"dense": _experts_dense, "ragged": _experts_ragged}


def _constrain(x, axes: tuple[str | None, ...]):
    """Pins an activation's sharding by the logical rules when traced with a mesh in context
    (`grpo_jax.sharding.activation_rules(mesh)`, as the train step and the sampler are, or
    `jax.set_mesh`); without one it is the identity and GSPMD propagates from the inputs."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(axes, x.shape, mesh))


_REMAT_POLICY = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _runs(cfg: ModelConfig) -> list[tuple[bool, int, int, int]]:
    """Maximal runs of consecutive layers of one kind: (is_moe, first layer, end, first in kind stack)."""
    runs, seen = [], {False: 0, True: 0}
    for i, kind in enumerate(cfg.moe_layers):
        if runs and runs[-1][0] == kind:
            runs[-1][2] = i + 1
        else:
            runs.append([kind, i, i + 1, seen[kind]])
        seen[kind] += 1
    return [tuple(r) for r in runs]


LAYER_STACKS = ("layers", "mlp", "moe")  # the params stacked over layers; the others are read once per token


def unstack_layers(params: Params) -> Params:
    """`params` with the stacked layer weights as one tree per layer. The sampler calls this once,
    outside its decode loop: XLA:CPU copies a layer's slice of a stack at every step otherwise (a
    large share of a decode step; bench/README.md: Sampler)."""
    return {name: [jax.tree.map(lambda a: a[i], tree) for i in range(jax.tree.leaves(tree)[0].shape[0])]
            if name in LAYER_STACKS else tree for name, tree in params.items()}


LAYOUT_ENV = "GRPO_JAX_LAYOUT"  # "accelerator": layer_loop="auto" scans on CPU too (`layers_unrolled`)


def layers_unrolled(cfg: ModelConfig, cache: bool = True) -> bool:
    """Whether the layers run unrolled rather than under one `jax.lax.scan`: the one place that
    resolves `ModelConfig.layer_loop`. `cache`: whether they run with a KV cache (sampling: prefill
    and decode) or without (training, scoring). The KV cache's layout (`cache_specs`) and the
    sampler's weight handling (`sampling._decoding_params`) follow the answer with `cache=True`.

    "scan" and "unrolled" are taken as given on every backend. "auto" is a rule by backend:

    - TPU and GPU: scanned, the accelerator layout. The programs stay flat in depth (size and compile
      time), on a mesh each layer's weights are gathered inside the scan one layer at a time, and the
      sampler carries one KV cache stacked over layers through it; unrolled, the memory plan needs
      several times the scan's temporaries (bench/scale_plan.py).
    - CPU: unrolled, the CPU layout. XLA:CPU runs the backward faster without the scan's stacked
      residuals, and decodes faster from one cache buffer per layer, read where it lies, than from a
      stack whose layer slice it copies out at every step.
    - CPU, training and scoring (no cache) under remat (`remat` not "none"): scanned. Unrolled,
      XLA:CPU keeps the activations that remat would free.
    - The environment variable GRPO_JAX_LAYOUT=accelerator (`LAYOUT_ENV`): scanned on CPU as well, the
      layout TPUs and GPUs run, e.g. to test it on CPU (tests/conftest.py sets it for the test
      session and the processes it launches). Unset or empty, the rule above; any other value is
      an error. It is read when a program is traced: set it before the process traces any (jitted
      functions cache their programs by config, not by this variable).

    Measurements of both layouts: bench/README.md (`scan_layers`, `decode_depth`, `scale_plan`)."""
    if cfg.layer_loop != "auto":
        return cfg.layer_loop == "unrolled"
    layout = os.environ.get(LAYOUT_ENV, "")
    if layout not in ("", "accelerator"):
        raise ValueError(f"{LAYOUT_ENV}={layout!r} is not understood; use 'accelerator' or leave it unset")
    if layout == "accelerator" or jax.default_backend() != "cpu":
        return False
    return cache or cfg.remat == "none"


def _layer(stack, i: int):
    """Layer i's weights: from a stacked tree, or from `unstack_layers`' per-layer list."""
    return stack[i] if isinstance(stack, list) else jax.tree.map(lambda a: a[i], stack)


def _decoder(cfg, params, tokens, positions, segment_ids, index=0, routes=None, prefix=None, emit_kv=False,
             cache=None, slots=None):
    """The layers over T tokens: (final normed hidden, the updated slot cache or None, aux). `prefix`:
    (k [layers, B/G, ...], v, segment_ids [B/G, P]) of P earlier tokens that every run of G rows
    shares, read-only, as scan inputs (so a remat layer saves its own slice, not a carried stack);
    `emit_kv`: aux["kv"] holds every layer's k and v of the T tokens (such a prefix). Decoding: `cache`
    (`init_cache`) and `slots` (`_Slots`, see `decode`), T = 1."""
    cdt = cfg.jnp_compute_dtype
    cast = lambda tree: jax.tree.map(lambda a: a.astype(cdt), tree)  # noqa: E731
    table = _constrain(params["embed"].astype(cdt), ("vocab", None))  # gathered over fsdp like every weight
    x = _constrain(table[tokens], ("batch", "seq", "embed"))
    group = 1 if prefix is None else tokens.shape[0] // prefix[2].shape[0]
    k_segment_ids = segment_ids
    if prefix is not None:
        k_segment_ids = jnp.concatenate([jnp.repeat(prefix[2], group, axis=0), segment_ids], axis=1)
    if cache is not None:  # decoding: the prompts are the read-only prefix of the slots
        prefix = (cache["prefix_k"], cache["prefix_v"])

    def layer(x, kv, i, lp, mp, replay, shared, is_moe):
        lp, mp = cast(lp), cast(mp)
        if shared is not None and slots is None:  # this layer's prefix, once per group: each row of the group reads it
            shared = tuple(jnp.repeat(a, group, axis=0) for a in shared)
        h = _rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
        a, kv, own = _attention(cfg, lp, h, positions, segment_ids, k_segment_ids, index, shared, kv, i, slots)
        x = x + a
        h = _rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
        if is_moe:
            m, *routing = _moe(cfg, mp, h, replay)
        else:
            m, routing = _mlp(mp, h), None
        return _constrain(x + m, ("batch", "seq", "embed")), kv, (routing, own if emit_kv else None)

    # unrolled over one weight tree and cache buffer per layer (`unstack_layers`, `cache_specs`), or scanned
    per_layer = isinstance(params["layers"], list) or (cache is not None and isinstance(cache["prefix_k"], list))
    kv = None if cache is None else [] if per_layer else (cache["k"], cache["v"])  # stacked: carried
    routing, emitted = [], []
    for is_moe, start, stop, kind_start in _runs(cfg):  # per run of layers of one kind: a scan, or unrolled
        kind = slice(kind_start, kind_start + stop - start)
        replay = routes[kind] if is_moe and routes is not None else None
        body = functools.partial(layer, is_moe=is_moe)
        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICY[cfg.remat])
        if per_layer:
            outs = []
            for j in range(start, stop):
                lp, mp = _layer(params["layers"], j), _layer(params["moe" if is_moe else "mlp"], kind_start + j - start)
                rp = None if replay is None else replay[j - start]
                mine = None if cache is None else (cache["k"][j], cache["v"][j])
                x, mine, out = body(x, mine, None, lp, mp, rp, None if prefix is None else (prefix[0][j], prefix[1][j]))
                if cache is not None:
                    kv.append(mine)
                outs.append(out)
            ys, own = jax.tree.map(lambda *a: jnp.stack(a), *outs)
        else:  # a stacked cache's layer index i is a scan input; without a cache it goes unused
            layer_p = jax.tree.map(lambda a: a[start:stop], params["layers"])
            mlp_p = jax.tree.map(lambda a: a[kind], params["moe" if is_moe else "mlp"])
            shared = None if prefix is None else (prefix[0][start:stop], prefix[1][start:stop])

            def scanned(carry, xs, body=body):
                x, kv, out = body(*carry, *xs)
                return (x, kv), out

            xs = (jnp.arange(start, stop), layer_p, mlp_p, replay, shared)
            (x, kv), (ys, own) = jax.lax.scan(scanned, (x, kv), xs, unroll=layers_unrolled(cfg, cache is not None))
        if is_moe:
            routing.append(ys)
        emitted.append(own)
    hidden = _rms_norm(x, params["final_norm"].astype(cdt), cfg.rms_norm_eps)
    aux = {}
    if routing:
        names = ("router_logits", "routes", "router_entropy")
        aux = {name: jnp.concatenate([r[j] for r in routing]) for j, name in enumerate(names)}
    if emit_kv:
        aux["kv"] = tuple(jnp.concatenate([e[j] for e in emitted]) for j in range(2))
    if cache is not None:
        k, v = ([k for k, _ in kv], [v for _, v in kv]) if per_layer else kv
        cache = {**cache, "k": k, "v": v}
    return hidden, cache, aux


@checked  # a public entry point: misshapen inputs are named, with their axes
def prefill(
    cfg: ModelConfig,
    params: Params,
    tokens: Int[ArrayLike, "batch time"],
    positions: Int[ArrayLike, "batch time"],
    segment_ids: Int[ArrayLike, "batch time"],
) -> tuple[Float[Array, "batch time embed"], tuple[Array, Array], dict[str, Array]]:
    """Encodes prompts for decoding: (final normed hidden, their keys and values stacked over layers
    (k [layers, batch, kv_heads, head_dim, time], v [layers, batch, kv_heads, time, head_dim]: the
    prefix of `init_cache`), aux as `forward_with_aux`'s). Segment id 0 marks left padding."""
    hidden, _, aux = _decoder(cfg, params, tokens, positions, segment_ids, emit_kv=True)
    return hidden, aux.pop("kv"), aux


@checked
def decode(
    cfg: ModelConfig,
    params: Params,
    cache: Cache,
    tokens: Int[ArrayLike, "slots"],
    positions: Int[ArrayLike, "slots"],
    written: Int[ArrayLike, "slots"],
    prompt: Int[ArrayLike, "lanes lane_slots"],
) -> tuple[Float[Array, "slots embed"], Cache, dict[str, Array]]:
    """Feeds one token per slot at RoPE position `positions[s]`. Slots and prefixes (the prompts of
    `init_cache`) are split into `lanes` equal consecutive blocks, one per device holding rows on a
    mesh; slot s of lane l continues that lane's prefix `prompt[l, s]`, so no prompt crosses devices.
    The token's key and value go to its slot's place `written[s]` (the number of its own tokens
    already there), and it attends to its prompt and to its slot's tokens up to itself, over as many of
    the cache's blocks as the largest `written` needs: give an idle slot written 0. Returns (final
    normed hidden, the updated cache, aux of the token: MoE routes etc.). The caller keeps written <
    the slot cache's length (a traced index cannot be checked)."""
    written = jnp.asarray(written, jnp.int32)
    size = jax.tree.leaves(cache["v"])[0].shape[-2]  # tokens per block
    slots = _Slots(jnp.asarray(prompt, jnp.int32), written, cache["prefix_valid"], jnp.max(written) // size + 1)
    ones = jnp.ones_like(tokens)[:, None]
    hidden, cache, aux = _decoder(cfg, params, tokens[:, None], positions[:, None], ones, cache=cache, slots=slots)
    return hidden[:, 0], cache, aux


@checked
def extend(
    cfg: ModelConfig,
    params: Params,
    cache_kv: tuple[Array, Array],
    cache_segment_ids: Int[ArrayLike, "batch cache_len"],
    tokens: Int[ArrayLike, "batch time"],
    positions: Int[ArrayLike, "batch time"],
    segment_ids: Int[ArrayLike, "batch time"],
) -> tuple[Float[Array, "batch time embed"], tuple[Array, Array]]:
    """Encodes T new tokens of each row after the row's cached ones, without re-encoding them: `cache_kv`
    (k [layers, batch, kv_heads, head_dim, cache_len], v [layers, batch, kv_heads, cache_len, head_dim],
    `prefill`'s layout) with segment id 0 on places not yet written. Returns (final normed hidden, the
    new tokens' k and v in that layout). The multi-turn sampler's one forward (`grpo_jax.multi_turn`)."""
    hidden, _, aux = _decoder(cfg, params, tokens, positions, segment_ids, cache_segment_ids.shape[1],
                              prefix=(*cache_kv, cache_segment_ids), emit_kv=True)
    return hidden, aux["kv"]


@checked
def forward_shared_prefix(
    cfg: ModelConfig,
    params: Params,
    prefix_tokens: Int[ArrayLike, "groups prefix"],
    prefix_positions: Int[ArrayLike, "groups prefix"],
    prefix_segment_ids: Int[ArrayLike, "groups prefix"],
    tokens: Int[ArrayLike, "batch time"],
    positions: Int[ArrayLike, "batch time"],
    segment_ids: Int[ArrayLike, "batch time"],
) -> tuple[Float[Array, "groups prefix embed"], Float[Array, "batch time embed"]]:
    """Prefix Grouper's shared-prefix forward (arXiv 2506.05433): rows g*G .. g*G+G-1 of `tokens`
    (G = batch / groups) continue prefix row g, which is encoded once. Returns the final normed hidden
    states of the prefixes and of the continuations: those of `forward` over each prefix followed by
    its continuation (the same segment-id rules). Each layer's prefix keys and values go from the
    first pass to the second as scan inputs, so under remat a layer saves only its own."""
    if tokens.shape[0] % prefix_tokens.shape[0]:
        raise ValueError(f"{tokens.shape[0]} rows do not continue {prefix_tokens.shape[0]} prefixes in equal runs: "
                         "give G rows per prefix, each prefix's rows consecutive")
    prefix_hidden, _, aux = _decoder(cfg, params, prefix_tokens, prefix_positions, prefix_segment_ids, emit_kv=True)
    hidden, _, _ = _decoder(cfg, params, tokens, positions, segment_ids, prefix_tokens.shape[1],
                            prefix=(*aux["kv"], prefix_segment_ids))
    return prefix_hidden, hidden


@checked
def forward_with_aux(
    cfg: ModelConfig,
    params: Params,
    tokens: Int[ArrayLike, "batch seq"],
    positions: Int[ArrayLike, "batch seq"] | None = None,
    segment_ids: Int[ArrayLike, "batch seq"] | None = None,
    routes: Int[ArrayLike, "moe_layers batch seq k"] | None = None,
) -> tuple[Float[Array, "batch seq embed"], dict[str, Array]]:
    """`forward` that also returns aux; for MoE models `router_logits` [moe_layers, batch, seq,
    experts] (float32), `routes` [moe_layers, batch, seq, k] (the experts the router picks) and
    `router_entropy` [moe_layers, batch, seq]. `routes` given: routing replay, every token runs on
    the given experts (see `_moe`), while aux still reports the router's own picks."""
    if segment_ids is None:
        segment_ids = jnp.ones_like(tokens, jnp.int32)
    if positions is None:
        positions = positions_from_segments(segment_ids)
    if routes is not None:
        want = (sum(cfg.moe_layers), *tokens.shape, cfg.num_experts_per_tok)
        if not any(cfg.moe_layers):
            raise ValueError(f"routes replay mixture-of-experts routing, but this {cfg.model_type} model has no MoE layer")
        if tuple(routes.shape) != want:
            raise ValueError(f"routes {tuple(routes.shape)} must be [moe_layers, batch, seq, k] = {want}")
    hidden, _, aux = _decoder(cfg, params, tokens, positions, segment_ids, routes=routes)
    return hidden, aux


@checked
def forward(
    cfg: ModelConfig,
    params: Params,
    tokens: Int[ArrayLike, "batch seq"],
    positions: Int[ArrayLike, "batch seq"] | None = None,
    segment_ids: Int[ArrayLike, "batch seq"] | None = None,
) -> Float[Array, "batch seq embed"]:
    """Final normed hidden states. Defaults: one segment per row; positions restart at each segment."""
    return forward_with_aux(cfg, params, tokens, positions, segment_ids)[0]


def unembedding(cfg: ModelConfig, params: Params) -> Float[Array, "embed vocab"]:
    """The [d, V] output matrix; for tied embeddings the transposed embedding (a free view under jit)."""
    return params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]


def unembed(cfg: ModelConfig, params: Params, hidden: Float[Array, "batch *seq embed"]) -> Float[Array, "batch *seq vocab"]:
    """Float32 logits of final hidden states, split over vocab as the unembedding is when traced with a
    mesh: asked for whole rows at once, XLA gathered the [d, V] weight over tensor in every decode loop
    (a whole copy of it per loop, in the memory plan of bench/scale_plan.py) rather than the sampler's
    [rows, V] logits of a step."""
    w = unembedding(cfg, params).astype(hidden.dtype)
    out = jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)
    return _constrain(out, ("batch", *("seq",) * (out.ndim - 2), "vocab"))


@checked
def logits(
    cfg: ModelConfig,
    params: Params,
    tokens: Int[ArrayLike, "batch seq"],
    positions: Int[ArrayLike, "batch seq"] | None = None,
    segment_ids: Int[ArrayLike, "batch seq"] | None = None,
) -> Float[Array, "batch seq vocab"]:
    """Full float32 logits. For evaluation and tests; training uses hidden states + `unembedding`."""
    return unembed(cfg, params, forward(cfg, params, tokens, positions, segment_ids))
