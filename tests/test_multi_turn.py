"""Multi-turn rollouts on a tiny decoder: a 3-turn trajectory's sampler log-probs are a full forward's
over the concatenated sequence; observations sit in the trajectory, masked, and take no part in the
loss or its normalizers; the same trajectories on a mesh; the turn and token budgets."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_trainer
from grpo_jax import algorithms, envs, models, multi_turn, run, sampling, sharding, trainer
from grpo_jax.algorithms import reference
from grpo_jax import train_step as ts
from grpo_jax.config import AlgorithmConfig, MeshConfig, RewardConfig, SamplingConfig
from grpo_jax.data.char_tokenizer import CharTokenizer

TOK = CharTokenizer()
CFG = models.ModelConfig(model_type="qwen3", vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, eos_token_id=TOK.eos_id)
DIGITS = tuple(TOK.encode("0123456789", continuation=True))  # a turn ends at a digit: turns of ~10 tokens
SCFG = SamplingConfig(max_prompt_len=8, max_new_tokens=48, group_size=2, temperature=1.0, stop_tokens=DIGITS)
EXAMPLES = [{"prompt": p, "answer": "0"} for p in ("12+3=", "7*8=", "1+1=", "99-1=")]


@dataclasses.dataclass(frozen=True)
class Echo(envs.EnvConfig):
    """Answers every turn with "ok<turn>", reward turn + 1; done after the third turn."""

    def step(self, state, completion):
        return envs.Step(f"ok{state.turn}", float(state.turn + 1), state.turn == 2)


def prompts_of(examples):
    prompts = sampling.pad_prompts([TOK.encode(e["prompt"]) for e in examples], SCFG)
    rows = [e for e in examples for _ in range(SCFG.group_size)]
    return jax.tree.map(lambda x: np.repeat(np.asarray(x), SCFG.group_size, 0), prompts), rows


@pytest.fixture(scope="module")
def sampled():
    params = models.init(CFG, jax.random.key(0))
    prompts, rows = prompts_of(EXAMPLES)
    rollout, turns = multi_turn.rollout(CFG, SCFG, Echo(max_turns=5), TOK, None, params, prompts, rows,
                                        jax.random.key(3))
    return params, prompts, rows, rollout, turns


def test_a_three_turn_trajectory_has_the_log_probs_of_a_full_forward(sampled):
    params, prompts, _, rollout, turns = sampled
    assert all(len(r.completions) == 3 and r.rewards == [1.0, 2.0, 3.0] for r in turns)
    tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
    for b, r in enumerate(turns):  # turn, observation, turn, observation, turn; mask 1 on the turns only
        masks = []
        for i, k in enumerate(r.lengths):
            masks += [1] * k + [0] * (len(r.observations[i]) if i < 2 else 0)
        n = int(rollout.lengths[b])
        assert n == sum(r.lengths) + sum(map(len, r.observations)) and not rollout.truncated[b]
        np.testing.assert_array_equal(mask[b, :n], masks)
        assert not mask[b, n:].any() and not tokens[b, n:].any()
        text = TOK.decode(tokens[b, :n])
        assert text == "".join(c + o for c, o in zip(r.completions, [*r.observations, ""]))
        assert r.observations == ["ok0", "ok1"]
    full, positions, segments = ts.sequences(prompts.tokens, prompts.lengths, rollout.tokens)
    logp, _ = ts.completion_logprobs(CFG, SCFG.temperature, params, full, positions, segments,
                                     rollout.mask.astype(jnp.float32))
    np.testing.assert_allclose(np.where(mask, logp, 0.0), rollout.logprobs, rtol=0, atol=2e-5)
    assert not np.asarray(rollout.logprobs)[~mask].any()


def test_the_same_trajectories_on_a_mesh_and_on_a_rerun(sampled):
    params, prompts, rows, rollout, turns = sampled
    mesh = sharding.make_mesh(MeshConfig(data=4, fsdp=2))
    on_mesh, turns_mesh = multi_turn.rollout(CFG, SCFG, Echo(max_turns=5), TOK, mesh,
                                             models.shard_params(params, CFG, mesh), sharding.global_batch(prompts, mesh),
                                             rows, jax.random.key(3))
    np.testing.assert_array_equal(on_mesh.tokens, rollout.tokens)
    np.testing.assert_array_equal(on_mesh.mask, rollout.mask)
    np.testing.assert_allclose(on_mesh.logprobs, rollout.logprobs, rtol=0, atol=2e-5)
    assert turns_mesh == turns


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_observations_get_exactly_zero_gradient_and_stay_out_of_the_normalizers(sampled, preset):
    """At r = 1 (l = l^old) the gradient of the step's loss with respect to each token's log-prob is
    hand-computable: grpo (seq_mean_token_mean) -A_i / (N L_i), dapo (token_mean) -A_i / sum_i L_i,
    dr_grpo (token_sum_norm) -A_i / (N L_max), gspo (seq_mean) -A_i / (N L_i), with L_i the policy's
    tokens of trajectory i, never its observations; and exactly 0 on every observation token, also
    through KL and the entropy bonus."""
    *_, rollout, _ = sampled
    alg = dataclasses.replace(AlgorithmConfig.from_preset(preset), beta=0.04, entropy_coef=0.01)
    mask = np.asarray(rollout.mask, np.float32)
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(-2.0, 0.5, mask.shape), jnp.float32)
    adv = jnp.asarray(rng.normal(size=mask.shape[0]), jnp.float32)
    norm = algorithms.normalizer(alg, mask, SCFG.max_new_tokens)
    assert float(norm.num_tokens) == mask.sum() < float(np.asarray(rollout.lengths).sum())

    def loss(logp, ref, entropy):
        return algorithms.policy_loss(alg, logp, jax.lax.stop_gradient(logp), adv, mask, ref, entropy=entropy,
                                      normalizer=norm)[0]

    grads = jax.grad(loss, argnums=(0, 1, 2))(logp, logp - 0.1, jnp.ones_like(logp))
    obs = (mask == 0) & (np.arange(mask.shape[1]) < np.asarray(rollout.lengths)[:, None])
    assert obs.sum() == 8 * 6  # two observations of 3 tokens in every trajectory
    for g in grads:
        assert not np.asarray(g)[obs].any()
    lengths, n = mask.sum(1, keepdims=True), mask.shape[0]
    scale = {"grpo": n * lengths, "gspo": n * lengths, "dapo": mask.sum(), "dr_grpo": n * SCFG.max_new_tokens}[preset]
    a = np.asarray(adv, np.float64)[:, None]
    kl_grad = alg.beta * (1 - np.exp(-0.1))  # d k3 / d l at l - l^ref = 0.1
    expect = np.where(mask > 0, (-a + kl_grad) / scale, 0.0)
    np.testing.assert_allclose(np.asarray(grads[0]), expect, rtol=2e-5, atol=1e-7)


def test_ended_rows_leave_the_batch_and_the_others_keep_their_trajectories(sampled, monkeypatch):
    """The first two prompts' trajectories end after one turn: the later turns decode only the other four
    rows (a batch of 4, not 8; on a mesh of 2 batch devices too), gathered from the cache and written back.
    Those rows' trajectories are the ones they have in a batch where every row goes on (`sampled`), and
    their log-probs a full forward's."""
    params, prompts, rows, full_rollout, full_turns = sampled

    @dataclasses.dataclass(frozen=True)
    class EchoOrStop(Echo):
        def step(self, state, completion):
            step = super().step(state, completion)
            return step._replace(done=step.done or state.example["prompt"] in ("12+3=", "7*8="))

    batches = []
    turn = multi_turn.turn
    monkeypatch.setattr(multi_turn, "turn", lambda *a: batches.append(a[6].shape[0]) or turn(*a))
    mesh = sharding.make_mesh(MeshConfig(data=2), jax.devices()[:2])
    for m in (None, mesh):
        batches.clear()
        args = (prompts, params) if m is None else (sharding.global_batch(prompts, m), models.shard_params(params, CFG, m))
        rollout, turns = multi_turn.rollout(CFG, SCFG, EchoOrStop(max_turns=5), TOK, m, args[1], args[0], rows,
                                            jax.random.key(3))
        assert batches == [8, 4, 4]
        assert [len(r.completions) for r in turns] == [1] * 4 + [3] * 4
        assert turns[4:] == full_turns[4:] and [r.completions for r in turns[:4]] == [[r.completions[0]] for r in full_turns[:4]]
        np.testing.assert_array_equal(np.asarray(rollout.tokens)[4:], np.asarray(full_rollout.tokens)[4:])
        np.testing.assert_allclose(np.asarray(rollout.logprobs)[4:], np.asarray(full_rollout.logprobs)[4:], rtol=0, atol=2e-5)
        full, positions, segments = ts.sequences(prompts.tokens, prompts.lengths, np.asarray(rollout.tokens))
        logp, _ = ts.completion_logprobs(CFG, SCFG.temperature, params, full, positions, segments,
                                         jnp.asarray(rollout.mask, jnp.float32))
        np.testing.assert_allclose(np.where(rollout.mask, logp, 0.0), rollout.logprobs, rtol=0, atol=2e-5)


def test_turn_limit_and_token_budget(sampled):
    """Two turns at most: the second is the last (`State.last`) and its observation is dropped; a
    budget of 16 tokens ends trajectories mid-turn (truncated) and cuts observations to fit; what the
    tokenizer cannot encode of an observation is left out."""
    params, prompts, rows, *_ = sampled
    seen = []

    @dataclasses.dataclass(frozen=True)
    class Never(envs.EnvConfig):
        def step(self, state, completion):
            seen.append(state.last)
            return envs.Step("abc\u00e9def", 0.0, False)  # a character the tokenizer cannot encode is dropped

    scfg = dataclasses.replace(SCFG, max_new_tokens=16)
    rollout, turns = multi_turn.rollout(CFG, scfg, Never(max_turns=2), TOK, None, params, prompts, rows,
                                        jax.random.key(5))
    lengths, mask = np.asarray(rollout.lengths), np.asarray(rollout.mask)
    for b, r in enumerate(turns):
        n = int(lengths[b])
        assert len(r.completions) <= 2 and len(r.observations) == len(r.completions) - 1
        assert n == sum(r.lengths) + mask[b, :n].size - mask[b, :n].sum() <= 16
        assert rollout.truncated[b] == (n == 16)
        if r.observations:  # cut so the policy keeps at least one token
            assert TOK.decode(rollout.tokens[b, r.lengths[0]: n][~mask[b, r.lengths[0]: n]]) == "abcdef"[: n - sum(r.lengths)]
    assert seen.count(True) == len(turns) and rollout.truncated.any() and not rollout.truncated.all()


def test_a_call_end_of_several_tokens_is_refused_before_compiling():
    with pytest.raises(ValueError, match=r"env.call_end='</calc>' is 7 tokens .* pick a call_end"):
        multi_turn.stop_ids(CFG, SCFG, envs.ENVS["calculator"](call_end="</calc>"), TOK)
    assert multi_turn.stop_ids(CFG, SCFG, envs.ENVS["calculator"](), TOK) == tuple(sorted({2, *DIGITS, *TOK.encode("]", continuation=True)}))


@dataclasses.dataclass(frozen=True)
class Lengths(Echo):
    """Echo rewarding each turn by its length: rewards that differ within a group."""

    def step(self, state, completion):
        return super().step(state, completion)._replace(reward=len(completion) / 10)


def env_config(tmp_path):
    """test_trainer's run with the Lengths environment (turns end at half the vocabulary, 3 turns each),
    credited by turn (gtpo_turn)."""
    cfg = test_trainer.config(tmp_path, "gtpo_turn", steps=3)
    return dataclasses.replace(
        cfg, env=Lengths(max_turns=3), reward=RewardConfig(names=("env",), num_workers=0),
        sampling=dataclasses.replace(cfg.sampling, max_new_tokens=16, stop_tokens=tuple(range(3, 50))))


def test_a_run_killed_mid_trajectory_resumes_exactly(tmp_path, monkeypatch):
    """Killed inside step 2's rollout, between two turns of its trajectories: the rerun restores step 1's
    checkpoint and samples the same trajectories (an environment keeps no state; a token's key is its
    row's and place's), ending where the uninterrupted run does, bit for bit."""
    straight = run.train(env_config(tmp_path / "straight"))
    rows = test_trainer.rows(tmp_path / "straight")
    trained = [r for r in rows if "env/turns_mean" in r]
    assert len(trained) == 3 and all(r["env/turns_mean"] == 3 and r["env/tool_call_rate"] == 1 for r in trained)
    assert [r["step"] for r in rows if "eval/tool_call_rate" in r] == [0, 3]  # greedy trajectories of the held-out set
    held_out = (tmp_path / "straight" / "held_out.jsonl").read_text().splitlines()
    assert len(held_out) == 4 and all(json.loads(r)["greedy"]["completions"] for r in held_out)
    assert all(r["groups/zero_variance_frac"] < 1 and r["grad_norm"] > 0 for r in trained)
    step, calls = Lengths.step, []

    def killed(self, state, completion):
        calls.append(1)
        if len(calls) == 2 * 24 + 8 + 3:  # steps 0 and 1 (8 rows, 3 turns each), then into step 2's second turn
            raise RuntimeError("killed")
        return step(self, state, completion)

    monkeypatch.setattr(Lengths, "step", killed)
    with pytest.raises(RuntimeError, match="killed"):
        run.train(env_config(tmp_path / "killed"))
    monkeypatch.undo()
    resumed = run.train(env_config(tmp_path / "killed"))
    assert resumed["resumed_from"] == 2
    for a, b in zip(jax.tree.leaves(straight["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert test_trainer.rows(tmp_path / "killed") == rows


def test_the_readme_environment_runs(sampled):
    """The README's custom environment, executed as written: registered by name, answering its turns, and
    driving a rollout of the tiny model."""
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("```python\nimport dataclasses\n\nfrom grpo_jax import envs\n")[1].split("```")[0]
    names = {}
    exec("import dataclasses\n\nfrom grpo_jax import envs\n" + block, names)
    guess = envs.EnvConfig.from_name("guess")
    assert type(guess) is names["Guess"] and guess.max_turns == 5
    example = {"prompt": "1+1=", "answer": "42"}
    assert guess.reset(example) == "1+1=?"
    assert guess.step(envs.State(example), "I say 7") == envs.Step("higher", 0.0, False)
    assert guess.step(envs.State(example), "50") == envs.Step("lower", 0.0, False)
    assert guess.step(envs.State(example, ("7", "50"), ("higher", "lower")), "42!") == envs.Step("", 1.0, True)
    params = sampled[0]
    examples = [dict(e, answer="5") for e in EXAMPLES]
    prompts, rows = prompts_of([dict(e, prompt=guess.reset(e)) for e in examples])
    rollout, turns = multi_turn.rollout(CFG, SCFG, guess, TOK, None, params, prompts, rows, jax.random.key(7))
    for r in turns:
        for c, o in zip(r.completions, r.observations):
            digits = "".join(filter(str.isdigit, c))
            assert o == ("higher" if not digits or int(digits) < 5 else "lower")
        assert r.rewards[:-1] == [0.0] * (len(r.rewards) - 1) and len(r.completions) <= 5
    assert max(len(r.completions) for r in turns) > 1


def test_turn_level_credit_gives_each_token_its_turns_advantage(tmp_path):
    """The trainer's batch under gtpo_turn: every policy token of turn j of trajectory i carries the float64
    reference's A_ij of the env's turn rewards; observation tokens carry 0 (and are masked)."""
    t = trainer.Trainer(env_config(tmp_path))
    batches, _ = t.rollout_batch(jax.random.key(0))
    s = t.last_rollout["drawn"][0]
    assert s["turn_mask"].all()  # 3 turns each
    expect = reference.turn_advantages(t.cfg.algorithm, s["turn_rewards"], s["turn_mask"], np.repeat(np.arange(2), 4))
    assert np.abs(expect).max() > 0.5
    adv, mask = (np.concatenate([np.asarray(getattr(b, k)) for b in batches]) for k in ("advantages", "mask"))
    checked = 0
    for i in range(len(adv)):  # a turn is a run of policy tokens between observations (unless the budget cut one to nothing)
        policy = mask[i] > 0
        turn_of = np.cumsum(policy & ~np.r_[False, policy[:-1]]) - 1
        assert not adv[i][~policy].any()
        if turn_of[policy].max() == 2:
            np.testing.assert_allclose(adv[i][policy], expect[i][turn_of[policy]], rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked >= 6


ECHO_CONFIG = '''"""The quickstart with an environment of 3 turns, for the run across processes (tests/test_multi_turn.py)."""
import dataclasses
import runpy

from grpo_jax import envs
from grpo_jax.config import RewardConfig

QUICKSTART = runpy.run_path({quickstart!r})["get_config"]


@envs.register("echo_turns")
@dataclasses.dataclass(frozen=True)
class EchoTurns(envs.EnvConfig):
    def step(self, state, completion):
        ends_early = sum(map(ord, state.example["prompt"])) % 2  # half the prompts: the batch shrinks at turn 1
        return envs.Step(f"ok{{state.turn}}", len(completion) / 10, state.turn == 2 or bool(ends_early))


def get_config():
    return dataclasses.replace(QUICKSTART(), env=EchoTurns(max_turns=3), reward=RewardConfig(names=("env",)))
'''


@pytest.mark.slow  # minutes of CPU: a run in one process and the same in two at once
def test_two_processes_sample_the_trajectories_of_one(tmp_path):
    """The quickstart with a 3-turn environment under turn-level credit, shrunk as test_distributed's run:
    each of 2 processes x 4 devices steps its own rows' environments, and the trajectories of half the
    prompts end after one turn, so each process's later turns decode fewer rows (`multi_turn._turn_rows`,
    sized by the process with the most live rows); every logged metric (rollouts, turn credit, greedy
    trajectories of the held-out set) is that of 1 process x 8 devices."""
    import test_distributed as td  # noqa: PLC0415  (its launch helpers; imported here, as the slow tests' only user)

    config = tmp_path / "echo_turns.py"
    config.write_text(ECHO_CONFIG.format(quickstart=str(td.QUICKSTART)))
    sets = [s for s in td.SETS if not s.startswith(("reward.", "train.eval_samples", "train.packing", "train.export_hf",
                                                      "sampling.max_new_tokens", "train.steps"))]
    sets += ["reward.num_workers=0", "sampling.max_new_tokens=16", "algorithm.preset=gtpo_turn", "train.steps=2",
             "sampling.stop_tokens=" + ",".join(map(str, range(3, 50)))]
    argv = lambda out: ["--config", str(config), *(a for s in (*sets, f"train.out_dir={out}") for a in ("--set", s))]  # noqa: E731
    run.train(td.parse_args(argv(tmp_path / "one")))
    want = td.rows(tmp_path / "one")
    turns = [r["env/turns_mean"] for r in want if "env/turns_mean" in r]
    assert turns and all(1 < t < 3 for t in turns) and "eval/tool_call_rate" in want[0]
    procs = td.cluster(["-m", "grpo_jax.train", *argv(tmp_path / "two")], 2, tmp_path / "two")
    td.finish(procs, tmp_path / "two")
    td.assert_same_metrics(td.rows(tmp_path / "two"), want)
    held_out = [(tmp_path / out / "held_out.jsonl").read_text() for out in ("one", "two")]
    assert held_out[0] == held_out[1]
