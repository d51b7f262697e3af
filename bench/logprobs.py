"""Memory and time of log-prob forward + backward: full logits ("naive") vs fused paths.

Peak temporary memory comes from the compiled executable's memory_analysis() (compiled, not run);
time is the median wall time of the jitted forward + backward on this machine's default backend.

    python -m bench.logprobs            # defaults below; writes bench/results/logprobs.json
"""

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from bench.common import RESULTS
from kernels import fused_logprobs


def loss_and_grads(impl, temperature=1.0, **tiles):
    def loss(hidden, unembed, targets, weights):
        logp = fused_logprobs(hidden, unembed, targets, temperature, impl=impl, **tiles)
        return jnp.sum(logp * weights)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def shapes(n, d, v, dtype):
    return (
        jax.ShapeDtypeStruct((n, d), dtype),
        jax.ShapeDtypeStruct((d, v), dtype),
        jax.ShapeDtypeStruct((n,), jnp.int32),
        jax.ShapeDtypeStruct((n,), jnp.float32),
    )


def peak_temp_bytes(impl, n, d, v, dtype, **tiles):
    compiled = loss_and_grads(impl, **tiles).lower(*shapes(n, d, v, dtype)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def time_s(impl, n, d, v, dtype, reps, **tiles):
    keys = jax.random.split(jax.random.key(0), 4)
    args = (
        jax.random.normal(keys[0], (n, d), dtype),
        (jax.random.normal(keys[1], (d, v)) * d**-0.5).astype(dtype),
        jax.random.randint(keys[2], (n,), 0, v),
        jax.random.normal(keys[3], (n,)),
    )
    fn = loss_and_grads(impl, **tiles)
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mem-n", type=int, default=8192)
    parser.add_argument("--time-n", type=int, default=2048)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--v", type=int, default=151_936)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--token-tile", type=int, default=None, help="default: fused_logprobs'")
    parser.add_argument("--vocab-tile", type=int, default=None, help="default: fused_logprobs'")
    parser.add_argument("--out", default=str(RESULTS / "logprobs.json"))
    args = parser.parse_args()
    tiles = dict(token_tile=args.token_tile, vocab_tile=args.vocab_tile)
    impls = ["naive", "chunked"] + (["pallas"] if jax.default_backend() in ("tpu", "gpu") else [])

    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        for impl in impls:
            kw = {} if impl == "naive" else tiles
            mem = peak_temp_bytes(impl, args.mem_n, args.d, args.v, dtype, **kw)
            rows.append(dict(kind="peak_temp_bytes", impl=impl, dtype=jnp.dtype(dtype).name,
                             n=args.mem_n, value=mem))
    for impl in impls:
        kw = {} if impl == "naive" else tiles
        secs = time_s(impl, args.time_n, args.d, args.v, jnp.float32, args.reps, **kw)
        rows.append(dict(kind="fwd_bwd_seconds", impl=impl, dtype="float32", n=args.time_n,
                         value=secs))

    print(f"{'measure':<18}{'impl':<9}{'dtype':<10}{'N':>6}{'value':>14}{'vs naive':>10}")
    for r in rows:
        base = next(b["value"] for b in rows if b["impl"] == "naive" and b["kind"] == r["kind"]
                    and b["dtype"] == r["dtype"])
        value = f"{r['value'] / 2**30:.3f} GiB" if r["kind"] == "peak_temp_bytes" else f"{r['value']:.2f} s"
        print(f"{r['kind']:<18}{r['impl']:<9}{r['dtype']:<10}{r['n']:>6}{value:>14}"
              f"{r['value'] / base:>10.3f}")
    result = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=f"{jax.default_backend()}: {jax.devices()[0].device_kind}, {platform.processor() or platform.machine()}",
        jax=jax.__version__,
        args=vars(args),
        rows=rows,
    )
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
