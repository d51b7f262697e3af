"""Meshes, the logical-axis rules and sharded forwards on 8 simulated devices."""

import ast
import dataclasses
import functools
import pathlib
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from grpo_jax import algorithms, models, sampling, sharding
from grpo_jax import train_step as ts
from grpo_jax.config import Config, MeshConfig, SamplingConfig, TrainConfig

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
    sharded = models.shard_params(params, CFG, mesh)
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
    shardings = models.param_shardings(state, CFG, mesh)
    assert shardings[0].mu["layers"]["q"].spec == P(None, "fsdp", "tensor", None)
    assert shardings[0].nu["moe"]["down"].spec == P(None, "expert", "tensor", "fsdp")
    assert shardings[0].count.spec == P()
    placed = models.shard_params(state, CFG, mesh)
    assert placed[0].mu["embed"].sharding.spec == P("tensor", "fsdp")


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
def test_cache_shardings_and_sharded_decode(params, layer_loop):
    """The decoding cache's shardings in both layouts: stacked over layers under the scan (layers
    unsplit), one buffer per layer unrolled; slots and prompts over data and fsdp, kv heads over tensor.
    A sharded prefill and decode step keep them and compute what one device does."""
    cfg = dataclasses.replace(CFG, layer_loop=layer_loop)
    mesh = sharding.make_mesh(MeshConfig(2, 2, 2))
    s = models.cache_shardings(cfg, mesh, 8, 2, 4, 3)  # 8 slots of 2 tokens, 4 prompts of 3
    rows = P(("data", "fsdp"), "tensor", None, None)
    if layer_loop == "scan":  # k and v: a list of blocks (one here), each stacked over layers
        assert s["k"][0].spec == s["v"][0].spec == s["prefix_k"].spec == P(None, *rows)
    else:  # per layer
        assert len(s["k"]) == len(s["v"]) == len(s["prefix_v"]) == CFG.num_layers
        assert s["k"][0][0].spec == s["v"][-1][0].spec == s["prefix_k"][0].spec == rows
    assert s["prefix_valid"].spec == P(("data", "fsdp"), None)
    tokens = np.arange(12).reshape(4, 3) % CFG.vocab_size
    seg, pos = np.ones_like(tokens), np.broadcast_to(np.arange(3), (4, 3))
    sharded = models.shard_params(params, CFG, mesh)
    _, kv, _ = jax.jit(models.prefill, static_argnums=0)(cfg, sharded, tokens, pos, seg)
    cache = jax.device_put(models.init_cache(cfg, kv, jnp.ones((4, 3), bool), 8, 2), s)
    decode = jax.jit(models.decode, static_argnums=0, out_shardings=(None, s, None))
    nxt = np.arange(8) % CFG.vocab_size
    h, cache, _ = decode(cfg, sharded, cache, nxt, np.full(8, 3), np.zeros(8, int), np.zeros((4, 2), int))
    assert jax.tree.map(lambda a: a.sharding.spec, cache) == jax.tree.map(lambda t: t.spec, s)
    lane_prompt = np.repeat(np.arange(4), 2)  # 4 lanes of 2 slots, each lane holding its prompt
    full = models.forward(CFG, params, np.concatenate([tokens[lane_prompt], nxt[:, None]], 1))
    np.testing.assert_allclose(np.asarray(h), np.asarray(full[:, -1]), atol=1e-5)


def test_load_hf_places_each_tensor_with_its_sharding(params, tmp_path):
    models.save_hf(CFG, params, tmp_path)
    mesh = sharding.make_mesh(MeshConfig(1, 2, 4))
    _, loaded = models.load_hf(tmp_path, mesh=mesh)
    want = models.param_shardings(params, CFG, mesh)
    jax.tree.map(lambda a, s: (a.sharding == s) or pytest.fail(f"{a.sharding} != {s}"), loaded, want)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, params)


def test_global_batch_rejects_indivisible_batch():
    mesh = sharding.make_mesh(MeshConfig(4, 2, 1))
    with pytest.raises(ValueError, match="does not divide"):
        sharding.global_batch(np.zeros((6, 3)), mesh)
    ok = sharding.global_batch({"tokens": np.zeros((8, 3), np.int32)}, mesh)
    assert ok["tokens"].shape == (8, 3) and ok["tokens"].dtype == jnp.int32


def test_rows_go_to_devices_and_back():
    """global_batch places rows by the batch rule, local_rows reads them back once (the tensor axis holds
    replicas), gather gives the whole value. In one process, the process holds every row."""
    mesh = sharding.make_mesh(MeshConfig(2, 2, 2))
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    rows = sharding.process_rows(mesh, 8)
    np.testing.assert_array_equal(rows, np.arange(8))
    placed = sharding.global_batch(x, mesh, 8)
    assert placed.sharding.spec == P(("data", "fsdp"), None)
    assert {tuple(np.asarray(s.data)[:, 0]) for s in placed.addressable_shards} == {(0, 3), (6, 9), (12, 15), (18, 21)}
    np.testing.assert_array_equal(sharding.local_rows(placed, rows), x)
    np.testing.assert_array_equal(sharding.gather(placed), x)
    with pytest.raises(ValueError, match="holds 16 of the batch's 16 rows, but 8 were given"):
        sharding.global_batch(x, mesh, 16)


def test_activations_follow_the_batch_rule_under_set_mesh(params, reference):
    mesh = sharding.make_mesh(MeshConfig(1, 2, 4))
    tokens, want = reference
    with jax.set_mesh(mesh):
        hidden = jax.jit(models.forward, static_argnums=0)(
            CFG, models.shard_params(params, CFG, mesh), sharding.global_batch(tokens, mesh)
        )
    assert hidden.sharding.is_equivalent_to(sharding.batch_sharding(mesh, 3), 3)
    got = np.asarray(hidden) @ np.asarray(params["lm_head"])
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("moe_impl", ["dense", "ragged"])
def test_expert_parallel_forward_equals_unsharded(params, reference, moe_impl):
    cfg = dataclasses.replace(CFG, moe_impl=moe_impl)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2, expert=2))
    sharded = models.shard_params(params, cfg, mesh)
    assert sharded["moe"]["up"].sharding.spec == P(None, "expert", "fsdp", "tensor")
    tokens, want = reference  # the dense, unsharded logits
    got = jax.jit(models.logits, static_argnums=0)(cfg, sharded, sharding.global_batch(tokens, mesh))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


# ----------------------------------------------------------------------------- activation shardings
CONSTRAINT = re.compile(r"sdy.sharding_constraint %\S+ <@mesh, (\[.*?\])>")
BATCH = '{"data", "fsdp"}'


def constraints(lowered) -> set[str]:
    """The partition specs of every sharding constraint in a lowered program, as Shardy prints them."""
    return set(CONSTRAINT.findall(lowered.as_text()))


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 4)])
def test_train_step_pins_activations_by_the_rules(shape):
    """Rows over data+fsdp, heads and MLP over tensor; in the compiled step each device holds its
    rows of the residual stream in full (GSPMD alone split d_model over fsdp instead)."""
    rows, prompt, new = 8, 4, 3
    cfg = Config(model=CFG, sampling=SamplingConfig(max_prompt_len=prompt, max_new_tokens=new),
                 algorithm=algorithms.AlgorithmConfig.from_preset("gspo"), train=TrainConfig(micro_batches=2))
    mesh = sharding.make_mesh(MeshConfig(*shape))
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, 10, mesh)
    params = jax.eval_shape(functools.partial(models.init, CFG), jax.random.key(0))
    state = jax.eval_shape(lambda p: ts.init_state(p, optimizer), params)
    seq, per_row = (rows, prompt + new), (rows, new)
    batch = ts.Batch(*(jax.ShapeDtypeStruct(seq, jnp.int32) for _ in range(3)),
                     *(jax.ShapeDtypeStruct(per_row, jnp.float32) for _ in range(3)),
                     jax.ShapeDtypeStruct((rows,), jnp.float32))
    lowered = step.lower(state, None, batch)
    kv = "{}" if shape[2] == 4 else '{"tensor"}'  # 2 kv heads do not split over tensor=4
    assert {f"[{BATCH}, {{}}, {{}}]", f'[{BATCH}, {{}}, {{"tensor"}}, {{}}]', f"[{BATCH}, {{}}, {kv}, {{}}]",
            f'[{BATCH}, {{}}, {{"tensor"}}]', f'[{BATCH}, {{}}, {{"expert"}}, {{"tensor"}}]'} <= constraints(lowered)
    local_rows = rows // cfg.train.micro_batches // (shape[0] * shape[1])
    residual = f"f32[{local_rows},{prompt + new - 1},{CFG.hidden_size}]"
    assert residual in lowered.compile().as_text()


def test_sampler_pins_activations_by_the_rules():
    """Decoding on a (fsdp, tensor, expert) mesh: rows over data+fsdp, heads over tensor, experts over expert."""
    cfg = dataclasses.replace(CFG, eos_token_id=1)
    scfg = SamplingConfig(max_prompt_len=4, max_new_tokens=3, group_size=2)
    mesh = sharding.make_mesh(MeshConfig(data=1, fsdp=2, tensor=2, expert=2))
    params = jax.eval_shape(functools.partial(models.init, cfg), jax.random.key(0))
    prompts = sampling.Prompts(jax.ShapeDtypeStruct((4, 4), jnp.int32), jax.ShapeDtypeStruct((4,), jnp.int32))
    lowered = sampling.rollout.lower(cfg, scfg, (1,), mesh, params, prompts, jax.random.key(0))
    assert {f'[{BATCH}, {{}}, {{"tensor"}}, {{}}]', f'[{BATCH}, {{}}, {{"expert"}}, {{"tensor"}}]'} <= constraints(lowered)
    # a decode step's expert activations on one device: 4 of 8 rows, 2 of 4 experts, 8 of 16 MLP units
    assert "f32[4,1,2,8]" in lowered.compile().as_text()


def _sampler_gathers(cfg, mesh_cfg=MeshConfig(data=1, fsdp=8)) -> list[tuple[int, ...]]:
    """The result shapes of the all-gathers in the sampler compiled for 8 rows on a mesh, for params
    split as a run holds them."""
    mesh = sharding.make_mesh(mesh_cfg)
    params = jax.eval_shape(functools.partial(models.init, cfg), jax.random.key(0))
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params,
                          models.param_shardings(params, cfg, mesh))
    prompts = sampling.Prompts(jax.ShapeDtypeStruct((8, 4), jnp.int32), jax.ShapeDtypeStruct((8,), jnp.int32))
    scfg = SamplingConfig(max_prompt_len=4, max_new_tokens=96, group_size=1)
    text = sampling.rollout.lower(cfg, scfg, (1,), mesh, params, prompts, jax.random.key(0)).compile().as_text()
    return [tuple(map(int, s.split(","))) for s in re.findall(r"= f32\[([\d,]+)\]\S* all-gather(?:-start)?\(", text)]


def _weights(shapes):  # the gathers of a weight: a result with a hidden_size (32) axis
    return [s for s in shapes if 32 in s]


def test_the_unrolled_sampler_gathers_each_weight_once():
    """On an fsdp mesh the unrolled sampler gathers each weight once, before the prefill, for the prefill
    and the decode loop. XLA hoists a loop's gathers of its loop-invariant weights out of the loop, so
    without that the loop held a gathered copy of every weight of its own (with the segmented cache
    before continuous batching, one per segment: Qwen3-1.7B, 8 devices, 37 GiB)."""
    cfg = dataclasses.replace(CFG, eos_token_id=1, layer_loop="unrolled")
    split = [s.shape for s in jax.tree.leaves(models.param_specs(cfg), is_leaf=sharding.is_spec) if "embed" in s.axes]
    assert sorted(_weights(_sampler_gathers(cfg))) == sorted(split)


def test_the_scanned_sampler_gathers_one_layer_at_a_time():
    """Under the layer scan (the default on TPU and GPU) the sampler gathers each layer's weights inside
    the loop: no gathered weight carries the stacked layer axis (6 layers: 1 dense, 5 MoE), so no device
    holds a whole gathered copy of the model, as it does unrolled. The embeddings and the lm_head, read
    outside the scan, are gathered once, for the prefill and the decode loop (each loop of the
    segmented cache before gathered its own: Qwen3-8B on 64 devices, 12.2 GiB of sampler temporaries
    against 3.5)."""
    cfg = dataclasses.replace(CFG, eos_token_id=1, num_layers=6)
    stacked = lambda shapes: [s for s in _weights(shapes) if s[0] in (5, 6)]  # noqa: E731
    tables = lambda shapes: sorted(s for s in shapes if s in ((64, 32), (32, 64)))  # noqa: E731 — embed, lm_head
    assert stacked(_sampler_gathers(dataclasses.replace(cfg, layer_loop="unrolled")))
    gathers = _sampler_gathers(dataclasses.replace(cfg, layer_loop="scan"))
    assert _weights(gathers) and not stacked(gathers)
    assert tables(gathers) == [(32, 64), (64, 32)]


@pytest.mark.parametrize("layer_loop", ["unrolled", "scan"])
def test_the_sampler_gathers_the_logits_not_the_lm_head_over_tensor(layer_loop):
    """With the vocabulary split over tensor, the sampler gathers each step's [rows, vocab] logits, never
    the [hidden, vocab] lm_head: asked for whole rows at once, XLA gathered the weight over tensor in the
    prefill and in each decode loop (Qwen3-8B on 64 devices: 4 x 2.3 GiB)."""
    cfg = dataclasses.replace(CFG, eos_token_id=1, layer_loop=layer_loop)
    shapes = _sampler_gathers(cfg, MeshConfig(data=1, fsdp=4, tensor=2))
    assert (32, CFG.vocab_size) not in shapes
    rows = [s for s in shapes if len(s) == 2 and s[0] == 2 and s[1] >= CFG.vocab_size]  # 8 rows over fsdp=4
    assert rows  # a step's logits (or the sampler's weights of them, padded to its blocks of 128)


def test_an_indivisible_dimension_warns_once_naming_rule_and_shape():
    mesh = sharding.make_mesh(MeshConfig(1, 2, 4))
    with pytest.warns(UserWarning, match=r"'heads'.*shape \(4, 6, 8\).*size 6 does not divide over tensor=4"):
        assert sharding.logical_spec(("batch", "heads", None), (4, 6, 8), mesh) == P(("data", "fsdp"), None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharding.logical_spec(("batch", "heads", None), (4, 6, 8), mesh)  # the same (rule, shape): silent


# ----------------------------------------------------------------------------- one-way imports
def test_sharding_imports_neither_the_models_nor_the_run_config():
    """The dependency runs one way, models -> sharding: importing sharding (in a fresh process) loads
    no other grpo_jax module, and no grpo_jax module imports sharding inside a function to dodge a cycle."""
    code = "import sys, grpo_jax.sharding; print(sorted(m for m in sys.modules if m.startswith('grpo_jax')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['grpo_jax',", "'grpo_jax.sharding']"]
    def imports_sharding(n) -> bool:  # import grpo_jax.sharding / from grpo_jax(.sharding) import ...
        if isinstance(n, ast.Import):
            return any(a.name == "grpo_jax.sharding" for a in n.names)
        return isinstance(n, ast.ImportFrom) and (n.module == "grpo_jax.sharding" or (
            n.module == "grpo_jax" and any(a.name == "sharding" for a in n.names)))

    late = []
    for path in pathlib.Path(sharding.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                late += [f"{path.name}:{n.lineno}" for n in ast.walk(node) if imports_sharding(n)]
    assert late == []


# ----------------------------------------------------------------------------- sharding tolerance
def _state(cfg):
    optimizer = ts.make_optimizer(Config(model=cfg).optim, 10)
    return jax.eval_shape(lambda: ts.init_state(models.init(cfg, jax.random.key(0)), optimizer))


def test_adamw_state_on_an_fsdp_mesh_passes_the_sharding_tolerance_silently():
    cfg = Config(model=CFG, mesh=MeshConfig(data=1, fsdp=8), algorithm=algorithms.AlgorithmConfig.from_preset("gspo"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ts.compiled_train_step(cfg, 10, sharding.make_mesh(cfg.mesh))
        assert sharding.check_replicated(_state(CFG), models.param_specs(CFG), sharding.make_mesh(cfg.mesh), 0.0) == 0
        # a mesh of data alone keeps whole weights by design: nothing to check
        assert sharding.check_replicated(_state(CFG), models.param_specs(CFG), sharding.make_mesh(MeshConfig()), 0.0) == 0


def test_replicated_bytes_that_could_be_split_warn_once_naming_the_largest_leaves_and_the_rule():
    """2 kv heads on tensor=4: k and v (params, mu, nu) stay whole, 9.6% of the state, within the
    default tolerance; an optimizer leaf that matches no parameter is reported, not silently replicated."""
    sharding._warn_once.cache_clear()
    mesh = sharding.make_mesh(MeshConfig(data=2, tensor=4))
    state, specs = _state(CFG), models.param_specs(CFG)
    with pytest.warns(UserWarning, match=r"9\.6% of the train state's \d+ bytes stays whole on every device of the mesh "
                      r"\(data=2, fsdp=1, tensor=4, expert=1\).*largest: layers/k \(12288 bytes in 3 leaves, shape "
                      r"\(2, 32, 2, 8\): rule 'kv_heads' -> tensor=4 does not divide 2\); layers/v .*RULES, the MeshConfig"):
        assert sharding.check_replicated(state, specs, mesh, 0.1) == pytest.approx(0.096, abs=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharding.check_replicated(state, specs, mesh, 0.1)  # once
    flat = {"state": state, "extra": {"moments": jax.ShapeDtypeStruct((1024,), jnp.float32)}}
    with pytest.warns(UserWarning, match=r"\['extra'\]\['moments'\] \(4096 bytes in 1 leaves, shape \(1024,\) matches "
                      r"no ParamSpec"):
        sharding.check_replicated(flat, specs, sharding.make_mesh(MeshConfig(data=1, fsdp=8)), 0.1)


def test_too_many_replicated_bytes_fail_before_compiling_with_what_to_change():
    """4 heads on tensor=8: q, o, k and v stay whole, 28.8% of the train state, above the default 10%."""
    cfg = Config(model=CFG, mesh=MeshConfig(data=1, tensor=8), algorithm=algorithms.AlgorithmConfig.from_preset("gspo"))
    with pytest.raises(ValueError, match=r"28\.8% of the train state's .*largest: layers/o \(24576 bytes in 3 leaves, "
                       r"shape \(2, 4, 8, 32\): rule 'heads' -> tensor=8 does not divide 4\).*and 1 more\. Change "
                       r"grpo_jax.sharding.RULES.*above MeshConfig.max_replicated_fraction=0.1"):
        ts.compiled_train_step(cfg, 10, sharding.make_mesh(cfg.mesh))
    ok = dataclasses.replace(cfg, mesh=MeshConfig(data=1, tensor=8, max_replicated_fraction=0.3))
    with pytest.warns(UserWarning, match=r"28\.8%.*within MeshConfig.max_replicated_fraction=0.3"):
        ts.compiled_train_step(ok, 10, sharding.make_mesh(ok.mesh))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_max_replicated_fraction_is_a_fraction(bad):
    with pytest.raises(ValueError, match=rf"MeshConfig.max_replicated_fraction={bad} must be in \[0, 1\]"):
        MeshConfig(max_replicated_fraction=bad)
