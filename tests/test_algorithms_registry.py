"""The registries: duplicates are errors, every entry carries its float64 reference, and what the
code knows about a variant (validation, the presets table, the tests' cases) comes from its
registration alone."""

import dataclasses

import numpy as np
import pytest

from grpo_jax.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    AlgorithmConfig,
    LossTerms,
    advantage,
    aggregation,
    kl_estimator,
    loss,
    reference,
)
from grpo_jax.algorithms import config as config_module

REGISTRIES = {"advantage": (ADVANTAGES, advantage, {}), "loss": (LOSSES, loss, dict(unit="token", ratio=True)),
              "aggregation": (AGGREGATIONS, aggregation, dict(unit="token", over="tokens")),
              "KL estimator": (KL_ESTIMATORS, kl_estimator, {})}


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_registering_a_taken_name_is_an_error(kind):
    registry, register, kwargs = REGISTRIES[kind]
    name = next(iter(registry))
    before = registry[name]
    with pytest.raises(ValueError, match=f"{kind} '{name}' is already registered"):
        register(name, reference=lambda *a: None, **kwargs)(lambda *a: None)
    assert registry[name] is before
    with pytest.raises(KeyError, match=f"unknown {kind} 'nope'; known: '{name}'"):
        registry["nope"]


def test_every_entry_declares_a_reference_and_real_fields():
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    for registry in (ADVANTAGES, LOSSES, AGGREGATIONS, KL_ESTIMATORS):
        for name, entry in registry.items():
            assert callable(entry.reference) and entry.reference.__module__.startswith(reference.__name__), name
    for name, spec in (*LOSSES.items(), *ADVANTAGES.items()):
        assert set(spec.fields) <= fields, name
    for name, spec in LOSSES.items():
        assert (spec.stats is None) == (spec.stats_reference is None), name
        assert spec.stats_reference is None or spec.stats_reference.__module__.startswith(reference.__name__), name
        assert not spec.needs_groups or spec.stats is not None, name


@pytest.fixture
def scaled_reinforce():
    """A loss registered by a test, as a fork would: REINFORCE times eps_max, no ratio."""

    def unit(cfg, c):
        return -cfg.eps_max * c.a * c.l, None, None

    @loss("scaled_reinforce", unit="token", ratio=False, fields=("eps_max",), reference=unit)
    def scaled(cfg, x):
        return LossTerms(-cfg.eps_max * x.advantages * x.logp)

    yield "scaled_reinforce"
    del LOSSES["scaled_reinforce"]


def test_a_new_registration_is_validated_tabulated_and_checked_by_its_declarations(scaled_reinforce):
    from _algorithm_cases import cfg_for, make_batch, reference_loss, run

    cfg = AlgorithmConfig(loss=scaled_reinforce, eps_max=3.0, beta=0.0, aggregation="token_mean")
    with pytest.raises(ValueError, match="has no importance ratio"):
        dataclasses.replace(cfg, num_iterations=2)
    with pytest.raises(ValueError, match=r"do not read eps_high=0.3 \(only \['ppo_clip'"):
        dataclasses.replace(cfg, eps_high=0.3)
    with pytest.raises(ValueError, match=r"scaled_reinforce'\] do\); unset it"):
        AlgorithmConfig(eps_max=3.0)  # ppo_clip does not read eps_max: the new loss is named as its reader
    assert "eps_max" in config_module.variant_fields()
    # the reference comparison the registry-wide tests run, on the new loss
    x = make_batch(seed=2)
    loss_value, grad, _ = run(cfg_for(scaled_reinforce, eps_max=3.0), x)
    want, _, want_grad, _ = reference_loss(cfg_for(scaled_reinforce, eps_max=3.0), x)
    np.testing.assert_allclose(loss_value, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
