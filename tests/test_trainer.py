"""The host loop: every preset end to end, mu > 1 semantics, dynamic sampling, stops mid-step and resume."""

import contextlib
import dataclasses
import json
import shutil
import signal

import jax
import numpy as np
import pytest

import fault_rewards
from grpo_jax import algorithms, checkpoint, data, evaluate, models, run, trainer
from grpo_jax import train_step as ts
from grpo_jax.config import Config, MeshConfig, OptimConfig, RewardConfig, SamplingConfig, TrainConfig, flatten
from grpo_jax.data import CharTokenizer, samplers
from grpo_jax.logging import read_events
from grpo_jax.metrics import Metric
from grpo_jax.rewards import Reward

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
        # tensor=4 splits the MLP; this tiny model's 2 heads and 94-row embedding stay whole (49% of the
        # train state): the sharding tolerance would stop it (sharding.check_replicated)
        mesh=MeshConfig(data=2, tensor=-1, max_replicated_fraction=1.0),
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
    minibatches = 2 if algorithms.AlgorithmConfig.from_preset(preset).loss.spec.ratio else 1
    t = trainer.Trainer(config(tmp_path, preset, minibatches=minibatches))
    for _ in range(2):
        metrics, updates = t.train_step()
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    mu = t.cfg.algorithm.num_iterations
    assert int(t.state.step) + int(t.state.empty) == 2 * mu * minibatches and int(t.state.skipped) == 0
    assert (t.ref_params is None) == (t.cfg.algorithm.beta == 0)
    assert metrics["groups/kept"] <= 2 and metrics["completion/length_mean"] > 0


def test_unlikeliness_ranks_each_group_by_the_samplers_mean_logprob(tmp_path):
    """The trainer hands compute_advantages each row's mean token l^samp: the rollout batch's advantages
    are the float64 reference's on the drawn rewards and the sampler's log-probs averaged here by hand."""
    t = trainer.Trainer(config(tmp_path, "unlikeliness", steps=1))
    metrics, _ = t.train_step()
    (s,) = t.last_rollout["drawn"]
    logp, mask = np.asarray(s["rollout"].logprobs, np.float64), np.asarray(s["rollout"].mask)
    mean = np.array([logp[i][mask[i]].mean() for i in range(len(mask))])
    want = algorithms.reference.compute_advantages(t.cfg.algorithm, s["rewards"], np.arange(len(mask)) // 4, None,
                                                    t.cfg.reward.weights, mean)
    np.testing.assert_allclose(t.last_rollout["advantages"], want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(want, algorithms.reference.compute_advantages(
        dataclasses.replace(t.cfg.algorithm, unlikeliness=0.0), s["rewards"], np.arange(len(mask)) // 4, None,
        t.cfg.reward.weights))  # the ranks changed the advantages
    # two rewards: the distinct (exact, length) pairs and advantages of each group, averaged
    groups = [(s["rewards"][i:i + 4], want[i:i + 4]) for i in range(0, len(want), 4)]
    assert metrics["advantage/distinct_reward_combos"] == np.mean([len({tuple(r) for r in rg}) for rg, _ in groups])
    assert metrics["advantage/distinct_values"] == np.mean([len(np.unique(np.round(ag, 4))) for _, ag in groups])


def test_label_noise_flips_the_rounds_correctness_labels_by_its_key(tmp_path):
    """reward.label_noise: a round samples the completions of a clean round with the same key, its
    exact-match labels flipped (the length reward untouched), the same flips again under that key, others
    under another; reward/label_flip_frac counts them; label_noise = 0 is the clean round. The round keeps
    the true labels (clean_correct): a rollout batch logs accuracy on the flipped labels it trains on and
    accuracy_clean on the true ones, the latter only under label noise."""
    cfg = config(tmp_path, "grpo", steps=1)
    t = trainer.Trainer(dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, label_noise=0.3)))
    examples, key = samplers.Picked(t.task.train, np.arange(8)), jax.random.key(7)
    noisy, again, other = (t.sample(examples, k, t.cfg.sampling) for k in (key, key, jax.random.key(8)))
    t.cfg = cfg
    clean, other_clean = (t.sample(examples, k, t.cfg.sampling) for k in (key, jax.random.key(8)))
    assert noisy["completions"] == clean["completions"] and "reward/label_flip_frac" not in clean["metrics"]
    flipped = noisy["rewards"][:, 0] != clean["rewards"][:, 0]
    np.testing.assert_array_equal(noisy["rewards"][flipped, 0], 1 - clean["rewards"][flipped, 0])
    np.testing.assert_array_equal(noisy["rewards"][:, 1], clean["rewards"][:, 1])
    assert 0 < flipped.sum() < len(flipped) and noisy["metrics"]["reward/label_flip_frac"] == flipped.mean()
    np.testing.assert_array_equal(again["rewards"], noisy["rewards"])
    assert ((other["rewards"][:, 0] != other_clean["rewards"][:, 0]) != flipped).any()
    np.testing.assert_array_equal(noisy["clean_correct"], clean["correct"])
    np.testing.assert_array_equal(clean["clean_correct"], clean["correct"])
    assert (noisy["correct"] != noisy["clean_correct"]).any()
    _, metrics = t.rollout_batch(key)
    assert "accuracy_clean" not in metrics
    t.cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, label_noise=0.3))
    _, metrics = t.rollout_batch(key)
    (s,) = t.last_rollout["drawn"]
    assert metrics["accuracy"] == s["correct"].mean() and metrics["accuracy_clean"] == s["clean_correct"].mean()
    with pytest.raises(ValueError, match="reward.label_noise=0.3 flips correctness labels, but none of"):
        trainer.Trainer(dataclasses.replace(cfg, reward=RewardConfig(names=("length",), label_noise=0.3, num_workers=1)))


def test_the_samplers_logit_noise_is_the_drift_the_trainer_logs(tmp_path):
    """sampling.logit_noise = 0.3 (the trainer's l^old clean): |l^samp - l^old| averages a few tenths,
    about s * E|N(0, 1)| = 0.24 for this near-uniform untrained policy, against float rounding without it."""
    drift = {}
    for s in (0.0, 0.3):
        cfg = config(tmp_path / str(s), "grpo", steps=1)
        t = trainer.Trainer(dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, logit_noise=s)))
        drift[s] = t.train_step()[0]["sampler_drift_mean"]
    assert drift[0.0] < 1e-5 and 0.15 < drift[0.3] < 0.4, drift


def test_prefix_grouping_through_the_trainer_changes_no_metric(tmp_path):
    """train.prefix_grouper on the trainer's rollout batches (groups in consecutive rows, split into
    2 minibatches with l^old from the grouped forward): every metric of a step as without it."""
    timing = ("time/", "throughput/", "reward/time_s")
    steps = []
    for grouper in (False, True):
        t = trainer.Trainer(config(tmp_path / str(grouper), "gspo", prefix_grouper=grouper))
        metrics, _ = t.train_step()
        steps.append({k: v for k, v in metrics.items() if not k.startswith(timing)})
    assert steps[0].keys() == steps[1].keys() and steps[0]["clip_frac_high"] + steps[0]["clip_frac_low"] > 0
    for name in steps[0]:
        np.testing.assert_allclose(steps[1][name], steps[0][name], rtol=1e-4, atol=1e-6, err_msg=name)


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
    assert (int(t.state.step), int(t.state.empty)) == (0, 2) and t.optimizer_step == 0


def test_the_updates_of_a_step_run_back_to_back_without_reading_the_device(tmp_path, monkeypatch):
    """Issue 35.3: from a step's first update to the one read of their metrics, the host reads nothing
    from the device (it read TrainState.step before every update, for the learning rate); the host's
    count of optimizer updates is TrainState.step, and each update logs the rate at its step."""
    cfg = config(tmp_path, "gspo")
    t = trainer.Trainer(dataclasses.replace(cfg, optim=OptimConfig(learning_rate=3e-3, warmup_steps=3)))
    array, in_loop, reads = type(t.state.step), [], []
    value, update, read_updates = array._value, t.update, trainer._read_updates

    def counted(self):  # every read of an array's value (int(), float(), np.asarray) goes through it
        if in_loop:
            reads.append(self.shape)
        return value.fget(self)

    def first_update_opens(*args):
        if not in_loop:  # the transfer guard: on CPU it lets such reads pass, on accelerators it raises
            in_loop.append(jax.transfer_guard_device_to_host("disallow"))
            in_loop[0].__enter__()
        return update(*args)

    def read_closes(*args):
        if in_loop:
            in_loop.pop().__exit__(None, None, None)
        return read_updates(*args)

    monkeypatch.setattr(array, "_value", property(counted))
    monkeypatch.setattr(t, "update", first_update_opens)
    monkeypatch.setattr(trainer, "_read_updates", read_closes)
    logged = [u["learning_rate"] for _ in range(2) for u in t.train_step()[1]]
    monkeypatch.undo()
    assert reads == []
    assert t.optimizer_step == int(t.state.step) == 4
    assert logged == [float(t.schedule(k)) for k in range(4)]  # warmup: 0, 1e-3, 2e-3, then 3e-3
    np.testing.assert_allclose(logged, [0.0, 1e-3, 2e-3, 3e-3], rtol=1e-6)


def test_each_update_logs_the_rate_of_the_updates_applied_before_it():
    """An empty or skipped update leaves the optimizer step, hence the next update's rate, where it was."""
    flags = [(0, 0), (0, 1), (1, 0), (0, 0)]  # (skipped, empty): applied, empty, skipped, applied
    updates = [{"skipped_updates": Metric.sum(s), "empty_updates": Metric.sum(e)} for s, e in flags]
    step, each = trainer._read_updates(updates, [0.0, 0.25, 0.5, 0.75])
    assert [float(u["learning_rate"]) for u in each] == [0.0, 0.25, 0.25, 0.25]
    assert float(step["learning_rate"]) == 0.1875 and float(step["empty_updates"]) == 1


def test_dynamic_sampling_filters_on_correctness_not_on_shaped_reward(tmp_path, monkeypatch):
    """Issue 13.5: a group all correct but of different lengths differs only in the overlong penalty;
    DAPO (0 < correct < G) drops it, where the old filter on the total reward kept it and trained on
    the length penalty alone. The zero-variance metric counts it too (one definition)."""
    cfg = config(tmp_path, "dapo")
    real_sample, drawn = trainer.Trainer.sample, []

    def all_correct(self, examples, rng, sampling_cfg, temperatures=None):
        s = real_sample(self, examples, rng, sampling_cfg, temperatures)
        s["rewards"][:, 0] = 1.0  # the exact-match column: every completion right
        s["correct"] = np.ones(len(s["rewards"]), bool)
        drawn.append(s)
        return s

    monkeypatch.setattr(trainer.Trainer, "sample", all_correct)
    t = trainer.Trainer(cfg)
    batches, metrics = t.rollout_batch(jax.random.key(0))
    # the shaped total reward does vary within some group: the old filter would have kept it
    max_len, g = cfg.sampling.max_new_tokens, cfg.sampling.group_size
    penalty = [np.asarray(algorithms.overlong_penalty(cfg.algorithm, np.asarray(s["rollout"].lengths), max_len))
               for s in drawn]
    assert any(np.ptp(p.reshape(-1, g), axis=1).max() > 0 for p in penalty)
    assert metrics["groups/kept"] == 0 and metrics["groups/zero_variance_frac"] == 1.0
    assert metrics["groups/gen_rounds"] == cfg.algorithm.max_gen_batches
    assert not any(np.asarray(b.mask).any() for b in batches)


def test_kept_groups_are_gathered_into_the_batch_on_device(tmp_path, monkeypatch):
    """DAPO keeps groups from different generation rounds; the batch is assembled on device (on several
    processes a row may come from another host) and holds exactly the kept rows, in order, then masked
    padding. Checked against the drawn rounds' own prompts, completions and sampler log-probs."""
    cfg = config(tmp_path, "dapo")
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, max_gen_batches=2, mask_truncated=True))
    # per round, which completions are correct: an informative group has both
    rounds = iter([[1, 1, 1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1],   # step 1: group 1 of round 0, then none
                   [0, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 1]])  # step 2: group 0 of round 0, group 1 of round 1
    real_sample, drawn = trainer.Trainer.sample, []

    def controlled(self, examples, rng, sampling_cfg, temperatures=None):
        s = real_sample(self, examples, rng, sampling_cfg, temperatures)
        s["correct"] = np.array(next(rounds), bool)
        drawn.append(s)
        return s

    monkeypatch.setattr(trainer.Trainer, "sample", controlled)
    t = trainer.Trainer(cfg)
    width, g = cfg.sampling.max_prompt_len, cfg.sampling.group_size
    for kept in ([(0, 1), None], [(0, 0), (1, 1)]):
        drawn.clear()
        batches, metrics = t.rollout_batch(jax.random.key(len(kept)))
        assert metrics["groups/kept"] == sum(k is not None for k in kept)
        for b, k in zip(batches, kept):  # 2 minibatches of one group each
            tokens, mask = np.asarray(b.tokens), np.asarray(b.mask)
            if k is None:
                assert not tokens.any() and not mask.any() and not np.asarray(b.advantages).any()
                continue
            s, rows = drawn[k[0]], slice(k[1] * g, (k[1] + 1) * g)
            r = jax.tree.map(np.asarray, s["rollout"])
            np.testing.assert_array_equal(tokens[:, :width], np.asarray(s["prompts"].tokens)[rows])
            np.testing.assert_array_equal(tokens[:, width:], r.tokens[rows])
            np.testing.assert_array_equal(mask, r.mask[rows] & ~r.truncated[rows, None])
            np.testing.assert_array_equal(np.asarray(b.sampler_logp), r.logprobs[rows])
            assert np.asarray(b.advantages).any()


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 3-step run (2 updates a step, checkpoints at steps 2 and 3), moved to `straight/`
    once done: the other runs reuse its directory name, so their configs (and compilations) are the same."""
    tmp = tmp_path_factory.mktemp("resume")
    result = run.train(config(tmp / "run", steps=3, checkpoint_every=2))
    (tmp / "run").rename(tmp / "straight")
    return tmp, result


def rows(out) -> list[dict]:
    """metrics.jsonl without the wall-clock metrics, which differ between any two runs."""
    timing = ("time/", "throughput/", "reward/time_s")
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(timing)}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGINT twice", "SIGINT twice, swallowed", "error"])
def test_a_stop_mid_step_resumes_exactly(stop, straight, monkeypatch, capsys):
    """A stop between the two updates of step 2, which has no checkpoint yet. SIGINT and SIGTERM finish
    the step and save it; a second SIGINT abandons the step, and an error stops it: both save nothing
    (the state is half-updated, the data position past step 2's prompts), so the run restarts. Either
    way the resumed run ends bit for bit where the uninterrupted one does, with each step logged once."""
    tmp, reference = straight
    shutil.rmtree(tmp / "run", ignore_errors=True)
    compiled = ts.compiled_train_step
    calls = []

    def stopping_at_update_3(*key):
        optimizer, state_sharding, ref_sharding, update = compiled(*key)

        def update_then_stop(*args):
            out = update(*args)  # consumes (donates) the state it was given
            calls.append(1)
            if len(calls) == 3:
                if stop == "error":
                    raise RuntimeError("a failure mid-step")
                signal.raise_signal(getattr(signal, stop.split()[0]))
                if stop == "SIGINT twice":
                    signal.raise_signal(signal.SIGINT)
                if stop == "SIGINT twice, swallowed":  # where XLA's gc callback ignores the exception
                    with contextlib.suppress(KeyboardInterrupt):
                        signal.raise_signal(signal.SIGINT)
            return out

        return optimizer, state_sharding, ref_sharding, update_then_stop

    monkeypatch.setattr(trainer.ts, "compiled_train_step", stopping_at_update_3)
    expected, match = {"SIGINT": (KeyboardInterrupt, ""), "SIGTERM": (SystemExit, "143"),
                       "SIGINT twice": (KeyboardInterrupt, "second SIGINT: abandoned the step in flight, unsaved"),
                       "SIGINT twice, swallowed": (KeyboardInterrupt, "second SIGINT: abandoned the step in flight"),
                       "error": (RuntimeError, "mid-step")}[stop]
    with pytest.raises(expected, match=match):
        run.train(config(tmp / "run", steps=3, checkpoint_every=2))
    monkeypatch.undo()
    saved = checkpoint.Checkpointer(tmp / "run" / "checkpoints", 1, 2).all_steps()
    finished = stop in ("SIGINT", "SIGTERM")
    assert saved == ([2] if finished else [])
    assert ("stopped after step 2" in capsys.readouterr().out) == finished

    resumed = run.train(config(tmp / "run", steps=3, checkpoint_every=2))
    for a, b in zip(jax.tree.leaves(reference["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed["last_eval"] == reference["last_eval"]
    assert (reference["resumed_from"], resumed["resumed_from"]) == (None, 2 if finished else None)
    assert rows(tmp / "run") == rows(tmp / "straight")  # steps 0..3, each once, the same values

    (tmp / "run" / "curves.png").unlink()  # as a kill while the run closed would leave it
    again = run.train(config(tmp / "run", steps=3, checkpoint_every=2))  # a finished run says so, does nothing
    assert "run complete" in capsys.readouterr().out and (tmp / "run" / "curves.png").exists()  # but the plot
    assert rows(tmp / "run") == rows(tmp / "straight")
    assert again["first_eval"] == reference["first_eval"] and again["last_eval"] == reference["last_eval"]
    assert again["resumed_from"] == 3


@pytest.mark.parametrize("on_failure", ["drop_group", "zero"])
def test_a_nonfinite_reward_drops_its_group_and_learning_goes_on(on_failure, tmp_path, caplog):
    """A reward that returns nan for every completion of one of the step's two prompts: the failures are
    counted and logged under its name and that group is dropped (or, with on_failure="zero", scored 0 by
    that reward), so the update's inputs stay finite (a nan reward used to make every later update
    non-finite, hence skipped)."""
    cfg = dataclasses.replace(config(tmp_path), reward=RewardConfig(
        names=("length", "nan_for_odd"), weights=(0.5, 1.0), num_workers=1, on_failure=on_failure))
    t = trainer.Trainer(cfg, rewards={"nan_for_odd": fault_rewards.nan_for_odd_answers})  # a reward passed in code
    first = data.batches(t.task.train, batch_size=2, seed=0)[0]  # the uniform sampler's first round
    assert [int(first[i]["answer"]) % 2 for i in range(2)] == [0, 1]  # seed 0: the second is odd
    batches, metrics = t.rollout_batch(jax.random.key(0))
    mask, advantages = (np.concatenate([np.asarray(getattr(b, f)) for b in batches]) for f in ("mask", "advantages"))
    assert metrics["reward/nan_for_odd_answers/nonfinites"] == 4
    assert "reward 'nan_for_odd_answers': 4 of 8 call(s) failed (nonfinite)" in caplog.text
    assert np.isfinite(advantages).all() and np.isfinite(metrics["reward/mean"])
    assert np.abs(advantages[:4]).sum() > 0 and mask[:4].any()  # the even prompt's group learns
    if on_failure == "drop_group":
        assert metrics["groups/kept"] == 1
        assert not mask[4:].any() and not advantages[4:].any()  # the odd one's rows are masked padding
    else:  # the odd group learns from its length reward alone
        assert metrics["groups/kept"] == 2 and mask[4:].any() and np.abs(advantages[4:]).sum() > 0


def test_a_run_that_only_skips_stops_with_the_cause_and_step(tmp_path):
    """Weights so large that the forward overflows make every update non-finite: after one step's worth
    of consecutive skipped updates the run stops, saving nothing (no checkpoint was due yet), and leaves
    the mark that lets its resume lower the learning rate."""
    cfg = config(tmp_path, steps=4, checkpoint_every=2, max_skipped_steps=1)
    huge = jax.tree.map(lambda w: w * 1e30, models.init(cfg.model, jax.random.key(0)))
    with pytest.raises(RuntimeError, match=r"step 1: the last 2 updates were all skipped \(non-finite gradient\); "
                                           r"stopping, unsaved. The updates diverged: resume from the last checkpoint "
                                           r"with a lower optim.learning_rate or optim.max_grad_norm"):
        run.train(cfg, huge)
    assert checkpoint.Checkpointer(tmp_path / "checkpoints", 1, 1).all_steps() == []
    assert json.loads((tmp_path / run.DIVERGED).read_text())["step"] == 1


def test_after_a_divergence_the_resume_may_lower_the_learning_rate(tmp_path):
    saved = flatten(config(tmp_path))
    lower = config(tmp_path)
    lower = dataclasses.replace(lower, optim=dataclasses.replace(lower.optim, learning_rate=1e-4, max_grad_norm=0.5))
    with pytest.raises(ValueError, match="optim.learning_rate: 0.003 -> 0.0001"):
        run.check_resume(saved, lower, tmp_path)
    run.check_resume(saved, lower, tmp_path, run.DIVERGED_MAY_CHANGE)  # what the stop's advice needs


def test_skip_watch_counts_consecutive_skipped_updates_across_steps():
    def update(cause=None, empty=0):
        return {"skipped_updates": int(cause is not None), "empty_updates": empty,
                **{name: int(name == cause) for name in ts.SKIP_CAUSES}}

    watch = run.SkipWatch(limit=3)
    assert watch.observe(1, [update("nonfinite_grad"), update("nonfinite_grad")]) is None
    assert watch.observe(2, [update(empty=1)]) is None  # an empty update neither ends nor extends the streak
    assert watch.observe(3, [update("nonfinite_params")]) == (
        "step 3: the last 3 updates were all skipped (non-finite parameters); stopping, unsaved. The updates "
        "diverged: resume from the last checkpoint with a lower optim.learning_rate or optim.max_grad_norm (after "
        "this stop, a resume may change them)")
    watch = run.SkipWatch(limit=3)
    assert watch.observe(1, [update("nonfinite_loss"), update("nonfinite_loss"), update()]) is None
    assert watch.observe(2, [update("nonfinite_loss"), update("nonfinite_loss")]) is None  # a good update reset it


def test_truncation_masking_and_truncated_importance_sampling(tmp_path):
    cfg = config(tmp_path, "grpo")
    # No stop tokens: an untrained model runs every completion into the length limit.
    cfg = dataclasses.replace(
        cfg,
        sampling=dataclasses.replace(cfg.sampling, stop_tokens=()),
        algorithm=dataclasses.replace(cfg.algorithm, mask_truncated=True, tis_level="token", tis_cap=2.0),
    )
    t = trainer.Trainer(cfg)
    batches, metrics = t.rollout_batch(jax.random.key(0))
    assert metrics["completion/truncated_frac"] == 1.0
    assert not any(np.asarray(b.mask).any() for b in batches)  # every token masked out
    metrics, updates = t.train_step()
    assert metrics["loss"] == 0 and metrics["grad_norm"] == 0 and "tis_weight_mean" in metrics
    # Issue 13.3 / 20.6: each of the 2 empty updates is counted, and the counts are summed (not averaged)
    assert [u["empty_updates"] for u in updates] == [1, 1] and metrics["empty_updates"] == 2
    assert (int(t.state.step), int(t.state.empty), int(t.state.skipped)) == (0, 2, 0)


# -- one's own data and rewards, completion logs, pass@k, per-example results ------------------------------

SUMS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def exact_sum(prompt, completion, example, **_):
    """A reward passed in code and scored in the trainer's process: a closure would do as well."""
    return float(completion == example["answer"])


def own_data_config(tmp_path, **train) -> Config:
    cfg = config(tmp_path, steps=2, checkpoint_every=1, log_completions_every=1, eval_samples=4, **train)
    return dataclasses.replace(
        cfg, task=data.Examples("sums"),
        reward=RewardConfig(names=("sum", "length"), weights=(1.0, 0.5), num_workers=0),
    )


def jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def own_data_run(tmp_path_factory):
    """A 2-step run, moved to `done/` once finished: later runs reuse the directory name `run`, so their
    configs (and compilations) are the same."""
    tmp = tmp_path_factory.mktemp("own")
    mine = dict(examples=SUMS, held_out=SUMS[:4], rewards={"sum": Reward(exact_sum, correctness=True)})
    result = run.train(own_data_config(tmp / "run"), **mine)
    (tmp / "run").rename(tmp / "done")
    return tmp, result, mine


def test_own_examples_and_reward_in_code_train_and_log_their_completions(own_data_run):
    tmp, result, _ = own_data_run
    out, cfg, g = tmp / "done", own_data_config(tmp / "run"), 4
    records = jsonl(out / "completions.jsonl")
    assert sorted({r["step"] for r in records}) == [1, 2] and len(records) == 2 * 2 * g  # every kept row, 2 steps
    by_prompt = {ex["prompt"]: ex for ex in SUMS}
    for r in records:
        example = by_prompt[r["prompt"]]  # the prompts are ours (the PLAIN template renders them as is)
        assert r["rewards"]["sum"] == exact_sum(r["prompt"], r["completion"], example)
        assert r["rewards"]["length"] == -r["length"] / cfg.sampling.max_new_tokens
        ids = CharTokenizer().encode(r["completion"], continuation=True)  # the text drops the eos id
        stopped = len(ids) == r["length"] - 1 or ids[-1] in cfg.sampling.stop_tokens
        assert 0 < r["length"] <= cfg.sampling.max_new_tokens and len(ids) <= r["length"]
        assert r["truncated"] == (not stopped and r["length"] == cfg.sampling.max_new_tokens)
    for i in range(0, len(records), g):  # the logged advantages are the group-standardized weighted rewards
        group = records[i:i + g]
        total = np.array([r["rewards"]["sum"] + 0.5 * r["rewards"]["length"] for r in group], np.float64)
        want = (total - total.mean()) / (total.std(ddof=1) + cfg.algorithm.advantage.eps) if np.ptp(total) else 0 * total
        np.testing.assert_allclose([r["advantage"] for r in group], want, rtol=1e-5, atol=1e-6)
    assert result["last_eval"] is not None and "eval/pass@4" in result["last_eval"]


def test_held_out_results_per_example_agree_with_the_pass_at_k_metrics(own_data_run):
    tmp, result, _ = own_data_run
    rows = jsonl(tmp / "done" / "held_out.jsonl")
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and {r["step"] for r in rows} == {2}
    assert [r["prompt"] for r in rows] == [ex["prompt"] for ex in SUMS[:4]]
    correct = np.array([r["sampled"]["correct"] for r in rows])
    assert all(r["sampled"]["samples"] == 4 for r in rows) and all(0 <= c <= 4 for c in correct)
    last = result["last_eval"]
    assert last["eval/accuracy_sampled"] == pytest.approx(correct.mean() / 4)  # avg@4
    assert last["eval/pass@4"] == pytest.approx((correct > 0).mean())
    greedy = [r["greedy"] for r in rows]
    assert last["eval/accuracy_greedy"] == pytest.approx(np.mean([r["correct"] for r in greedy]))
    assert all(r["correct"] == exact_sum("", r["completion"], ex) for r, ex in zip(greedy, SUMS))


def test_histograms_of_rewards_and_lengths_reach_tensorboard(own_data_run):
    tmp, _, _ = own_data_run
    out = tmp / "done"
    histograms = {(v.tag, e.step): v.histo for e in read_events(out / "tensorboard") for v in e.summary.value
                  if v.HasField("histo")}
    assert sorted(histograms) == [(tag, step) for tag in ("completion/length", "reward/total") for step in (1, 2)]
    for step in (1, 2):  # every group kept: the 8 rows drawn are the 8 logged
        logged = [r for r in jsonl(out / "completions.jsonl") if r["step"] == step]
        lengths, totals = histograms[("completion/length", step)], histograms[("reward/total", step)]
        assert lengths.num == totals.num == 8 and sum(lengths.bucket) == 8
        assert lengths.sum == sum(r["length"] for r in logged) and lengths.max == max(r["length"] for r in logged)
        assert totals.sum == pytest.approx(sum(r["rewards"]["sum"] + 0.5 * r["rewards"]["length"] for r in logged))


def test_completion_logs_are_resume_safe(own_data_run):
    """Killed after logging step 2 but before its checkpoint: the resumed run logs step 2 again, once."""
    tmp, _, mine = own_data_run
    out, again = tmp / "done", tmp / "run"
    shutil.rmtree(again, ignore_errors=True)
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "2")
    (again / "held_out.jsonl").unlink()  # written again at the end
    run.train(own_data_config(again), **mine)
    for name in ("completions.jsonl", "histograms.jsonl"):
        assert jsonl(again / name) == jsonl(out / name), name
    assert jsonl(again / "held_out.jsonl") == jsonl(out / "held_out.jsonl")


def test_a_run_without_a_held_out_set_does_not_evaluate(own_data_run):
    tmp, _, mine = own_data_run
    out = tmp / "run"
    shutil.rmtree(out, ignore_errors=True)
    result = run.train(own_data_config(out), examples=SUMS, rewards=mine["rewards"])
    assert result["first_eval"] is None and result["last_eval"] is None
    assert not any(k.startswith("eval/") for r in jsonl(out / "metrics.jsonl") for k in r)
    assert not (out / "held_out.jsonl").exists() and [r["step"] for r in jsonl(out / "metrics.jsonl")] == [1, 2]


def test_examples_and_rewards_in_code_are_checked_before_compiling(tmp_path):
    cfg = own_data_config(tmp_path)
    with pytest.raises(ValueError, match="examples passed in code need Config.task=data.Examples"):
        trainer.build_task(dataclasses.replace(cfg, task=data.ArithmeticConfig()), examples=SUMS)
    with pytest.raises(ValueError, match="pass the examples in code"):
        trainer.build_task(cfg)
    with pytest.raises(ValueError, match=r"unknown reward\(s\) \['sum'\]"):
        trainer.build_task(cfg, examples=SUMS)
    workers = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, num_workers=1))
    with pytest.raises(ValueError, match="reward 'sum' .*cannot be loaded by a reward worker process"):
        trainer.build_task(workers, examples=SUMS, reward_fns={"sum": lambda p, c, e, **_: 0.0})
    task = trainer.build_task(workers, examples=SUMS, reward_fns={"sum": exact_sum})  # module-level: a worker imports it
    assert task.held_out is None and task.train is SUMS and not task.rewards[0].correctness


def broken_grader(prompt, completion, example, **_):
    raise ConnectionError("the grader is down")


def test_a_run_whose_every_reward_call_fails_stops_with_the_cause(tmp_path, caplog):
    """Every call raises: every group is dropped (reward.on_failure='drop_group'), no update is applied,
    and after train.max_skipped_steps such steps the run stops, unsaved, naming the cause; it used to
    run to its end and exit 0 having learned nothing."""
    cfg = own_data_config(tmp_path / "run")
    cfg = dataclasses.replace(cfg, reward=RewardConfig(names=("sum",), weights=(1.0,), num_workers=0),
                              train=dataclasses.replace(cfg.train, steps=5, max_skipped_steps=2, checkpoint_every=5))
    with pytest.raises(RuntimeError, match=r"step 2: the last 2 steps applied no update that could teach the policy: "
                                           r"every reward call failed"):
        run.train(cfg, examples=SUMS, held_out=SUMS[:4], rewards={"sum": Reward(broken_grader)})
    assert "the grader is down" in caplog.text
    assert checkpoint.Checkpointer(tmp_path / "run" / "checkpoints", 1, 1).all_steps() == []


def test_idle_watch_names_why_no_update_taught_anything():
    def update(skipped=0, empty=0):
        return {"skipped_updates": skipped, "empty_updates": empty}

    good, empty = [update(), update(empty=1)], [update(empty=1), update(empty=1)]
    watch = run.IdleWatch(limit=2)  # on_failure='zero': updates apply, but every score is a failure's 0
    assert watch.observe(1, {"reward/failed_frac": 1.0}, good) is None
    assert "every reward call failed" in watch.observe(2, {"reward/failed_frac": 1.0}, good)
    watch = run.IdleWatch(limit=2)
    assert watch.observe(1, {"reward/failed_frac": 0.5, "groups/kept": 0.0}, empty) is None
    assert watch.observe(2, {"reward/failed_frac": 0.0, "groups/kept": 2.0}, good) is None  # an update reset it
    assert watch.observe(3, {"reward/failed_frac": 0.5, "groups/kept": 0.0}, empty) is None
    assert "no group was kept" in watch.observe(4, {"reward/failed_frac": 0.5, "groups/kept": 0.0}, empty)
    watch = run.IdleWatch(limit=1)
    assert "every completion's tokens were masked" in watch.observe(1, {"groups/kept": 2.0}, empty)


def test_a_second_sigterm_exits_143_and_is_raised_again_where_it_was_swallowed():
    with run.Interrupts() as interrupts:
        signal.raise_signal(signal.SIGTERM)
        assert interrupts.requested() and not interrupts.abandoned
        with contextlib.suppress(SystemExit):  # swallowed where it landed
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(SystemExit) as stopped:
            interrupts.unless_abandoned()
    assert stopped.value.code == 143 and interrupts.abandoned == "second SIGTERM: abandoned the step in flight, unsaved"


def test_a_held_out_set_of_prime_size_evaluates_on_8_devices_each_problem_once(tmp_path):
    """5 problems on 8 devices: padded to 8 with copies of the first, whose rows enter no metric and no
    record; the metrics recomputed from the per-problem records equal the reported ones."""
    cfg = own_data_config(tmp_path / "run", prompts_per_step=4, minibatches=1, eval_prompts=5)
    cfg = dataclasses.replace(cfg, mesh=MeshConfig(data=-1))
    t = trainer.Trainer(cfg, examples=SUMS, held_out=SUMS[:5], rewards={"sum": Reward(exact_sum, correctness=True)})
    assert t.shards == 8
    metrics, records = t.evaluate_examples()
    assert [r["index"] for r in records] == [0, 1, 2, 3, 4] and [r["prompt"] for r in records] == [
        ex["prompt"] for ex in SUMS[:5]]
    greedy = [r["greedy"]["correct"] for r in records]
    sampled = np.array([r["sampled"]["correct"] for r in records])
    n = cfg.train.eval_samples
    assert metrics["eval/accuracy_greedy"] == pytest.approx(np.mean(greedy))
    assert metrics["eval/accuracy_sampled"] == pytest.approx(sampled.sum() / (5 * n))
    assert metrics["eval/pass@4"] == pytest.approx(np.mean(evaluate.pass_at_k(n, sampled, 4)))
    assert metrics["eval/reward_sampled"] == pytest.approx(
        np.mean([r["sampled"]["reward_mean"] for r in records]))


def test_rollout_seed_changes_the_samples_only(tmp_path):
    """train.rollout_seed reseeds the sampling streams and nothing else: the init, data order and held-out
    set stay those of train.seed (a study's null control resamples a run with it)."""
    base, other = (trainer.Trainer(config(tmp_path / str(r), rollout_seed=r)) for r in (None, 7))
    assert np.array_equal(jax.random.key_data(base.rng), jax.random.key_data(jax.random.key(0)))
    assert np.array_equal(jax.random.key_data(other.rng), jax.random.key_data(jax.random.key(7)))
    first = [samplers.Picked(t.task.train, t.sampler.choose(t.sampler_state, t.draw()).indices) for t in (base, other)]
    assert [ex["prompt"] for ex in first[0]] == [ex["prompt"] for ex in first[1]]
    assert [ex["prompt"] for ex in base.task.held_out] == [ex["prompt"] for ex in other.task.held_out]
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), base.state.params, other.state.params))
    with pytest.raises(ValueError, match="rollout_seed=-1 must be None or in"):
        config(tmp_path, rollout_seed=-1)
