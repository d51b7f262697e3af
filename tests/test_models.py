"""Decoder parity with PyTorch `transformers` on tiny random models, cache, packing and HF I/O."""

import dataclasses
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from grpo_jax import models
from grpo_jax.models.decoder import LAYOUT_ENV

VOCAB = 97
KINDS = {  # name -> (HF config class, extra kwargs)
    "llama3": (
        transformers.LlamaConfig,
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "qwen2": (transformers.Qwen2Config, dict(rope_theta=10000.0)),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=12)),  # head_dim != hidden / heads
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        dict(
            head_dim=12,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            norm_topk_prob=True,
            mlp_only_layers=[1],  # one dense layer in the middle: two scanned runs of MoE layers
        ),
    ),
}
CASES = [("llama3", False), ("llama3", True), ("qwen2", True), ("qwen3", False), ("qwen3_moe", False)]


def make_hf(kind: str, tie: bool, seed: int = 0):
    cls, extra = KINDS[kind]
    hf_cfg = cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        max_position_embeddings=256,
        **extra,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
    with torch.no_grad():  # larger than the default init so that every term matters in the logits
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Every case saved once by `save_pretrained` (safetensors): {(kind, tie): (torch model, dir)}."""
    out = {}
    for kind, tie in CASES:
        model = make_hf(kind, tie)
        path = tmp_path_factory.mktemp(f"{kind}_{tie}")
        model.save_pretrained(path)
        out[(kind, tie)] = (model, path)
    return out


def left_padded(lengths, total, seed=0):
    """Tokens, segment ids (0 = left padding) and positions for rows of different prompt lengths."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, (len(lengths), total))
    seg = np.array([[0] * (total - n) + [1] * n for n in lengths], np.int32)
    pos = np.maximum(np.cumsum(seg, axis=1) - 1, 0).astype(np.int32)
    return tokens, seg, pos


def torch_logits(model, tokens, seg, pos):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(seg),
            position_ids=torch.tensor(pos, dtype=torch.long),
        )
    return out.logits.numpy()


jit_logits = jax.jit(models.logits, static_argnums=0)
jit_forward = jax.jit(models.forward, static_argnums=0)


@pytest.mark.parametrize("kind,tie", CASES)
def test_logits_match_transformers_left_padded(hf_dirs, kind, tie):
    model, path = hf_dirs[(kind, tie)]
    cfg, params = models.load_hf(path)
    assert cfg.model_type == kind.replace("llama3", "llama") and cfg.tie_word_embeddings == tie
    assert ("lm_head" in params) == (not tie)
    tokens, seg, pos = left_padded([7, 4, 2], 7)
    ours = np.asarray(jit_logits(cfg, params, tokens, pos, seg))
    ref = torch_logits(model, tokens, seg, pos)
    valid = seg.astype(bool)
    assert np.abs(ours - ref)[valid].max() <= 1e-4
    assert np.isfinite(ours).all()  # padding rows attend to nothing yet stay finite


def test_positions_from_segments():
    seg = jnp.array([[0, 0, 1, 1, 1], [1, 1, 2, 2, 2], [1, 2, 2, 0, 0]])
    want = [[0, 1, 0, 1, 2], [0, 1, 0, 1, 2], [0, 0, 1, 0, 1]]
    np.testing.assert_array_equal(models.positions_from_segments(seg), want)


def test_packed_segments_equal_separate_rows(hf_dirs):
    _, path = hf_dirs[("qwen2", True)]
    cfg, params = models.load_hf(path)
    a, b = np.arange(1, 6), np.arange(20, 23)
    packed = np.concatenate([a, b])[None]
    seg = np.array([[1] * 5 + [2] * 3])
    hidden = jit_forward(cfg, params, packed, None, seg)  # positions restart per segment
    alone_a = jit_forward(cfg, params, a[None])
    alone_b = jit_forward(cfg, params, b[None])
    np.testing.assert_allclose(hidden[:, :5], alone_a, atol=1e-5)
    np.testing.assert_allclose(hidden[:, 5:], alone_b, atol=1e-5)


jit_prefill = jax.jit(models.prefill, static_argnums=0)
jit_decode = jax.jit(models.decode, static_argnums=0)


@pytest.mark.parametrize("kind", ["llama3", "qwen3_moe"])
def test_prefill_and_decode_equal_forward(hf_dirs, kind):
    """Left-padded prompts encoded by `prefill`, then 4 tokens fed one per slot by `decode` (slot s
    continues prompt s): the hidden states and router logits of a forward over the whole rows."""
    _, path = hf_dirs[(kind, False)]
    cfg, params = models.load_hf(path)
    prompt, total = 5, 9
    tokens, seg, pos = left_padded([5, 3, 1], prompt)
    new = np.random.default_rng(1).integers(0, VOCAB, (3, total - prompt))
    tokens = np.concatenate([tokens, new], 1)
    seg = np.concatenate([seg, np.ones_like(new)], 1)
    pos = np.concatenate([pos, pos[:, -1:] + 1 + np.arange(total - prompt)], 1)
    full, full_aux = models.forward_with_aux(cfg, params, tokens, pos, seg)

    h, kv, aux = jit_prefill(cfg, params, tokens[:, :prompt], pos[:, :prompt], seg[:, :prompt])
    cache = models.init_cache(cfg, kv, jnp.asarray(seg[:, :prompt] > 0), 3, 7)
    hs, router = [h], [aux.get("router_logits")]
    for t in range(prompt, total):
        h, cache, aux = jit_decode(cfg, params, cache, tokens[:, t], pos[:, t], np.full(3, t - prompt), np.arange(3)[None])
        hs.append(h[:, None])
        router.append(aux.get("router_logits"))
    valid = seg.astype(bool)
    np.testing.assert_allclose(np.concatenate(hs, 1)[valid], np.asarray(full)[valid], atol=1e-5)
    if kind == "qwen3_moe":
        assert full_aux["router_logits"].shape == (2, 3, total, 4)  # layers 0 and 2 are MoE
        got = np.concatenate(router, axis=2)
        np.testing.assert_allclose(got[:, valid], np.asarray(full_aux["router_logits"])[:, valid], atol=1e-5)


@pytest.mark.parametrize("lanes", [1, 2])
def test_slots_share_their_prompts_prefix(hf_dirs, lanes):
    """Two prompts encoded once each, continued by G = 3 slots each: two decoded tokens per slot equal
    a forward over G separate copies of the prompts. In 2 lanes, lane l holds prompt l and its slots
    name it as their lane's prefix 0."""
    _, path = hf_dirs[("llama3", False)]
    cfg, params = models.load_hf(path)
    tokens, seg, pos = left_padded([4, 2], 4)
    _, kv, _ = jit_prefill(cfg, params, tokens, pos, seg)
    g = 3
    cache = models.init_cache(cfg, kv, jnp.asarray(seg > 0), 2 * g, 2)
    shapes = lambda tree: {a.shape[-4:] for a in jax.tree.leaves(tree)}  # noqa: E731 — per layer, either layout
    assert shapes(cache["prefix_k"]) == {(2, cfg.num_kv_heads, cfg.head_dim, 4)}  # each prompt stored once
    assert shapes(cache["k"]) == {(2 * g, cfg.num_kv_heads, cfg.head_dim, 2)}
    prompt = np.repeat(np.arange(2), g)[None] if lanes == 1 else np.zeros((2, g), int)
    nxt = np.arange(4 * g).reshape(2 * g, 2) + 5
    next_pos = np.repeat(pos[:, -1:], g, axis=0) + np.arange(1, 3)
    for t in range(2):
        h, cache, _ = jit_decode(cfg, params, cache, nxt[:, t], next_pos[:, t], np.full(2 * g, t), prompt)
    full = jit_forward(
        cfg,
        params,
        np.concatenate([np.repeat(tokens, g, 0), nxt], 1),
        np.concatenate([np.repeat(pos, g, 0), next_pos], 1),
        np.concatenate([np.repeat(seg, g, 0), np.ones_like(nxt)], 1),
    )
    np.testing.assert_allclose(h, full[:, -1], atol=1e-5)


@pytest.mark.parametrize("attention", sorted(set(models.ATTENTION) - {"reference"}))
def test_attention_kernels_agree(hf_dirs, attention):
    _, path = hf_dirs[("qwen3", False)]
    cfg, params = models.load_hf(path, attention=attention)
    ref_cfg, _ = models.load_hf(path, attention="reference")
    tokens, seg, pos = left_padded([6, 3], 6)
    np.testing.assert_allclose(
        jit_forward(ref_cfg, params, tokens, pos, seg) * seg[..., None],
        jit_forward(cfg, params, tokens, pos, seg) * seg[..., None],
        atol=1e-5,
    )


def test_remat_policies_give_the_same_gradients(hf_dirs):
    _, path = hf_dirs[("qwen3", False)]
    tokens = np.arange(12).reshape(2, 6)

    def loss(c, p):
        return jnp.mean(models.logits(c, p, tokens) ** 2)

    grads = []
    for remat in ["none", "full", "dots"]:
        cfg, params = models.load_hf(path, remat=remat)
        grads.append(jax.jit(jax.grad(loss, argnums=1), static_argnums=0)(cfg, params))
    for g in grads[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grads[0], g)


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_unrolled_layers_equal_the_layer_scan(hf_dirs, kind, monkeypatch):
    """layer_loop="unrolled" (the layer scan unrolled into straight-line code) computes what the scan
    does: hidden states, router logits and every gradient; on the dense model (one run of 3 layers) and
    on the MoE model whose MoE, dense, MoE layers make three runs of one. "auto" unrolls on CPU (without
    the session's GRPO_JAX_LAYOUT=accelerator)."""
    monkeypatch.delenv(LAYOUT_ENV)
    _, path = hf_dirs[(kind, False)]
    tokens, seg, pos = left_padded([7, 4], 7)

    def loss(c, p):
        hidden, aux = models.forward_with_aux(c, p, tokens, pos, seg)
        return jnp.mean(hidden**2) + jnp.mean(aux.get("router_logits", 0.0) ** 2), (hidden, aux)

    outs, loops = [], []
    for loop in ["scan", "unrolled", "auto"]:
        cfg, params = models.load_hf(path, layer_loop=loop)
        step = jax.jit(jax.grad(loss, argnums=1, has_aux=True), static_argnums=0)
        loops.append(step.lower(cfg, params).as_text().count("stablehlo.while"))
        outs.append(step(cfg, params))
    if kind == "qwen3":  # the 3-layer scan and its transpose are loops; unrolled, none is left (a run of
        assert loops == [2, 0, 0 if jax.default_backend() == "cpu" else 2]  # one layer lowers to a loop either way)
    for out in outs[1:]:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outs[0], out)


def test_auto_scans_the_layers_under_remat(monkeypatch):
    """Unrolled, XLA:CPU keeps what remat would free (a 4-layer gradient under remat="full": ~2.5 MB of
    temporaries against ~0.8 scanned), so "auto" scans the layers without a cache whenever remat is
    on; the sampler's cache stays one buffer per layer on CPU (the CPU rule: without the session's
    GRPO_JAX_LAYOUT=accelerator)."""
    monkeypatch.delenv(LAYOUT_ENV)
    base = models.ModelConfig(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=4,
                              num_heads=4, num_kv_heads=2, head_dim=8, remat="full")
    tokens = np.arange(128).reshape(2, 64) % base.vocab_size
    temps, loops = {}, {}
    for loop in ("scan", "unrolled", "auto"):
        cfg = dataclasses.replace(base, layer_loop=loop)
        params = jax.eval_shape(functools.partial(models.init, cfg), jax.random.key(0))
        lowered = jax.jit(jax.grad(lambda p, cfg=cfg: jnp.mean(models.forward(cfg, p, tokens) ** 2))).lower(params)
        temps[loop] = lowered.compile().memory_analysis().temp_size_in_bytes
        loops[loop] = lowered.as_text().count("stablehlo.while")
    assert loops == {"scan": 2, "unrolled": 0, "auto": 2}
    assert temps["auto"] == temps["scan"] and temps["unrolled"] > 2 * temps["scan"]
    on_cpu = jax.default_backend() == "cpu"
    assert isinstance(models.cache_specs(dataclasses.replace(base, layer_loop="auto"), 1, 4, 1, 4)["prefix_k"], list) == on_cpu


def test_auto_picks_the_layout_by_backend(monkeypatch):
    """`layers_unrolled` is the one rule of layer_loop="auto": on CPU the layers run unrolled, except
    without a cache (training, scoring) under remat, which scans; on TPU and GPU, and on CPU with
    GRPO_JAX_LAYOUT=accelerator (what the test session sets, tests/conftest.py), they scan and the
    KV cache is stacked over layers. "scan" and "unrolled" hold on every backend and either way."""
    assert os.environ[LAYOUT_ENV] == "accelerator"  # the suite tests the accelerator layout by default
    base = models.ModelConfig(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=3,
                              num_heads=4, num_kv_heads=2, head_dim=8)
    cases = [(remat, cache) for remat in ("none", "full", "dots") for cache in (True, False)]

    def rule(loop="auto"):
        return {(r, c): models.layers_unrolled(dataclasses.replace(base, remat=r, layer_loop=loop), c) for r, c in cases}

    on_cpu = jax.default_backend() == "cpu"
    for env in (None, "", "accelerator"):
        if env is None:
            monkeypatch.delenv(LAYOUT_ENV)
        else:
            monkeypatch.setenv(LAYOUT_ENV, env)
        cpu_layout = on_cpu and env != "accelerator"
        assert rule() == {(r, c): cpu_layout and (c or r == "none") for r, c in cases}, env
        assert rule("scan") == dict.fromkeys(cases, False) and rule("unrolled") == dict.fromkeys(cases, True)
        k = models.cache_specs(base, 2, 5, 1, 4)["k"]  # one block of 5 tokens
        if cpu_layout:
            assert [[a.shape for a in layer] for layer in k] == [[(2, 2, 8, 5)]] * 3
        else:
            assert [a.shape for a in k] == [(3, 2, 2, 8, 5)]
    monkeypatch.setenv(LAYOUT_ENV, "cpu")
    with pytest.raises(ValueError, match="GRPO_JAX_LAYOUT='cpu' is not understood; use 'accelerator' or leave it unset"):
        models.layers_unrolled(base)
    assert not models.layers_unrolled(dataclasses.replace(base, layer_loop="scan"))  # read only for "auto"


def test_ragged_experts_equal_dense_experts(hf_dirs):
    _, path = hf_dirs[("qwen3_moe", False)]
    tokens = np.arange(14).reshape(2, 7)

    def loss(c, p):
        hidden, aux = models.forward_with_aux(c, p, tokens)
        return jnp.mean(hidden**2) + jnp.mean(aux["router_logits"] ** 2), hidden

    outs = []
    for impl in ["dense", "ragged"]:
        cfg, params = models.load_hf(path, moe_impl=impl)
        outs.append(jax.jit(jax.grad(loss, argnums=1, has_aux=True), static_argnums=0)(cfg, params))
    np.testing.assert_allclose(outs[0][1], outs[1][1], atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), outs[0][0], outs[1][0])


def test_bfloat16_compute_close_to_float32(hf_dirs):
    _, path = hf_dirs[("qwen2", True)]
    cfg, params = models.load_hf(path)
    bf_cfg, bf_params = models.load_hf(path, dtype="bfloat16")
    assert bf_params["embed"].dtype == jnp.bfloat16 and bf_cfg.compute_dtype == "bfloat16"
    tokens = np.arange(10).reshape(2, 5)
    ref = jit_logits(cfg, params, tokens)
    got = jit_logits(bf_cfg, bf_params, tokens)
    assert got.dtype == jnp.float32
    assert float(jnp.abs(got - ref).max()) < 0.1 * float(jnp.abs(ref).max())


@pytest.mark.parametrize("kind,tie", [("llama3", True), ("qwen2", True), ("qwen3_moe", False)])
def test_save_hf_round_trip(hf_dirs, tmp_path, kind, tie):
    model, path = hf_dirs[(kind, tie)]
    cfg, params = models.load_hf(path)
    models.save_hf(cfg, params, tmp_path)
    cfg2, params2 = models.load_hf(tmp_path)
    assert cfg2 == cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params, params2)  # bit-exact
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    tokens, seg, pos = left_padded([6, 3], 6)
    valid = seg.astype(bool)
    np.testing.assert_allclose(
        torch_logits(reloaded, tokens, seg, pos)[valid],
        torch_logits(model, tokens, seg, pos)[valid],
        atol=1e-5,
    )


def test_save_hf_bfloat16_bit_exact(hf_dirs, tmp_path):
    _, path = hf_dirs[("qwen3", False)]
    cfg, params = models.load_hf(path, dtype="bfloat16")
    models.save_hf(cfg, params, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    _, params2 = models.load_hf(tmp_path, dtype="bfloat16")
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params, params2)


def test_sharded_checkpoint_loads(tmp_path):
    model = make_hf("qwen3", False, seed=3)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert (tmp_path / "model.safetensors.index.json").exists()
    cfg, params = models.load_hf(tmp_path)
    tokens, seg, pos = left_padded([5, 5], 5)
    np.testing.assert_allclose(jit_logits(cfg, params, tokens, pos, seg), torch_logits(model, tokens, seg, pos), atol=1e-4)


def test_save_hf_shards_a_large_model_with_an_index_transformers_reads(hf_dirs, tmp_path):
    model, path = hf_dirs[("qwen3", False)]
    cfg, params = models.load_hf(path)
    models.save_hf(cfg, params, tmp_path, max_shard_bytes=20_000)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(files) > 1 and sorted(set(index["weight_map"].values())) == files
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    tokens, seg, pos = left_padded([5, 5], 5)
    np.testing.assert_allclose(torch_logits(reloaded, tokens, seg, pos), torch_logits(model, tokens, seg, pos), atol=1e-5)
    models.save_hf(cfg, params, tmp_path)  # one file again: the shards of the earlier export are gone
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    jax.tree.map(np.testing.assert_array_equal, models.load_hf(tmp_path)[1], params)


def test_init_matches_param_specs():
    cfg = models.ModelConfig.from_hf(make_hf("qwen3_moe", False).config.to_dict())
    params = jax.jit(models.init, static_argnums=0)(cfg, jax.random.key(0))
    shapes = jax.tree.map(lambda s: s.shape, models.param_specs(cfg), is_leaf=lambda x: isinstance(x, models.ParamSpec))
    assert jax.tree.map(jnp.shape, params) == shapes
    assert params["layers"]["q_norm"].min() == 1.0
    assert jit_forward(cfg, params, np.zeros((1, 3), np.int32)).shape == (1, 3, 32)


def test_unembedding_tied_is_embedding_transpose(hf_dirs):
    cfg, params = models.load_hf(hf_dirs[("llama3", True)][1])
    np.testing.assert_array_equal(models.unembedding(cfg, params), params["embed"].T)


# ----------------------------------------------------------------------------- user errors
@pytest.fixture
def copy_of(hf_dirs, tmp_path):
    def copy(kind="qwen2", tie=True):
        dst = tmp_path / "model"
        shutil.copytree(hf_dirs[(kind, tie)][1], dst)
        return dst

    return copy


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_config_json_names_the_file(copy_of):
    path = copy_of()
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf(path)


def test_missing_tensor_names_the_tensor(copy_of):
    path = copy_of()
    edit_config(path, num_hidden_layers=4)
    with pytest.raises(ValueError, match=r"model\.layers\.3\.input_layernorm\.weight is missing"):
        models.load_hf(path)


def test_misshapen_tensor_names_tensor_and_file(copy_of):
    path = copy_of()
    edit_config(path, intermediate_size=40)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor model\.layers\.0\.mlp\.\w+_proj\.weight has shape"):
        models.load_hf(path)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"]), "model_type"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)), "rope_type"),
        (dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_unsupported_config_names_the_field(copy_of, changes, field):
    path = copy_of()
    edit_config(path, **changes)
    with pytest.raises(ValueError, match=field):
        models.load_hf(path)


def test_missing_config_field_is_named(copy_of):
    path = copy_of()
    cfg = json.loads((path / "config.json").read_text())
    del cfg["hidden_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="config.json: required field 'hidden_size' is missing"):
        models.load_hf(path)


def test_bad_dtype_names_the_field(copy_of):
    path = copy_of()
    with pytest.raises(ValueError, match="dtype='float8'"):
        models.load_hf(path, dtype="float8")
    with pytest.raises(ValueError, match="compute_dtype"):
        models.load_hf(path, compute_dtype="half-ish")


def test_bad_run_options_name_the_field(copy_of):
    path = copy_of()
    with pytest.raises(ValueError, match="attention='flash9'"):
        models.load_hf(path, attention="flash9")
    with pytest.raises(ValueError, match="remat='some'"):
        models.load_hf(path, remat="some")
    with pytest.raises(ValueError, match=r"layer_loop='unroll' is not understood; use one of \('auto', 'scan', 'unrolled'\)"):
        models.load_hf(path, layer_loop="unroll")
