"""The Pallas kernels lower for the platforms CI does not have.

`jax.export` from this CPU host lowers a program for TPU and for CUDA: the kernels go through
Pallas' Mosaic TPU and Triton lowerings (block-shape rules, power-of-two tensors, supported
primitives) exactly as on those machines, and the Triton modules through the MLIR verifier, short of
the device compiler itself (bench/gpu.py ran them on an H100). Values and
gradients are tested in interpret mode (test_kernels_logprobs.py, test_kernels_ratio_clip.py)."""

import jax
import jax.numpy as jnp
import pytest

from kernels import fused_logprobs, ratio_clip

TRITON = "__gpu$xla.gpu.triton"  # XLA's Triton custom call: no export compatibility guarantee
KERNEL_CALL = {"tpu": "@tpu_custom_call", "cuda": "@" + TRITON}
# SmolLM2's d_model (576) is no power of two and the vocabulary is no multiple of any tile.
N, D, V = 1000, 576, 5003


@pytest.fixture(autouse=True)
def triton_modules_verified(monkeypatch):
    """Every Triton module Pallas lowers is run through the MLIR verifier, as XLA's Triton compile does
    first on a GPU: `jax.export` alone would not catch a malformed kernel. (On an H100 a loop bound of
    the wrong integer type, which Pallas lowered without complaint, failed there; this check fails the
    same way here.) Reaches into jax's private Pallas Triton lowering: if that moves, update the path."""
    from jax._src.pallas.triton import lowering

    lower = lowering.lower_jaxpr_to_triton_module

    def lower_and_verify(*args, **kwargs):
        result = lower(*args, **kwargs)
        result.module.operation.verify()  # raises MLIRError naming the op
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", lower_and_verify)


def _lowered(fn, platform, *args):
    exported = jax.export.export(
        jax.jit(fn), platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)],
    )(*args)
    return exported.mlir_module()


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
@pytest.mark.parametrize("transposed,w_dtype", [(False, jnp.bfloat16), (True, jnp.bfloat16), (True, jnp.float32)])
def test_fused_logprobs_lowers(platform, transposed, w_dtype):
    """Forward, d hidden and d unembed: three kernels, bf16 hidden, entropy on, default tiles; and
    no [N, V] array anywhere in the program. float32 weights against bf16 activations (a bf16-compute
    train step's tied embedding) too: Triton's dot refuses mixed operands (found on an H100)."""
    w_shape = (V, D) if transposed else (D, V)
    args = [jax.ShapeDtypeStruct(s, dt) for s, dt in
            (((N, D), jnp.bfloat16), (w_shape, w_dtype), ((N,), jnp.int32))]

    def loss(h, w, t):
        logp, ent = fused_logprobs(h, w, t, 0.7, impl="pallas", return_entropy=True,
                                   transposed=transposed)
        return jnp.sum(logp + 0.1 * ent)

    text = _lowered(jax.value_and_grad(loss, (0, 1)), platform, *args)
    assert text.count(KERNEL_CALL[platform]) == 3
    assert f"{N}x{V}" not in text


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_ratio_clip_lowers(platform):
    """Default blocks: 256 x 128 on TPU, 8 x 128 on GPU (19,200 units pad to 256 rows)."""
    x = jax.ShapeDtypeStruct((64, 300), jnp.float32)

    def loss(log_ratio, adv):
        return jnp.sum(ratio_clip(log_ratio, adv, 0.2, 0.28, clip_c=3.0, impl="pallas")[0])

    text = _lowered(jax.value_and_grad(loss, (0, 1)), platform, x, x)
    assert text.count(KERNEL_CALL[platform]) == 2
    if platform == "cuda":  # 8-row blocks (Mosaic's grid is inside its serialized kernel)
        assert text.count("grid_x = 32 ") == 2


@pytest.mark.parametrize("interpret_as", ["tpu", "gpu"])
def test_cpu_runs_the_interpreted_kernels_it_is_asked_for(interpret_as):
    """For CPU only interpreted kernels are lowered (`kernels._launch.per_platform`), of the family
    `interpret_as` names: the Triton kernels pad N=20 token rows to a 32-row tile, the Mosaic ones
    take all 20 as one tile."""
    h, w, t = jnp.ones((20, 16)), jnp.ones((16, 40)), jnp.zeros((20,), jnp.int32)
    text = _lowered(lambda h, w: fused_logprobs(h, w, t, 1.0, impl="pallas",
                                                interpret_as=interpret_as), "cpu", h, w)
    assert "custom_call" not in text
    assert ("tensor<32x16xf32>" in text) == (interpret_as == "gpu")


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
def test_a_decode_step_lowers_the_slot_attention_kernel_for_tpu_only(layer_loop):
    """`decode_attention="auto"`: a TPU decode step runs kernels.slot_attention (Mosaic), one per layer
    (the scanned layout's one in the scan body, reading its layer of the stacked blocks); CUDA and CPU
    lower the plain path, with no kernel."""
    from grpo_jax import models

    cfg = models.ModelConfig(model_type="qwen3", vocab_size=96, hidden_size=256, intermediate_size=512, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=64, eos_token_id=5, layer_loop=layer_loop,
                             compute_dtype="bfloat16")
    params = models.init(cfg, jax.random.key(0))
    tokens = jnp.ones((2, 16), jnp.int32)
    _, kv, _ = models.prefill(cfg, params, tokens, jnp.tile(jnp.arange(16), (2, 1)), jnp.ones((2, 16), jnp.int32))
    cache = models.init_cache(cfg, kv, jnp.ones((2, 16), bool), 4, 600)  # 3 blocks of 256 own places

    def step(params, cache, written):
        return models.decode(cfg, params, cache, jnp.ones(4, jnp.int32), written + 16, written,
                             jnp.array([[0, 0, 1, 1]]))[0]

    calls = {p: _lowered(step, p, params, cache, jnp.arange(4)).count(KERNEL_CALL.get(p, "custom_call"))
             for p in ("tpu", "cuda", "cpu")}
    assert calls == {"tpu": 1 if layer_loop == "scan" else 2, "cuda": 0, "cpu": 0}
