"""The decoder family (Llama 3 / SmolLM2, Qwen2/2.5, Qwen3, Qwen3-MoE) as pure functions.

    cfg, params = load_hf(path, dtype="float32", mesh=None)   # local HF dir -> (ModelConfig, params)
    save_hf(cfg, params, path)                                # -> config.json + model.safetensors
    params = init(cfg, rng)                                   # from scratch
    hidden = forward(cfg, params, tokens, positions=None, segment_ids=None)  # [B, S, d], final-normed
    hidden, aux = forward_with_aux(..., routes=None)          # MoE: aux router_logits, routes,
                                                              # router_entropy; routes: replay
    prefix_hidden, hidden = forward_shared_prefix(cfg, params, prefix_tokens, prefix_positions,
        prefix_segment_ids, tokens, positions, segment_ids)  # each prefix once for its G rows
    w = unembedding(cfg, params)                              # [d, V]; logits = hidden @ w
    logits = unembed(cfg, params, hidden)                     # float32, split over vocab on a mesh
    logits(cfg, params, tokens, positions=None, segment_ids=None)            # [B, S, V] float32

Segment ids: 0 = padding (never attended to); tokens attend causally within their own segment id,
so packing is several ids in one row and left padding is leading zeros. Positions feed RoPE only;
`positions_from_segments` gives positions that restart at each segment.

KV cache (for sampling; one code path with `forward`):

    cache = init_cache(cfg, batch, max_len)
        {"k": per layer [batch, kv_heads, head_dim, max_len], "v": per layer [batch, kv_heads, max_len,
         head_dim] in cfg.compute_dtype (the layouts the attention kernels read; one buffer per layer,
         which extend's unrolled layers update and read in place, or under the layer scan one buffer
         [layers, ...] carried through it: `layers_unrolled(cfg)`), "segment_ids": [batch, max_len]
         int32, 0 = slot unwritten or padding (the validity mask is `cache["segment_ids"] != 0`),
         MoE models: "routes": [moe_layers, batch, max_len, k] int32, the experts of each slot's token}
    hidden, cache, aux = extend(cfg, params, tokens, positions, segment_ids, cache, index)
        tokens/positions/segment_ids [B, T]; writes slots [index, index+T) (index: int32 scalar, the
        same for every row) and attends to all earlier slots with the same segment id.
        Prefill: T = prompt length, index 0. Decode: T = 1, index = number of slots already written.
    cache = repeat_cache(cfg, cache, G)      # each row G times: G samples share one prefill
    cache = grow_cache(cfg, cache, max_len)  # empty slots appended up to max_len
    params = unstack_layers(params)          # one weight tree per layer: unrolled, extend reads them in place

`cache_shardings(cfg, mesh, batch, max_len)` shards the cache, `param_shardings(tree, cfg, mesh)` /
`shard_params(params, cfg, mesh)` the params and the optimizer state (by `grpo_jax.sharding`'s rules).

Params are a nested dict described by `param_specs(cfg)` (shape + logical axes of every leaf):
embed [V, d]; layers/{attn_norm, q [L,d,H,hd], k, v [L,d,K,hd], o [L,H,hd,d], mlp_norm,
q_bias/k_bias/v_bias (Qwen2), q_norm/k_norm (Qwen3)}; mlp/{gate, up [Ld,d,F], down [Ld,F,d]} for
dense layers; moe/{router [Lm,d,E], gate, up [Lm,E,d,F], down [Lm,E,F,d]} for MoE layers;
final_norm [d]; lm_head [d, V] unless embeddings are tied.
"""

from grpo_jax.models.config import Llama3RopeScaling, ModelConfig
from grpo_jax.models.decoder import (
    ATTENTION,
    LAYER_STACKS,
    MOE,
    ParamSpec,
    cache_shardings,
    cache_specs,
    extend,
    forward,
    forward_shared_prefix,
    forward_with_aux,
    grow_cache,
    init,
    init_cache,
    layers_unrolled,
    logits,
    param_shardings,
    param_specs,
    positions_from_segments,
    repeat_cache,
    shard_params,
    unembed,
    unembedding,
    unstack_layers,
)
from grpo_jax.models.hf_io import fingerprint, load_hf, save_hf

__all__ = [
    "ATTENTION",
    "LAYER_STACKS",
    "Llama3RopeScaling",
    "MOE",
    "ModelConfig",
    "ParamSpec",
    "cache_shardings",
    "cache_specs",
    "extend",
    "forward",
    "forward_shared_prefix",
    "forward_with_aux",
    "grow_cache",
    "init",
    "init_cache",
    "layers_unrolled",
    "load_hf",
    "logits",
    "param_shardings",
    "param_specs",
    "positions_from_segments",
    "repeat_cache",
    "save_hf",
    "shard_params",
    "unembed",
    "unembedding",
    "unstack_layers",
]
