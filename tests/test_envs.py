"""The built-in environments as the policy meets them: answers, tool observations, and failures
(errors, timeouts, memory, malformed calls) that become observations instead of exceptions."""

import json

import pytest

from grpo_jax import envs
from grpo_jax.config import Config, override
from grpo_jax.envs import State, Step

EXAMPLE = {"prompt": "123*45=", "answer": "5535"}


def test_calculator_answers_calls_and_grades_the_final_answer():
    calc = envs.ENVS["calculator"]()
    assert calc.step(State(EXAMPLE), "123*45=[123*45]") == Step("5535", 0.0, False)
    assert calc.step(State(EXAMPLE), "[(7-1)/4]") == Step("3/2", 0.0, False)
    assert calc.step(State(EXAMPLE, ("[123*45]",), ("5535",)), "so 5535") == Step("", 1.0, True)
    assert calc.step(State(EXAMPLE), "so 5536") == Step("", 0.0, True)
    # the last turn is graded, even if it is a call
    assert calc.step(State(EXAMPLE, last=True), "[123*45]") == Step("", 0.0, True)


def test_a_tool_call_that_answers_earns_the_call_reward():
    calc = envs.ENVS["calculator"](call_reward=0.25)
    assert calc.step(State(EXAMPLE), "123*45=[123*45]") == Step("5535", 0.25, False)
    assert calc.step(State(EXAMPLE), "[1/0]").reward == 0.0  # a failed call earns nothing
    assert calc.step(State(EXAMPLE, ("[123*45]",), ("5535",)), "so 5535") == Step("", 1.0, True)


@pytest.mark.parametrize("call,why", [
    ("[12*/3]", "not an expression"),
    ("[1/0]", "ZeroDivisionError"),
    ("[__import__('os').getcwd()]", "not allowed"),  # parsed, never evaluated as code
    ("[2**10]", "not allowed"),
    ("12]", "no ["),
])
def test_calculator_failures_are_observations(call, why):
    obs, reward, done = envs.ENVS["calculator"]().step(State(EXAMPLE), call)
    assert obs.startswith("error: ") and why in obs and (reward, done) == (0.0, False)


def test_retrieval_looks_keys_up_in_a_table_and_a_file(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"Capital of Peru": "Lima"}))
    env = envs.ENVS["retrieval"](table=(("capital of France", "Paris"),), path=str(path))
    assert env.step(State(EXAMPLE), "look: [Capital of FRANCE ]").observation == "Paris"
    assert env.step(State(EXAMPLE), "[capital of peru]").observation == "Lima"
    assert env.step(State(EXAMPLE), "[capital of Mars]").observation == "not found"


@pytest.mark.parametrize("code,expect", [
    ("print(6*7)", "42"),
    ("print('a'); print(1+1)", "2"),
    ("raise ValueError('bad input')", "ValueError: bad input"),
    ("x = bytearray(2 << 30)", "MemoryError"),  # over memory_mb
    ("while True: pass", "error: timeout"),
    ("print(", "SyntaxError: '(' was never closed"),
])
def test_python_tool_runs_code_in_a_limited_interpreter(code, expect):
    env = envs.ENVS["python"](timeout_s=1.0, memory_mb=256, num_workers=0)
    assert env.step(State(EXAMPLE), f"<python>{code}</python>") == Step(expect, 0.0, False)


def test_python_tool_in_the_reward_pool_survives_a_hung_call():
    """Through a pool worker: a call that outlives the pool's deadline too (a sleep the interpreter's own
    timeout would catch first is the common case) is a timeout observation, and the pool serves on."""
    env = envs.ENVS["python"](timeout_s=1.0, num_workers=1)
    assert env.step(State(EXAMPLE), "<python>import time; time.sleep(5)</python>").observation == "error: timeout"
    assert env.step(State(EXAMPLE), "<python>print(sum(range(10)))</python>").observation == "45"


def test_environments_are_chosen_by_name_and_checked():
    cfg = override(Config(model=None, model_path="x"), ["env=calculator", "env.max_turns=3", "reward.names=env"])
    assert cfg.env == envs.ENVS["calculator"](max_turns=3) and cfg.env.name == "calculator"
    with pytest.raises(ValueError, match=r"reward.names holds 'env' .* exactly when Config.env is set: env='calculator'"):
        override(Config(model=None, model_path="x"), ["env=calculator"])
    for change, message in (("train.max_staleness=1", "train.max_staleness=1: multi-turn rollouts"),
                            ("train.packing=true", "train.packing lays rows out"),
                            ("algorithm.sampler=repo", "algorithm.sampler='repo' replays stored groups"),
                            ("train.eval_samples=4", "train.eval_samples=4 sample one turn"),
                            ("sampling.compute_dtype=bfloat16", "sampling.compute_dtype='bfloat16' and sampling.logit_noise=0.0"),
                            ("sampling.logit_noise=0.1", "sampling.compute_dtype=None and sampling.logit_noise=0.1 mismatch"),
                            ("algorithm.routing_replay=sampler", "routing_replay='sampler' replays the experts")):
        with pytest.raises(ValueError, match=message):
            override(cfg, [change])
    with pytest.raises(KeyError, match="unknown environment 'calculater'; did you mean 'calculator'"):
        envs.EnvConfig.from_name("calculater")
    with pytest.raises(ValueError, match=r"max_turns=0 .* must be >= 1 \(env.max_turns"):
        envs.ENVS["calculator"](max_turns=0)
