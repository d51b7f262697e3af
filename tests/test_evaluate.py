"""python -m grpo_jax.evaluate: a 37-problem set on 8 devices (every problem once, metrics recomputed from
the records), an HF directory through the CLI, maj@k and the table by hand, bad input before compiling;
pass@k against brute-force enumeration and the held-out metrics (the trainer's) by hand."""

import itertools
import json
import math
import pathlib

import jax
import numpy as np
import pytest

from grpo_jax import checkpoint, evaluate as ev, rewards, sampling, trainer
from grpo_jax.config import (
    ArithmeticConfig, Config, FileTaskConfig, MeshConfig, RewardConfig, SamplingConfig, TrainConfig, override,
)
from grpo_jax.rewards import answers
from test_cli import tiny_hf_checkpoint
from test_trainer import MODEL

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "gsm8k_tiny.jsonl"


@rewards.register("test_evaluate_has_number", correctness=True)
def has_number(prompt, completion, example, **_):
    """Right when the completion holds a number: an untrained model is right often enough for every metric to vary."""
    return float(answers.extract_answer(completion) is not None)


def run_config(out) -> Config:
    return Config(
        model=MODEL, tokenizer="char", mesh=MeshConfig(data=-1), task=ArithmeticConfig(),
        reward=RewardConfig(names=("exact",), num_workers=0),
        sampling=SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=2),
        train=TrainConfig(steps=2, prompts_per_step=4, eval_prompts=1, out_dir=str(out), checkpoint_every=1),
    )


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run with a checkpoint at step 3 (an untrained policy saved as a step: the harness reads any step)."""
    cfg = run_config(tmp_path_factory.mktemp("run"))
    t = trainer.Trainer(cfg)
    t.step = 3
    ckpt = checkpoint.Checkpointer(pathlib.Path(cfg.train.out_dir) / "checkpoints", 1, 2)
    t.save(ckpt, force=True)
    ckpt.close()
    return cfg


def benchmarks(**changes) -> ev.EvalConfig:
    return ev.EvalConfig(benchmarks=(
        ev.Benchmark("arith37", ArithmeticConfig(), size=37, reward="test_evaluate_has_number", ks=(2, 4),
                     sampling=SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=4, temperature=1.0)),
        ev.Benchmark("arith5_greedy", ArithmeticConfig(), size=5, reward="exact",
                     sampling=SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=1, greedy=True)),
    ), **{"reward_workers": 0, "batch_problems": 16, **changes})


def test_a_prime_sized_set_on_8_devices_holds_every_problem_once_and_its_metrics_recompute(saved_run, tmp_path):
    assert jax.device_count() == 8
    cfg = benchmarks()
    result = ev.evaluate(cfg, run=saved_run, out=tmp_path)  # the newest step: 3
    assert result["step"] == 3 and result["source"].endswith("step 3")
    held_out = ArithmeticConfig().sources(cfg.seed)[1]
    a = result["benchmarks"]["arith37"]
    # 37 problems in batches of 16 on 8 devices: 16, 16 and 5 padded to 8; each problem once, in order
    assert [r["index"] for r in a["records"]] == list(range(37))
    assert [r["prompt"] for r in a["records"]] == [held_out[i]["prompt"] for i in range(37)]
    assert all(len(r["samples"]) == 4 for r in a["records"])
    assert a["metrics"] == ev.metrics(a["records"], 4, (2, 4))  # recomputed from the records alone
    c = np.array([sum(s["correct"] for s in r["samples"]) for r in a["records"]])
    assert 0 < c.sum() < 37 * 4, "every metric should vary"
    assert a["metrics"]["avg@n"] == pytest.approx(c.sum() / (37 * 4))
    for k in (2, 4):  # pass@k by binomials, independently of evaluate.pass_at_k
        assert a["metrics"][f"pass@{k}"] == pytest.approx(np.mean([1 - math.comb(4 - ci, k) / math.comb(4, k) for ci in c]))
    assert a["metrics"]["pass@4"] == pytest.approx(np.mean(c > 0))
    g = result["benchmarks"]["arith5_greedy"]
    assert [r["index"] for r in g["records"]] == list(range(5)) and g["config"]["ks"] == []
    assert result["mean"] == {"avg@n": pytest.approx((a["metrics"]["avg@n"] + g["metrics"]["avg@n"]) / 2)}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["benchmarks"]["arith37"]["records"] == a["records"]
    table = (tmp_path / "results.md").read_text()
    assert "| benchmark | problems | n | avg@n | pass@2 | pass@4 | maj@2 | maj@4 |" in table
    assert "| arith37 | 37 | 4 |" in table and "| mean |" in table
    # the same problems at another batch size and mesh: the same records' problems, the greedy ones identical
    other = ev.evaluate(benchmarks(batch_problems=5), run=override(saved_run, ["mesh.data=2", "mesh.tensor=4", "mesh.max_replicated_fraction=1"]),
                        step=3, out=tmp_path / "other")
    assert [r["index"] for r in other["benchmarks"]["arith37"]["records"]] == list(range(37))
    assert other["benchmarks"]["arith5_greedy"]["records"] == g["records"]


def test_maj_at_k_and_metrics_by_hand():
    def sample(answer, correct):
        return {"answer": answer, "correct": correct, "length": 3, "truncated": False}

    # "0.5" and "1/2" are one vote; a tie goes to the answer seen first; no answer does not vote
    assert ev.majority_correct([sample("7", False), sample("0.5", True), sample("1/2", True)])
    assert not ev.majority_correct([sample("7", False), sample("1/2", True)])
    assert ev.majority_correct([sample(None, False), sample(None, False), sample("x", True)])
    assert not ev.majority_correct([sample(None, True)])
    records = [{"samples": [sample("1", True), sample("2", False), sample("2", False), sample("2", False)]},
               {"samples": [sample("3", False), sample("4", True), sample("4", True), sample(None, False)]}]
    m = ev.metrics(records, 4, (2, 4))
    assert m["avg@n"] == 3 / 8 and m["pass@4"] == 1.0
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)  # 1 - C(4-c,2)/C(4,2), c = 1 and 2
    # maj@2: a tie in both, to the first answer ("1" right, "3" wrong); maj@4: "2" (wrong) and "4" (right)
    assert m["maj@2"] == 0.5 and m["maj@4"] == 0.5 and [ev.majority_correct(r["samples"]) for r in records] == [False, True]
    assert ev.metrics(records[1:], 4, (3,))["maj@3"] == 1.0


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of the k-subsets of n samples (c of them correct) that hold a correct one."""
    correct = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_probability_that_k_of_the_n_samples_hold_a_correct_one(n):
    for k in range(1, n + 1):
        c = np.arange(n + 1)
        got = ev.pass_at_k(n, c, k)
        want = [brute_force_pass_at_k(n, ci, k) for ci in c]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got, [1 - math.comb(n - ci, k) / math.comb(n, k) for ci in c], atol=1e-12)
    np.testing.assert_allclose(ev.pass_at_k(n, np.arange(n + 1), 1), np.arange(n + 1) / n)  # pass@1 = avg
    with pytest.raises(ValueError, match="needs 1 <= k <= n"):
        ev.pass_at_k(n, [0], n + 1)


def test_pass_at_k_for_many_samples_needs_no_large_binomials():
    # C(2000, 1000) ~ 1e600 is beyond float64; exact integer binomials as the reference.
    c = np.array([0, 1, 3, 1000, 2000])
    want = [1 - math.comb(2000 - ci, 1000) / math.comb(2000, 1000) for ci in c]
    np.testing.assert_allclose(ev.pass_at_k(2000, c, 1000), want, rtol=1e-12)


def held_out_records(correct, n, reward=None, length=3):
    """Records as `sample_set` writes them, prompt-major `correct` (None: no correctness reward)."""
    rows = len(reward if correct is None else correct)
    reward = np.zeros(rows) if reward is None else reward
    samples = [{"correct": None if correct is None else bool(correct[i]), "reward": float(reward[i]), "length": length}
               for i in range(rows)]
    return [{"correct": None if correct is None else sum(s["correct"] for s in samples[j:j + n]),
             "samples": samples[j:j + n]} for j in range(0, rows, n)]


def test_pass_ks_and_held_out_metrics_by_hand():
    assert ev.pass_ks(1) == [] and ev.pass_ks(8) == [2, 4, 8] and ev.pass_ks(6) == [2, 4, 6]
    # 2 prompts x 4 samples: 1 and 4 correct
    out = ev.held_out_metrics("sampled", held_out_records([0, 1, 0, 0, 1, 1, 1, 1], 4, reward=np.arange(8.0)))
    assert out["eval/accuracy_sampled"] == 5 / 8 and out["eval/reward_sampled"] == 3.5
    assert out["eval/length_sampled"] == 3
    assert out["eval/pass@2"] == pytest.approx((0.5 + 1.0) / 2)  # 1 - C(3,2)/C(4,2) = 1/2 for the first prompt
    assert out["eval/pass@4"] == 1.0
    assert ev.held_out_metrics("greedy", held_out_records(None, 1, reward=np.zeros(2))) == {
        "eval/reward_greedy": 0.0, "eval/length_greedy": 3.0}


def test_held_out_accuracy_per_bucket_by_hand():
    # 3 prompts x 2 samples, prompt-major: prompt 0 (short) 1 of 2 right, prompt 1 (long) 2 of 2, prompt 2 (short) 0.
    records = held_out_records([1, 0, 1, 1, 0, 0], 2)
    out = ev.held_out_metrics("sampled", records, ["short", "long", "short"])
    assert out["eval/accuracy_sampled@short"] == 0.25 and out["eval/accuracy_sampled@long"] == 1.0
    assert out["eval/accuracy_sampled"] == 0.5
    assert not any(k.startswith("eval/accuracy_sampled@") for k in ev.held_out_metrics("sampled", records))


def test_an_hf_directory_through_the_command_line(tmp_path, capsys):
    tiny_hf_checkpoint(tmp_path / "hf")
    (tmp_path / "bench.py").write_text(f"""
from grpo_jax.config import FileTaskConfig, SamplingConfig
from grpo_jax.evaluate import Benchmark, EvalConfig

def get_config():
    task = FileTaskConfig(format="gsm8k", path={str(FIXTURE)!r}, eval_path={str(FIXTURE)!r})
    return EvalConfig(benchmarks=(
        Benchmark("gsm8k", task, reward="math", sampling=SamplingConfig(max_prompt_len=96, max_new_tokens=3, group_size=2)),
        Benchmark("unused", task, size=1),
    ), reward_workers=0)
""")
    ev.main(["--benchmarks", str(tmp_path / "bench.py"), "--hf", str(tmp_path / "hf"), "--only", "gsm8k",
             "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(result["benchmarks"]) == ["gsm8k"] and result["step"] is None
    records = result["benchmarks"]["gsm8k"]["records"]
    assert [r["index"] for r in records] == list(range(20)) and records[0]["reference"] == "15"
    assert result["benchmarks"]["gsm8k"]["metrics"] == ev.metrics(records, 2, (2,))
    assert "| gsm8k | 20 | 2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"python -m grpo_jax.evaluate: error: --only gsm: no such benchmark"):
        ev.main(["--benchmarks", str(tmp_path / "bench.py"), "--hf", str(tmp_path / "hf"), "--only", "gsm",
                 "--out", str(tmp_path / "out")])


def empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return FileTaskConfig(path=str(tmp_path / "empty.jsonl"), eval_path=str(tmp_path / "empty.jsonl"))


ONE = SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=1)
BAD = {
    "unknown benchmark": (lambda p: dict(only=["arith"]), r"--only arith: no such benchmark in the EvalConfig; its "
                          r"benchmarks: arith37, arith5_greedy"),
    "empty set": (lambda p: dict(cfg=ev.EvalConfig((ev.Benchmark("empty", empty_file(p), sampling=ONE),))),
                  r"Benchmark 'empty': its set \(.*empty.jsonl\) is empty"),
    "endless set without a size": (lambda p: dict(cfg=ev.EvalConfig((ev.Benchmark("a", ArithmeticConfig(), sampling=ONE),))),
                                   r"Benchmark 'a'.size=0, but task 'arithmetic' generates problems without end; set size"),
    "not a checker": (lambda p: dict(cfg=ev.EvalConfig((ev.Benchmark("a", ArithmeticConfig(), size=2, reward="format", sampling=ONE),))),
                      r"Benchmark 'a'.reward='format' is not a registered correctness reward; choose from \[.*'math'"),
    "prompt too long": (lambda p: dict(cfg=ev.EvalConfig((ev.Benchmark("a", ArithmeticConfig(), "held_out", 2, "exact", sampling=SamplingConfig(max_prompt_len=3)),))),
                        r"Benchmark 'a': problem 0 renders to \d+ tokens; Benchmark 'a'.sampling.max_prompt_len=3: raise it"),
    "checkpoint of another model": (lambda p: dict(run=["model.hidden_size=64"]),
                                    r"holds a run whose config differs from this one \(checkpoint -> now\):\n  model.hidden_size: 32 -> 64"),
    "missing step": (lambda p: dict(step=5), r"holds no intact checkpoint of step 5; its intact steps: \[3\]"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_refused_before_anything_compiles(case, saved_run, tmp_path, monkeypatch):
    def compiled(*args, **kwargs):
        raise AssertionError("reached the model before the input was checked")

    monkeypatch.setattr(trainer, "Trainer", compiled)
    monkeypatch.setattr(sampling, "rollout", compiled)
    monkeypatch.setattr(sampling, "rollout_rows", compiled)
    make, message = BAD[case]
    args = {"cfg": benchmarks(), "run": [], "step": None, "only": (), **make(tmp_path)}
    with pytest.raises(ValueError, match=message):
        ev.evaluate(args["cfg"], run=override(saved_run, args["run"]), step=args["step"], only=args["only"],
                    out=tmp_path)


def test_k_above_n_and_a_mismatched_hf_directory_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"Benchmark 'b'.ks=\(8,\): k=8 is not in \[1, n=4\] \(n = sampling.group_size"):
        ev.Benchmark("b", ArithmeticConfig(), size=2, ks=(8,), sampling=SamplingConfig(group_size=4))
    tiny_hf_checkpoint(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    for name in ("rollout", "rollout_rows"):
        monkeypatch.setattr(sampling, name, lambda *a, **k: pytest.fail("compiled before the check"))
    cfg = ev.EvalConfig((ev.Benchmark("a", FileTaskConfig(path=str(FIXTURE), eval_path=str(FIXTURE)), size=1,
                                      sampling=SamplingConfig(max_prompt_len=96, max_new_tokens=2)),), reward_workers=0)
    with pytest.raises(ValueError, match=r"tensor model.layers.0.mlp.\w+_proj.weight has shape .*, expected .* from config.json"):
        ev.evaluate(cfg, hf=str(tmp_path / "hf"), out=tmp_path / "out")


def test_a_run_evaluates_its_benchmarks_file_at_every_evaluation_as_the_cli_does(tmp_path):
    """train.eval_benchmarks: the harness of python -m grpo_jax.evaluate inside the run, beside the held-out
    set's metrics (their names unchanged); its last rates equal the CLI's on the saved last step."""
    import textwrap

    from grpo_jax import run
    from grpo_jax.logging import read_rows
    from grpo_jax.train import load_config

    path = tmp_path / "bench.py"
    path.write_text(textwrap.dedent("""
        from grpo_jax.config import ArithmeticConfig, SamplingConfig
        from grpo_jax.evaluate import Benchmark, EvalConfig

        def get_config():
            return EvalConfig(reward_workers=0, benchmarks=(
                Benchmark("arith7", ArithmeticConfig(), size=7, reward="test_evaluate_has_number", ks=(2,),
                          sampling=SamplingConfig(max_prompt_len=8, max_new_tokens=4, group_size=2)),))
    """))
    cfg = override(run_config(tmp_path / "run"), [f"train.eval_benchmarks={path}", "train.eval_every=1"])
    result = run.train(cfg)
    rows = {r["step"]: r for r in read_rows(tmp_path / "run" / "metrics.jsonl")}
    keys = {"eval/arith7/avg@n", "eval/arith7/pass@2", "eval/arith7/maj@2", "eval/mean/avg@n", "eval/accuracy_greedy"}
    assert all(keys <= set(rows[step]) for step in (0, 1, 2))
    again = ev.evaluate(load_config(path, ev.EvalConfig), run=cfg, step=2, out=tmp_path / "again")
    assert {k: result["last_eval"][f"eval/arith7/{k}"] for k in ("avg@n", "pass@2", "maj@2")} == {
        k: again["benchmarks"]["arith7"]["metrics"][k] for k in ("avg@n", "pass@2", "maj@2")}
    with pytest.raises(FileNotFoundError, match="train.eval_benchmarks=.*no such file"):
        run.train(override(cfg, [f"train.eval_benchmarks={tmp_path / 'none.py'}"]))


def test_two_processes_score_only_their_rows_and_gather_every_problem_once(tmp_path):
    """37 problems (prime) over 2 processes x 4 devices, the CLI as a cluster runs it: each process scores
    only its own rows (a reward that notes every row it scores, per process), every problem is in the
    records once, the metrics recompute from them, and the records are those of 1 process x 8 devices."""
    from test_distributed import cluster, finish

    tiny_hf_checkpoint(tmp_path / "hf")
    scored = tmp_path / "scored"
    scored.mkdir()
    (tmp_path / "bench.py").write_text(f"""
import json, os
from grpo_jax import rewards
from grpo_jax.config import ArithmeticConfig, SamplingConfig
from grpo_jax.evaluate import Benchmark, EvalConfig

def counted(prompt, completion, example, **_):
    with open(os.path.join({str(scored)!r}, str(os.getpid())), "a") as f:
        f.write(json.dumps(example["prompt"]) + "\\n")
    return float(any(c.isdigit() for c in completion))

rewards.register("test_evaluate_counted", correctness=True)(counted)  # once: load_config runs a file once

def get_config():
    return EvalConfig(benchmarks=(Benchmark("arith37", ArithmeticConfig(), size=37, reward="test_evaluate_counted",
                                            ks=(2,), sampling=SamplingConfig(max_prompt_len=16, max_new_tokens=4,
                                                                             group_size=2, temperature=1.0)),),
                      reward_workers=0, batch_problems=16)
""")
    argv = ["-m", "grpo_jax.evaluate", "--benchmarks", str(tmp_path / "bench.py"), "--hf", str(tmp_path / "hf")]
    procs = cluster([*argv, "--out", str(tmp_path / "two")], 2, tmp_path / "logs")
    finish(procs, tmp_path / "logs")
    two = json.loads((tmp_path / "two" / "results.json").read_text())["benchmarks"]["arith37"]
    held_out = ArithmeticConfig().sources(0)[1]
    assert [r["index"] for r in two["records"]] == list(range(37))
    assert two["metrics"] == ev.metrics(two["records"], 2, (2,)) and 0 < two["metrics"]["avg@n"] < 1
    # batches of 16 problems: process 0's devices hold problems 0-7 of each, process 1's 8-15 (none of the
    # last batch's 5 real ones); together every row once
    counts = [[json.loads(line) for line in (scored / str(p.pid)).read_text().splitlines()] for p in procs]
    want = [[held_out[i]["prompt"] for i in problems for _ in range(2)]
            for problems in ([*range(8), *range(16, 24), *range(32, 37)], [*range(8, 16), *range(24, 32)])]
    assert counts == want
    ev.main(["--benchmarks", str(tmp_path / "bench.py"), "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "one")])
    one = json.loads((tmp_path / "one" / "results.json").read_text())["benchmarks"]["arith37"]
    assert two == one
