"""Prompt samplers (grpo_jax.data.samplers): the uniform default is the shuffle of data.batches, rounds
drawn by a trainer included; each sampler's math against a hand or float64 computation; bad choices
and changed samplers refused; a stateful sampler's run resumes bit for bit."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from grpo_jax import algorithms, checkpoint, data, models, run, trainer
from grpo_jax.config import Config, MeshConfig, OptimConfig, RewardConfig, SamplingConfig, TrainConfig, flatten
from grpo_jax.config import resume_changes
from grpo_jax.data import CharTokenizer, curricula, samplers
from grpo_jax.algorithms import reference
from grpo_jax.data.samplers import SAMPLERS, Choice, Draw, Results
from grpo_jax.rewards import Reward

MODEL = models.ModelConfig(
    model_type="qwen3", vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True,
    bos_token_id=CharTokenizer.bos_id, eos_token_id=CharTokenizer.eos_id,
)
SUMS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def exact_sum(prompt, completion, example, **_):
    return float(completion == example["answer"])


MINE = dict(examples=SUMS, held_out=SUMS[:4], rewards={"sum": Reward(exact_sum, correctness=True)})


def config(tmp_path, preset="grpo", **train) -> Config:
    return Config(
        model=MODEL, tokenizer="char", task=data.Examples("sums"),
        mesh=MeshConfig(data=2, tensor=-1, max_replicated_fraction=1.0),
        sampling=SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=4, stop_tokens=tuple(range(3, 50))),
        algorithm=algorithms.AlgorithmConfig.from_preset(preset),
        reward=RewardConfig(names=("sum", "length"), weights=(1.0, 0.5), num_workers=0),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(**{"steps": 2, "prompts_per_step": 2, "eval_prompts": 4, "out_dir": str(tmp_path),
                             "checkpoint_every": 1, **train}),
    )


@pytest.fixture
def registered():
    """Registers test samplers by name for one test, unregistered afterwards."""
    names = []

    def register(name, cls, **spec):
        names.append(name)
        return samplers.sampler(name, **spec)(dataclasses.dataclass(frozen=True)(cls))

    yield register
    for name in names:
        del SAMPLERS[name]


# -- the uniform default ---------------------------------------------------------------------------

@pytest.mark.parametrize("size, prompts, seed", [(10, 3, 0), (16, 2, 0), (64, 8, 5)])
def test_uniform_draws_the_batches_of_data_batches(size, prompts, seed):
    """The same examples, round after round across epochs (whose batches straddle their boundaries)."""
    source = [{"prompt": str(i)} for i in range(size)]
    batches = data.batches(source, batch_size=prompts, seed=seed)
    for position in range(3 * size // prompts + 2):
        choice = samplers.Uniform().choose({}, Draw(size, prompts, 4, seed, position))
        assert [source[i] for i in choice.indices] == [batches[position][i] for i in range(prompts)]
        assert choice.samples.tolist() == [4] * prompts


@pytest.mark.parametrize("name", sorted(algorithms.ADVANTAGES))
def test_one_slot_per_prompt_gives_the_advantages_of_group_size(name):
    """The trainer passes group ids (a prompt given several slots is one group); with one slot each they
    are the groups of group_size, and every estimator gives the same bits."""
    spec = algorithms.ADVANTAGES[name]
    cfg = algorithms.AlgorithmConfig(advantage=spec.params(**spec.test_params))
    g = max(4, spec.min_group_size(cfg.advantage) if spec.min_group_size else 0)
    rewards = np.random.default_rng(0).integers(0, 3, (3 * g, 2)).astype(np.float32)
    lengths = np.arange(3 * g) % 5 + 1
    by_size = algorithms.compute_advantages(cfg, rewards, group_size=g, lengths=lengths, reward_weights=(1.0, 0.5))
    by_ids = algorithms.compute_advantages(cfg, rewards, group_ids=np.arange(3 * g) // g, lengths=lengths,
                                           reward_weights=(1.0, 0.5))
    np.testing.assert_array_equal(np.asarray(by_size), np.asarray(by_ids))


def test_the_trainer_draws_the_rounds_of_data_batches_in_order(tmp_path, monkeypatch):
    """Under DAPO dynamic sampling (several rounds a step), every round's prompts are the next batch of
    data.batches, as before samplers existed. (Run against the code before them, 3 steps of grpo and of
    dapo logged the same metrics and ended at the same params bit for bit.)"""
    t = trainer.Trainer(config(tmp_path, "dapo"), **MINE)
    seen, sample = [], t.sample
    monkeypatch.setattr(t, "sample", lambda examples, *a: seen.append([examples[i]["prompt"] for i in range(len(examples))])
                        or sample(examples, *a))
    for _ in range(2):
        t.train_step()
    batches = data.batches(SUMS, batch_size=2, seed=0)
    assert t.position == len(seen) >= 2 and not t.sampler_state
    assert seen == [[ex["prompt"] for ex in batches[p]] for p in range(len(seen))]


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_sampler_chooses_valid_rounds_from_a_checkpointable_state_purely(name):
    """Registry-wide (a fork's sampler is tested here too): rounds that pass the trainer's checks, the same
    choice for the same draw, state in float32 / int32 arrays, and no input modified in place."""
    spec = SAMPLERS[name]
    params, rng, size, g = spec.params(), np.random.default_rng(0), 12, 2
    state = samplers.check_state(params, params.init(size))
    stored = rng.random(size) < 0.5 if spec.replays else None
    for position in range(6):
        draw = Draw(size, prompts=4, group_size=g, seed=1, position=position, stored=stored)
        given, before = state, {k: v.copy() for k, v in state.items()}
        choice = samplers.checked(params, params.choose(state, draw), draw)
        again = params.choose(state, draw)
        assert np.array_equal(again.indices, choice.indices) and np.array_equal(again.samples, choice.samples)
        trials = choice.samples
        successes = rng.integers(0, trials + 1)
        results = Results(choice.indices, trials, successes, successes.astype(np.float64))
        if spec.baseline:
            assert params.baseline(state, choice.indices).shape == choice.indices.shape
        state = samplers.check_state(params, params.update(state, results))
        if spec.drift:
            state = samplers.check_state(params, params.observe(state, 0.01))
        assert all(np.array_equal(given[k], v) for k, v in before.items())  # the state passed in: untouched


# -- bad input -------------------------------------------------------------------------------------

def test_bad_choices_are_refused_naming_the_sampler(registered):
    fixed = registered("fixed_for_test", type("Fixed", (samplers.SamplerParams,), {}), allocates=True)()
    draw = Draw(size=10, prompts=2, group_size=4, seed=0, position=3)
    check = lambda indices, samples: samplers.checked(fixed, Choice(np.array(indices), np.array(samples)), draw)  # noqa: E731
    assert check([7, 7], [4, 4]).indices.tolist() == [7, 7]
    assert check([7], [8]).samples.tolist() == [8]  # one prompt, two slots: allowed to a sampler that allocates
    with pytest.raises(ValueError, match=r"sampler 'fixed_for_test' \(algorithm.sampler\) at data position 3 chose 0 "
                                         "prompts"):
        check(np.zeros(0, int), np.zeros(0, int))
    with pytest.raises(ValueError, match=r"chose prompt index 10, outside the train source's 10 examples \[0, 10\)"):
        check([1, 10], [4, 4])
    with pytest.raises(ValueError, match="chose prompt index -1"):
        check([-1, 2], [4, 4])
    with pytest.raises(ValueError, match=r"gave samples \[4, 2, 2\]: each must be a positive multiple of "
                                         "sampling.group_size=4"):
        check([1, 2, 3], [4, 2, 2])
    with pytest.raises(ValueError, match=r"gave samples \[4\]: .* sum to train.prompts_per_step \* group_size = 8"):
        check([1], [4])
    with pytest.raises(ValueError, match="indices of float64"):
        check([1.0, 2.0], [4, 4])
    plain = registered("plain_for_test", type("Plain", (samplers.SamplerParams,), {}))()
    with pytest.raises(ValueError, match="gave a prompt 8 samples, but it is registered without allocates=True"):
        samplers.checked(plain, Choice(np.array([7]), np.array([8])), draw)
    with pytest.raises(TypeError, match=r"state\['n'\] is ndarray float64; a sampler's state holds numpy float32 or "
                                        "int32 arrays"):
        samplers.check_state(plain, {"n": np.zeros(3)})


def test_the_trainer_refuses_a_bad_choice_before_sampling(tmp_path, registered):
    def choose(self, state, draw):
        return Choice(np.array([0, len(SUMS)]), np.array([4, 4]))

    registered("off_the_end", type("OffTheEnd", (samplers.SamplerParams,), {"choose": choose}))
    cfg = config(tmp_path)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, sampler="off_the_end"))
    t = trainer.Trainer(cfg, **MINE)
    with pytest.raises(ValueError, match="sampler 'off_the_end' .* chose prompt index 16, outside the train "
                                         "source's 16 examples"):
        t.train_step()
    assert t.position == 0


def test_a_sampler_that_learns_from_correctness_needs_a_correctness_reward(tmp_path):
    cfg = dataclasses.replace(config(tmp_path, "vade"), reward=RewardConfig(names=("length",), num_workers=0))
    with pytest.raises(ValueError, match=r"algorithm.sampler='vade' learns from each prompt's correctness, but none "
                                         r"of reward.names=\('length',\) is a correctness reward"):
        trainer.Trainer(cfg, examples=SUMS, held_out=SUMS[:4])


def test_a_sampler_with_a_baseline_refuses_per_reward_normalization():
    with pytest.raises(ValueError, match="sampler='spo' subtracts its baseline from the weighted total reward, so "
                                         "reward_combine='normalize_each'"):
        algorithms.AlgorithmConfig.from_preset("spo", reward_combine="normalize_each")


def test_a_sampler_that_allocates_refuses_a_loss_over_groups(registered):
    registered("two_slots", type("TwoSlots", (samplers.SamplerParams,), {}), allocates=True)
    with pytest.raises(ValueError, match="sampler='two_slots' may give a prompt several slots .* loss='gvpo' reads "
                                         "groups"):
        algorithms.AlgorithmConfig.from_preset("gvpo", sampler="two_slots")


def test_a_resume_with_another_sampler_or_its_parameters_is_refused():
    base = Config(model=MODEL)
    vade = dataclasses.replace(base, algorithm=algorithms.AlgorithmConfig(sampler="vade"))
    assert resume_changes(flatten(base), flatten(vade)) == [
        "algorithm.sampler: 'uniform' -> 'vade'", "algorithm.sampler.decay: '(absent)' -> 0.5",
        "algorithm.sampler.forget: '(absent)' -> 0.99", "algorithm.sampler.prior_alpha: '(absent)' -> 1.0",
        "algorithm.sampler.prior_beta: '(absent)' -> 1.0"]
    slower = dataclasses.replace(base, algorithm=algorithms.AlgorithmConfig(sampler=curricula.Vade(decay=0.9)))
    assert resume_changes(flatten(vade), flatten(slower)) == ["algorithm.sampler.decay: 0.5 -> 0.9"]
    before = {k: v for k, v in flatten(base).items() if k != "algorithm.sampler"}  # saved before samplers existed
    assert resume_changes(before, flatten(base)) == []


# -- VADE ------------------------------------------------------------------------------------------

def test_vade_posterior_update_by_hand():
    """forget 0.5 toward the prior Beta(1, 2) for all; then, for the prompts seen, decay 0.25 of their
    evidence and add their successes and failures."""
    vade = curricula.Vade(prior_alpha=1.0, prior_beta=2.0, decay=0.25, forget=0.5)
    state = {"alpha": np.array([5, 1, 3, 9], np.float32), "beta": np.array([2, 6, 2, 4], np.float32)}
    new = vade.update(state, Results(np.array([2, 0, 3]), trials=np.array([4, 8, 0]), successes=np.array([3, 0, 0]),
                                     rewards=np.zeros(3)))
    # after forgetting: alpha [3, 1, 2, 5], beta [2, 4, 2, 3]
    # prompt 2: alpha 1 + 0.25 (2 - 1) + 3 = 4.25, beta 2 + 0.25 (2 - 2) + 1 = 3
    # prompt 0: alpha 1 + 0.25 (3 - 1) + 0 = 1.5, beta 2 + 0.25 (2 - 2) + 8 = 10; prompt 3 has no trial
    np.testing.assert_array_equal(new["alpha"], np.array([1.5, 1, 4.25, 5], np.float32))
    np.testing.assert_array_equal(new["beta"], np.array([10, 4, 3, 3], np.float32))
    assert state["alpha"][0] == 5 and all(v.dtype == np.float32 for v in new.values())  # pure


def test_vade_thompson_choice_is_the_top_of_p_times_1_minus_p_in_float64():
    vade, size = curricula.Vade(), 50
    rng = np.random.default_rng(1)
    state = {"alpha": rng.uniform(0.5, 20, size).astype(np.float32), "beta": rng.uniform(0.5, 20, size).astype(np.float32)}
    draw = Draw(size, prompts=6, group_size=4, seed=3, position=11)
    p = np.random.default_rng([3, 11]).beta(state["alpha"].astype(np.float64), state["beta"].astype(np.float64))
    assert vade.choose(state, draw).indices.tolist() == np.argsort(-(p * (1 - p)), kind="stable")[:6].tolist()
    # Over many rounds, prompts solved half the time are drawn far more than solved or hopeless ones
    state = {"alpha": np.array([50, 1, 25] * 10, np.float32), "beta": np.array([1, 50, 25] * 10, np.float32)}
    counts = np.zeros(3)
    for position in range(50):
        np.add.at(counts, vade.choose(state, Draw(30, 5, 4, 0, position)).indices % 3, 1)
    assert counts[2] == 250


# -- the curriculum --------------------------------------------------------------------------------

def test_curriculum_pools_by_hand():
    cur = curricula.Curriculum(easy_at=0.75, hard_at=0.25, easy_fraction=0.25, hard_fraction=0.25)
    state = cur.init(8)
    state = cur.update(state, Results(np.array([0, 1, 2, 3, 4]), trials=np.array([4, 4, 4, 4, 0]),
                                      successes=np.array([4, 3, 1, 2, 0]), rewards=np.zeros(5)))
    assert state["pool"].tolist() == [curricula.EASY, curricula.EASY, curricula.HARD] + [curricula.NORMAL] * 5
    for position in range(20):
        chosen = cur.choose(state, Draw(8, 4, 2, 0, position)).indices
        assert len(set(chosen.tolist())) == 4
        pools = state["pool"][chosen].tolist()
        assert pools.count(curricula.EASY) == 1 and pools.count(curricula.HARD) == 1  # 1/4 of 4 from each
    state["pool"][:] = curricula.EASY  # no normal prompt: a round still fills, from the other pools
    assert sorted(cur.choose(state, Draw(8, 4, 2, 0, 0)).indices.tolist()) != []
    assert len(set(cur.choose(state, Draw(8, 8, 2, 0, 0)).indices.tolist())) == 8


def test_curriculum_pools_the_prompts_of_a_trainer_round(tmp_path, monkeypatch):
    """A round whose first group is all correct and second all wrong moves those prompts to the easy and
    hard pools; the next round, with fractions 0, draws neither."""
    cfg = config(tmp_path, "curriculum")
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, sampler=curricula.Curriculum(
        easy_fraction=0.0, hard_fraction=0.0)))
    t = trainer.Trainer(cfg, **MINE)
    real_sample, g = trainer.Trainer.sample, cfg.sampling.group_size

    def first_right(self, examples, rng, sampling_cfg, temperatures=None):
        s = real_sample(self, examples, rng, sampling_cfg, temperatures)
        s["correct"] = np.arange(len(s["correct"])) < g  # the first group all right, the second all wrong
        return s

    monkeypatch.setattr(trainer.Trainer, "sample", first_right)
    first = t.sampler.choose(t.sampler_state, t.draw()).indices
    t.rollout_batch(jax.random.key(0))
    assert t.sampler_state["pool"][first].tolist() == [curricula.EASY, curricula.HARD]
    assert (t.sampler_state["pool"] == curricula.NORMAL).sum() == len(SUMS) - 2
    assert not set(t.sampler.choose(t.sampler_state, t.draw()).indices.tolist()) & set(first.tolist())


# -- through the trainer ---------------------------------------------------------------------------

def test_a_prompt_given_two_slots_is_one_group(tmp_path, registered):
    """A sampler that gives prompt 5 both slots of a round: its 2G samples get the advantages of one group."""
    def choose(self, state, draw):
        return Choice(np.array([5]), np.array([2 * draw.group_size]))

    registered("twice", type("Twice", (samplers.SamplerParams,), {"choose": choose}), allocates=True)
    cfg = config(tmp_path)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, sampler="twice"))
    t = trainer.Trainer(cfg, **MINE)
    batches, metrics = t.rollout_batch(jax.random.key(0))
    (scores,) = t.last_rollout["drawn"]
    total = scores["rewards"] @ np.float32([1.0, 0.5])
    assert np.ptp(total) > 0 and metrics["groups/kept"] == 2
    want = algorithms.compute_advantages(cfg.algorithm, scores["rewards"], group_size=8, reward_weights=(1.0, 0.5))
    np.testing.assert_array_equal(t.last_rollout["advantages"], np.asarray(want))


@pytest.fixture(scope="module")
def vade_straight(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vade")
    result = run.train(config(tmp / "run", "vade", steps=3, checkpoint_every=2), **MINE)
    (tmp / "run").rename(tmp / "straight")
    return tmp, result


def test_a_stateful_sampler_resumes_bit_for_bit(vade_straight):
    """Three VADE steps straight, and two steps then a resume for the third: the same params, the same
    posterior (restored from the checkpoint), the same logged metrics (but the evaluation the two-step
    run made at its end)."""
    tmp, straight = vade_straight
    run.train(config(tmp / "run", "vade", steps=2, checkpoint_every=2), **MINE)
    resumed = run.train(config(tmp / "run", "vade", steps=3, checkpoint_every=2), **MINE)
    assert resumed["resumed_from"] == 2
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    timing = ("time/", "throughput/", "reward/time_s", "eval/")
    rows = lambda d: [{k: v for k, v in json.loads(r).items() if not k.startswith(timing)}  # noqa: E731
                      for r in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows(tmp / "run") == rows(tmp / "straight")
    t = trainer.Trainer(config(tmp / "run", "vade", steps=3, checkpoint_every=2), **MINE)
    ckpt = checkpoint.Checkpointer(tmp / "straight" / "checkpoints", 2, 2)
    t.restore(ckpt, 3)
    ckpt.close()
    assert t.sampler_state["alpha"].dtype == np.float32 and t.sampler_state["alpha"].shape == (len(SUMS),)
    assert (t.sampler_state["alpha"] + t.sampler_state["beta"] > 2).any()  # it learned from the rounds


# -- ERPO ------------------------------------------------------------------------------------------

def test_erpo_streaks_and_temperatures_by_hand():
    erpo = curricula.Erpo(step=0.25, max_increase=0.6)
    state = {"streak": np.array([0, 1, 4, 2, 0], np.int32)}
    state = erpo.update(state, Results(np.array([0, 1, 2, 3]), trials=np.array([4, 4, 4, 0]),
                                       successes=np.array([4, 4, 3, 0]), rewards=np.zeros(4)))
    assert state["streak"].tolist() == [1, 2, 0, 2, 0]  # all correct: +1; a wrong answer: 0; no trial: kept
    draw = Draw(5, prompts=5, group_size=2, seed=0, position=0, temperature=0.8)
    choice = erpo.choose(state, draw)
    assert choice.indices.tolist() == samplers.Uniform().choose({}, draw).indices.tolist()
    hotter = {0: 0.25, 1: 0.5, 2: 0.0, 3: 0.5, 4: 0.0}  # min(0.25 * streak, 0.6)
    np.testing.assert_allclose(choice.temperatures, [0.8 + hotter[i] for i in choice.indices], rtol=1e-6)


def test_a_prompt_sampled_at_its_own_temperature_matches_a_run_at_that_temperature():
    """Per-prompt temperatures give each prompt's rows exactly the tokens and log-probs of a rollout at
    that temperature (the same keys)."""
    from grpo_jax import sampling

    params = models.init(MODEL, jax.random.key(0))
    scfg = SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=3)
    tok = CharTokenizer()
    prompts = sampling.pad_prompts([tok.encode("1+2="), tok.encode("3+3=")], scfg)
    key = jax.random.key(1)
    mixed = sampling.generate(MODEL, params, dataclasses.replace(prompts, temperatures=jax.numpy.asarray([0.5, 2.0])),
                              key, scfg)
    for p, t in enumerate((0.5, 2.0)):
        alone = sampling.generate(MODEL, params, prompts, key, dataclasses.replace(scfg, temperature=t))
        rows = slice(3 * p, 3 * p + 3)
        np.testing.assert_array_equal(np.asarray(mixed.tokens[rows]), np.asarray(alone.tokens[rows]))
        np.testing.assert_allclose(np.asarray(mixed.logprobs[rows]), np.asarray(alone.logprobs[rows]), rtol=1e-6, atol=1e-6)


def test_erpo_samples_residual_prompts_hotter_through_the_trainer(tmp_path):
    t = trainer.Trainer(config(tmp_path, "erpo"), **MINE)
    assert t.cfg.algorithm.tis_level == "token"  # the hotter samples are corrected as off-policy
    t.sampler_state["streak"][:] = 9  # every prompt all correct 9 rounds in a row: +0.5, the cap
    draw = t.draw()
    t.rollout_batch(jax.random.key(0))
    (got,) = t.last_rollout["drawn"]
    hot = t.sample(samplers.Picked(SUMS, samplers.Uniform().choose({}, draw).indices),
                   jax.random.fold_in(jax.random.key(0), 0), dataclasses.replace(t.cfg.sampling, temperature=1.5))
    np.testing.assert_array_equal(np.asarray(got["rollout"].tokens), np.asarray(hot["rollout"].tokens))
    np.testing.assert_allclose(np.asarray(got["rollout"].logprobs), np.asarray(hot["rollout"].logprobs), atol=1e-6)


# -- GDRO ------------------------------------------------------------------------------------------

def test_square_root_allocation_by_hand_and_its_optimum_in_float64():
    alloc = curricula.sqrt_allocation
    assert alloc(np.array([1.0, 2, 3, 2]), 16, cap=8).tolist() == [2, 4, 6, 4]  # exactly proportional
    assert alloc(np.array([1.0, 2, 3, 2]), 16, cap=5).tolist() == [3, 4, 5, 4]  # capped; the spare slot by remainder
    assert alloc(np.array([0.0, 0, 0]), 4, cap=4).tolist() == [2, 1, 1]  # no spread: even, ties to the lower index
    # the minimum of sum sigma^2 / n over every split of 9 slots (n >= 1), found by brute force
    sigma = np.array([0.5, 0.3, 0.1])
    splits = [(a, b, 9 - a - b) for a in range(1, 8) for b in range(1, 9 - a)]
    best = min(splits, key=lambda n: float(np.sum(sigma ** 2 / np.array(n, np.float64))))
    assert alloc(sigma, 9, cap=9).tolist() == list(best) == [5, 3, 1]


def test_gdro_bins_weights_and_update_by_hand():
    gdro = curricula.Gdro(bins=2, eta=1.0, ema=0.5, explore=0.2)
    state = gdro.init(6)
    state["successes"][:4], state["trials"][:4] = [4, 3, 1, 0], [4, 4, 4, 4]
    assert gdro.bin_of(state).tolist() == [1, 1, 0, 0, 2, 2]  # rates 1, .75, .25, 0; never seen
    state["score"][:], state["observed"][:] = [0.3, 0.1, 0.0], [2, 1, 0]
    # bias-corrected: 0.3 / (1 - 0.5^2) = 0.4, 0.1 / 0.5 = 0.2; never observed: 1
    w = np.exp(np.array([0.4, 0.2, 1.0]) - 1.0)
    np.testing.assert_allclose(gdro.weights(state, np.ones(3, bool)), 0.8 * w / w.sum() + 0.2 / 3, rtol=1e-6)
    np.testing.assert_allclose(gdro.weights(state, np.array([True, True, False])),  # an empty bin: never drawn
                               np.r_[0.8 * w[:2] / w[:2].sum() + 0.1, 0.0], rtol=1e-6)
    new = gdro.update(state, Results(np.array([0, 2, 3, 4]), trials=np.array([4, 4, 4, 4]),
                                     successes=np.array([2, 1, 0, 3]), rewards=np.zeros(4)))
    # drawn from bins 1, 0, 0, 2: failure rates 2/4, 7/8, 1/4
    np.testing.assert_allclose(new["score"], [0.5 * 0.3 + 0.5 * 7 / 8, 0.5 * 0.1 + 0.5 * 0.5, 0.5 * 0.25], rtol=1e-6)
    assert new["observed"].tolist() == [3, 2, 1] and state["observed"].tolist() == [2, 1, 0]
    assert new["successes"].tolist() == [2, 3, 1, 0, 3, 0] and new["trials"].tolist() == [4, 4, 4, 4, 4, 0]


def test_gdro_gives_uncertain_prompts_more_samples_and_fills_the_batch():
    gdro = curricula.Gdro(bins=2, max_slots=3)
    state = gdro.init(40)
    state["trials"][:] = 8
    state["successes"][:] = 8
    state["successes"][::4] = 4  # every fourth prompt is solved half the time
    for position in range(10):
        choice = samplers.checked(gdro, gdro.choose(state, Draw(40, 8, 2, 0, position)), Draw(40, 8, 2, 0, position))
        assert choice.samples.sum() == 16 and len(set(choice.indices.tolist())) == len(choice.indices)
        uncertain = choice.indices % 4 == 0
        if uncertain.any() and not uncertain.all():
            assert choice.samples[uncertain].min() >= choice.samples[~uncertain].max()


def test_gdro_runs_through_the_trainer_with_unequal_groups(tmp_path):
    t = trainer.Trainer(config(tmp_path, "gdro", prompts_per_step=4), **MINE)
    t.sampler_state["trials"][:], t.sampler_state["successes"][:] = 200, 200  # solved: sigma 0.07
    t.sampler_state["trials"][:4], t.sampler_state["successes"][:4] = 8, 4  # prompts 0-3 half: sigma 0.5
    choice = t.sampler.choose(t.sampler_state, t.draw())
    assert choice.samples.tolist() == [8, 8] and (choice.indices < 4).all()  # the solved ones' slots go to them
    metrics, _ = t.train_step()
    assert all(np.isfinite(v) for v in metrics.values()) and metrics["groups/kept"] == 4
    assert (t.sampler_state["trials"][choice.indices] == choice.samples).all()  # learned from this round


# -- SPO -------------------------------------------------------------------------------------------

def test_spo_tracker_by_hand():
    """rho = clip(2^(-D / 0.1), 0.5, 0.9), D the drift since the prompt's last round (0 if never seen)."""
    spo = curricula.SpoTracker(prior=0.5, half_drift=0.1, rho_min=0.5, rho_max=0.9)
    state = spo.init(4)
    state = spo.update(state, Results(np.array([0, 1]), trials=np.array([1, 1]), successes=np.array([1, 0]),
                                      rewards=np.array([1.0, 0.0])))
    # first seen: D = 0, rho = min(1, 0.9): alpha = 0.9 * 0.5 + r, beta = 0.9 * 0.5 + 1 - r
    np.testing.assert_allclose(state["alpha"], [1.45, 0.45, 0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(state["beta"], [0.45, 1.45, 0.5, 0.5], rtol=1e-6)
    state = spo.observe(spo.observe(state, 0.05), 0.05)  # the policy moved 0.1 since: rho = 2^-1 = 0.5
    np.testing.assert_allclose(spo.baseline(state, np.array([0, 2])), [1.45 / 1.9, 0.5], rtol=1e-6)
    new = spo.update(state, Results(np.array([0, 3]), trials=np.array([2, 1]), successes=np.array([1, 1]),
                                    rewards=np.array([1.5, 1.0])))  # rewards are weighted totals, not counts
    np.testing.assert_allclose(new["alpha"], [0.5 * 1.45 + 1.5, 0.45, 0.5, 0.9 * 0.5 + 1.0], rtol=1e-6)
    np.testing.assert_allclose(new["beta"], [0.5 * 0.45 + 0.5, 1.45, 0.5, 0.9 * 0.5], rtol=1e-6)
    np.testing.assert_allclose(new["seen_at"], [0.1, 0, -1, 0.1], rtol=1e-6)
    assert state["alpha"][0] == np.float32(1.45)  # pure


def test_spo_prioritized_sampling_is_gumbel_top_k_in_float64():
    spo = curricula.SpoTracker()
    rng = np.random.default_rng(0)
    state = spo.init(30)
    state["alpha"][:], state["beta"][:] = rng.uniform(0.1, 5, 30), rng.uniform(0.1, 5, 30)
    v = state["alpha"].astype(np.float64) / (state["alpha"].astype(np.float64) + state["beta"])
    keys = np.log(np.sqrt(v * (1 - v)) + 0.05) + np.random.default_rng([4, 9]).gumbel(size=30)
    assert spo.choose(state, Draw(30, 7, 1, 4, 9)).indices.tolist() == np.argsort(-keys, kind="stable")[:7].tolist()
    # solved prompts (v = 1) are drawn at the floor rate: far less than uncertain ones, never zero
    state["alpha"][:], state["beta"][:] = 1.0, 1.0
    state["beta"][:15] = 1e-6
    counts = np.zeros(2)
    for position in range(200):
        np.add.at(counts, (spo.choose(state, Draw(30, 3, 1, 0, position)).indices < 15).astype(int), 1)
    assert 0 < counts[1] < counts[0] / 5


def test_spo_single_stream_through_the_trainer(tmp_path):
    """One sample per prompt: advantages are the rewards less the tracker's baseline, standardized over the
    batch; the step's drift is measured and the tracker learns the round."""
    cfg = config(tmp_path, "spo", prompts_per_step=4)
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, group_size=1))
    t = trainer.Trainer(cfg, **MINE)
    metrics, _ = t.train_step()
    (s,) = t.last_rollout["drawn"]
    total = (s["rewards"] @ np.float32([1.0, 0.5])).astype(np.float64)
    want = reference.spo(cfg.algorithm.advantage, total - 0.5, None, None)  # every prompt's first baseline: 0.5
    np.testing.assert_allclose(t.last_rollout["advantages"], want, rtol=1e-5, atol=1e-6)
    assert metrics["sampler/drift"] > 0 and t.sampler_state["clock"][0] == np.float32(metrics["sampler/drift"])
    chosen = t.sampler_state["seen_at"] == 0
    assert chosen.sum() == 4
    np.testing.assert_allclose(t.sampler_state["alpha"][chosen] + t.sampler_state["beta"][chosen], 0.96 + 1, rtol=1e-6)
    with pytest.raises(ValueError, match=r"sampling.group_size=1: group advantages need at least 2 samples per prompt "
                                         r"\(algorithm.advantage='group_std'\)"):
        trainer.Trainer(dataclasses.replace(cfg, algorithm=algorithms.AlgorithmConfig.from_preset("grpo")), **MINE)


# -- RePO ------------------------------------------------------------------------------------------

def test_repo_pairs_a_fresh_slot_with_the_stored_group_once_there_is_one():
    repo, stored = curricula.Repo(), np.zeros(10, bool)
    stored[[3, 5]] = True
    draw = Draw(10, prompts=5, group_size=2, seed=0, position=0, stored=stored)
    choice = samplers.checked(repo, repo.choose({}, draw), draw)
    order = samplers.batch_indices(10, 3, 0, 0)  # the uniform order at half the batch (and one single slot)
    assert choice.indices.tolist() == order.tolist()
    want_replay = [int(stored[i]) if k < 2 else 0 for k, i in enumerate(order)]
    assert choice.replay.tolist() == want_replay
    assert choice.samples.tolist() == [2 * (2 - r) if k < 2 else 2 for k, r in enumerate(want_replay)]
    with pytest.raises(ValueError, match="replays prompt 4, which has no stored group"):
        samplers.checked(repo, Choice(np.array([4, 5]), np.array([2, 4]), replay=np.array([1, 0])), draw)


def test_a_replay_store_too_large_for_the_host_is_refused_with_its_estimate(monkeypatch):
    monkeypatch.setattr(samplers, "host_memory", lambda: 2**30)
    # 1e6 x 8 x (512 tokens x (4 + 4) bytes + length and finish reason 8 + 2 rewards x 4) + 4e6 = 32.9e9 bytes
    with pytest.raises(ValueError, match=r"algorithm.sampler='repo' keeps each prompt's last group: 1000000 prompts x "
                                         r"sampling.group_size=8 x sampling.max_new_tokens=512 tokens need about 30.64 "
                                         r"GiB of host memory, more than 25% of this host's 1.0 GiB"):
        samplers.replay_store(curricula.Repo(), 1_000_000, 8, 512, 2)
    assert samplers.replay_store(curricula.Repo(), 16, 4, 4, 2)["tokens"].shape == (16, 4, 4)


def test_repo_trains_on_the_stored_group_again_as_a_group_of_its_own(tmp_path):
    """Two prompts, one a round: from the third step on, the round's prompt brings back its group of two
    steps before, with the tokens, the sampler log-probs and the rewards it had then; its advantages are
    its own group's."""
    cfg = config(tmp_path, "repo")
    t = trainer.Trainer(cfg, examples=SUMS[:2], held_out=SUMS[:4], rewards=MINE["rewards"])
    assert cfg.algorithm.tis_level == "token"  # replayed rows are weighted as off-policy
    for _ in range(2):
        metrics, _ = t.train_step()
        assert metrics["replay/rows"] == 0
    first = {k: v.copy() for k, v in t.replay.items()}
    choice = t.sampler.choose(t.sampler_state, t.draw())
    (p,) = choice.indices
    assert choice.replay.tolist() == [1] and first["stored"].tolist() == [1, 1]
    batches, metrics = t.rollout_batch(jax.random.key(5))
    assert metrics["replay/rows"] == 4 and metrics["groups/kept"] == 2
    fresh, replayed = t.last_rollout["drawn"]
    g, width = cfg.sampling.group_size, cfg.sampling.max_prompt_len
    rows = slice(g, 2 * g)  # the kept slots: the fresh one, then the replayed one
    tokens = np.concatenate([np.asarray(b.tokens) for b in batches])[rows, width:]
    np.testing.assert_array_equal(tokens[:, :cfg.sampling.max_new_tokens - 1], first["tokens"][p][:, :-1])
    sampler_logp = np.concatenate([np.asarray(b.sampler_logp) for b in batches])[rows]
    np.testing.assert_array_equal(sampler_logp, first["logprobs"][p])
    total = first["rewards"][p].astype(np.float64) @ [1.0, 0.5]
    want = reference.group_std(cfg.algorithm.advantage, total, np.zeros(g, int), None)
    np.testing.assert_allclose(t.last_rollout["advantages"][rows], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t.replay["logprobs"][p], np.asarray(fresh["rollout"].logprobs)[:g])  # now the fresh one
    ckpt = checkpoint.Checkpointer(tmp_path / "ck", 1, 1)
    t.save(ckpt, force=True)
    again = trainer.Trainer(cfg, examples=SUMS[:2], held_out=SUMS[:4], rewards=MINE["rewards"])
    again.restore(ckpt, t.step)
    ckpt.close()
    for k in t.replay:
        np.testing.assert_array_equal(again.replay[k], t.replay[k])


# -- AR3PO -----------------------------------------------------------------------------------------

def test_ar3po_gives_hard_prompts_more_slots_by_hand():
    ar3po = curricula.Ar3po(hard_slots=2)
    state = ar3po.init(10)
    order = samplers.batch_indices(10, 4, 0, 0)
    state["hard"][order[:2]] = 1  # the first two candidates had no correct answer last time: two slots each
    choice = ar3po.choose(state, Draw(10, 4, 2, 0, 0))
    assert choice.indices.tolist() == order[:2].tolist() and choice.samples.tolist() == [4, 4]
    state["hard"][:] = 0
    state["hard"][order[3]] = 1  # the last would want two, one is left
    assert ar3po.choose(state, Draw(10, 4, 2, 0, 0)).samples.tolist() == [2, 2, 2, 2]
    new = ar3po.update(state, Results(order[:3], trials=np.array([2, 2, 0]), successes=np.array([0, 1, 0]),
                                      rewards=np.zeros(3)))
    assert new["hard"][order].tolist() == [1, 0, 0, 1]  # no trial: as it was


def test_ar3po_lends_a_stored_correct_answer_to_a_group_with_none(tmp_path, monkeypatch):
    """Step 1 (stubbed): every group holds a correct answer, so both prompts' groups are stored. Step 2
    (the untrained policy: no correct answer): each group's last sample is its prompt's stored correct
    answer, with the log-probs its sampler reported, and its advantages are those of the group so mixed."""
    cfg = config(tmp_path, "ar3po")
    t = trainer.Trainer(cfg, examples=SUMS[:2], held_out=SUMS[:4], rewards=MINE["rewards"])
    real_sample, g = trainer.Trainer.sample, cfg.sampling.group_size

    def first_right(self, examples, rng, sampling_cfg, temperatures=None):
        s = real_sample(self, examples, rng, sampling_cfg, temperatures)
        s["rewards"][::g, 0] = 1.0  # sample 0 of each group right
        s["correct"] = s["rewards"][:, 0] >= 1.0
        return s

    monkeypatch.setattr(trainer.Trainer, "sample", first_right)
    t.train_step()
    monkeypatch.undo()
    assert t.replay["stored"].tolist() == [1, 1] and t.sampler_state["hard"].tolist() == [0, 0]
    stored = {k: v.copy() for k, v in t.replay.items()}
    batches, metrics = t.rollout_batch(jax.random.key(3))
    drawn, kept = t.last_rollout["drawn"], t.last_rollout["kept"]
    assert not drawn[0]["correct"].any()  # the untrained policy
    lent = [j for j, (rows, _, _) in enumerate(kept) if "stored" in drawn[rows[-1][0]]]
    assert lent == [0, 1] and metrics["replay/rows"] == 2
    sampler_logp = np.concatenate([np.asarray(b.sampler_logp) for b in batches])
    for j in lent:  # the batch row of the slot's last sample carries a stored correct answer's log-probs
        last = sampler_logp[j * g + g - 1]
        same = [(p, q) for p in range(2) for q in range(g) if np.array_equal(stored["logprobs"][p][q], last)]
        assert same and stored["rewards"][same[0]][0] == 1.0
        total = kept[j][1].astype(np.float64) @ [1.0, 0.5]
        want = reference.group_std(cfg.algorithm.advantage, total, np.zeros(g, int), None)
        np.testing.assert_allclose(t.last_rollout["advantages"][j * g:(j + 1) * g], want, rtol=1e-5, atol=1e-6)
        assert kept[j][1][-1][0] == 1.0  # the lent answer scores as correct
