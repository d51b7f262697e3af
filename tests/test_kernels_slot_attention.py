"""The decode attention kernel (kernels/slot_attention.py) in Pallas' TPU interpreter: against float64
numpy, per slot only its own written blocks read, and through the sampler equal to the plain path it
replaces (`decode_attention="xla"`), in both cache layouts, with GQA and one kv head, on a mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models, sampling, sharding
from grpo_jax.config import MeshConfig, SamplingConfig
import kernels
from kernels import slot_attention

DENSE = models.ModelConfig(model_type="qwen3", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=5)


@pytest.fixture
def kernel_traces(monkeypatch):
    """The `interpret` flag of each trace of kernels.slot_attention: True where CPU runs the kernel (a path
    that silently took the plain attention would pass the equality tests below); False where only the
    TPU branch of decode_attention="auto" was traced, never lowered here."""
    traces = []

    def counted(*args, **kwargs):
        traces.append(kwargs["interpret"])
        return slot_attention(*args, **kwargs)

    monkeypatch.setattr(kernels, "slot_attention", counted)
    return traces


def reference(q, pk, pv, valid, prompt, kb, vb, written, layer=None):
    """Softmax attention in float64 of each slot over its prompt's valid keys and its places 0..written."""
    q, pk, pv = (np.asarray(a, np.float64) for a in (q, pk, pv))
    slots, kv, _, hd = q.shape
    unit = kb[0].ndim == 3 + (layer is not None)  # one kv head: own blocks without the axis
    lanes = prompt.shape[0]
    prefix = (prompt + pk.shape[0] // lanes * np.arange(lanes)[:, None]).reshape(-1)
    out = np.zeros(q.shape)
    for s in range(slots):
        for h in range(kv):
            pick = (lambda a, i: a[i]) if unit else (lambda a, i: a[i, h])  # noqa: E731
            keys, values = [pk[prefix[s], h][:, valid[prefix[s]]]], [pv[prefix[s], h][valid[prefix[s]]]]
            for i, (k, v) in enumerate(zip(kb, vb)):
                k, v = (np.asarray(a if layer is None else a[layer], np.float64) for a in (k, v))
                mine = i * v.shape[-2] + np.arange(v.shape[-2]) <= written[s]
                keys.append(pick(k, s)[:, mine]), values.append(pick(v, s)[mine])
            x = q[s, h] @ np.concatenate(keys, 1) / np.sqrt(hd)
            w = np.exp(x - x.max(-1, keepdims=True))
            out[s, h] = (w / w.sum(-1, keepdims=True)) @ np.concatenate(values)
    return out


def inputs(unit: bool, stacked: bool, seed: int = 0):
    """6 slots in 2 lanes of 2 prefixes each, 3 blocks of 4 own places, prompts of 5 places (some padding)."""
    rng = np.random.default_rng(seed)
    slots, kv, g, hd, prompt_len, size, prefixes = 6, 1 if unit else 2, 2, 8, 5, 4, 4
    heads = () if unit else (kv,)
    layers = (3,) if stacked else ()
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    valid = rng.random((prefixes, prompt_len)) < 0.7
    valid[:, -1] = True
    return dict(q=f(slots, kv, g, hd), pk=f(prefixes, kv, hd, prompt_len), pv=f(prefixes, kv, prompt_len, hd),
                valid=valid, prompt=rng.integers(0, 2, (2, 3)).astype(np.int32),
                kb=[f(*layers, slots, *heads, hd, size) for _ in range(3)],
                vb=[f(*layers, slots, *heads, size, hd) for _ in range(3)],
                written=np.array([0, 3, 4, 11, 7, 1], np.int32), layer=1 if stacked else None)


def run(x):
    return np.asarray(slot_attention(
        jnp.asarray(x["q"]), jnp.asarray(x["pk"]), jnp.asarray(x["pv"]), jnp.asarray(x["valid"]),
        jnp.asarray(x["prompt"]), [jnp.asarray(b) for b in x["kb"]], [jnp.asarray(b) for b in x["vb"]],
        jnp.asarray(x["written"]), None if x["layer"] is None else jnp.int32(x["layer"]), interpret=True))


@pytest.mark.parametrize("unit,stacked", [(False, False), (True, False), (False, True)], ids=["gqa", "one_kv_head", "stacked"])
def test_the_kernel_is_float64_attention_over_each_slots_prompt_and_written_places(unit, stacked):
    x = inputs(unit, stacked)
    np.testing.assert_allclose(run(x), reference(**x), rtol=0, atol=2e-6)


def test_a_slot_reads_only_its_own_written_blocks():
    """NaN in every block past each slot's last written one (slot 3 writes into the third block, the
    others do not): the kernel reads none of them; the plain path reads up to the longest slot's."""
    x = inputs(False, False)
    for i, (k, v) in enumerate(zip(x["kb"], x["vb"])):
        past = i * 4 > x["written"]
        k[past], v[past] = np.nan, np.nan
    out = run(x)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, reference(**inputs(False, False)), rtol=0, atol=2e-6)


@pytest.mark.parametrize("layer_loop,kv_heads,mesh", [("unrolled", 1, None), ("scan", 2, (2, 2))],
                         ids=["unrolled-one-kv-head", "scan-gqa-mesh"])
def test_the_sampler_with_the_kernel_samples_what_the_plain_path_does(layer_loop, kv_heads, mesh, monkeypatch,
                                                                     kernel_traces):
    """Slot blocks of 8 own places (`SLOT_BLOCK` lowered from 256 for the interpreter's sake), rows of up to
    20 tokens ending in different blocks, 3 slots (4 on the mesh) refilled as rows end, G = 2: the same tokens and log-probs
    with decode_attention="pallas" (interpreted) as with "xla": unrolled with one kv head, and scanned with GQA
    on a mesh of 2 data x 2 tensor devices, where the kernel runs per device with the kv heads split."""
    monkeypatch.setattr(models.decoder, "SLOT_BLOCK", 8)
    cfg = dataclasses.replace(DENSE, layer_loop=layer_loop, num_kv_heads=kv_heads)
    params = models.init(cfg, jax.random.key(0))
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=20, group_size=2, decode_slots=4 if mesh else 3,
                          temperature=3.0)
    prompts = sampling.pad_prompts([[1, 7, 9], [11, 12, 13, 14, 15, 16], [20], [30, 31]], scfg)
    plain = sampling.generate(cfg, params, prompts, jax.random.key(3), scfg)
    assert True not in kernel_traces
    kernel_cfg = dataclasses.replace(cfg, decode_attention="pallas")
    if mesh is None:
        out = sampling.generate(kernel_cfg, params, prompts, jax.random.key(3), scfg)
    else:
        m = sharding.make_mesh(MeshConfig(data=mesh[0], tensor=mesh[1]), jax.devices()[:4])
        out = sampling.generate(kernel_cfg, models.shard_params(params, cfg, m), sharding.global_batch(prompts, m),
                                jax.random.key(3), scfg, mesh=m)
    assert True in kernel_traces  # the kernel ran, interpreted
    assert models.slot_blocks(19) == (3, 8) and len({(n - 1) // 8 for n in np.asarray(plain.lengths).tolist()}) > 1
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_allclose(out.logprobs, plain.logprobs, rtol=0, atol=2e-5)


def test_pallas_decode_attention_is_refused_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    cfg = dataclasses.replace(DENSE, decode_attention="pallas")
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=1)
    with pytest.raises(ValueError, match="decode_attention='pallas' is a TPU kernel"):
        sampling.generate(cfg, models.init(cfg, jax.random.key(0)), sampling.pad_prompts([[1, 2]], scfg),
                          jax.random.key(0), scfg)
    with pytest.raises(ValueError, match="decode_attention='fast' is not understood"):
        dataclasses.replace(DENSE, decode_attention="fast")


def test_a_bfloat16_decode_step_is_the_plain_paths_to_bfloat16_rounding(kernel_traces):
    """A bfloat16 sampler's step (bf16 keys, values and queries; logits and softmax in float32 on both
    paths): the kernel's hidden states are the plain path's within bfloat16 rounding, slots written into
    different blocks (`SLOT_BLOCK` 8)."""
    cfg = dataclasses.replace(DENSE, compute_dtype="bfloat16", layer_loop="scan")
    params = models.init(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 96, (2, 6)), jnp.int32)
    _, kv, _ = models.prefill(cfg, params, tokens, jnp.tile(jnp.arange(6), (2, 1)), jnp.ones((2, 6), jnp.int32))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(models.decoder, "SLOT_BLOCK", 8)
        cache = models.init_cache(cfg, kv, jnp.ones((2, 6), bool), 4, 24)
        assert len(cache["k"]) == 3  # blocks of 8 places
        cache = {**cache, **{n: [jnp.asarray(np.random.default_rng(i).normal(size=b.shape), b.dtype)
                                 for i, b in enumerate(cache[n])] for n in ("k", "v")}}  # every place "written"
        args = (jnp.arange(4) + 3, jnp.array([6, 9, 20, 29]), jnp.array([0, 3, 14, 23]), jnp.array([[0, 0, 1, 1]]))
        plain, _, _ = models.decode(cfg, params, cache, *args)
        assert True not in kernel_traces  # "auto" traces the TPU branch only
        kernel, _, _ = models.decode(dataclasses.replace(cfg, decode_attention="pallas"), params, cache, *args)
    assert True in kernel_traces  # "pallas" ran it, interpreted
    np.testing.assert_allclose(np.asarray(kernel, np.float32), np.asarray(plain, np.float32), rtol=0, atol=0.02)
