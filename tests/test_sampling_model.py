"""`generate` on tiny real decoders: cache vs full forward, log-probs, `transformers` greedy parity, seeds."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models, sampling, sharding
from grpo_jax import train_step as ts
from grpo_jax.config import MeshConfig, SamplingConfig
from grpo_jax.sampling import generate, pad_prompts

DENSE = models.ModelConfig(
    model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=5,
)
MOE = models.ModelConfig(
    model_type="qwen3_moe", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=5, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, decoder_sparse_step=2,  # layer 0 dense, layer 1 MoE
)
PROMPTS = [[1, 7, 9], [11, 12, 13, 14, 15, 16], [20], [30, 31, 32, 33]]
SCFG = SamplingConfig(max_prompt_len=8, max_new_tokens=10, group_size=3, temperature=0.8)


@pytest.fixture(scope="module", params=[DENSE, MOE], ids=["dense", "moe"])
def model(request):
    cfg = request.param
    return cfg, models.init(cfg, jax.random.key(0))


def full_sequences(prompts, rollout, group):
    """[prompt padding, prompt, completion] rows with segment ids (0 on padding and past the end)."""
    tokens = np.concatenate([np.repeat(prompts.tokens, group, 0), rollout.tokens], 1)
    width = prompts.tokens.shape[1]
    lengths = np.repeat(prompts.lengths, group)
    segments = np.concatenate([np.arange(width) >= width - lengths[:, None], rollout.mask], 1).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(segments)


def test_cached_decoding_matches_a_full_forward_at_every_step(model):
    """`models.prefill` encodes each prompt once; `models.decode` feeds the rollout's tokens one per slot
    (slot s is row s, continuing prompt s // G): its logits are those of a full forward at every step."""
    cfg, params = model
    scfg = SCFG
    prompts = pad_prompts(PROMPTS, scfg)
    rollout = generate(cfg, params, prompts, jax.random.key(1), scfg)
    tokens, segments = full_sequences(prompts, rollout, scfg.group_size)
    reference = models.logits(cfg, params, tokens, segment_ids=segments)
    width, steps, g = scfg.max_prompt_len, scfg.max_new_tokens, scfg.group_size
    valid = np.arange(width) >= width - np.asarray(prompts.lengths)[:, None]
    hidden, kv, _ = jax.jit(models.prefill, static_argnums=0)(
        cfg, params, prompts.tokens, np.maximum(np.arange(width) - (width - np.asarray(prompts.lengths)[:, None]), 0),
        valid.astype(np.int32))
    logits = np.repeat(models.unembed(cfg, params, hidden[:, -1]), g, axis=0)
    rows = len(PROMPTS) * g
    cache = models.init_cache(cfg, kv, jnp.asarray(valid), rows, steps - 1)
    step = jax.jit(models.decode, static_argnums=0)
    lengths = np.repeat(prompts.lengths, g)
    for t in range(steps):
        live = np.asarray(rollout.lengths) > t  # rows still generating at step t
        np.testing.assert_allclose(logits[live], reference[live, width - 1 + t], rtol=0, atol=1e-5)
        if t + 1 < steps:
            written = np.full(rows, t, np.int32)
            hidden, cache, _ = step(cfg, params, cache, rollout.tokens[:, t], lengths + t, written,
                                    np.arange(rows)[None] // g)
            logits = models.unembed(cfg, params, hidden)


def test_logprobs_equal_a_recomputation_on_the_finished_sequences(model):
    cfg, params = model
    for scfg in (SCFG, SamplingConfig(max_prompt_len=8, max_new_tokens=10, group_size=2, temperature=1.3,
                                      top_k=5, top_p=0.9, stop_tokens=(17,))):
        prompts = pad_prompts(PROMPTS, scfg)
        rollout = generate(cfg, params, prompts, jax.random.key(2), scfg)
        tokens, segments = full_sequences(prompts, rollout, scfg.group_size)
        logits = models.logits(cfg, params, tokens, segment_ids=segments)[:, scfg.max_prompt_len - 1 : -1]
        logprobs = jax.nn.log_softmax(logits / scfg.temperature, axis=-1)
        expected = np.take_along_axis(np.asarray(logprobs), np.asarray(rollout.tokens)[..., None], -1)[..., 0]
        mask = np.asarray(rollout.mask)
        np.testing.assert_allclose(np.where(mask, rollout.logprobs, 0), np.where(mask, expected, 0), atol=1e-5)
        ends = np.asarray(rollout.tokens)[np.arange(len(mask)), np.asarray(rollout.lengths) - 1]
        stopped = np.isin(ends, (5, *scfg.stop_tokens))
        np.testing.assert_array_equal(rollout.truncated, ~stopped)
        assert (np.asarray(rollout.lengths)[~stopped] == scfg.max_new_tokens).all()


def test_a_bfloat16_sampler_of_a_float32_model_samples_as_the_model_in_bfloat16():
    """SamplingConfig.compute_dtype='bfloat16' under a float32 model gives the bfloat16 model's rollout bit for
    bit, whose l^samp differ from the float32 recomputation (the trainer's l^old) by bfloat16 rounding."""
    params = models.init(DENSE, jax.random.key(0))
    prompts = pad_prompts(PROMPTS, SCFG)
    ours = generate(DENSE, params, prompts, jax.random.key(2), dataclasses.replace(SCFG, compute_dtype="bfloat16"))
    bf16 = generate(dataclasses.replace(DENSE, compute_dtype="bfloat16"), params, prompts, jax.random.key(2), SCFG)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(bf16)):
        np.testing.assert_array_equal(a, b)
    tokens, segments = full_sequences(prompts, ours, SCFG.group_size)
    logits = models.logits(DENSE, params, tokens, segment_ids=segments)[:, SCFG.max_prompt_len - 1 : -1]
    old = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits / SCFG.temperature)), np.asarray(ours.tokens)[..., None], -1)
    gap = np.abs(np.asarray(ours.logprobs) - old[..., 0])[np.asarray(ours.mask)]
    assert 1e-4 < gap.mean() < 0.05, gap.mean()


def test_moe_sampler_records_the_routes_of_a_full_forward():
    """Routing replay R3: the routes the sampler reports (prompt tokens from the prefill, completion
    tokens from decoding) are those of one forward over the finished sequences, at every token it ran;
    laid out like the train Batch (the row without its last token)."""
    params = models.init(MOE, jax.random.key(0))
    prompts = pad_prompts(PROMPTS, SCFG)
    rollout = generate(MOE, params, prompts, jax.random.key(1), SCFG)
    g, width = SCFG.group_size, SCFG.max_prompt_len
    lengths = np.repeat(np.asarray(prompts.lengths), g)
    tokens, positions, segments = ts.sequences(jnp.repeat(prompts.tokens, g, 0), jnp.asarray(lengths), rollout.tokens)
    _, aux = models.forward_with_aux(MOE, params, tokens[:, :-1], positions[:, :-1], segments[:, :-1])
    want, got = np.moveaxis(np.asarray(aux["routes"]), 0, 1), np.asarray(rollout.routes)
    assert got.shape == want.shape == (len(PROMPTS) * g, 1, width + SCFG.max_new_tokens - 1, 2)
    column = np.arange(got.shape[2])
    ran = (column >= width - lengths[:, None]) & (column < width + np.asarray(rollout.lengths)[:, None] - 1)
    assert ran[:, width:].sum() > 10  # decoded tokens are compared, not only the prompts
    np.testing.assert_array_equal(got[:, 0][ran], want[:, 0][ran])
    assert generate(DENSE, models.init(DENSE, jax.random.key(0)), prompts, jax.random.key(1), SCFG).routes is None


def test_same_seed_same_samples_whatever_the_batch_composition(model):
    """A row's tokens and log-probs are the same alone with its prompt's rows, beside other prompts, and
    under continuous batching on 5 or 2 slots (its neighbours and its slot change, not its samples)."""
    cfg, params = model
    key = jax.random.key(3)
    stop = dataclasses.replace(SCFG, stop_tokens=(17, 23, 40, 41, 42, 43))  # mixed lengths
    both = generate(cfg, params, pad_prompts(PROMPTS, stop), key, stop)
    assert len(set(np.asarray(both.lengths).tolist())) >= 3
    rows = 2 * SCFG.group_size
    for scfg in (stop, dataclasses.replace(stop, decode_slots=5), dataclasses.replace(stop, decode_slots=2)):
        first = generate(cfg, params, pad_prompts(PROMPTS[:2], scfg), key, scfg)
        np.testing.assert_array_equal(first.tokens, both.tokens[:rows])
        np.testing.assert_array_equal(first.lengths, both.lengths[:rows])
        np.testing.assert_array_equal(first.logprobs, both.logprobs[:rows])
        if cfg.num_experts:
            np.testing.assert_array_equal(first.routes, both.routes[:rows])
    both = generate(cfg, params, pad_prompts(PROMPTS, SCFG), key, SCFG)
    first = generate(cfg, params, pad_prompts(PROMPTS[:2], SCFG), key, SCFG)
    compiled = sampling.rollout._cache_size()
    other = generate(cfg, params, pad_prompts(PROMPTS[:2], SCFG), jax.random.key(4), SCFG)
    assert sampling.rollout._cache_size() == compiled  # a new seed, same shapes: no recompilation
    assert (np.asarray(other.tokens) != np.asarray(first.tokens)).any()
    samples = np.asarray(both.tokens).reshape(len(PROMPTS), SCFG.group_size, -1)
    assert (samples[:, 0] != samples[:, 1]).any()  # the G samples of a prompt differ


@pytest.mark.parametrize(
    "cfg,mesh_cfg",
    [(DENSE, MeshConfig(data=8)), (DENSE, MeshConfig(data=2, fsdp=2, tensor=2)),
     (MOE, MeshConfig(data=2, tensor=2, expert=2)),
     (dataclasses.replace(DENSE, layer_loop="scan"), MeshConfig(data=2, fsdp=2, tensor=2)),
     (dataclasses.replace(MOE, layer_loop="scan"), MeshConfig(fsdp=2, tensor=2, expert=2))],
    ids=["dense-data8", "dense-data2-fsdp2-tensor2", "moe-data2-tensor2-expert2", "scan-dense-data2-fsdp2-tensor2",
         "scan-moe-fsdp2-tensor2-expert2"],
)
def test_same_seed_same_samples_on_a_mesh_as_on_one_device(cfg, mesh_cfg):
    """8 rows (2 per prompt): on one device, and on meshes of 8, 4 and 2 lanes (devices holding rows),
    all rows at once and on 4 slots less than rows where the lanes allow it (a lane's slot takes its
    lane's next row)."""
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=10, group_size=2, stop_tokens=(17, 23, 40, 41))
    params = models.init(cfg, jax.random.key(0))
    prompts = pad_prompts(PROMPTS, scfg)
    single = generate(cfg, params, prompts, jax.random.key(5), scfg)
    mesh = sharding.make_mesh(mesh_cfg)
    lanes = mesh.shape["data"] * mesh.shape["fsdp"]
    if lanes < 8:
        scfg = dataclasses.replace(scfg, decode_slots=lanes)
    sharded = generate(cfg, models.shard_params(params, cfg, mesh), prompts, jax.random.key(5), scfg, mesh)
    np.testing.assert_array_equal(sharded.tokens, single.tokens)
    np.testing.assert_array_equal(sharded.lengths, single.lengths)
    np.testing.assert_allclose(sharded.logprobs, single.logprobs, atol=1e-5)
    if cfg.num_experts:
        np.testing.assert_array_equal(sharded.routes, single.routes)
    per_device = 8 // lanes  # rows really are split over (data, fsdp)
    assert {shard.data.shape[0] for shard in sharded.tokens.addressable_shards} == {per_device}


@pytest.mark.parametrize(
    "prompts,scfg,message",
    [
        ([[1] * 9], SCFG, "max_prompt_len=8"),
        ([[1, 2], []], SCFG, "prompt 1 is empty"),
    ],
)
def test_bad_prompts_fail_before_compiling(prompts, scfg, message):
    with pytest.raises(ValueError, match=message):
        generate(DENSE, None, pad_prompts(prompts, scfg), jax.random.key(0), scfg)


def test_bad_arrays_and_configs_fail_before_compiling():
    too_long = pad_prompts([[1, 2]], SCFG)
    with pytest.raises(ValueError, match="claims 9 tokens"):
        generate(DENSE, None, type(too_long)(too_long.tokens, jnp.array([9])), jax.random.key(0), SCFG)
    with pytest.raises(ValueError, match="empty"):
        generate(DENSE, None, type(too_long)(too_long.tokens, jnp.array([0])), jax.random.key(0), SCFG)
    with pytest.raises(ValueError, match="6 tokens wide"):
        generate(DENSE, None, pad_prompts([[1]], SamplingConfig(max_prompt_len=6)), jax.random.key(0), SCFG)
    with pytest.raises(ValueError, match="group_size=0"):
        SamplingConfig(group_size=0)
    with pytest.raises(ValueError, match="stop ids"):
        generate(DENSE, None, too_long, jax.random.key(0), SamplingConfig(max_prompt_len=8, stop_tokens=(96,)))


def test_program_size_is_flat_in_depth_under_the_scan():
    """With layer_loop="scan" neither the training and scoring forward nor the sampler (prefill and
    two decode loops over a stacked cache) grows with depth; unrolled, the sampler does."""
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=64, group_size=1)
    prompts = sampling.Prompts(jax.ShapeDtypeStruct((2, 8), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32))

    def lines(layers, loop):
        cfg = dataclasses.replace(DENSE, num_layers=layers, layer_loop=loop)
        params = jax.eval_shape(functools.partial(models.init, cfg), jax.random.key(0))
        tokens = jax.ShapeDtypeStruct((4, 8), jnp.int32)
        forward = jax.jit(models.forward, static_argnums=0).lower(cfg, params, tokens)
        rollout = sampling.rollout.lower(cfg, scfg, (5,), None, params, prompts, jax.random.key(0))
        return np.array([len(forward.as_text().splitlines()), len(rollout.as_text().splitlines())])

    assert (lines(16, "scan") <= 1.2 * lines(2, "scan")).all()
    assert lines(16, "unrolled")[1] > 3 * lines(2, "unrolled")[1]


@pytest.mark.parametrize("cfg", [DENSE, MOE, dataclasses.replace(DENSE, num_kv_heads=1)], ids=["dense", "moe", "mqa"])
def test_the_scanned_sampler_samples_what_the_unrolled_one_does(cfg):
    """layer_loop="scan" (the default on TPU and GPU) carries the slot cache stacked over layers through
    the layer scan; "unrolled" (CPU) keeps one buffer per layer: the same tokens, log-probs, lengths and
    routes, on 3 slots (MoE: the stack passes through two runs of layers)."""
    params = models.init(cfg, jax.random.key(0))
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=64, group_size=2, temperature=0.9, decode_slots=3)
    scanned, unrolled = (dataclasses.replace(cfg, layer_loop=loop) for loop in ("scan", "unrolled"))
    kv = (cfg.num_kv_heads,) if cfg.num_kv_heads > 1 else ()
    specs = models.cache_specs(scanned, 3, 600, 4, 8)  # 3 slots of 600 tokens (3 blocks of 256), 4 prompts of 8
    assert [b.shape for b in specs["k"]] == [(cfg.num_layers, 3, *kv, cfg.head_dim, 256)] * 3
    assert specs["prefix_v"].shape == (cfg.num_layers, 4, cfg.num_kv_heads, 8, cfg.head_dim)
    unrolled_v = models.cache_specs(unrolled, 3, 600, 4, 8)["v"]
    assert [[b.shape for b in layer] for layer in unrolled_v] == [[(3, *kv, 256, cfg.head_dim)] * 3] * cfg.num_layers
    prompts = pad_prompts(PROMPTS, scfg)
    a, b = (generate(c, params, prompts, jax.random.key(8), scfg) for c in (scanned, unrolled))
    assert len(set(np.asarray(b.lengths).tolist())) > 2  # rows stop at different steps
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    if cfg.num_experts:
        np.testing.assert_array_equal(a.routes, b.routes)


@pytest.mark.parametrize("cfg", [DENSE, MOE, dataclasses.replace(DENSE, num_kv_heads=1)], ids=["dense", "moe", "mqa"])
def test_rows_longer_than_an_attention_block_sample_what_a_full_forward_gives(cfg):
    """Completions of up to 300 tokens span two blocks of 256 own tokens (`slot_blocks`): the slot
    attention's online softmax over the prompt and the blocks a slot has written gives the log-probs
    of a full forward, on 3 slots as on all 16 rows at once (rows ending in both blocks)."""
    params = models.init(cfg, jax.random.key(0))
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=300, group_size=4)
    prompts = pad_prompts(PROMPTS, scfg)
    a, b = (generate(cfg, params, prompts, jax.random.key(3), s) for s in (scfg, dataclasses.replace(scfg, decode_slots=3)))
    assert models.slot_blocks(299) == (2, 256)
    assert {(n - 1) // 256 for n in np.asarray(a.lengths).tolist()} == {0, 1}  # rows end in both blocks
    tokens, segments = full_sequences(prompts, b, 4)
    logits = models.logits(cfg, params, tokens, segment_ids=segments)[:, 7:-1]
    want = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(b.tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.where(b.mask, b.logprobs, 0), np.where(b.mask, want, 0), atol=1e-5)
    np.testing.assert_array_equal(b.tokens, a.tokens)
    np.testing.assert_array_equal(b.lengths, a.lengths)
    np.testing.assert_array_equal(b.truncated, a.truncated)
    np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=1e-6)  # other matmul shapes: other rounding
    if cfg.num_experts:
        np.testing.assert_array_equal(b.routes, a.routes)


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
def test_decoding_reads_only_the_blocks_written(layer_loop):
    """A slot cache of 600 tokens is 3 blocks of 256 (`slot_blocks`); with every slot's tokens in the
    first, the step never reads the other two: filled with NaN (which any read would spread through the
    softmax's weighted sum), they change nothing. Filled from a later step on, they would."""
    cfg = dataclasses.replace(DENSE, layer_loop=layer_loop)
    params = models.init(cfg, jax.random.key(0))
    prompts = pad_prompts(PROMPTS, SCFG)
    width = SCFG.max_prompt_len
    valid = np.arange(width) >= width - np.asarray(prompts.lengths)[:, None]
    positions = np.maximum(np.arange(width) - (width - np.asarray(prompts.lengths)[:, None]), 0)
    _, kv, _ = models.prefill(cfg, params, prompts.tokens, positions, valid.astype(np.int32))
    cache = models.init_cache(cfg, kv, jnp.asarray(valid), 4, 600)

    def poison(cache, first):  # NaN in the blocks from `first` on, in either layout
        blocks = lambda bs: [jnp.full_like(b, jnp.nan) if i >= first else b for i, b in enumerate(bs)]  # noqa: E731
        per_layer = isinstance(cache["prefix_k"], list)
        return {**cache, **{n: [blocks(layer) for layer in cache[n]] if per_layer else blocks(cache[n]) for n in ("k", "v")}}

    step = jax.jit(models.decode, static_argnums=0)
    args = (jnp.arange(4) + 3, jnp.asarray(prompts.lengths) + 200, jnp.full(4, 200), jnp.arange(4)[None])
    clean, _, _ = step(cfg, params, cache, *args)
    skipped, _, _ = step(cfg, params, poison(cache, 1), *args)
    np.testing.assert_array_equal(skipped, clean)
    assert np.isfinite(clean).all()
    read, _, _ = step(cfg, params, poison(cache, 1), args[0], args[1] + 100, jnp.full(4, 300), args[3])
    assert np.isnan(read).all()  # written 300: the second block is read


def test_a_step_writes_its_token_into_its_block_only():
    """Slot s writes its key and value at its place `written[s]`, in the block holding it; the other
    blocks keep what they held (a negative place in a later block is out of range, not wrapped)."""
    cfg = dataclasses.replace(DENSE, layer_loop="unrolled")
    params = models.init(cfg, jax.random.key(0))
    _, kv, _ = models.prefill(cfg, params, jnp.ones((2, 3), jnp.int32), jnp.tile(jnp.arange(3), (2, 1)), jnp.ones((2, 3), jnp.int32))
    cache = models.init_cache(cfg, kv, jnp.ones((2, 3), bool), 2, 600)  # 3 blocks of 256
    _, cache, _ = models.decode(cfg, params, cache, jnp.array([4, 5]), jnp.array([13, 303]), jnp.array([10, 300]),
                                jnp.arange(2)[None])
    v = [np.asarray(b) for b in cache["v"][0]]  # layer 0's blocks [slots, kv_heads, 256, head_dim]
    written = [np.flatnonzero(np.abs(b).sum(axis=(1, 3)).T.any(axis=1)) for b in v]  # places holding a value
    assert [w.tolist() for w in written] == [[10], [44], []]  # slot 0 at 10 (block 0), slot 1 at 300 = 256 + 44
    assert np.abs(v[0][1]).sum() == 0 and np.abs(v[1][0]).sum() == 0
