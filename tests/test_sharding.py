"""Meshes, the logical-axis rules and sharded forwards on 8 simulated devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from grpo_jax import models, sharding
from grpo_jax.config import MeshConfig

MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]
CFG = models.ModelConfig(
    model_type="qwen3_moe",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    mlp_only_layers=(0,),
)


@pytest.fixture(scope="module")
def params():
    return jax.jit(models.init, static_argnums=0)(CFG, jax.random.key(0))


@pytest.fixture(scope="module")
def reference(params):
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (8, 6))
    return tokens, np.asarray(jax.jit(models.logits, static_argnums=0)(CFG, params, tokens))


def test_make_mesh_resolves_minus_one():
    mesh = sharding.make_mesh(MeshConfig(data=-1, tensor=2))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2, "expert": 1}
    one = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    assert dict(one.shape) == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1}


@pytest.mark.parametrize("bad", [MeshConfig(data=3), MeshConfig(data=-1, fsdp=-1), MeshConfig(data=-1, fsdp=3)])
def test_make_mesh_rejects_shapes_that_do_not_fit(bad):
    with pytest.raises(ValueError, match="MeshConfig"):
        sharding.make_mesh(bad)


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_unsharded(params, reference, shape):
    mesh = sharding.make_mesh(MeshConfig(*shape))
    sharded = sharding.shard_params(params, CFG, mesh)
    layers, moe, mlp = sharded["layers"], sharded["moe"], sharded["mlp"]
    tensor = 4 if shape[2] == 4 else None  # 2 kv heads cannot split over tensor=4: replicated
    assert layers["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert layers["k"].sharding.spec == P(None, "fsdp", "tensor" if tensor is None else None, None)
    assert layers["o"].sharding.spec == P(None, "tensor", None, "fsdp")
    assert layers["attn_norm"].sharding.spec == P(None, None)
    assert mlp["down"].sharding.spec == P(None, "tensor", "fsdp")
    assert moe["gate"].sharding.spec == P(None, "expert", "fsdp", "tensor")
    assert moe["router"].sharding.spec == P(None, "fsdp", None)
    assert sharded["embed"].sharding.spec == P("tensor", "fsdp")
    assert sharded["lm_head"].sharding.spec == P("fsdp", "tensor")
    tokens, want = reference
    batch = sharding.global_batch(tokens, mesh)
    assert batch.sharding.spec == P(("data", "fsdp"), None)
    got = jax.jit(models.logits, static_argnums=0)(CFG, sharded, batch)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_optimizer_state_follows_param_shardings(params):
    mesh = sharding.make_mesh(MeshConfig(2, 2, 2))
    state = optax.adam(1e-3).init(params)
    shardings = sharding.param_shardings(state, CFG, mesh)
    assert shardings[0].mu["layers"]["q"].spec == P(None, "fsdp", "tensor", None)
    assert shardings[0].nu["moe"]["down"].spec == P(None, "expert", "tensor", "fsdp")
    assert shardings[0].count.spec == P()
    placed = sharding.shard_params(state, CFG, mesh)
    assert placed[0].mu["embed"].sharding.spec == P("tensor", "fsdp")


def test_cache_shardings_and_sharded_extend(params):
    mesh = sharding.make_mesh(MeshConfig(2, 2, 2))
    s = sharding.cache_shardings(CFG, mesh, batch=4, max_len=8)
    assert len(s["k"]) == len(s["v"]) == CFG.num_layers  # one buffer per layer
    assert {x.spec for x in s["k"] + s["v"]} == {P(("data", "fsdp"), "tensor", None, None)}
    assert s["segment_ids"].spec == P(("data", "fsdp"), None)
    cache = jax.device_put(models.init_cache(CFG, 4, 8), s)
    tokens = np.arange(12).reshape(4, 3) % CFG.vocab_size
    seg = np.ones_like(tokens)
    pos = np.broadcast_to(np.arange(3), (4, 3))
    extend = jax.jit(models.extend, static_argnums=0, out_shardings=(None, s, None))
    h, cache, _ = extend(CFG, sharding.shard_params(params, CFG, mesh), tokens, pos, seg, cache, 0)
    assert [k.sharding.spec for k in cache["k"]] == [x.spec for x in s["k"]]
    np.testing.assert_allclose(np.asarray(h), np.asarray(models.forward(CFG, params, tokens)), atol=1e-5)


def test_load_hf_places_each_tensor_with_its_sharding(params, tmp_path):
    models.save_hf(CFG, params, tmp_path)
    mesh = sharding.make_mesh(MeshConfig(1, 2, 4))
    _, loaded = models.load_hf(tmp_path, mesh=mesh)
    want = sharding.param_shardings(params, CFG, mesh)
    jax.tree.map(lambda a, s: (a.sharding == s) or pytest.fail(f"{a.sharding} != {s}"), loaded, want)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, params)


def test_global_batch_rejects_indivisible_batch():
    mesh = sharding.make_mesh(MeshConfig(4, 2, 1))
    with pytest.raises(ValueError, match="does not divide"):
        sharding.global_batch(np.zeros((6, 3)), mesh)
    ok = sharding.global_batch({"tokens": np.zeros((8, 3), np.int32)}, mesh)
    assert ok["tokens"].shape == (8, 3) and ok["tokens"].dtype == jnp.int32


def test_activations_follow_the_batch_rule_under_set_mesh(params, reference):
    mesh = sharding.make_mesh(MeshConfig(1, 2, 4))
    tokens, want = reference
    with jax.set_mesh(mesh):
        hidden = jax.jit(models.forward, static_argnums=0)(
            CFG, sharding.shard_params(params, CFG, mesh), sharding.global_batch(tokens, mesh)
        )
    assert hidden.sharding.is_equivalent_to(sharding.batch_sharding(mesh, 3), 3)
    got = np.asarray(hidden) @ np.asarray(params["lm_head"])
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("moe_impl", ["dense", "ragged"])
def test_expert_parallel_forward_equals_unsharded(params, reference, moe_impl):
    cfg = dataclasses.replace(CFG, moe_impl=moe_impl)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2, expert=2))
    sharded = sharding.shard_params(params, cfg, mesh)
    assert sharded["moe"]["up"].sharding.spec == P(None, "expert", "fsdp", "tensor")
    tokens, want = reference  # the dense, unsharded logits
    got = jax.jit(models.logits, static_argnums=0)(cfg, sharded, sharding.global_batch(tokens, mesh))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
