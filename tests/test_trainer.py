"""The host loop: every preset end to end, mu > 1 semantics, dynamic sampling, kill and resume."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from grpo_jax import algorithms, models, trainer
from grpo_jax.config import Config, MeshConfig, OptimConfig, SamplingConfig, TrainConfig
from grpo_jax.data import CharTokenizer
from grpo_jax.rewards import RewardConfig

MODEL = models.ModelConfig(
    model_type="qwen3", vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True,
    bos_token_id=CharTokenizer.bos_id, eos_token_id=CharTokenizer.eos_id,
)


def config(tmp_path, preset="gspo", **train) -> Config:
    alg = algorithms.AlgorithmConfig.from_preset(preset)
    return Config(
        model=MODEL,
        tokenizer="char",
        mesh=MeshConfig(data=2, tensor=-1),
        # Half the vocabulary stops a completion, so an untrained model's lengths (and with them the
        # length reward and the advantages) vary within every group.
        sampling=SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=4, stop_tokens=tuple(range(3, 50))),
        algorithm=alg,
        reward=RewardConfig(names=("exact", "length"), weights=(1.0, 0.5), num_workers=1),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(**{
            "steps": 2, "prompts_per_step": 2, "minibatches": 2, "eval_prompts": 4,
            "out_dir": str(tmp_path), "checkpoint_every": 1, **train,
        }),
    )


@pytest.mark.parametrize("preset", sorted(algorithms.PRESETS))
def test_every_preset_runs_two_steps(preset, tmp_path):
    # Losses without an importance ratio run one update per rollout batch (2 minibatches are refused).
    minibatches = 2 if algorithms.LOSSES[algorithms.PRESETS[preset].get("loss", "ppo_clip")].ratio else 1
    t = trainer.Trainer(config(tmp_path, preset, minibatches=minibatches))
    for _ in range(2):
        metrics, updates = t.train_step()
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    mu = t.cfg.algorithm.num_iterations
    assert int(t.state.step) + int(t.state.empty) == 2 * mu * minibatches and int(t.state.skipped) == 0
    assert (t.ref_params is None) == (t.cfg.algorithm.beta == 0)
    assert metrics["groups/kept"] <= 2 and metrics["completion/length_mean"] > 0


def test_mu_2_reuses_old_logprobs_so_the_ratio_moves_and_clips(tmp_path):
    cfg = config(tmp_path, "gspo", minibatches=1)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, num_iterations=2))
    _, updates = trainer.Trainer(cfg).train_step()
    first, second = updates
    # First inner step: on-policy, l == l^old exactly, so every ratio is 1 and nothing clips.
    assert first["log_ratio_abs_max"] < 1e-5
    assert first["clip_frac_low"] == first["clip_frac_high"] == 0
    # Second: same rollouts, same l^old, moved params: the ratio leaves 1 and GSPO's clip engages.
    assert second["log_ratio_abs_max"] > 1e-3
    assert second["clip_frac_low"] + second["clip_frac_high"] > 0


def test_dynamic_sampling_drops_zero_variance_groups(tmp_path):
    cfg = config(tmp_path, "dapo")
    # Exact match only and no overlong shaping: an untrained model scores 0 everywhere, so every
    # group is dropped. (With shaping on, lengths differ and so do the shaped rewards.)
    cfg = dataclasses.replace(
        cfg,
        reward=RewardConfig(names=("exact",), weights=(1.0,), num_workers=1),
        algorithm=dataclasses.replace(cfg.algorithm, overlong_buffer_frac=0.0),
    )
    t = trainer.Trainer(cfg)
    metrics, _ = t.train_step()
    assert metrics["groups/kept"] == 0 and metrics["groups/gen_rounds"] == cfg.algorithm.max_gen_batches
    assert t.position == cfg.algorithm.max_gen_batches  # each round consumed a prompt batch
    assert metrics["groups/zero_variance_frac"] == 1.0
    # an all-padding batch is no update: counted as empty, summed over the step's 2 updates
    assert metrics["loss"] == 0 and metrics["empty_updates"] == 2 and int(t.state.skipped) == 0
    assert (int(t.state.step), int(t.state.empty)) == (0, 2)


def test_dynamic_sampling_filters_on_correctness_not_on_shaped_reward(tmp_path, monkeypatch):
    """Issue 13.5: a group all correct but of different lengths differs only in the overlong penalty;
    DAPO (0 < correct < G) drops it, where the old filter on the total reward kept it and trained on
    the length penalty alone. The zero-variance metric counts it too (one definition)."""
    cfg = config(tmp_path, "dapo")
    real_sample, drawn = trainer.Trainer.sample, []

    def all_correct(self, examples, rng, sampling_cfg):
        s = real_sample(self, examples, rng, sampling_cfg)
        s["rewards"][:, 0] = 1.0  # the exact-match column: every completion right
        s["correct"] = np.ones(len(s["rewards"]), bool)
        drawn.append(s)
        return s

    monkeypatch.setattr(trainer.Trainer, "sample", all_correct)
    t = trainer.Trainer(cfg)
    host, metrics = t.rollout_batch(jax.random.key(0))
    # the shaped total reward does vary within some group: the old filter would have kept it
    max_len, g = cfg.sampling.max_new_tokens, cfg.sampling.group_size
    penalty = [np.asarray(algorithms.overlong_penalty(cfg.algorithm, np.asarray(s["rollout"].lengths), max_len))
               for s in drawn]
    assert any(np.ptp(p.reshape(-1, g), axis=1).max() > 0 for p in penalty)
    assert metrics["groups/kept"] == 0 and metrics["groups/zero_variance_frac"] == 1.0
    assert metrics["groups/gen_rounds"] == cfg.algorithm.max_gen_batches and host[3].sum() == 0


def test_kill_and_resume_continues_the_same_trajectory(tmp_path, monkeypatch):
    cfg = config(tmp_path / "run", steps=2)  # one config (and one compilation) for all three runs
    straight = trainer.train(cfg)
    (tmp_path / "run").rename(tmp_path / "straight")

    real_step = trainer.Trainer.train_step

    def killed_after_1(self):
        if self.step == 1:
            raise KeyboardInterrupt  # a kill after N/2 = 1 step; the exit path still checkpoints
        return real_step(self)

    monkeypatch.setattr(trainer.Trainer, "train_step", killed_after_1)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg)
    monkeypatch.setattr(trainer.Trainer, "train_step", real_step)
    resumed = trainer.train(cfg)

    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("straight", "run")}
    by_step = {name: {r["step"]: r for r in rs if "reward/mean" in r} for name, rs in rows.items()}
    assert sorted(by_step["run"]) == sorted(by_step["straight"]) == [1, 2]
    a, b = by_step["straight"][2], by_step["run"][2]  # the step after the resume
    for key in ("reward/mean", "loss", "grad_norm", "completion/length_mean", "ratio_max"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)
    assert straight["last_eval"] == resumed["last_eval"]
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    for name in ("straight", "run"):
        assert (tmp_path / name / "curves.png").stat().st_size > 0
        assert list((tmp_path / name / "tensorboard").iterdir())


def test_truncation_masking_and_truncated_importance_sampling(tmp_path):
    cfg = config(tmp_path, "grpo")
    # No stop tokens: an untrained model runs every completion into the length limit.
    cfg = dataclasses.replace(
        cfg,
        sampling=dataclasses.replace(cfg.sampling, stop_tokens=()),
        algorithm=dataclasses.replace(cfg.algorithm, mask_truncated=True, tis_level="token", tis_cap=2.0),
    )
    t = trainer.Trainer(cfg)
    host, metrics = t.rollout_batch(jax.random.key(0))
    assert metrics["completion/truncated_frac"] == 1.0
    assert host[3].sum() == 0  # every token masked out
    metrics, updates = t.train_step()
    assert metrics["loss"] == 0 and metrics["grad_norm"] == 0 and "tis_weight_mean" in metrics
    # Issue 13.3 / 20.6: each of the 2 empty updates is counted, and the counts are summed (not averaged)
    assert [u["empty_updates"] for u in updates] == [1, 1] and metrics["empty_updates"] == 2
    assert (int(t.state.step), int(t.state.empty), int(t.state.skipped)) == (0, 2, 0)
