"""One pass on a GPU: its two ceilings, the Pallas kernels checked and timed on the device, and the train
step's model FLOPs utilisation (MFU) and greedy decoding's bandwidth fraction on a Qwen3-0.6B shape.

    python -m bench.gpu                 # ~4 min on one H100 (compiles included); writes bench/results/gpu.json
    python -m bench.gpu --smoke         # every section at toy shapes (a CPU check of the script)

Sections, each recorded as it ends with its own date (a failing one records its error and the next runs;
sections not run keep what the results file already holds):
  ceilings   bf16 and float32 (XLA's default precision) 8192^3 matmuls; a device-to-device pass over
             4 GiB (x + 1 on bf16: bytes read plus written), the yardsticks below divide by.
  kernels    fused_logprobs (naive, chunked, pallas = the Triton kernels, untied and tied) and
             ratio_clip (pallas against jnp) on the device at odd shapes (N, d, V no multiple of any
             tile), against float64 numpy: ||got - ref|| / ||ref|| of log-probs, entropies and both
             gradients (NaN where an output holds a non-finite element).
  logprobs   forward + backward time and compiled temporary memory of fused_logprobs at N 8192,
             d 1024, V 151,936 (Qwen's vocabulary), per implementation and dtype, and Triton tiles.
  train      the on-policy GSPO update (fwd + bwd + AdamW, one micro-batch) of a random Qwen3-0.6B
             (float32 params, bfloat16 compute), and the forward of its tokens (what l^old costs):
             model FLOPs (bench/roofline.py: no attention halving, no recompute) over the bf16 peak;
             16 rows as run (the layer scan, log-probs chunked), unrolled, and by the Triton kernels,
             and 64 rows under remat="full" (its recompute is not counted).
  decode     greedy decoding (ignore_eos) in bfloat16 under the layer scan and unrolled: bytes each
             step must read (every weight once, every row's prompt and its slot's own cache: one block
             of models.slot_blocks at 256 new tokens, read whole) over time, against the copy bandwidth.
Times are medians after a warm-up; "compile_s" is the first call less the median.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from bench import logprobs as logprobs_bench
from bench import roofline
from bench.common import RESULTS, update_runs
from grpo_jax import models, sampling
from grpo_jax.config import SamplingConfig
from kernels import fused_logprobs, logprobs_triton, ratio_clip

OUT = RESULTS / "gpu.json"
QWEN3_06B = dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                 num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1e6, tie_word_embeddings=True)
TOY = dict(QWEN3_06B, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
           num_kv_heads=1, head_dim=32)


def timed(fn, reps: int) -> dict:
    """{median_s, compile_s}: `fn` blocks; its first call compiles."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return dict(median_s=median, compile_s=first - median)


def ceilings(a: argparse.Namespace) -> dict:
    n = a.matmul_n
    out = {}
    for name, dtype in (("bf16", jnp.bfloat16), ("fp32", jnp.float32)):
        x = jax.random.normal(jax.random.key(0), (n, n), dtype)
        mm = jax.jit(lambda x: x @ x)
        t = timed(lambda: jax.block_until_ready(mm(x)), a.reps * 4)["median_s"]
        out[f"matmul_{name}_tflops"] = 2 * n**3 / t / 1e12
    x = jax.random.normal(jax.random.key(1), (a.copy_bytes // 2,), jnp.bfloat16)
    add = jax.jit(lambda x: x + 1)
    t = timed(lambda: jax.block_until_ready(add(x)), a.reps * 4)["median_s"]
    out["copy_gbps"] = 2 * x.nbytes / t / 1e9
    return out


def _reference(h, w, t, m, temp, w_logp, w_ent):
    """float64 numpy (logp, entropy, d hidden, d unembed) of sum(w_logp logp + w_ent entropy) over
    counted rows; w is [d, V]."""
    h, w = h.astype(np.float64), w.astype(np.float64)
    z = h @ w / temp
    z -= z.max(1, keepdims=True)
    lse = np.log(np.exp(z).sum(1, keepdims=True))
    p = np.exp(z - lse)
    ez = (p * z).sum(1, keepdims=True)
    logp = np.take_along_axis(z, t[:, None], 1)[:, 0] - lse[:, 0]
    ent = lse[:, 0] - ez[:, 0]
    onehot = np.eye(w.shape[1])[t]
    dz = (w_logp[:, None] * (onehot - p) + w_ent[:, None] * p * (ez - z)) * m[:, None] / temp
    return logp * m, ent * m, dz @ w.T, h.T @ dz


def _rel(got, want) -> float:
    got = np.asarray(got, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want)) if np.isfinite(got).all() else float("nan")


def kernels(a: argparse.Namespace) -> dict:
    n, d, v, temp = a.check_shape
    rng = np.random.default_rng(0)
    m = (rng.random(n) < 0.8).astype(np.float64)
    m[16:80] = 0  # a fully masked token tile
    t = rng.integers(0, v, n)
    w_logp, w_ent = rng.normal(size=n), rng.normal(size=n)
    out = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        h = jnp.asarray(rng.normal(size=(n, d)), dtype)
        w = jnp.asarray(rng.normal(size=(d, v)) * d**-0.5, dtype)
        want = _reference(np.asarray(h, np.float64), np.asarray(w, np.float64), t, m, temp, w_logp, w_ent)
        for impl, tied in (("naive", False), ("chunked", False), ("pallas", False), ("pallas", True)):
            unembed = w.T if tied else w

            def loss(h, u):
                logp, ent = fused_logprobs(h, u, jnp.asarray(t), temp, mask=jnp.asarray(m) > 0,  # noqa: B023
                                           return_entropy=True, impl=impl, transposed=tied)  # noqa: B023
                return jnp.sum(logp * w_logp) + jnp.sum(ent * w_ent), (logp, ent)  # noqa: B023

            fn = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))
            (_, (logp, ent)), (dh, dw) = fn(h, unembed)
            dw = dw.T if tied else dw
            key = f"fused_logprobs {impl}{' tied' if tied else ''} {jnp.dtype(dtype).name}"
            out[key] = {name: _rel(g, r) for name, g, r in
                        zip(("logp", "entropy", "d_hidden", "d_unembed"), (logp, ent, dh, dw), want)}
    x = jnp.asarray(rng.normal(size=(777, 129)) * 0.3, jnp.float32)
    adv, g = (jnp.asarray(rng.normal(size=x.shape), jnp.float32) for _ in range(2))
    runs = {}
    for impl in ("jnp", "pallas"):
        def f(x, adv):
            u, low, high = ratio_clip(x, adv, 0.2, 0.28, clip_c=3.0, impl=impl)  # noqa: B023
            return jnp.sum(u * g), (u, low, high)

        (_, (u, low, high)), grads = jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True))(x, adv)
        runs[impl] = [np.asarray(y, np.float64) for y in (u, *grads)], np.asarray(low), np.asarray(high)
    (pv, plo, phi), (jv, jlo, jhi) = runs["pallas"], runs["jnp"]
    out["ratio_clip pallas vs jnp"] = dict({k: _rel(p, j) for k, p, j in zip(("u", "d_log_ratio", "d_adv"), pv, jv)},
                                           flags_equal=bool((plo == jlo).all() and (phi == jhi).all()))
    return out


def logprobs(a: argparse.Namespace) -> dict:
    n, d, v = a.time_shape
    k = jax.random.split(jax.random.key(2), 4)
    rows = []
    variants = [("naive", {}), ("chunked", {}), ("pallas", {})]
    for dtype in (jnp.bfloat16, jnp.float32):
        args = (jax.random.normal(k[0], (n, d), dtype), (jax.random.normal(k[1], (d, v)) * d**-0.5).astype(dtype),
                jax.random.randint(k[2], (n,), 0, v), jax.random.normal(k[3], (n,)))
        vs = variants + ([("pallas", dict(token_tile=tn, vocab_tile=tv, warps=w)) for tn, tv, w in a.triton_tiles]
                         if dtype == jnp.bfloat16 else [])
        for impl, kw in vs:
            kw = dict(kw)
            warps = kw.pop("warps", logprobs_triton.NUM_WARPS)
            default_warps, logprobs_triton.NUM_WARPS = logprobs_triton.NUM_WARPS, warps
            try:
                fn = logprobs_bench.loss_and_grads(impl, **kw)
                temp = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
                t = timed(lambda: jax.block_until_ready(fn(*args)), 3)  # noqa: B023
            finally:
                logprobs_triton.NUM_WARPS = default_warps
            flops = 4 * 2 * n * d * v  # logits forward; backward recomputes them and takes two products
            rows.append(dict(impl=impl, dtype=jnp.dtype(dtype).name, n=n, d=d, v=v, warps=warps if impl == "pallas"
                             else None, **kw, temp_gib=temp / 2**30, **t, tflops=flops / t["median_s"] / 1e12))
            print(f"  logprobs {rows[-1]}", flush=True)
    return dict(rows=rows)


def train(a: argparse.Namespace, peak_tflops: float) -> list:
    return [_train(a, shape, run_fields, peak_tflops) for shape, run_fields in a.train_runs]


def _train(a: argparse.Namespace, shape: tuple, run_fields: dict, peak_tflops: float) -> dict:
    model = dict(a.model, compute_dtype="bfloat16", **run_fields)
    mcfg = models.ModelConfig(**model)
    prompts, group, prompt_len, new = shape
    rows = prompts * group
    step, forward = update_runs(mcfg, models.init(mcfg, jax.random.key(0)), prompts, group, prompt_len, new)
    t_train, t_fwd = timed(step, a.reps), timed(forward, a.reps)
    seq = prompt_len + new - 1
    f_train, f_fwd = roofline.train_flops(mcfg, rows, seq, new), roofline.forward_flops(mcfg, rows, seq, new)
    print(f"  train {rows} rows, {run_fields}: {t_train} forward {t_fwd}", flush=True)
    return dict(model=model, rows=rows, prompt_len=prompt_len, new=new, tokens=rows * seq, train=t_train, forward=t_fwd,
                bf16_peak_tflops=peak_tflops,
                train_over_forward=t_train["median_s"] / t_fwd["median_s"],
                train_tflops=f_train / t_train["median_s"] / 1e12, forward_tflops=f_fwd / t_fwd["median_s"] / 1e12,
                train_mfu=f_train / t_train["median_s"] / 1e12 / peak_tflops,
                forward_mfu=f_fwd / t_fwd["median_s"] / 1e12 / peak_tflops)


def decode(a: argparse.Namespace, copy_gbps: float) -> list:
    return [_decode(a, layer_loop, rows, copy_gbps) for layer_loop in ("scan", "unrolled") for rows in a.decode_rows]


def _decode(a: argparse.Namespace, layer_loop: str, rows: int, copy_gbps: float) -> dict:
    """Under the layer scan (`auto` on a GPU: a KV cache stacked over layers) or unrolled (one buffer per
    layer, what CPU runs)."""
    mcfg = models.ModelConfig(**dict(a.model, dtype="bfloat16", compute_dtype="bfloat16", layer_loop=layer_loop))
    params = models.init(mcfg, jax.random.key(0))
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    prompt_len, new = a.decode_shape
    greedy = SamplingConfig(max_prompt_len=prompt_len, max_new_tokens=new, group_size=1, greedy=True,
                            ignore_eos=True)
    ids = np.random.default_rng(rows).integers(3, mcfg.vocab_size, (rows, prompt_len))
    prompts = sampling.pad_prompts(ids.tolist(), greedy)
    t = timed(lambda: jax.block_until_ready(sampling.generate(mcfg, params, prompts, jax.random.key(0), greedy)), a.reps)
    # every row its own prompt (group_size 1) and its slot's whole cache (models.slot_blocks): exact up to
    # new = SLOT_BLOCK + 1 (one block, read whole by every step), above it an upper bound (a step reads
    # only the blocks written)
    blocks, block = models.slot_blocks(max(new - 1, 1))
    kv_slots = prompt_len + blocks * block
    kv_bytes = rows * mcfg.num_layers * 2 * mcfg.num_kv_heads * mcfg.head_dim * 2 * kv_slots
    step_s = t["median_s"] / new
    out = dict(layer_loop=layer_loop, rows=rows, prompt_len=prompt_len, new=new, **t, step_ms=step_s * 1e3,
               tokens_per_s=rows * new / t["median_s"], param_gb=param_bytes / 1e9, kv_gb=kv_bytes / 1e9,
               gbps=(param_bytes + kv_bytes) / step_s / 1e9, copy_gbps=copy_gbps,
               bandwidth_frac=(param_bytes + kv_bytes) / step_s / 1e9 / copy_gbps)
    print(f"  decode {out}", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="toy shapes everywhere (checks the script on CPU)")
    parser.add_argument("--only", nargs="*", default=["ceilings", "kernels", "logprobs", "train", "decode"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    a = parser.parse_args()
    big = not a.smoke
    a.matmul_n, a.copy_bytes = (8192, 4 << 30) if big else (256, 1 << 20)
    a.check_shape = (1000, 576, 5003, 0.7) if big else (100, 80, 300, 0.7)
    a.time_shape = (8192, 1024, 151936) if big else (64, 32, 300)
    a.triton_tiles = [(128, 128, 8), (64, 128, 4), (32, 128, 4)] if big else [(32, 128, 4)]
    a.model = QWEN3_06B if big else TOY
    # (prompts, group, prompt_len, new), ModelConfig run fields: 32 rows of 512 tokens without remat need
    # ~75 GiB (OOM on an H100)
    a.train_runs = ([((2, 8, 64, 448), {}), ((2, 8, 64, 448), dict(layer_loop="unrolled")),
                     ((2, 8, 64, 448), dict(logprobs_impl="pallas")), ((8, 8, 64, 448), dict(remat="full"))]
                    if big else [((2, 2, 4, 8), {}), ((2, 2, 4, 8), dict(layer_loop="unrolled"))])
    a.decode_shape = (64, 256) if big else (4, 8)
    a.decode_rows = (64, 256) if big else (4,)
    run = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="python -m bench.gpu " + " ".join(sys.argv[1:]), jax=jax.__version__,
               device=f"{jax.default_backend()}: {jax.devices()[0].device_kind}")
    print(run["device"], flush=True)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = json.loads(out.read_text()) if out.exists() else {}

    def ceiling(key):
        return result.get("ceilings", {}).get("values", {}).get(key, float("nan"))

    sections = dict(ceilings=lambda: ceilings(a), kernels=lambda: kernels(a), logprobs=lambda: logprobs(a),
                    train=lambda: train(a, ceiling("matmul_bf16_tflops")), decode=lambda: decode(a, ceiling("copy_gbps")))
    for name in a.only:
        t0 = time.perf_counter()
        try:
            result[name] = dict(run, values=sections[name]())
        except Exception:  # noqa: BLE001  one failing section must not lose the others' numbers
            result[name] = dict(run, error=traceback.format_exc(limit=4))
        print(f"[{name} {time.perf_counter() - t0:.0f} s] {json.dumps(result[name], default=float)[:1500]}", flush=True)
        out.write_text(json.dumps(result, indent=2, default=float) + "\n")
        if os.environ.get("OUT"):
            (pathlib.Path(os.environ["OUT"]) / out.name).write_text(out.read_text())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
