"""LoRA: the adapted product against the merged weight, the merged HF export against the adapter forward,
sharding by the RULES table, a frozen base, adapter-only optimizer state and checkpoints, resume."""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from grpo_jax import checkpoint, lora, models, run, sampling, sharding, trainer
from grpo_jax.config import MeshConfig, SamplingConfig

from test_trainer import MODEL, config

LORA = lora.LoraConfig(rank=4, alpha=8.0)
QWEN2 = models.ModelConfig(model_type="qwen2", vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8)


def random_adapters(model_cfg, cfg, seed=1):
    """Adapters with B != 0 (fresh ones are zero: the base model), so the adapted model differs."""
    fresh = lora.init(model_cfg, cfg, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(fresh))))
    return jax.tree.map(lambda a: a + 0.05 * jax.random.normal(next(keys), a.shape), fresh)


@pytest.mark.parametrize("equation", ["btd,dnh->btnh", "btnh,nhd->btd", "btd,df->btf", "btf,fd->btd"])
def test_the_adapted_product_equals_the_product_with_the_merged_weight(equation):
    """LoraWeight.dense (x [b, t, *in] @ W over the weight's leading input axes) against the float64
    einsum with W = base + scale a b formed explicitly."""
    x_axes, w_axes = equation.split("->")[0].split(",")
    size = dict(b=2, t=3, d=5, n=2, h=3, f=7)
    rng = np.random.default_rng(0)
    x = rng.standard_normal([size[c] for c in x_axes])
    w = rng.standard_normal([size[c] for c in w_axes])
    inputs = [c for c in w_axes if c in x_axes]
    a = rng.standard_normal([*(size[c] for c in inputs), 4])
    b = rng.standard_normal([4, *(size[c] for c in w_axes if c not in inputs)])
    merged = w + 0.5 * (a.reshape(-1, 4) @ b.reshape(4, -1)).reshape(w.shape)  # float64 reference
    with jax.enable_x64():
        got = lora.LoraWeight(jnp.asarray(w), jnp.asarray(a), jnp.asarray(b), 0.5).dense(
            jnp.asarray(x), len(inputs))
    np.testing.assert_allclose(got, np.einsum(equation, x, merged), rtol=1e-10)


def test_fresh_adapters_are_the_base_model_and_a_merged_export_is_the_adapted_model(tmp_path):
    base = models.init(QWEN2, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(3), (2, 7), 0, QWEN2.vocab_size)
    fresh = lora.init(QWEN2, LORA, jax.random.key(1))
    np.testing.assert_array_equal(models.logits(QWEN2, lora.attach(base, fresh, LORA), tokens),
                                  models.logits(QWEN2, base, tokens))
    adapters = random_adapters(QWEN2, LORA)
    adapted = models.logits(QWEN2, lora.attach(base, adapters, LORA), tokens)
    assert np.abs(adapted - models.logits(QWEN2, base, tokens)).max() > 1e-2  # the adapters matter
    checkpoint.export_hf(QWEN2, lora.merge(base, adapters, LORA), tmp_path / "hf")
    cfg, exported = models.load_hf(tmp_path / "hf")
    assert set(jax.tree.leaves(jax.tree.map(lambda a: a.shape, exported))) <= set(
        jax.tree.leaves(jax.tree.map(lambda a: a.shape, base)))  # plain weights: no adapter in the file
    np.testing.assert_allclose(models.logits(cfg, exported, tokens), adapted, rtol=1e-5, atol=1e-5)


def test_adapters_are_sharded_by_the_rules_table_and_sharded_equals_unsharded():
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    specs = lora.specs(QWEN2, LORA)
    shardings = sharding.spec_shardings(specs, mesh)
    want = {  # A: the weight's input axes then rank; B: rank then the weight's output axes
        ("layers", "q", "a"): P(None, "fsdp", None), ("layers", "q", "b"): P(None, None, "tensor", None),
        ("layers", "o", "a"): P(None, "tensor", None, None), ("layers", "o", "b"): P(None, None, "fsdp"),
        ("mlp", "up", "b"): P(None, None, "tensor"), ("mlp", "down", "a"): P(None, "tensor", None),
    }
    for (group, name, part), spec in want.items():
        assert shardings[group][name][part].spec == spec, (group, name, part)
    base = models.init(QWEN2, jax.random.key(0))
    adapters = random_adapters(QWEN2, LORA)
    tokens = jax.random.randint(jax.random.key(3), (8, 5), 0, QWEN2.vocab_size)
    placed = jax.device_put(adapters, shardings)
    sharded = jax.jit(lambda b, a, t: models.logits(QWEN2, lora.attach(b, a, LORA), t))(
        models.shard_params(base, QWEN2, mesh), placed, tokens)
    np.testing.assert_allclose(sharded, models.logits(QWEN2, lora.attach(base, adapters, LORA), tokens), atol=2e-5)


def test_config_errors():
    with pytest.raises(ValueError, match="LoraConfig.targets=.*choose a non-empty subset"):
        lora.LoraConfig(rank=2, targets=("q", "lm_head"))
    with pytest.raises(ValueError, match="rank=-1 must be >= 0"):
        lora.LoraConfig(rank=-1)
    moe = dataclasses.replace(QWEN2, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=16)
    assert set(lora.specs(moe, lora.LoraConfig(rank=2, targets=("q", "o")))["layers"]) == {"q", "o"}
    with pytest.raises(ValueError, match="no mlp gate weight .*experts, which LoRA does not adapt"):
        lora.specs(moe, lora.LoraConfig(rank=2, targets=("q", "gate")))


def lora_config(out, **train):
    """The trainer tests' run on a (2, 1, 4) mesh, GRPO with its KL term (beta > 0), adapters of rank 4."""
    cfg = config(out, "grpo", steps=2, checkpoint_every=1, export_hf=True, **train)
    return dataclasses.replace(cfg, lora=LORA)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 2-step run, moved to `done/` once finished: later ones reuse the name `run` (same config and
    compilations)."""
    tmp = tmp_path_factory.mktemp("lora")
    base = models.init(MODEL, jax.random.key(0))
    result = run.train(lora_config(tmp / "run"), base)
    (tmp / "run").rename(tmp / "done")
    return tmp, base, result


def test_training_moves_only_the_adapters_and_the_base_is_the_reference(lora_run):
    tmp, base, result = lora_run
    adapters = result["params"]
    assert jax.tree.structure(adapters) == jax.tree.structure(lora.init(MODEL, LORA, jax.random.key(0)))
    assert all(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(adapters["layers"]["q"]["b"]))  # B moved

    t = trainer.Trainer(lora_config(tmp / "run"))
    t.restore(checkpoint.Checkpointer(tmp / "done" / "checkpoints", 1, 2), 2)
    assert t.ref_params is not None and t.cfg.algorithm.beta > 0
    # one copy of the base: the policy (and sampler) read the very arrays the reference (beta > 0) reads
    assert t.policy_params["layers"]["q"].base is t.ref_params["layers"]["q"]
    assert t.policy_params["embed"] is t.ref_params["embed"]
    adapter_shapes = {a.shape for a in jax.tree.leaves(t.state.params)}
    moments = [x for x in jax.tree.leaves(t.state.opt_state) if x.ndim]
    assert moments and {x.shape for x in moments} <= adapter_shapes  # optimizer state: adapters only
    assert sum(x.size for x in jax.tree.leaves(t.state.params)) < 0.25 * sum(x.size for x in jax.tree.leaves(base))
    assert set(t.checkpoint_state()) == {"train", "rng"}  # adapter-only checkpoints: the base is not saved
    frozen, trained = (jax.tree.map(np.array, x) for x in (t.ref_params, t.state.params))
    t.train_step()  # 2 more updates: the adapters move, the trainer's base stays bit-identical
    assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(t.state.params)))
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(t.ref_params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    # On the (data 2, tensor 4) mesh, up's B [layers, rank, mlp=64] and its Adam moments split mlp over tensor
    up_b = [x for path, x in jax.tree.flatten_with_path(t.state)[0]
            if [getattr(k, "key", None) for k in path[-3:]] == ["mlp", "up", "b"]]
    assert len(up_b) == 3 and all(x.sharding.spec == P(None, None, "tensor") for x in up_b)


def test_the_exported_policy_is_the_adapted_model(lora_run):
    tmp, base, result = lora_run
    tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, MODEL.vocab_size)
    cfg, exported = models.load_hf(tmp / "done" / "hf")
    adapted = models.logits(MODEL, lora.attach(base, result["params"], LORA), tokens)
    np.testing.assert_allclose(models.logits(cfg, exported, tokens), adapted, rtol=1e-5, atol=1e-5)


def test_a_lora_run_resumes_exactly(lora_run):
    """Killed after step 2's logs, before its checkpoint: the resumed run redoes step 2 bit for bit."""
    tmp, base, result = lora_run
    again = tmp / "run"
    shutil.rmtree(again, ignore_errors=True)
    shutil.copytree(tmp / "done", again)
    shutil.rmtree(again / "checkpoints" / "2")
    resumed = run.train(lora_config(again), base)
    for a, b in zip(jax.tree.leaves(result["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed["last_eval"] == result["last_eval"]


@pytest.mark.parametrize("layer_loop", ["unrolled", "scan"])
def test_sampling_a_lora_policy_on_a_mesh_equals_one_device(layer_loop):
    """The sampler over base weights with adapters attached, on a data x fsdp x tensor mesh and 4 decode
    slots for its 8 rows (one per lane), samples what one device does with all rows at once, under
    either layer loop: unrolled, the sampler gathers the weights a param spec
    names once and leaves a LoRA weight's base and adapters in their layout; scanned, every layer's
    weights are sliced and gathered inside the layer scan."""
    cfg = dataclasses.replace(QWEN2, layer_loop=layer_loop, eos_token_id=3)
    base, adapters = models.init(cfg, jax.random.key(0)), random_adapters(cfg, LORA)
    scfg = SamplingConfig(max_prompt_len=6, max_new_tokens=40, group_size=2)
    prompts = sampling.pad_prompts([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], scfg)
    one_device = dataclasses.replace(cfg, layer_loop="unrolled")
    want = sampling.generate(one_device, lora.attach(base, adapters, LORA), prompts, jax.random.key(4), scfg)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    placed = jax.device_put(adapters, sharding.spec_shardings(lora.specs(cfg, LORA), mesh))
    policy = lora.attach(models.shard_params(base, cfg, mesh), placed, LORA)
    got = sampling.generate(cfg, policy, prompts, jax.random.key(4), dataclasses.replace(scfg, decode_slots=4), mesh)
    assert len(set(np.asarray(want.lengths).tolist())) > 1  # rows stop at different steps
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_adapters_resume_only_onto_the_base_they_were_trained_on(tmp_path):
    """The base of a LoRA run is not saved (it is model_path): its checkpoints hold the base's
    fingerprint, and a resume onto another base of the same architecture is refused (it went on silently)."""
    for name, key in (("base", 0), ("other", 1)):
        models.save_hf(MODEL, models.init(MODEL, jax.random.key(key)), tmp_path / name)

    def cfg(base, steps):
        c = lora_config(tmp_path / "run")
        return dataclasses.replace(c, model=None, model_path=str(tmp_path / base),
                                   train=dataclasses.replace(c.train, steps=steps, export_hf=False))

    run.train(cfg("base", 1))
    assert models.fingerprint(tmp_path / "base") != models.fingerprint(tmp_path / "other")
    with pytest.raises(ValueError, match=r"holds LoRA adapters trained on the base model of .*/base, but "
                                         r"model_path=.*/other holds other weights"):
        run.train(cfg("other", 2))
    assert run.train(cfg("base", 2))["resumed_from"] == 1
