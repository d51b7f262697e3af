"""Bounded staleness (train.max_staleness) and the sampler's own mesh (mesh.sampler), on test_trainer's
tiny model: k = 0 is the synchronous loop bit for bit; k > 0 samples with params k steps old and takes
l^old under them, or (train.proximal="trainer") under the trainer's current params, so that the rollout
correction carries the staleness; a run killed anywhere with k = 2 resumes bit for bit; 8 devices split 4 + 4."""

import dataclasses

import jax
import numpy as np
import pytest

from grpo_jax import checkpoint, lora, models, run, trainer
from grpo_jax.config import Config, override
from test_trainer import config, rows


def test_staleness_0_is_the_synchronous_loop(tmp_path):
    """The loop before max_staleness, written out: sample, l^old, the updates; the same params bit for bit."""
    t, ref = trainer.Trainer(config(tmp_path)), trainer.Trainer(config(tmp_path))
    for _ in range(2):
        t.train_step()
        batches, _ = ref.rollout_batch(jax.random.fold_in(jax.random.fold_in(ref.rng, 0), ref.step))
        for mb in ref.minibatches(batches):
            ref.state, _ = ref.update(ref.state, ref.ref_params, mb)
        ref.step += 1
    assert t._sampled is None and not t.queue  # no copy of the params, nothing sampled ahead
    for a, b in zip(jax.tree.leaves(t.state.params), jax.tree.leaves(ref.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_staleness_k_samples_with_params_k_steps_old(tmp_path):
    t = trainer.Trainer(config(tmp_path, steps=4, max_staleness=2))
    got = [t.train_step()[0] for _ in range(4)]
    assert [m["staleness/max"] for m in got] == [0, 1, 2, 2] and [m["staleness/mean"] for m in got] == [0, 1, 2, 2]
    # l^old is taken under the params that sampled (their sampler log-probs, up to numerics), and the
    # trainer's policy has moved away from them: the ratio leaves 1 at a stale batch's first update
    assert all(m["sampler_drift_max"] < 1e-5 for m in got)
    assert got[3]["staleness/logprob_gap_mean"] > got[0]["staleness/logprob_gap_mean"]
    assert not t.queue  # nothing sampled past train.steps


def logprobs(cfg: Config, params, b) -> np.ndarray:
    """l of a batch's completion tokens from the model's full logits, apart from the train step's forward."""
    new = b.mask.shape[1]
    logp = jax.nn.log_softmax(models.logits(cfg.model, params, b.tokens, b.positions, b.segment_ids)
                              / cfg.sampling.temperature)
    return np.take_along_axis(np.asarray(logp[:, -new - 1:-1]), np.asarray(b.tokens[:, -new:, None]), -1)[..., 0]


@pytest.mark.parametrize("proximal", ["sampler", "trainer"])
def test_the_proximal_policy_gives_l_old_and_the_correction_its_staleness(proximal, tmp_path, monkeypatch):
    """l^old equals the sampling params' log-probs ("sampler") or the current params' before the step's
    updates ("trainer"); only the latter gives token TIS a weight away from 1 and a drift that grows with
    the staleness (0 at step 0, where the sampler's params are the trainer's)."""
    cfg = config(tmp_path, "bnpo", steps=4, max_staleness=2, proximal=proximal)  # token TIS: a token loss
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, tis_level="token", tis_cap=10.0))
    t, seen, minibatches = trainer.Trainer(cfg), [], trainer.Trainer.minibatches

    def checked(self, batches):  # compared when taken: the updates donate the params
        out = minibatches(self, batches)
        for b in out:
            want = logprobs(cfg, self.policy_params if proximal == "trainer" else self.sampler_params, b)
            np.testing.assert_allclose(np.asarray(b.old_logp), want * np.asarray(b.mask), atol=2e-5)
        seen.append(self.step)
        return out
    monkeypatch.setattr(trainer.Trainer, "minibatches", checked)
    got = [t.train_step()[0] for _ in range(4)]
    assert [m["staleness/max"] for m in got] == [0, 1, 2, 2]
    drift, weight = (np.array([m[key] for m in got]) for key in ("sampler_drift_mean", "tis_weight_mean"))
    assert drift[0] < 1e-5 and abs(weight[0] - 1) < 1e-5
    if proximal == "sampler":  # numerics only, at every staleness
        assert seen == [0, 0, 0, 1] and drift.max() < 1e-5 and np.abs(weight - 1).max() < 1e-5
    else:
        assert seen == [0, 1, 2, 3]  # taken at the step that trains
        assert drift[2:].min() > drift[1] > 100 * drift[0] and np.abs(weight[1:] - 1).min() > 1e-3, (drift, weight)


@pytest.mark.parametrize("proximal", ["sampler", "rollout"])
def test_rollout_proximal_takes_l_old_from_the_sampler_with_no_forward(proximal, tmp_path, monkeypatch):
    """train.proximal="rollout" (GSPO sec. 5.4, arXiv 2507.18071): under a logit-noise sampler at k = 0,
    l^old is the rollout's own sampler log-probs exactly, no l^old forward runs, and the correction's
    drift is 0; under the default l^old is recomputed and the drift is the noise's."""
    cfg = config(tmp_path, "bnpo", steps=1, proximal=proximal)
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, logit_noise=0.5),
                              algorithm=dataclasses.replace(cfg.algorithm, tis_level="token", tis_cap=10.0))
    t, minibatches, forwards = trainer.Trainer(cfg), trainer.Trainer.minibatches, []

    def checked(self, batches):
        out = minibatches(self, batches)
        for b in out:
            if proximal == "rollout":
                np.testing.assert_array_equal(np.asarray(b.old_logp), np.asarray(b.sampler_logp) * np.asarray(b.mask))
        return out
    monkeypatch.setattr(trainer.Trainer, "minibatches", checked)
    old_logprobs = trainer.ts.old_logprobs
    monkeypatch.setattr(trainer.ts, "old_logprobs", lambda *a, **k: forwards.append(1) or old_logprobs(*a, **k))
    metrics, _ = t.train_step()
    if proximal == "rollout":
        assert metrics["sampler_drift_mean"] == 0 and abs(metrics["tis_weight_mean"] - 1) < 1e-6
        assert not forwards  # neither an l^old pass nor (on the tiny model) anything else through old_logprobs
    else:
        assert metrics["sampler_drift_mean"] > 1e-2 and forwards, metrics["sampler_drift_mean"]


@pytest.mark.parametrize("moe", [False, True])
def test_rollout_proximal_at_staleness_2_trains_on_the_stale_samplers_log_probs(moe, tmp_path, monkeypatch):
    """train.proximal="rollout" at k = 2: every minibatch's l^old is the stale sampler's log-probs exactly
    (on an MoE model under R3 with the sampler's routes), so the correction sees no drift while the
    trainer's policy has moved two steps from the params that sampled: its log-probs leave the sampler's.
    (The kill-and-resume test below runs it too.)"""
    cfg = config(tmp_path, "grpo", steps=3, max_staleness=2, proximal="rollout")
    if moe:
        cfg = override(cfg, ["model.model_type=qwen3_moe", "model.num_experts=4", "model.num_experts_per_tok=2",
                             "model.moe_intermediate_size=8", "algorithm.routing_replay=sampler"])
    t, minibatches, seen = trainer.Trainer(cfg), trainer.Trainer.minibatches, []

    def checked(self, batches):
        out = minibatches(self, batches)
        for b in out:
            np.testing.assert_array_equal(np.asarray(b.old_logp), np.asarray(b.sampler_logp) * np.asarray(b.mask))
            if moe:  # the experts the sampler chose, replayed by the update
                assert b.routes is not None and 0 <= int(b.routes.min()) and int(b.routes.max()) < 4
            seen.append(1)
        return out
    monkeypatch.setattr(trainer.Trainer, "minibatches", checked)
    got = [t.train_step()[0] for _ in range(3)]
    assert len(seen) == 3 * cfg.train.minibatches and [m["staleness/mean"] for m in got] == [0, 1, 2]
    assert all(m["sampler_drift_mean"] == 0 for m in got)
    # step 0's gap is the drift of its first minibatch's update; step 2's adds the two steps' updates
    assert got[2]["staleness/logprob_gap_mean"] > 1.5 * got[0]["staleness/logprob_gap_mean"] > 0, got


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run of each train.proximal, run once."""
    tmp, done = tmp_path_factory.mktemp("async"), {}

    def get(proximal):
        if proximal not in done:
            done[proximal] = run.train(config(tmp / "run", steps=4, max_staleness=2, proximal=proximal))
            (tmp / "run").rename(tmp / f"straight_{proximal}")
        return tmp, done[proximal]
    return get


@pytest.mark.parametrize("kill_at, proximal", [(1, "sampler"), (4, "sampler"), (7, "sampler"), (4, "trainer"),
                                             (4, "rollout")])
def test_a_run_killed_anywhere_with_staleness_2_resumes_bit_for_bit(kill_at, proximal, straight, monkeypatch):
    """A kill saves nothing past the last checkpoint (every step), which holds the two rollouts sampled
    ahead as their sampler outputs and (proximal "sampler") l^old; the resume rebuilds them and goes on as
    if never stopped ("trainer" takes l^old from the restored params)."""
    tmp, reference = straight(proximal)
    update, calls = trainer.Trainer.train_step, []

    def killed(self):
        if len(calls) == kill_at // 2:
            raise RuntimeError("killed")
        calls.append(1)
        return update(self)

    monkeypatch.setattr(trainer.Trainer, "train_step", killed)
    with pytest.raises(RuntimeError, match="killed"):
        run.train(config(tmp / f"run{kill_at}{proximal}", steps=4, max_staleness=2, proximal=proximal))
    monkeypatch.undo()
    ckpt = checkpoint.Checkpointer(tmp / f"run{kill_at}{proximal}" / "checkpoints", 1, 2)
    saved = ckpt.latest_intact()
    if saved:
        versions = [item["version"] for item in ckpt.read_meta(saved)["inflight"]]
        assert versions == [max(0, s - 2) for s in range(saved, min(saved + 2, 4))]  # step s sampled at s - 2
    ckpt.close()
    resumed = run.train(config(tmp / f"run{kill_at}{proximal}", steps=4, max_staleness=2, proximal=proximal))
    assert resumed["resumed_from"] == (kill_at // 2 or None)
    for a, b in zip(jax.tree.leaves(reference["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert rows(tmp / f"run{kill_at}{proximal}") == rows(tmp / f"straight_{proximal}")


def split(cfg: Config, sampler=4) -> Config:
    return dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, sampler=sampler))


@pytest.mark.parametrize("rank, proximal", [(0, "sampler"), (4, "sampler"), (4, "trainer")])
def test_the_sampler_mesh_holds_its_own_copy_on_its_own_devices(rank, proximal, tmp_path):
    """8 devices split 4 + 4; under LoRA only the adapters move each step (the base moved once); proximal
    "trainer" takes l^old on the trainer's devices."""
    cfg = split(dataclasses.replace(config(tmp_path, max_staleness=1, proximal=proximal), lora=lora.LoraConfig(rank=rank)))
    t = trainer.Trainer(cfg)
    sampler, trainer_devices = set(jax.devices()[:4]), set(jax.devices()[4:])
    for step in range(2):
        metrics, _ = t.train_step()
        assert np.isfinite(metrics["loss"]) and metrics["staleness/max"] == step
        assert (metrics["sampler_drift_mean"] > 1e-4) == (proximal == "trainer" and step == 1), metrics["sampler_drift_mean"]
    assert {d for x in jax.tree.leaves(t.state) for d in x.devices()} == trainer_devices
    assert {d for x in jax.tree.leaves(t.sampler_params) for d in x.devices()} == sampler
    assert jax.tree.structure(t._sampled) == jax.tree.structure(t.state.params)  # adapters, under LoRA
    assert (t._sampler_base is None) == (rank == 0)
    for a, b in zip(jax.tree.leaves(t._sampled), jax.tree.leaves(t.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # published after the step


def test_the_sampler_mesh_samples_what_one_mesh_does(tmp_path):
    """k = 0 on 4 + 4 devices against 8: the same samples and, to float tolerance, the same step."""
    got = [trainer.Trainer(cfg).train_step()[0] for cfg in (config(tmp_path), split(config(tmp_path)))]
    assert got[0]["completion/length_mean"] == got[1]["completion/length_mean"]
    for key in ("reward/mean", "loss", "grad_norm"):
        np.testing.assert_allclose(got[1][key], got[0][key], rtol=1e-4, err_msg=key)


@pytest.mark.parametrize("change, message", [
    (lambda c: dataclasses.replace(c, train=dataclasses.replace(c.train, max_staleness=-1)),
     "TrainConfig.max_staleness=-1 must be >= 0"),
    (lambda c: dataclasses.replace(c, mesh=dataclasses.replace(c.mesh, sampler=-4)), "MeshConfig.sampler=-4 must be >= 0"),
    (lambda c: split(c, 8), "mesh.sampler=8: the sampler takes as many devices"),
    (lambda c: split(c, 6), "a minibatch of 4 rows does not split over the sampler mesh's 6 batch devices"),
    (lambda c: split(dataclasses.replace(c, train=dataclasses.replace(c.train, packing=True))),
     "set train.packing=False or mesh.sampler=0"),
    (lambda c: config(c.train.out_dir, proximal="stale"), "or 'rollout' (the sampler's own log-probs, no l"),
    (lambda c: config(c.train.out_dir, proximal="trainer"), "at train.max_staleness=0 they are the same params"),
    (lambda c: override(config(c.train.out_dir, proximal="rollout"), [
        "model.model_type=qwen3_moe", "model.num_experts=4", "model.num_experts_per_tok=2", "model.moe_intermediate_size=8",
        "algorithm.routing_replay=old"]), "set algorithm.routing_replay='sampler' (R3) or another train.proximal"),
    (lambda c: config(c.train.out_dir, "rloo", minibatches=1, max_staleness=1),
     "algorithm.loss='reinforce' has no importance ratio and algorithm.tis_level is None"),
])
def test_bad_staleness_and_sampler_meshes_are_refused_before_compiling(change, message, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer.ts, "compiled_train_step", lambda *a: pytest.fail("compiled"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        trainer.Trainer(change(config(tmp_path)))


def test_reinforce_on_stale_samples_runs_under_token_tis(tmp_path):
    cfg = config(tmp_path, "rloo", minibatches=1)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, tis_level="token"),
                              train=dataclasses.replace(cfg.train, max_staleness=1))
    t = trainer.Trainer(cfg)
    assert all(np.isfinite(t.train_step()[0]["loss"]) for _ in range(2))
