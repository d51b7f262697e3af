"""Presets and AlgorithmConfig validation: every preset runs end to end; bad configs fail early."""

import dataclasses

import jax
import numpy as np
import pytest

from grpo_jax.algorithms import PRESETS, AlgorithmConfig, compute_advantages, finalize_metrics, normalizer, policy_loss
from grpo_jax.algorithms.presets_doc import PATH, presets_markdown


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_runs_one_loss_evaluation(preset):
    cfg = AlgorithmConfig.from_preset(preset)
    rng = np.random.default_rng(0)
    g, n_groups, t = 2, 3, 5  # 2-GRPO-sized groups
    mask = (rng.random((g * n_groups, t)) < 0.8).astype(np.float32)
    logp = -np.abs(rng.normal(1, 0.5, mask.shape)).astype(np.float32)
    old = (logp + rng.normal(0, 0.1, mask.shape)).astype(np.float32)
    adv = compute_advantages(cfg, rng.integers(0, 2, g * n_groups).astype(np.float32), group_size=g,
                             lengths=mask.sum(1))
    ref = logp - 0.1 if cfg.beta > 0 else None
    nz = normalizer(cfg, mask, t)
    (loss, metrics), grad = jax.jit(jax.value_and_grad(
        lambda lp: policy_loss(cfg, lp, old, adv, mask, normalizer=nz, ref_logp=ref), has_aux=True))(logp)
    assert np.isfinite(loss) and np.isfinite(grad).all() and np.abs(grad).sum() > 0
    assert all(np.isfinite(v) for v in finalize_metrics(metrics).values())


def test_presets_doc_is_generated():
    assert PATH.read_text() == presets_markdown(), "run: python -m grpo_jax.algorithms.presets_doc"


def test_overrides():
    cfg = AlgorithmConfig.from_preset("gspo", beta=0.01)
    assert (cfg.loss, cfg.eps_low, cfg.eps_high, cfg.beta) == ("gspo", 3e-4, 4e-4, 0.01)
    assert dataclasses.replace(cfg, eps_high=1e-3).eps_high == 1e-3
    assert hash(cfg) == hash(AlgorithmConfig.from_preset("gspo", beta=0.01))  # jit-static
    from grpo_jax.config import AlgorithmConfig as reexported
    assert reexported is AlgorithmConfig


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="ppo"), r"loss='ppo' is unknown; known: 'ppo_clip', 'gspo'"),
    (dict(advantage="grpo"), "known: 'group_std'"),
    (dict(aggregation="mean"), "known: 'token_mean'"),
    (dict(kl_estimator="k4"), "known: 'k1'"),
    (dict(ratio_impl="triton"), "ratio_impl='triton' is unknown; known: 'auto', 'reference'"),
    (dict(loss="gspo", aggregation="token_mean"), "weight completions by length"),
    (dict(loss="gmpo", aggregation="seq_mean_token_mean"), "aggregation='seq_mean'"),
    (dict(aggregation="seq_mean"), "seq_mean_token_mean"),
    (dict(loss="gspo", aggregation="seq_mean", tis_level="token"), "tis_level='sequence'"),
    (dict(loss="sapo", clip_c=3.0), "delta/clip_c apply to"),
    (dict(loss="cispo", aggregation="token_mean", ratio_impl="pallas"), "ratio_impl='pallas' picks how"),
    (dict(delta=1.1), "delta=1.1 must exceed"),
    (dict(clip_c=0.9), "clip_c=0.9 must be > 1"),
    (dict(eps_low=1.0), "eps_low=1.0"),
    (dict(beta=-1.0), "beta=-1.0"),
    (dict(num_iterations=0), "num_iterations"),
    (dict(loss="reinforce", num_iterations=2), "off-policy without correction"),
    (dict(overlong_buffer_frac=1.5), "overlong_buffer_frac"),
])
def test_bad_configs_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlgorithmConfig(**kwargs)


def test_bad_preset_and_fields():
    with pytest.raises(ValueError, match="preset='ppo' is unknown; known: 'grpo', 'dr_grpo'"):
        AlgorithmConfig.from_preset("ppo")
    with pytest.raises(ValueError, match="unknown field"):
        AlgorithmConfig.from_preset("grpo", epsilon=0.2)
    with pytest.raises(ValueError, match="weight completions by length"):
        dataclasses.replace(AlgorithmConfig.from_preset("gspo"), aggregation="token_mean")
