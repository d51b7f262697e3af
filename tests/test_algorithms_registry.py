"""The registries: duplicates are errors, every entry carries its float64 reference and its parameter
class, and a parameter class names one variant. A variant added outside the library:
tests/test_fork_variant.py."""

import pickle

import pytest

from grpo_jax.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    advantage,
    aggregation,
    kl_estimator,
    loss,
    reference,
)
from grpo_jax.algorithms import AlgorithmConfig, losses
from grpo_jax.algorithms.config import PARTS

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
    with pytest.raises(KeyError, match=f"unknown {kind} 'nope'; .*known: '{name}'"):
        registry["nope"]


def test_every_entry_declares_a_reference_and_its_parameters():
    for registry in (ADVANTAGES, LOSSES, AGGREGATIONS, KL_ESTIMATORS):
        for name, entry in registry.items():
            assert callable(entry.reference) and entry.reference.__module__.startswith(reference.__name__), name
    for base in PARTS.values():
        for name, spec in base.registry.items():
            assert issubclass(spec.params, base) and spec.params.__dataclass_params__.frozen, name
            assert spec.params().name == name and base.from_name(name) == spec.params(), name
    for name, spec in LOSSES.items():
        assert (spec.stats is None) == (spec.stats_reference is None), name
        assert spec.stats_reference is None or spec.stats_reference.__module__.startswith(reference.__name__), name
        assert not spec.needs_groups or spec.stats is not None, name


def test_configs_pickle_with_every_part():
    """A part without parameters has a class made at its registration, bound in its module for pickle."""
    for base in PARTS.values():
        for name in base.registry:
            params = base.from_name(name)
            assert pickle.loads(pickle.dumps(params)) == params, name
    cfg = AlgorithmConfig.from_preset("gspo")
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_a_parameter_class_names_one_variant():
    """A config value names its variant by its class: two names may not share one."""
    with pytest.raises(ValueError, match="Gspo is already the parameter class of 'gspo'; subclass it"):
        loss("gspo_again", params=losses.Gspo, unit="sequence", ratio=True, reference=lambda *a: None)(lambda p, x: 0)
    with pytest.raises(TypeError, match="must be a frozen dataclass subclassing"):
        loss("plain", params=dict, unit="token", ratio=True, reference=lambda *a: None)(lambda p, x: 0)
    with pytest.raises(ValueError, match="the ratio_clip kernel path reads a Clip's parameters"):
        loss("kernel_without_clip", unit="token", ratio=True, reference=lambda *a: None,
             kernel="ratio_clip")(lambda p, x: 0)
    assert "gspo_again" not in LOSSES and "plain" not in LOSSES
