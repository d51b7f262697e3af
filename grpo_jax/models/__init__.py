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

Decoding (for sampling; one code path with `forward`): prompts are encoded once, and decode slots
continue them, each with its own tokens.

    hidden, prefix_kv, aux = prefill(cfg, params, tokens, positions, segment_ids)  # prompts' k and v
    cache = init_cache(cfg, prefix_kv, prefix_valid, slots, max_len)
        {"prefix_k", "prefix_v": the prompts' keys and values, read-only (the G samples of a prompt
         share them), "prefix_valid": [prefixes, prompt_len] (False on left padding), "k", "v": each
         slot's own tokens, written in place, in `slot_blocks(max_len)` separate blocks; per layer
         (unrolled) or stacked [layers, ...] (scan): `cache_specs` has the layouts}
    hidden, cache, aux = decode(cfg, params, cache, tokens, positions, written, prompt)
        one token per slot, written at its slot's place `written[s]`, attending to its lane's prompt
        `prompt[lane, s]` and its slot's tokens so far (lanes: one per device holding rows on a mesh)
    params = unstack_layers(params)          # one weight tree per layer: unrolled, decode reads them in place
    hidden, new_kv = extend(cfg, params, cache_kv, cache_segment_ids, tokens, positions, segment_ids)
        T new tokens per row after its own cached ones (multi-turn rollouts: an observation, then each
        sampled token), their k and v returned for the caller to write into its cache

`cache_shardings(cfg, mesh, *cache_specs' shape)` shards the cache, `param_shardings(tree, cfg, mesh)` /
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
    decode,
    extend,
    forward,
    forward_shared_prefix,
    forward_with_aux,
    init,
    init_cache,
    layers_unrolled,
    logits,
    param_shardings,
    param_specs,
    positions_from_segments,
    prefill,
    shard_params,
    slot_blocks,
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
    "decode",
    "extend",
    "forward",
    "forward_shared_prefix",
    "forward_with_aux",
    "init",
    "init_cache",
    "layers_unrolled",
    "load_hf",
    "logits",
    "param_shardings",
    "param_specs",
    "positions_from_segments",
    "prefill",
    "save_hf",
    "shard_params",
    "slot_blocks",
    "unembed",
    "unembedding",
    "unstack_layers",
]
