"""fused_logprobs: the chunked path and both Pallas kernel families (Mosaic TPU and Triton GPU,
interpreted) against full logits and float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from kernels import fused_logprobs, logprobs_reference

# Odd sizes: neither N nor V is a multiple of its tile, nor d of the Triton kernels' 64-wide slices
# of d_model; rows 16..31 form a fully masked tile.
N, D, V, TN, TV, TEMP = 37, 80, 300, 16, 128, 0.7


@pytest.fixture(scope="module")
def data():
    k = jax.random.split(jax.random.key(0), 6)
    mask = jax.random.bernoulli(k[3], 0.8, (N,)).at[16:32].set(False)
    targets = jax.random.randint(k[2], (N,), 0, V)
    return dict(
        hidden=jax.random.normal(k[0], (N, D)),
        unembed=jax.random.normal(k[1], (D, V)) * 0.3,
        targets=jnp.where(mask, targets, -7),  # garbage where masked: must be ignored
        mask=mask,
        w_logp=jax.random.normal(k[4], (N,)),  # random cotangents for both outputs
        w_ent=jax.random.normal(k[5], (N,)),
    )


def _run(data, dtype=jnp.float32, transposed=False, entropy=True, **kw):
    """Outputs and gradients of a random linear function of (logp, entropy), jitted."""
    h, w = data["hidden"].astype(dtype), data["unembed"].astype(dtype)
    w = w.T if transposed else w

    def loss(h, w):
        out = fused_logprobs(h, w, data["targets"], TEMP, mask=data["mask"],
                             return_entropy=entropy, transposed=transposed, **kw)
        logp, ent = out if entropy else (out, jnp.zeros_like(out))
        return jnp.sum(logp * data["w_logp"]) + jnp.sum(ent * data["w_ent"]), (logp, ent)

    (_, (logp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(h, w)
    dw = dw.T if transposed else dw
    return [np.asarray(x, np.float32) for x in (logp, ent, dh, dw)]


def _close(got, want, tol):
    for g, w, name in zip(got, want, ("logp", "entropy", "d hidden", "d unembed")):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max(), err_msg=name)


@pytest.fixture(scope="module")
def naive(data):
    return {dt: _run(data, dt, impl="naive") for dt in (jnp.float32, jnp.bfloat16)}


TILES = dict(token_tile=TN, vocab_tile=TV)
FUSED = [dict(impl="chunked"), dict(impl="pallas", interpret_as="tpu"),
         dict(impl="pallas", interpret_as="gpu")]
FUSED_IDS = ["chunked", "pallas-mosaic", "pallas-triton"]


@pytest.mark.parametrize("impl", FUSED, ids=FUSED_IDS)
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)])
def test_matches_full_logits(data, naive, impl, dtype, tol):
    _close(_run(data, dtype, **impl, **TILES), naive[dtype], tol)


@pytest.mark.parametrize("impl", FUSED, ids=FUSED_IDS)
def test_logprobs_only_and_tied_layout(data, naive, impl):
    """Without entropy (its backward terms skipped), and with unembed given as [V, d]."""
    logp, _, dh, dw = _run(data, entropy=False, transposed=True, **impl, **TILES)
    want = _run(data, impl="naive", entropy=False)
    _close([logp, dh, dw], [want[0], want[2], want[3]], 1e-5)


@pytest.mark.parametrize("impl", FUSED, ids=FUSED_IDS)
def test_mixed_dtypes_meet_in_float32(data, impl):
    """bf16 hidden against float32 unembed (bf16 compute, float32 params): full logits of the same
    numbers in float32, and each gradient in its input's dtype."""
    h, w = data["hidden"].astype(jnp.bfloat16), data["unembed"]

    def outputs(h, **kw):
        def loss(h, w):
            logp, ent = fused_logprobs(h, w, data["targets"], TEMP, mask=data["mask"], return_entropy=True, **kw)
            return jnp.sum(logp * data["w_logp"]) + jnp.sum(ent * data["w_ent"]), (logp, ent)

        (_, values), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(h, w)
        return [*values, *grads]

    got, want = outputs(h, **impl, **TILES), outputs(h.astype(jnp.float32), impl="naive")
    assert [x.dtype for x in got] == [jnp.float32, jnp.float32, jnp.bfloat16, jnp.float32]
    _close([np.asarray(x, np.float32) for x in got[:2]] + [np.asarray(got[3])],
           [np.asarray(x) for x in want[:2]] + [np.asarray(want[3])], 1e-5)
    np.testing.assert_allclose(np.asarray(got[2], np.float32), want[2], rtol=1e-2, atol=1e-2 * np.abs(want[2]).max())


@pytest.mark.parametrize("impl", FUSED, ids=FUSED_IDS)
def test_default_tiles(data, naive, impl):
    """Each implementation's own tiles (larger than N, V and d here: clipped to them)."""
    _close(_run(data, **impl), naive[jnp.float32], 1e-5)


@pytest.mark.parametrize("impl", FUSED, ids=FUSED_IDS)
def test_masked_rows_are_zero(data, naive, impl):
    logp, ent, dh, _ = _run(data, **impl, **TILES)
    off = ~np.asarray(data["mask"])
    assert off.sum() >= 16
    assert not np.any(logp[off]) and not np.any(ent[off]) and not np.any(dh[off])
    assert np.all(logp[~off] < 0) and np.all(ent[~off] > 0)


def test_float64_numpy(data):
    """Hand-derived float64 formulas: dz = g_l (onehot - p) + g_H p (E_p[z] - z), z = h W / T."""
    h, w = (np.asarray(data[k], np.float64) for k in ("hidden", "unembed"))
    t, m = np.asarray(data["targets"]), np.asarray(data["mask"])
    z = h @ w / TEMP
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    p = np.exp(z - lse[:, None])
    ez = (p * z).sum(1)
    onehot = np.eye(V)[np.where(m, t, 0)]
    logp = np.where(m, (onehot * z).sum(1) - lse, 0.0)
    ent = np.where(m, lse - ez, 0.0)
    gl, ge = (np.where(m, np.asarray(data[k], np.float64), 0.0) for k in ("w_logp", "w_ent"))
    dz = gl[:, None] * (onehot - p) + ge[:, None] * p * (ez[:, None] - z)
    want = [logp, ent, dz @ w.T / TEMP, h.T @ dz / TEMP]
    _close(_run(data, impl="chunked", **TILES), want, 1e-5)


def test_tied_embedding_is_not_copied(data):
    """With transposed=True the compiled program holds no [d, V] array (no transpose copy)."""
    embed = data["unembed"].T  # [V, d], as a model's embedding table

    def loss(h, e):
        return fused_logprobs(h, e, data["targets"], TEMP, mask=data["mask"], transposed=True,
                              impl="chunked", **TILES).sum()

    hlo = jax.jit(jax.grad(loss, (0, 1))).lower(data["hidden"], embed).compile().as_text()
    assert f"[{V},{D}]" in hlo and f"[{D},{V}]" not in hlo

    def loss_copying(h, e):  # the same through embed.T: documented to copy; keep the doc true
        return fused_logprobs(h, e.T, data["targets"], TEMP, impl="chunked", **TILES).sum()

    hlo = jax.jit(jax.grad(loss_copying, (0, 1))).lower(data["hidden"], embed).compile().as_text()
    assert f"[{D},{V}]" in hlo


@pytest.mark.parametrize("interpret_as", ["tpu", "gpu"])
def test_pallas_splits_tokens_over_the_mesh(data, naive, interpret_as):
    """On a (2,2,2) mesh the kernels run in a shard_map over each device's tokens (GSPMD cannot
    split a pallas_call): N=37 rows are padded to 40, 5 per device; values and gradients are those
    of the full logits."""
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
    on_mesh = dict(data, hidden=put(data["hidden"], P(None, "fsdp")),
                   unembed=put(data["unembed"], P("fsdp")))
    pallas = dict(impl="pallas", interpret_as=interpret_as, **TILES)
    _close(_run(on_mesh, **pallas), naive[jnp.float32], 1e-5)

    def loss(h, w):
        return fused_logprobs(h, w, data["targets"], TEMP, **pallas).sum()

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, (0, 1)))(on_mesh["hidden"], on_mesh["unembed"]))
    assert jaxpr.count("shard_map") == 2 and f"f32[5,{D}]" in jaxpr  # forward, backward


def test_default_impl_and_plain_call(data):
    assert jax.default_backend() == "cpu"  # default there: chunked; check it runs unjitted too
    logp = fused_logprobs(data["hidden"], data["unembed"], data["targets"], TEMP,
                          mask=data["mask"], **TILES)
    want, _ = logprobs_reference(data["hidden"], data["unembed"],
                                 jnp.where(data["mask"], data["targets"], 0), TEMP, data["mask"])
    np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(impl="triton"), "impl='triton'"),
        (dict(impl="pallas", token_tile=24), "token_tile must be a power of two >= 16"),
        (dict(impl="pallas", vocab_tile=64), "vocab_tile must be a power of two >= 128"),
        (dict(impl="chunked", vocab_tile=0), "vocab_tile must be >= 1"),
        (dict(impl="naive", token_tile=16), "impl='naive' has no tiles"),
        (dict(impl="chunked", interpret_as="gpu"), "interpret_as='gpu' needs impl='pallas'"),
        (dict(impl="pallas", interpret_as="cuda"), "interpret_as='cuda' needs"),
        (dict(temperature=0.0), "temperature"),
        (dict(unembed=jnp.zeros((V, D))), "transposed=True"),
        (dict(targets=jnp.zeros((N + 1,), jnp.int32)), "targets"),
        (dict(mask=jnp.ones((N - 1,), bool)), "mask"),
        (dict(hidden=jnp.zeros((2, N, D))), "flatten batch and seq"),
    ],
)
def test_user_errors(data, kwargs, match, unchecked):
    args = dict(hidden=data["hidden"], unembed=data["unembed"], targets=data["targets"],
                temperature=TEMP)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fused_logprobs(**args)
