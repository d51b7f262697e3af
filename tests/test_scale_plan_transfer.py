"""The memory plan's modelled weight transfer (bench.scale_plan.transfer) against a hand computation of
one cell: Qwen3-1.7B on 64 H100s, whose sampler devices sit in other nodes than the trainer's (InfiniBand)."""

import pytest

from bench import scale_plan


def test_qwen3_1p7b_on_64_h100s_matches_the_hand_count():
    d, f, heads, kv, hd, layers = 2048, 6144, 16, 8, 128, 28
    per_layer = 2 * d * heads * hd + 2 * d * kv * hd + 3 * d * f + 2 * d + 2 * hd  # q o, k v, mlp, norms, q/k norms
    params = 151936 * d + layers * per_layer + d  # tied embedding, layers, final norm
    r = 32  # rank x (in + out) per adapted weight: q, k, v, o, gate, up, down
    adapters = layers * r * (2 * (d + heads * hd) + 2 * (d + kv * hd) + 3 * (d + f))
    t = scale_plan.transfer("Qwen3-1.7B", 64, "H100")
    assert t["link_bytes_per_s"] == 50e9  # 400 Gb/s per GPU past a node of 8
    assert (t["f32_bytes"], t["bf16_bytes"], t["lora_bytes"]) == (4 * params, 2 * params, 4 * adapters)
    assert t["f32_s"] == pytest.approx(4 * params / 50e9) and t["f32_s"] == pytest.approx(0.1377, abs=1e-4)
    assert t["bf16_s"] == pytest.approx(t["f32_s"] / 2) and t["lora_s"] == pytest.approx(4 * adapters / 50e9)
    assert t["lora_held_bytes"] == 4 * (params + adapters)  # the float32 base, moved once, beside the adapters
    assert scale_plan.transfer("Qwen3-1.7B", 8, "H100")["link_bytes_per_s"] == 450e9  # one node: NVLink
