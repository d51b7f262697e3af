"""Presets and AlgorithmConfig validation: every preset runs end to end; bad configs fail early."""

import dataclasses
import json
import re

import jax
import numpy as np
import pytest

from grpo_jax import algorithms, metrics
from grpo_jax.algorithms import (
    PRESETS,
    AlgorithmConfig,
    compute_advantages,
    needs_step_stats,
    normalizer,
    policy_loss,
    step_stats,
)
from grpo_jax.algorithms import advantages, losses
from grpo_jax.algorithms.presets_doc import PATH, presets_markdown


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_runs_one_loss_evaluation(preset):
    cfg = AlgorithmConfig.from_preset(preset)
    rng = np.random.default_rng(0)
    g, n_groups, t = 8, 2, 5  # groups of 8: pass@k's default k = 4 needs G > k for a signal
    mask = (rng.random((g * n_groups, t)) < 0.8).astype(np.float32)
    logp = -np.abs(rng.normal(1, 0.5, mask.shape)).astype(np.float32)
    old = (logp + rng.normal(0, 0.1, mask.shape)).astype(np.float32)
    entropy = np.abs(rng.normal(0.5, 0.2, mask.shape)).astype(np.float32)
    tokens = rng.integers(0, 3, mask.shape).astype(np.int32)
    rewards = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 1, 1, 0], np.float32)  # binary (pass@k, S-GRPO)
    adv = compute_advantages(cfg, rewards, group_size=g, lengths=mask.sum(1),
                             sampler_logprobs=(old * mask).sum(1) / np.maximum(mask.sum(1), 1))  # unlikeliness
    ref = logp - 0.1 if cfg.beta > 0 else None
    nz = normalizer(cfg, mask, t)
    stats = None
    if needs_step_stats(cfg):
        stats = step_stats(cfg, logp, old, adv, mask, entropy, np.arange(mask.size).reshape(mask.shape),
                           tokens=tokens, group_size=g)
    (loss, m), grad = jax.jit(jax.value_and_grad(
        lambda lp: policy_loss(cfg, lp, old, adv, mask, normalizer=nz, ref_logp=ref, stats=stats,
                               sampler_logp=old - 0.05 if cfg.tis_level else None), has_aux=True))(logp)
    assert np.isfinite(loss) and np.isfinite(grad).all() and np.abs(grad).sum() > 0
    assert all(np.isfinite(v) for v in metrics.finalize(m).values())


def test_presets_doc_is_generated():
    assert PATH.read_text() == presets_markdown(), "run: python -m grpo_jax.algorithms.presets_doc"
    assert all(p.source for p in PRESETS.values())  # every preset names its paper


def test_the_readme_algorithms_example_runs():
    """The README's API example from `alg = ...` on (its names bound to) a random batch of 2 groups of 8."""
    readme = (PATH.parents[1] / "README.md").read_text()
    block = readme.split("```python\nfrom grpo_jax import algorithms, metrics")[1].split("```")[0]
    rng = np.random.default_rng(0)
    mask = (np.arange(512) < rng.integers(1, 512, (16, 1))).astype(np.float32)
    logp = -rng.random((16, 512)).astype(np.float32)
    names = dict(algorithms=algorithms, metrics=metrics, rewards=rng.random(16).astype(np.float32), mask=mask,
                 logp=logp, old_logp=logp + rng.normal(0, 1e-3, logp.shape).astype(np.float32))
    exec(block[block.index("alg = "):], names)
    assert np.isfinite(names["loss"]) and {"clip_frac_low", "clip_frac_high"} <= names["values"].keys()


def test_every_cited_document_is_in_the_repository():
    root = PATH.parents[1]
    for path in [*root.glob("*.md"), *(p for d in ("grpo_jax", "kernels", "experiments", "bench", "scripts", "tests")
                                      for p in (root / d).rglob("*.py"))]:
        for cited in re.findall(r"\b(?:docs|shared)/[\w/.-]+\.md\b", path.read_text()):
            assert (root / cited).exists(), f"{path.relative_to(root)} cites {cited}"


def test_overrides():
    cfg = AlgorithmConfig.from_preset("gspo", beta=0.01)
    assert (cfg.loss.name, cfg.loss.eps_low, cfg.loss.eps_high, cfg.beta) == ("gspo", 3e-4, 4e-4, 0.01)
    assert cfg.loss == losses.Gspo() and cfg.aggregation.name == "seq_mean"  # a name: the variant's defaults
    assert dataclasses.replace(cfg, loss=losses.Gspo(eps_high=1e-3)).loss.eps_high == 1e-3
    assert hash(cfg) == hash(AlgorithmConfig.from_preset("gspo", beta=0.01))  # jit-static
    assert AlgorithmConfig(advantage="pass_at_k").advantage == advantages.PassAtK(k=4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="ppo"), r"unknown loss 'ppo'; did you mean .*'ppo_clip'.*\? known: 'ppo_clip', 'gspo'"),
    (dict(advantage="grpo"), "known: 'group_std'"),
    (dict(aggregation="mean"), "known: 'token_mean'"),
    (dict(loss=lambda: advantages.GroupStd()), "is not a registered loss"),
    (dict(kl_estimator="k4"), "known: 'k1'"),
    (dict(loss=lambda: losses.PpoClip(ratio_impl="triton")), r"algorithm.loss.ratio_impl='triton' \(loss 'ppo_clip'\) is unknown"),
    (dict(loss="gspo", aggregation="token_mean"), "weight completions by length"),
    (dict(loss="gmpo", aggregation="seq_mean_token_mean"), "aggregation='seq_mean'"),
    (dict(aggregation="seq_mean"), "seq_mean_token_mean"),
    (dict(loss="gspo", aggregation="seq_mean", tis_level="token"), "tis_level='sequence' or 'geometric'"),
    (dict(advantage=lambda: advantages.NoiseAware(noise_rate=0.5)), "noise_rate=0.5 .* must lie in"),
    (dict(advantage=lambda: advantages.Gapo(fraction=0.0)), r"algorithm.advantage.fraction=0.0 \(advantage 'gapo'\) must lie in"),
    (dict(advantage=lambda: advantages.Ngrpo(virtual_samples=0)), "virtual_samples=0 .* must be >= 1"),
    (dict(advantage=lambda: advantages.GroupStd(eps=-1.0)), "eps=-1.0 .* must be >= 0"),
    (dict(loss=lambda: losses.Dhpo(alpha=1.5)), "alpha=1.5 .* must lie in"),
    (dict(loss=lambda: losses.AbcGrpo(neg_eps_low=1.0)), "neg_eps_low=1.0 .* must lie in"),
    (dict(loss=lambda: losses.Gvpo(beta=0.0), aggregation="seq_mean"), r"algorithm.loss.beta=0.0 \(loss 'gvpo'\) must be > 0"),
    (dict(loss=lambda: losses.Disco(score="logp"), aggregation="seq_mean"), "score='logp' .* is unknown; known: log_prob"),
    (dict(loss=lambda: losses.Egsw(temperature=0.0)), "temperature=0.0 .* must be > 0"),
    (dict(reward_combine="normalize"), "known: 'sum_then_normalize', 'normalize_each', 'normalize_then_sum'"),
    (dict(loss="gtpo", num_iterations=2), "off-policy without correction"),
    (dict(loss="gspo", aggregation="seq_mean", top_entropy_quantile=0.5), "top_entropy_quantile selects tokens"),
    (dict(top_entropy_quantile=0.0), "top_entropy_quantile=0.0"),
    (dict(tis_level="tokens"), "tis_level='tokens' is unknown"),
    (dict(tis_level="token", tis_mode="clip"), "tis_mode='clip' is unknown; known: 'truncate', 'mask', 'icepop'"),
    (dict(tis_mode="mask"), "act only with a tis_level"),
    (dict(tis_cap=3.0), "act only with a tis_level"),
    (dict(tis_level="token", tis_mode="icepop", tis_cap=0.5), "tis_cap=0.5 must be > 1"),
    (dict(off_policy_threshold=-1.0), "off_policy_threshold=-1.0"),
    (dict(loss=lambda: losses.ClipCov(lb=5.0)), "lb=5.0 .* must be < ub=5.0"),
    (dict(loss=lambda: losses.KlCov(ratio=0.0)), "ratio=0.0 .* in \\(0, 1\\]"),
    (dict(loss=lambda: losses.PpoClip(delta=1.1)), "delta=1.1 .* must exceed"),
    (dict(loss=lambda: losses.PpoClip(clip_c=0.9)), "clip_c=0.9 .* must be > 1"),
    (dict(loss=lambda: losses.Gspo(eps_low=1.0), aggregation="seq_mean"), "eps_low=1.0"),
    (dict(beta=-1.0), "beta=-1.0"),
    (dict(unlikeliness=1.5), "unlikeliness=1.5 must lie in"),
    (dict(unlikeliness=0.25, turn_discount=0.9), "unlikeliness=0.25 scales each completion's reward"),
    (dict(num_iterations=0), "num_iterations"),
    (dict(loss="reinforce", num_iterations=2), "off-policy without correction"),
    (dict(overlong_buffer_frac=1.5), "overlong_buffer_frac"),
])
def test_bad_configs_fail_at_construction(kwargs, match, unchecked):
    with pytest.raises((ValueError, TypeError), match=match):
        AlgorithmConfig(**{k: v() if callable(v) else v for k, v in kwargs.items()})


def test_bad_preset_and_fields():
    with pytest.raises(ValueError, match="preset='ppo' is unknown; known: 'grpo', 'dr_grpo'"):
        AlgorithmConfig.from_preset("ppo")
    with pytest.raises(ValueError, match="unknown field"):
        AlgorithmConfig.from_preset("grpo", epsilon=0.2)
    with pytest.raises(ValueError, match="weight completions by length"):
        dataclasses.replace(AlgorithmConfig.from_preset("gspo"), aggregation="token_mean")


def test_rloo_sums_the_log_probs_of_a_completion():
    """RLOO (and TRL's RLOOTrainer) weights each completion by its summed token log-prob: the loss is
    (1/N) sum_i -A_i sum_t l_{i,t}, not a per-completion token mean (the old preset)."""
    cfg = AlgorithmConfig.from_preset("rloo")
    logp = np.array([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    loss, _ = policy_loss(cfg, logp, logp, adv, mask, normalizer=normalizer(cfg, mask, 3))
    assert float(loss) == pytest.approx((6.0 - 1.0) / 2)


def test_configs_saved_before_the_variants_owned_their_parameters_resume():
    """Every preset's flattened config as checkpoints stored it before (flat fields, some prefixed by
    their variant: tests/fixtures) maps onto today's exactly, and a changed parameter is still refused."""
    from grpo_jax.config import Config, flatten, resume_changes

    fixture = json.loads((PATH.parents[1] / "tests" / "fixtures" / "algorithm_configs_before_params.json").read_text())
    old = {"grpo": fixture["grpo"], **{k: {**fixture["grpo"], **v} for k, v in fixture["others"].items()}}
    now = {name: AlgorithmConfig.from_preset(name) for name in PRESETS}
    now = {name: cfg for name, cfg in now.items()  # samplers, turn credit and the unlikeliness reward came later
           if cfg.sampler.name == "uniform" and cfg.turn_discount is None and not cfg.unlikeliness}
    now["grpo(eps_high=0.27, delta=3.0, ratio_impl=reference)"] = AlgorithmConfig.from_preset(
        "grpo", loss=losses.PpoClip(eps_high=0.27, delta=3.0, ratio_impl="reference"))
    now |= {"clip_cov": AlgorithmConfig(loss=losses.ClipCov(ratio=0.01)), "kl_cov": AlgorithmConfig(loss=losses.KlCov(coef=1.0)),
            "beta_norm": AlgorithmConfig(advantage="beta_norm")}
    assert old.keys() == now.keys()
    for name, saved in old.items():
        flat = flatten(Config(model_path="unused", algorithm=now[name]))
        saved = {**{k: v for k, v in flat.items() if not k.startswith("algorithm.")}, **saved}
        assert resume_changes(saved, flat) == [], name
    flat = flatten(Config(model_path="unused", algorithm=AlgorithmConfig(loss=losses.ClipCov(ratio=0.02))))
    saved = {**{k: v for k, v in flat.items() if not k.startswith("algorithm.")}, **old["clip_cov"]}
    assert resume_changes(saved, flat) == ["algorithm.loss.ratio: 0.01 -> 0.02"]
