"""Decode attention over the sampler's slot cache as one Pallas TPU kernel (Mosaic; interpreted on CPU).

A decode step attends one query per slot to its prompt's keys (shared by the G slots that continue
that prompt: read where the prompt lies, never copied per slot) and to the blocks of the slot's own
tokens that hold a written token. The kernel reads each slot's blocks from HBM itself (a DMA per
block, under `pl.when`), so a slot reads only its own written blocks, however long the longest slot:
what the plain path (`grpo_jax.models.decoder._slot_attention`, the reference this is tested against)
can only skip for all slots at once. Logits, online softmax and accumulation in float32.

JAX's own Pallas paged and ragged attention kernels (jax.experimental.pallas.ops.tpu) do not fit
this cache: they attend to the first `length` tokens of a sequence's pages, but a slot's prompt is
left-padded inside its prefix (its valid keys are no prefix of the pages); they return no
log-sum-exp to merge a shared prompt part with the slot's own; and they read the keys in bfloat16."""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Bool, Float, Int


def _kernel(blocks: int, size: int, scale: float, unit: bool, stacked: bool,
            prefix_of_slot, written, layer, q_ref, pk_ref, pv_ref, valid_ref, *refs):
    """One (slot, kv head): its prompt from VMEM blocks, then each own block with a written token from HBM."""
    k_hbm, v_hbm = refs[:blocks], refs[blocks: 2 * blocks]
    o_ref, k_buf, v_buf, sem, top_ref, total_ref, acc_ref = refs[2 * blocks:]
    s, h = pl.program_id(0), pl.program_id(1)
    q = q_ref[0, 0]  # [g, hd]

    def add(keys, values, valid, first: bool):  # the online softmax's update with keys [hd, w], values [w, hd]
        x = jnp.dot(q, keys.astype(q.dtype), preferred_element_type=jnp.float32) * scale
        x = jnp.where(valid, x, -jnp.inf)
        top = jnp.max(x, axis=-1, keepdims=True) if first else jnp.maximum(top_ref[...], jnp.max(x, axis=-1, keepdims=True))
        p = jnp.exp(x - top)
        pv = jnp.dot(p.astype(q.dtype), values.astype(q.dtype), preferred_element_type=jnp.float32)
        if first:
            total_ref[...], acc_ref[...] = jnp.sum(p, axis=-1, keepdims=True), pv
        else:
            shrink = jnp.exp(top_ref[...] - top)
            total_ref[...] = total_ref[...] * shrink + jnp.sum(p, axis=-1, keepdims=True)
            acc_ref[...] = acc_ref[...] * shrink + pv
        top_ref[...] = top

    add(pk_ref[0, 0], pv_ref[0, 0], valid_ref[0] != 0, first=True)  # a prompt has a token: finite from here
    mine = (s,) if unit else (s, h)
    if stacked:
        mine = (layer[0], *mine)
    for i in range(blocks):
        @pl.when(i * size <= written[s])
        def _(i=i):
            copies = (pltpu.make_async_copy(k_hbm[i].at[mine], k_buf, sem.at[0]),
                      pltpu.make_async_copy(v_hbm[i].at[mine], v_buf, sem.at[1]))
            for c in copies:
                c.start()
            for c in copies:
                c.wait()
            place = i * size + jax.lax.broadcasted_iota(jnp.int32, (1, size), 1)
            add(k_buf[...], v_buf[...], place <= written[s], first=False)

    o_ref[0, 0] = (acc_ref[...] / total_ref[...]).astype(o_ref.dtype)


def slot_attention(
    q: Float[Array, "slots kv_heads group head_dim"],
    prefix_k: Float[Array, "prefixes kv_heads head_dim prompt_len"],
    prefix_v: Float[Array, "prefixes kv_heads prompt_len head_dim"],
    prefix_valid: Bool[Array, "prefixes prompt_len"],
    prompt: Int[Array, "lanes lane_slots"],
    k_blocks: list[Array],  # each [(layers,) slots, (kv_heads,) head_dim, block]: no kv_heads axis for one
    v_blocks: list[Array],  # each [(layers,) slots, (kv_heads,) block, head_dim]
    written: Int[Array, "slots"],
    layer: Int[Array, ""] | None = None,
    *,
    interpret: bool = False,
) -> Float[Array, "slots kv_heads group head_dim"]:
    """Slot s (of lane l = s // lane_slots) attends to prefix `prompt[l, s % lane_slots]` of its lane (the
    lanes' prefixes are consecutive equal blocks) and to its own places 0..written[s]; `layer`: the layer
    of blocks stacked over layers. One device's slots: under a mesh call it inside a shard_map that
    keeps each lane's slots with its prefixes (the decoder does). `interpret`: run the kernel in Pallas'
    TPU interpreter (on CPU)."""
    stacked = layer is not None
    layer = jnp.zeros(1, jnp.int32) if layer is None else jnp.reshape(layer, (1,)).astype(jnp.int32)
    slots, kv, g, hd = q.shape
    prompt_len = prefix_k.shape[-1]
    size = v_blocks[0].shape[-2]
    unit = k_blocks[0].ndim == 3 + stacked  # one kv head: its own blocks stored without the axis (decoder.cache_specs)
    lanes = prompt.shape[0]  # lane l's prefixes: the l-th of `lanes` consecutive equal blocks
    prefix_of_slot = (prompt + prefix_k.shape[0] // lanes * jnp.arange(lanes)[:, None]).reshape(-1)
    blocks = len(k_blocks)
    kernel = functools.partial(_kernel, blocks, size, 1.0 / math.sqrt(hd), unit, stacked)
    prompt_block = lambda s, h, prefix_of_slot, *_: (prefix_of_slot[s], h, 0, 0)  # noqa: E731
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(slots, kv),
        in_specs=[pl.BlockSpec((1, 1, g, hd), lambda s, h, *_: (s, h, 0, 0)),
                  pl.BlockSpec((1, 1, hd, prompt_len), prompt_block),
                  pl.BlockSpec((1, 1, prompt_len, hd), prompt_block),
                  pl.BlockSpec((1, 1, prompt_len), lambda s, h, prefix_of_slot, *_: (prefix_of_slot[s], 0, 0)),
                  *[hbm] * (2 * blocks)],
        out_specs=pl.BlockSpec((1, 1, g, hd), lambda s, h, *_: (s, h, 0, 0)),
        scratch_shapes=[pltpu.VMEM((hd, size), k_blocks[0].dtype), pltpu.VMEM((size, hd), v_blocks[0].dtype),
                        pltpu.SemaphoreType.DMA((2,)), pltpu.VMEM((g, 1), jnp.float32),
                        pltpu.VMEM((g, 1), jnp.float32), pltpu.VMEM((g, hd), jnp.float32)],
    )
    return pl.pallas_call(
        kernel, grid_spec=grid, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=pltpu.InterpretParams() if interpret else False,
    )(prefix_of_slot, written, layer, q, prefix_k, prefix_v, prefix_valid[:, None].astype(jnp.int32), *k_blocks, *v_blocks)
