"""ratio_clip (jnp custom VJP and Pallas, interpreted) against the algorithms' clipped_surrogate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import _algorithm_cases as cases
from grpo_jax.algorithms import LOSSES
from grpo_jax.algorithms.ratio import clipped_surrogate
from kernels.ratio_clip import LOG_RATIO_BOUND, ratio_clip

CLIPS = [
    dict(eps_low=0.2, eps_high=0.28),
    dict(eps_low=0.2, eps_high=0.2, delta=1.4),
    dict(eps_low=0.2, eps_high=0.2, clip_c=1.6),
    dict(eps_low=3e-4, eps_high=4e-4),  # the GSPO range
]


@pytest.fixture(scope="module")
def units():
    k = jax.random.split(jax.random.key(3), 3)
    log_ratio = jax.random.normal(k[0], (6, 45)) * 0.5  # 270 units: not a multiple of 128
    return log_ratio, jax.random.normal(k[1], (6, 45)), jax.random.normal(k[2], (6, 45))


@pytest.mark.parametrize("impl", ["jnp", "pallas"])
@pytest.mark.parametrize("clip", CLIPS)
def test_matches_clipped_surrogate(units, impl, clip):
    x, a, g = units

    def run(fn):
        def f(x, a):
            u, low, high = fn(x, a, **clip)
            return jnp.sum(u * g), (u, low, high)

        (_, outs), grads = jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True))(x, a)
        return outs, grads

    (u, low, high), grads = run(functools.partial(ratio_clip, impl=impl, block_rows=1))
    (u_ref, low_ref, high_ref), grads_ref = run(clipped_surrogate)
    np.testing.assert_allclose(u, u_ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(low, low_ref)
    np.testing.assert_array_equal(high, high_ref)
    assert low.dtype == high.dtype == jnp.bool_ and low.any() and high.any()
    for got, want in zip(grads, grads_ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pallas_splits_units_over_the_mesh(units):
    """On a (2,2,2) mesh the Pallas kernels run in a shard_map, one [1, 128] block per device (270
    units padded to 8 x 128), rather than gathered and replicated; values and gradients unchanged."""
    x, a, g = units
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    put = lambda v: jax.device_put(v, NamedSharding(mesh, P("data")))  # noqa: E731

    def f(x, a):
        u, low, high = ratio_clip(x, a, **CLIPS[2], impl="pallas")
        return jnp.sum(u * g), (low, high)

    step = jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True))
    got, want = step(put(x), put(a)), step(x, a)
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda x, a: f(x, a)[0], (0, 1)))(put(x), put(a)))
    assert jaxpr.count("shard_map") == 2 and "f32[1,128]" in jaxpr  # forward, backward


@pytest.mark.parametrize("impl", ["jnp", "pallas"])
def test_log_ratios_beyond_the_bound_are_clamped(impl):
    """|log-ratio| up to 200 (exp overflows float32 past 88): both paths clamp it to +-20 before exp,
    like the reference: finite values equal to those at the bound, and no gradient through the clamp."""
    x = jnp.array([-200.0, -25.0, -20.5, -3.0, 0.0, 3.0, 20.5, 25.0, 200.0] * 2)
    a = jnp.array([1.0] * 9 + [-1.0] * 9)

    def f(fn, x, a):
        return jnp.sum(fn(x, a, 0.2, 0.28, None, 1.5)[0])

    kernel = functools.partial(ratio_clip, impl=impl, block_rows=1)
    (value, (dx, da)) = jax.value_and_grad(functools.partial(f, kernel), (0, 1))(x, a)
    (ref_value, (ref_dx, ref_da)) = jax.value_and_grad(functools.partial(f, clipped_surrogate), (0, 1))(x, a)
    at_bound = jax.value_and_grad(functools.partial(f, kernel), 1)(jnp.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND), a)
    assert np.isfinite(value) and np.isfinite(dx).all() and np.isfinite(da).all()
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(value, at_bound[0], rtol=1e-6)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-6)
    np.testing.assert_allclose(da, ref_da, rtol=1e-6)
    np.testing.assert_allclose(da, at_bound[1], rtol=1e-6)
    assert (np.asarray(dx)[np.abs(np.asarray(x)) > LOG_RATIO_BOUND] == 0).all()


# Every loss registered on the kernel path (a new one joins by its registration), and the dual clip.
KERNEL_CASES = [(name, {}) for name, spec in LOSSES.items() if spec.kernel == "ratio_clip"] + [("ppo_clip", {"clip_c": 3.0})]


@pytest.mark.parametrize("name,fields", KERNEL_CASES, ids=["-".join([name, *fields]) for name, fields in KERNEL_CASES])
def test_every_kernel_loss_through_the_pallas_kernel(name, fields):
    """AlgorithmConfig.ratio_impl puts the kernel into grpo_jax.algorithms: the same loss, metrics
    and gradient as the reference implementation (the jnp path is the registry-wide tests' default)."""
    x = cases.make_batch(seed=4, noise=0.4)  # sequence ratios clip too
    want_loss, want_grad, want = cases.run(cases.cfg_for(name, ratio_impl="reference", **fields), x)
    got_loss, got_grad, got = cases.run(cases.cfg_for(name, ratio_impl="pallas", **fields), x)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key].value, want[key].value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert want["clip_frac_low"].value + want["clip_frac_high"].value > 0


def test_user_errors(units, unchecked):
    x, a, _ = units
    with pytest.raises(ValueError, match="impl='cuda'"):
        ratio_clip(x, a, 0.2, 0.2, impl="cuda")
    with pytest.raises(ValueError, match="broadcast sequence advantages"):
        ratio_clip(x, a[:, 0], 0.2, 0.2)
    with pytest.raises(ValueError, match="block_rows must be a power of two"):
        ratio_clip(x, a, 0.2, 0.2, impl="pallas", block_rows=3)
