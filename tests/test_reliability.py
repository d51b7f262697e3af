"""Bad inputs through the CLI, resume-safe logs, reward failures and workers, and the soak drill."""

import dataclasses
import importlib.util
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from grpo_jax import checkpoint, models, trainer
from grpo_jax import train_step as ts
from grpo_jax.config import AlgorithmConfig, flatten, override, resume_changes
from grpo_jax import logging as run_logging
from grpo_jax.rewards import scoring
from grpo_jax.train import load_config, main, parse_args
from xla_flags import xla_flags  # tests/xla_flags.py
from fault_rewards import dies_or_sleeps, odd_values

ROOT = pathlib.Path(__file__).parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# The quickstart shrunk: a 1-layer model, 2 prompts x 4 samples a step, 8 held-out prompts (one per
# simulated device), a constant learning rate (so train.steps may change on resume).
TINY = ["model.num_layers=1", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
        "model.num_kv_heads=1", "train.prompts_per_step=2", "sampling.group_size=4", "train.minibatches=1",
        "train.eval_prompts=8", "train.steps=2", "reward.num_workers=1", "optim.schedule=constant"]


def argv(out, *sets, config=QUICKSTART) -> list[str]:
    tiny = [s for s in TINY if "model=none" not in sets or not s.startswith("model.")]  # no model: no model fields
    return ["--config", str(config), *(a for s in (*tiny, f"train.out_dir={out}", *sets) for a in ("--set", s))]


# -- bad inputs: a clear error naming the field and the fix, before anything is sampled or compiled -----

def write(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def file_task_config(tmp, train_lines: list[str]) -> str:
    """A config file: the quickstart with its task read from a GSM8K-format JSONL written here."""
    good = json.dumps({"question": "12+7=", "answer": "#### 19"})
    train = write(tmp / "train.jsonl", "\n".join(train_lines) + "\n")
    held_out = write(tmp / "held_out.jsonl", "\n".join([good] * 8) + "\n")
    return write(tmp / "file_task.py", (
        "import dataclasses, runpy\n"
        "from grpo_jax.config import FileTaskConfig\n"
        f"def get_config():\n"
        f"    cfg = runpy.run_path({str(QUICKSTART)!r})['get_config']()\n"
        f"    return dataclasses.replace(cfg, task=FileTaskConfig('gsm8k', {train!r}, {held_out!r}))\n"
    ))


def hf_dir(tmp, damage=None) -> str:
    """A tiny saved model directory, `damage`d: "architecture", "truncated" or "no_weights" (or "moe": a
    mixture-of-experts one, intact)."""
    moe = dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    cfg = models.ModelConfig(**{"model_type": "qwen3", **(moe if damage == "moe" else {})}, vocab_size=64, hidden_size=16,
                             intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
    path = tmp / "model"
    models.save_hf(cfg, models.init(cfg, jax.random.key(0)), path)
    weights = path / "model.safetensors"
    if damage == "architecture":
        write(path / "config.json", json.dumps({**cfg.to_hf(), "model_type": "gpt2"}))
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "no_weights":
        weights.unlink()
    return str(path)


def saved_run(tmp, *sets) -> pathlib.Path:
    """A run directory with checkpoints at steps 1 and 2 of the CLI config `argv(out, *sets)`."""
    out = tmp / "run"
    t = trainer.Trainer(parse_args(argv(out, *sets)))
    ckpt = checkpoint.Checkpointer(out / "checkpoints", 1, 2)
    for t.step in (1, 2):
        t.save(ckpt)
    ckpt.close()
    return out


def flip_a_bit(out: pathlib.Path, step: int) -> None:
    data = max((p for p in (out / "checkpoints" / str(step) / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))


GOOD = json.dumps({"question": "12+7=", "answer": "#### 19"})
# (--set assignments, files to prepare, the error's type, what its message must say)
BAD_INPUTS = {
    "misspelt key": (["train.stpes=3"], None, ValueError, "TrainConfig has no field 'stpes'; did you mean 'steps'"),
    "mistyped value": (["train.steps=three"], None, ValueError, "train.steps=three: expected a value of type int"),
    "no value": (["train.steps"], None, ValueError, "expected key=value"),
    "negative steps": (["train.steps=-3"], None, ValueError, "TrainConfig.steps=-3 must be >= 1"),
    "nan learning rate": (["optim.learning_rate=nan"], None, ValueError, "learning_rate=nan must be finite"),
    "inf learning rate": (["optim.learning_rate=inf"], None, ValueError, "learning_rate=inf must be finite"),
    "negative learning rate": (["optim.learning_rate=-1e-3"], None, ValueError, "learning_rate=-0.001 must be finite and >= 0"),
    "b1 above 1": (["optim.b1=1.5"], None, ValueError, r"OptimConfig.b1=1.5 must be in \[0, 1\)"),
    "negative warmup": (["optim.warmup_steps=-5"], None, ValueError, "warmup_steps=-5 must be >= 0"),
    "zero minibatches": (["train.minibatches=0"], None, ValueError, "TrainConfig.minibatches=0 must be >= 1"),
    "nan algorithm field": (["algorithm.loss.eps_low=nan"], None, ValueError, "algorithm.loss.eps_low=nan"),
    "infinite temperature": (["sampling.temperature=inf"], None, ValueError, "temperature=inf must be finite"),
    "names without weights": (["reward.names=exact,format"], None, ValueError, "give one weight per name"),
    "unknown reward": (["reward.names=exakt"], None, ValueError, r"unknown reward\(s\) \['exakt'\]"),
    "unknown failure policy": (["reward.on_failure=skip"], None, ValueError, "on_failure='skip': use one of"),
    "sizes that do not divide": (["train.minibatches=3"], None, ValueError, "does not split into train.minibatches=3"),
    "one sample per prompt": (["sampling.group_size=1"], None, ValueError, "group advantages need at least 2"),
    "mesh larger than the devices": (["mesh.data=16"], None, ValueError, "needs 16 devices, there are 8"),
    "decode slots that do not divide": (["sampling.decode_slots=3"], None, ValueError,
                                        r"sampling.decode_slots=3 does not split over the \d+ devices .*make it a multiple"),
    "tokenizer larger than the vocabulary": (["model.vocab_size=8"], None, ValueError, "vocab_size is 8: Config.tokenizer does not belong"),
    "missing tokenizer": (["tokenizer=/nonexistent/tok"], None, FileNotFoundError, "expected a Hugging Face tokenizer directory"),
    "missing model_path": (["model=none", "model_path=/nonexistent/model"], None, FileNotFoundError,
                           "model_path=/nonexistent/model does not exist"),
    "unsupported architecture": (["model=none", "model_path={model}"], "architecture", ValueError, "model_type='gpt2'.* is not supported"),
    "truncated weights": (["model=none", "model_path={model}"], "truncated", ValueError, "model.safetensors is truncated"),
    "missing weights": (["model=none", "model_path={model}"], "no_weights", FileNotFoundError, r"no \*.safetensors file"),
    "bad JSONL line": ([], [GOOD, "{'question': 1}"], ValueError, r"train.jsonl line 2 is not JSON"),
    "record of another format": ([], [GOOD, json.dumps({"problem": "1+1=", "solution": "2"})], ValueError,
                                 "train.jsonl record 2 is not gsm8k format: it has no field 'answer'"),
    "empty prompt": ([], [GOOD, json.dumps({"question": " ", "answer": "#### 1"})], ValueError,
                     "train.jsonl record 2 is not gsm8k format .*the question is empty"),
    "prompt over the limit": ([], [GOOD, json.dumps({"question": "1+" * 20 + "1=", "answer": "#### 21"})], ValueError,
                              r"train.jsonl: example 1 .* renders to 43 tokens; sampling.max_prompt_len=8"),  # BOS + 42 chars
    "prompt the tokenizer cannot encode": ([], [json.dumps({"question": "2€+1=", "answer": "#### 3"})] * 2, ValueError,
                                           r"train.jsonl: example 0 .*CharTokenizer cannot encode \['€'\]"),
    "out_dir is a file": (["train.out_dir={file}"], None, ValueError, "a file is in the way of the run directory"),
    "resume with another model shape": (["model.hidden_size=48"], "checkpoint", ValueError,
                                        r"differs from this one .*\n  model.hidden_size: 32 -> 48"),
    "resume with another seed and batch": (["train.seed=3", "train.prompts_per_step=4"], "checkpoint", ValueError,
                                           r"train.prompts_per_step: 2 -> 4\n  train.seed: 0 -> 3"),
    "every checkpoint damaged": ([], "all damaged", RuntimeError, r"every checkpoint in .* is damaged \(step 2: .*; step 1: "),
    # float32 overflow: finite in Python, not on the device
    "learning rate beyond float32": (["optim.learning_rate=1e39"], None, ValueError,
                                     r"Config.optim.learning_rate=1e\+39 overflows float32 .*: lower it"),
    "reward weight beyond float32": (["reward.weights=1e39"], None, ValueError,
                                     r"Config.reward.weights=\[1e\+39\] overflows float32 .*: lower it"),
    "temperature too small for float32": (["sampling.temperature=1e-30"], None, ValueError,
                                          r"SamplingConfig.temperature=1e-30 must be finite and >= 0.001 .*for argmax decoding set "
                                          "sampling.greedy=true"),
    "unknown sampler dtype": (["sampling.compute_dtype=float16"], None, ValueError,
                              r"SamplingConfig.compute_dtype='float16' must be None \(the model's\) or one of"),
    "negative logit noise": (["sampling.logit_noise=-0.1"], None, ValueError, "SamplingConfig.logit_noise=-0.1 must be finite and >= 0"),
    "label noise of pure noise": (["reward.label_noise=0.5"], None, ValueError, r"RewardConfig.label_noise=0.5 must lie in \[0, 0.5\)"),
    # inputs that used to fail unclearly, late or not at all
    "negative seed": (["train.seed=-1"], None, ValueError, r"TrainConfig.seed=-1 must be in \[0, 2\*\*32\)"),
    "seed beyond uint32": (["train.seed=99999999999"], None, ValueError, r"TrainConfig.seed=99999999999 must be in \[0, 2\*\*32\)"),
    "no kv heads": (["model.num_kv_heads=0"], None, ValueError, "ModelConfig.num_kv_heads=0 must be >= 1"),
    "no intermediate size": (["model.intermediate_size=0"], None, ValueError, "ModelConfig.intermediate_size=0 must be >= 1"),
    "negative hidden size": (["model.hidden_size=-32"], None, ValueError, "ModelConfig.hidden_size=-32 must be >= 1"),
    "no layers": (["model.num_layers=0"], None, ValueError, "ModelConfig.num_layers=0 must be >= 1"),
    "positions shorter than the sequences": (["model.max_position_embeddings=10"], None, ValueError,
                                             r"model.max_position_embeddings=10 is shorter than sampling.max_prompt_len \+ "
                                             r"sampling.max_new_tokens = 8 \+ 4 = 12.*lower them"),
    "prefix grouper on an MoE model_path": (["model=none", "model_path={model}", "train.prefix_grouper=true"], "moe", ValueError,
                                            "train.prefix_grouper=True: this MoE model's routing .*set train.prefix_grouper=False"),
    "empty data file": ([], [], ValueError, r"train.jsonl holds 0 examples, fewer than train.prompts_per_step=2: add examples"),
    "data file shorter than a batch": ([], [GOOD], ValueError,
                                       r"train.jsonl holds 1 examples, fewer than train.prompts_per_step=2: add examples"),
    "held-out file smaller than eval_prompts": (["train.eval_prompts=16"], [GOOD] * 4, ValueError,
                                                r"held_out.jsonl holds 8 held-out examples, fewer than train.eval_prompts=16: "
                                                "lower train.eval_prompts"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_are_clear_errors_before_compiling(case, tmp_path, monkeypatch):
    sets, prepare, error, message = BAD_INPUTS[case]
    config = QUICKSTART
    if isinstance(prepare, list):
        config = file_task_config(tmp_path, prepare)
    elif prepare in ("architecture", "truncated", "no_weights", "moe"):
        sets = [s.format(model=hf_dir(tmp_path, prepare)) for s in sets]
    elif prepare in ("checkpoint", "all damaged"):
        out = saved_run(tmp_path)
        for step in (1, 2) if prepare == "all damaged" else ():
            flip_a_bit(out, step)
    sets = [s.format(file=write(tmp_path / "a_file", "")) for s in sets]
    for method in ("evaluate", "train_step"):  # nothing may be sampled, compiled or trained first
        monkeypatch.setattr(trainer.Trainer, method, lambda *a, m=method: pytest.fail(f"{m} ran before the error"))
    # The config's own errors end the command line in their message (no traceback); the others raise.
    with pytest.raises((error, SystemExit)) as raised:
        main(argv(tmp_path / "run", *sets, config=config))
    if raised.type is SystemExit:
        text = str(raised.value.code)
        assert issubclass(error, (ValueError, TypeError, AttributeError, FileNotFoundError))
        assert text.startswith("python -m grpo_jax.train: error: ") and re.search(message, text), text
    else:
        assert re.search(message, str(raised.value)), raised.value


def no_compiling(monkeypatch):
    monkeypatch.setattr(trainer.ts, "compiled_train_step", lambda *a: pytest.fail("the train step compiled before the error"))


SUM = {"prompt": "1+2=", "answer": "3"}
# In code: (Trainer keyword arguments, the error's type, what its message must say)
BAD_DATA_IN_CODE = {
    "examples without a prompt": (dict(examples=[{"question": "1+2=", "answer": "3"}] * 8), TypeError,
                                  r"the train examples of task 'examples': example 0 has no 'prompt' \(its keys: "
                                  r"\['answer', 'question'\]\); every example is a dict with a str 'prompt'"),
    "an int prompt": (dict(examples=[SUM] * 8, held_out=[{"prompt": 12, "answer": "3"}] * 8), TypeError,
                      "held_out examples of task 'examples': example 0 has prompt=12 of type int; every example is a dict "
                      "with a str 'prompt'"),
    "a generator": (dict(examples=(SUM for _ in range(8))), TypeError,
                    r"examples= is a generator, not random-access examples: pass a list of dicts \(e.g. examples=list"),
    "int answers under exact": (dict(examples=[{"prompt": "1+2=", "answer": 3}] * 8), ValueError,
                                r"example 0 \(prompt '1\+2='\) has answer=3 of type int, but reward 'exact' compares a "
                                "str answer; give every example's 'answer' as a str"),
    "a reward without **kwargs": (dict(examples=[SUM] * 8, rewards={"exact_sum": lambda prompt, completion, example: 1.0}),
                                  TypeError, r"reward 'exact_sum': .*\(prompt, completion, example\) takes no \*\*kwargs, .*"
                                  r"define it as fn\(prompt, completion, example, \*\*kwargs\)"),
}


@pytest.mark.parametrize("case", BAD_DATA_IN_CODE)
def test_bad_examples_and_rewards_in_code_are_clear_errors_before_compiling(case, tmp_path, monkeypatch, unchecked):
    """(With the tests' type checks off: a user's process has none, `unchecked`.)"""
    given, error, message = BAD_DATA_IN_CODE[case]
    names = ["reward.names=exact_sum", "reward.num_workers=0"] if "rewards" in given else []
    cfg = parse_args(argv(tmp_path, "task=examples", *names))
    no_compiling(monkeypatch)
    with pytest.raises(error, match=message):
        trainer.Trainer(cfg, **given)


def test_params_of_another_model_are_clear_errors_before_compiling(tmp_path, monkeypatch, unchecked):
    """Params passed in code: a missing leaf used to fail with a 40-line pytree dump, another width
    trained anyway, int32 params failed at the first update, and NaN params skipped every update."""
    cfg = parse_args(argv(tmp_path))
    no_compiling(monkeypatch)
    params = models.init(cfg.model, jax.random.key(0))
    missing = {**params, "layers": {k: v for k, v in params["layers"].items() if k != "q_norm"}}
    with pytest.raises(ValueError, match=r"^params do not have the leaves of the qwen3 model of Config.model: missing "
                                         r"layers/q_norm \(1\); pass params of this model"):
        trainer.Trainer(cfg, missing)
    extra = {**params, "lm_head": params["embed"]}
    with pytest.raises(ValueError, match=r"params do not have the leaves .*: extra lm_head \(1\)"):
        trainer.Trainer(cfg, extra)
    wider = models.init(dataclasses.replace(cfg.model, hidden_size=48), jax.random.key(0))
    with pytest.raises(ValueError, match=r"params embed has shape \(\d+, 48\) where Config.model \(hidden_size=32, .*\) "
                                         r"needs \(\d+, 32\): the params are of another model; set Config.model to theirs"):
        trainer.Trainer(cfg, wider)
    with pytest.raises(TypeError, match=r"params embed are int32, not floating point: .*cast the params to "
                                        "model.dtype='float32'"):
        trainer.Trainer(cfg, jax.tree.map(lambda x: x.astype(np.int32), params))
    with pytest.raises(ValueError, match=r"params layers/q hold non-finite values \(NaN or inf\): every update would "
                                         "be skipped"):
        trainer.Trainer(cfg, {**params, "layers": {**params["layers"], "q": params["layers"]["q"].at[0, 0].set(np.nan)}})


def test_prefix_grouper_on_a_dense_model_path_passes_the_checks(tmp_path):
    """The MoE check of train.prefix_grouper reads a model_path's config.json (it used to fail on
    Config.model=None with "'NoneType' object has no attribute 'moe_layers'")."""
    cfg = parse_args(argv(tmp_path / "run", "model=none", f"model_path={hf_dir(tmp_path)}", "train.prefix_grouper=true"))
    trainer.check(cfg)
    ts.check(cfg)


def test_set_changes_fields_that_must_agree_together(tmp_path):
    cfg = parse_args(argv(tmp_path, "reward.names=exact,length", "reward.weights=1,0.5"))
    assert cfg.reward.names == ("exact", "length") and cfg.reward.weights == (1.0, 0.5)


@pytest.mark.parametrize("damage", ["flipped bit", "missing file", "truncated file"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(damage, tmp_path, caplog):
    """Through the CLI: the run (train.steps=1, so resuming from step 1 is already complete) warns and
    uses step 1; the damaged step 2 is kept aside as `2.damaged`."""
    out = saved_run(tmp_path)
    step2 = out / "checkpoints" / "2"
    if damage == "flipped bit":
        flip_a_bit(out, 2)
    elif damage == "missing file":
        (step2 / "_CHECKPOINT_METADATA").unlink()
    else:
        (step2 / "meta" / "metadata").write_text("{")
    with caplog.at_level(logging.WARNING, logger="grpo_jax.checkpoint"):
        main(argv(out, "train.steps=1"))
    assert any(re.search("is damaged .*falling back to an older one", r.getMessage()) for r in caplog.records), caplog.text
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["1", "2.damaged"]


def test_a_checkpoint_in_an_older_format_resumes(tmp_path, caplog):
    """Step 2 as a grpo_jax of before 2026-11-27 wrote it: no checksums.json (they came later) and the
    config's algorithm fields flat (tests/fixtures: the gspo preset's, as then stored). The run resumes
    from it and goes on to step 3."""
    out = saved_run(tmp_path)
    step2 = out / "checkpoints" / "2"
    (step2 / checkpoint.CHECKSUMS).unlink()
    meta = json.loads((step2 / "meta" / "metadata").read_text())
    fixture = json.loads((ROOT / "tests" / "fixtures" / "algorithm_configs_before_params.json").read_text())
    old = {**fixture["grpo"], **fixture["others"]["gspo"]}
    meta["config"] = {**{k: v for k, v in meta["config"].items() if not k.startswith("algorithm.")}, **old}
    (step2 / "meta" / "metadata").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="grpo_jax.checkpoint"):
        main(argv(out, "train.steps=3"))
    assert "no checksums.json" in caplog.text
    steps = [r["step"] for r in run_logging.read_rows(out / "metrics.jsonl")]
    assert steps[-1] == 3 and 1 not in steps  # went on from step 2, not from scratch
    assert "3" in {p.name for p in (out / "checkpoints").iterdir()}


# -- logs ----------------------------------------------------------------------------------------------

def test_the_run_clock_counts_each_process_start_and_the_kept_steps_once(tmp_path):
    """time/run_s: from `started` (the process's start-up before its first row counts), continued on
    resume from the checkpointed step's row (the time of the steps a kill lost is not counted twice)."""
    t0 = time.perf_counter()
    first = run_logging.MetricsLogger(tmp_path, 6, started=t0 - 100.0)
    for step in range(6):
        first.log(step, {})
    first.close()
    first_took = time.perf_counter() - t0
    at_checkpoint = first.history[3]["time/run_s"]
    t1 = time.perf_counter()
    resumed = run_logging.MetricsLogger(tmp_path, 6, resume_step=3, started=t1 - 7.0)
    resumed.log(4, {})
    resumed.close()
    resumed_took = time.perf_counter() - t1
    rows = run_logging.read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert 100.0 <= rows[0]["time/run_s"] <= at_checkpoint <= 100.0 + first_took
    assert at_checkpoint + 7.0 <= rows[4]["time/run_s"] <= at_checkpoint + 7.0 + resumed_took


def test_a_resumed_log_holds_every_step_once_and_plots_the_whole_run(tmp_path, monkeypatch):
    plotted = []
    monkeypatch.setattr(run_logging, "plot_curves", lambda history, path: plotted.append(list(history)))
    first = run_logging.MetricsLogger(tmp_path, 6)
    for step in range(6):
        first.log(step, {"reward/mean": step / 10}, {"completion/length": [step, step + 1]})
        first.log_completions(step, [{"completion": str(step)}] * 2)
    for name in ("metrics.jsonl", "completions.jsonl"):
        first.files[name].write('{"step": 6, "reward/me')  # a line cut short by a kill
        first.files[name].flush()
    # Killed after logging step 5; the newest checkpoint is step 3, so steps 4 and 5 will be redone.
    resumed = run_logging.MetricsLogger(tmp_path, 6, resume_step=3)
    for step in (4, 5, 6):
        resumed.log(step, {"reward/mean": step / 100}, {"completion/length": [step]})
        resumed.log_completions(step, [{"completion": f"again {step}"}])
    resumed.close()
    completions = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [(r["step"], r["completion"]) for r in completions] == [
        *((s, str(s)) for s in range(4) for _ in range(2)), *((s, f"again {s}") for s in (4, 5, 6))]
    histograms = [(e.step, v.histo.num) for e in run_logging.read_events(tmp_path / "tensorboard")
                  for v in e.summary.value if v.HasField("histo")]
    assert sorted(histograms) == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 1), (5, 1), (6, 1)]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert [r["reward/mean"] for r in rows] == [0, 0.1, 0.2, 0.3, 0.04, 0.05, 0.06]
    assert [r["step"] for r in plotted[-1]] == [0, 1, 2, 3, 4, 5, 6]  # the curves: the whole run
    drill = load_drill()
    events = drill.event_scalars(tmp_path / "tensorboard")
    assert sorted(step for tag, step in events if tag == "reward/mean") == [0, 1, 2, 3, 4, 5, 6]  # once each
    assert all(np.float32(v) == np.float32(r["reward/mean"]) for r in rows for v in events[("reward/mean", r["step"])])


def test_a_killed_run_loses_no_logged_row(tmp_path):
    """Every row `log` returned from is on disk, in metrics.jsonl and TensorBoard: the step's checkpoint
    is saved right after, and a kill then must not lose the step from the logs (tensorboardX's
    SummaryWriter queued events in a thread and lost them)."""
    script = (f"import os, signal\nfrom grpo_jax.logging import MetricsLogger\nlog = MetricsLogger({str(tmp_path)!r}, 50)\n"
              "for step in range(50):\n    log.log(step, {'loss': float(step)})\nos.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert len(run_logging.read_rows(tmp_path / "metrics.jsonl")) == 50
    events = load_drill().event_scalars(tmp_path / "tensorboard")
    assert sorted(step for tag, step in events if tag == "loss") == list(range(50))


# -- rewards -------------------------------------------------------------------------------------------

def test_nonfinite_rewards_are_failures_named_and_counted(caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_jax.rewards.scoring"):
        rewards, status, metrics = scoring.score(
            (odd_values,), (1.0,), ["q"] * 8, ["nan", "ok", "inf", "ok", "ok", "ok", "huge", "ok"], [{}] * 8,
            num_workers=1,
        )
    np.testing.assert_array_equal(status[:, 0], [3, 0, 3, 0, 0, 0, 3, 0])  # 1 + FAILURES.index("nonfinite")
    np.testing.assert_array_equal(rewards[:, 0], [0, 1, 0, 1, 1, 1, 0, 1])  # failures score 0, never nan
    assert metrics["reward/odd_values/nonfinites"] == metrics["reward/nonfinites"] == 3
    assert "reward 'odd_values': 3 of 8 call(s) failed (nonfinite)" in caplog.text
    # Groups of 2: the first two have a failure. drop_group drops them; zero keeps all (scored 0).
    np.testing.assert_array_equal(scoring.usable_groups(status, 2, "drop_group"), [0, 0, 1, 0])
    np.testing.assert_array_equal(scoring.usable_groups(status, 2, "zero"), [1, 1, 1, 1])


def test_a_dying_worker_causes_no_false_timeouts(caplog):
    """The replacement of a dead worker starts in the background: the calls in flight on the other
    worker answer in 0.2 s and must not be timed out while it imports (the old pool waited for it)."""
    completions = ["die"] + ["ok"] * 7
    with caplog.at_level(logging.WARNING, logger="grpo_jax.rewards.scoring"):
        rewards, failed, metrics = scoring.score(
            (dies_or_sleeps,), (1.0,), ["q"] * 8, completions, [{}] * 8, timeout_s=1.0, num_workers=3)
    assert metrics["reward/timeouts"] == 0 and metrics["reward/errors"] == 1, caplog.text
    np.testing.assert_array_equal(rewards[:, 0], [0] + [1] * 7)
    assert "reward worker died" in caplog.text


def test_timeouts_reach_the_console():
    """In a process that configures no logging (a user's script, the CLI), the warning is on stderr."""
    script = (f"import os, sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
              "from grpo_jax.rewards import scoring; from fault_rewards import hangs\n"
              "_, failed, metrics = scoring.score((hangs,), (1.0,), ['q'], [os.devnull], [{}], timeout_s=0.5, num_workers=1)\n"
              "assert failed.all() and metrics['reward/hangs/timeouts'] == 1, metrics\n")
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reward 'hangs': 1 of 1 call(s) failed (timeout), first: no answer within 0.5s" in proc.stderr


def test_a_starting_worker_survives_ctrl_c_to_the_process_group():
    """Ctrl-C reaches every process of the terminal's group; a worker still importing must ignore it
    (the trainer finishes its step and needs the worker to)."""
    pool = scoring._Pool(1)
    for s in (signal.SIGINT, signal.SIGTERM):
        os.kill(pool.workers[0].process.pid, s)
    try:
        assert pool.run([(odd_values, ("q", "ok", {}), {})], timeout_s=60) == [("ok", 1.0)]
    finally:
        pool.close()


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGTERM"])
def test_no_worker_outlives_a_killed_trainer(kill, tmp_path):
    """A worker stuck in a hung call when its parent is killed (no handler, no atexit runs) dies too."""
    marker = tmp_path / "worker_pid"
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
              "from grpo_jax.rewards import scoring; from fault_rewards import hangs\n"
              f"scoring.score((hangs,), (1.0,), ['q'], [{str(marker)!r}], [{{}}], timeout_s=600, num_workers=1)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline and parent.poll() is None, "the worker never started its call"
        time.sleep(0.05)
    worker = int(marker.read_text())
    parent.send_signal(getattr(signal, kill))
    parent.wait(30)
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail(f"the reward worker outlived its parent ({kill})")


def alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- the soak drill, briefly -----------------------------------------------------------------------------

def load_drill():
    spec = importlib.util.spec_from_file_location("soak_drill", ROOT / "scripts" / "soak_drill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resume_changes_allow_only_what_keeps_the_trajectory():
    """What a resume may change: layout, logging and, under a constant learning rate, the length."""
    quickstart = load_config(QUICKSTART)  # cosine schedule, 400 steps, seed 0
    saved = flatten(quickstart)
    changes = lambda *sets: resume_changes(saved, flatten(override(quickstart, list(sets))))  # noqa: E731
    assert changes("train.eval_every=7", "train.out_dir=elsewhere", "mesh.data=2", "reward.num_workers=0",
                   "sampling.decode_slots=4") == []
    assert changes("train.steps=500") == ["train.steps: 400 -> 500"]  # the cosine decays over train.steps
    constant = flatten(override(quickstart, ["optim.schedule=constant"]))
    assert resume_changes(constant, flatten(override(quickstart, ["optim.schedule=constant", "train.steps=500"]))) == []
    assert changes("train.seed=1", "optim.learning_rate=1e-3") == [
        "optim.learning_rate: 0.0008 -> 0.001", "train.seed: 0 -> 1"]
    older = {k: v for k, v in saved.items() if k != "train.max_skipped_steps"}  # a field added since it was saved
    assert resume_changes(older, saved) == []  # resumable fields may be absent
    renamed = {k.replace(".layer_loop", ".scan_layers"): True if k.endswith(".layer_loop") else v for k, v in saved.items()}
    assert sorted(set(renamed) - set(saved)) == ["model.scan_layers", "model_options.scan_layers"]
    assert resume_changes(renamed, saved) == []  # a checkpoint saved before layer_loop's rename resumes
    # A field that changes the run, added since: absent reads as its default (the run as it was saved).
    before = {k: v for k, v in saved.items() if k != "train.rollout_seed"}
    assert resume_changes(before, saved) == []
    assert resume_changes(before, flatten(override(quickstart, ["train.rollout_seed=5"]))) == [
        "train.rollout_seed: None -> 5"]
    del older["algorithm.loss"]
    assert resume_changes(older, saved) == [f"algorithm.loss: {AlgorithmConfig().loss.name!r} -> 'gspo'"]


@pytest.mark.slow
def test_soak_drill_stops_at_random_points_and_resumes_exactly(tmp_path, monkeypatch):
    """SIGKILL, SIGINT and SIGTERM, once and twice, each once, at random points of a tiny run (subprocesses
    on one CPU device); the drill itself checks exit codes, leftovers, the final state, logs, TensorBoard
    and a lost curves.png against an uninterrupted run. A failure prints the seed: `python
    scripts/soak_drill.py --kills 5 --seed N` replays its choices."""
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))
    summary_path = tmp_path / "summary.json"
    drill = load_drill()
    rc = drill.main(["--kills", str(len(drill.STOPS)), "--workdir", str(tmp_path), "--json", str(summary_path)])
    summary = json.loads(summary_path.read_text())
    assert rc == 0 and summary["exact"] and summary["kills"] == len(drill.STOPS), summary
    assert summary["runs_exact"] == summary["runs"] >= 1
