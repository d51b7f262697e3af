"""The command line: config files, --set parsing by field type, presets, typo suggestions."""

import json
import pathlib
import sys

import pytest

from grpo_jax.algorithms import losses
from grpo_jax.config import Config, CountdownConfig, FileTaskConfig, flatten, override
from grpo_jax.rewards import REWARDS
from grpo_jax.train import load_config, parse_args

ROOT = pathlib.Path(__file__).parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"


def test_values_parse_by_field_type():
    cfg = parse_args([
        "--config", str(QUICKSTART),
        "--set", "train.steps=7", "--set", "optim.learning_rate=2.5e-4", "--set", "train.export_hf=true",
        "--set", "sampling.stop_tokens=5,6", "--set", "algorithm.loss.delta=none", "--set", "reward.names=exact",
        "--set", "task.max_value=99",
    ])
    assert cfg.train.steps == 7 and cfg.optim.learning_rate == 2.5e-4 and cfg.train.export_hf is True
    assert cfg.sampling.stop_tokens == (5, 6) and cfg.algorithm.loss.delta is None
    assert cfg.reward.names == ("exact",) and cfg.task.max_value == 99


def test_preset_applies_first_and_explicit_fields_win():
    cfg = override(load_config(QUICKSTART), ["algorithm.loss.eps_low=0.3", "algorithm.preset=dapo"])
    assert cfg.algorithm.loss.name == "ppo_clip" and cfg.algorithm.dynamic_sampling
    assert (cfg.algorithm.loss.eps_low, cfg.algorithm.loss.eps_high) == (0.3, 0.28)  # the preset's eps_high kept
    cfg = override(load_config(QUICKSTART), ["algorithm.loss.eps_high=4e-3", "algorithm.loss=gspo_token",
                                             "algorithm.aggregation=token_mean"])
    assert cfg.algorithm.loss == losses.GspoToken(eps_high=4e-3) and cfg.algorithm.aggregation.name == "token_mean"


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("train.stpes=3", "did you mean 'steps'"),
        ("optim.learning_rat=1", "did you mean 'learning_rate'"),
        ("trian.steps=3", "did you mean 'train'"),
        ("train.steps=three", "expected a value of type int"),
        ("train.export_hf=maybe", "expected true or false"),
        ("train.steps", "expected key=value"),
        ("algorithm.preset=gspp", "known: "),
        ("algorithm.loss=nope", "AlgorithmConfig.loss: unknown loss 'nope'"),
        ("algorithm.loss.eps_hihg=0.3", "did you mean 'eps_high'"),
        ("algorithm.eps_high=0.3", r"--set algorithm.loss.eps_high= \(eps_high is a parameter of algorithm.loss\)"),
        ("model_options.remat=dots", "for a model from scratch set dtype, compute_dtype, remat"),
    ],
)
def test_user_errors_name_the_field(assignment, message):
    with pytest.raises(ValueError, match=message):
        override(load_config(QUICKSTART), [assignment])


def test_the_command_line_ends_a_config_error_in_its_message(capsys):
    from grpo_jax.train import main

    for argv, message in (
        (["--config", str(QUICKSTART), "--set", "train.minibatches=0"], "TrainConfig.minibatches=0 must be >= 1"),
        (["--config", str(QUICKSTART), "--set", "train.minibatches=3"], "does not split into train.minibatches=3"),
        (["--config", "nowhere.py"], "no such file"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert str(stop.value.code).startswith("python -m grpo_jax.train: error: ") and message in str(stop.value.code)


def test_model_options_for_a_checkpoint():
    gsm8k = ROOT / "experiments" / "configs" / "gsm8k.py"
    cfg = override(load_config(gsm8k), ["model_options.moe_impl=ragged", "model_options.remat=full",
                                        "model_options.layer_loop=unrolled"])
    assert (cfg.model_options.moe_impl, cfg.model_options.remat, cfg.model_options.layer_loop) == ("ragged", "full", "unrolled")
    with pytest.raises(ValueError, match="Config.model_options.compute_dtype='fp16' is not understood"):
        override(cfg, ["model_options.compute_dtype=fp16"])


def test_a_task_is_named_on_the_command_line_then_its_fields_set():
    for order in (["task=countdown", "task.max_number=50"], ["task.max_number=50", "task=countdown"]):
        cfg = override(load_config(QUICKSTART), order)
        assert cfg.task == CountdownConfig(max_number=50)
    cfg = override(load_config(QUICKSTART), ["task=file", "task.path=train.jsonl"])
    assert cfg.task == FileTaskConfig(path="train.jsonl") and flatten(cfg)["task"] == "file"
    # the nearest name first; others follow, as the tasks registered in this process (a study's own) allow
    with pytest.raises(ValueError, match="--set task=countdwn: unknown task 'countdwn'; did you mean 'countdown'( or '\\w+')*\\? known: "):
        override(load_config(QUICKSTART), ["task=countdwn"])
    with pytest.raises(ValueError, match="CountdownConfig has no field 'max_value'"):  # arithmetic's field, not countdown's
        override(load_config(QUICKSTART), ["task=countdown", "task.max_value=9"])


def test_a_union_field_parses_as_its_first_fitting_member():
    cfg = load_config(QUICKSTART)
    assert override(cfg, ["model.eos_token_id=5"]).model.eos_token_id == 5
    assert override(cfg, ["model.eos_token_id=5,6"]).model.eos_token_id == (5, 6)
    assert override(cfg, ["model.eos_token_id=none"]).model.eos_token_id is None
    with pytest.raises(ValueError, match="--set model.eos_token_id=x: expected a value of type int"):
        override(cfg, ["model.eos_token_id=x"])


def test_a_config_builds_on_another_by_a_relative_import(tmp_path):
    """No sys.path edits: the folder of a config file is a package for its relative imports. A file runs
    once per content, so what it registers (a reward here) is registered once however often it loads."""
    (tmp_path / "base.py").write_text(
        "from grpo_jax import rewards\n"
        "from grpo_jax.train import load_config\n"
        f"BASE = {str(QUICKSTART)!r}\n"
        "@rewards.register('test_cli_shout')\n"
        "def shout(prompt, completion, example, **_):\n"
        "    return float(completion.isupper())\n"
        "def get_config():\n"
        "    return load_config(BASE)\n"
    )
    (tmp_path / "child.py").write_text(
        "import dataclasses\n"
        "from .base import get_config as base\n"
        "def get_config():\n"
        "    cfg = base()\n"
        "    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=7))\n"
    )
    path_before = list(sys.path)
    cfg = load_config(tmp_path / "child.py")
    assert cfg.train.steps == 7 and cfg.task == load_config(QUICKSTART).task and sys.path == path_before
    assert load_config(tmp_path / "base.py").train.steps == load_config(QUICKSTART).train.steps  # loaded once
    assert load_config(tmp_path / "child.py") == cfg
    assert REWARDS["test_cli_shout"].fn("q", "HI", {}) == 1.0


def test_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_config(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="define get_config"):
        load_config(bad)


def test_every_experiment_config_builds_and_checkpoints_before_its_end():
    paths = sorted(p for p in (ROOT / "experiments" / "configs").rglob("*.py") if not p.name.startswith("_"))
    assert len(paths) >= 5, paths
    for path in paths:
        if path.stem.endswith("_benchmarks"):  # a recipe's benchmarks file, for python -m grpo_jax.evaluate
            from grpo_jax.evaluate import EvalConfig

            assert load_config(path, EvalConfig).benchmarks, path
            continue
        cfg = load_config(path)
        assert isinstance(cfg, Config), path
        assert cfg.train.checkpoint_every < cfg.train.steps, path  # a killed run resumes from before its end


def tiny_hf_checkpoint(path: pathlib.Path) -> None:
    """A random Qwen2-style checkpoint (models.init + save_hf) with a byte-level BPE trained on the fixture."""
    import jax
    import tokenizers
    import transformers

    from grpo_jax import models

    texts = (ROOT / "tests" / "fixtures" / "gsm8k_tiny.jsonl").read_text().splitlines()
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=320, special_tokens=["<pad>", "<eos>", "<|user|>", "<|assistant|>"])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>", pad_token="<pad>")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok.save_pretrained(path)
    cfg = models.ModelConfig(
        model_type="qwen2", vocab_size=len(tok) + 15,  # padded, as real checkpoints are
        hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
    )
    models.save_hf(cfg, models.init(cfg, jax.random.key(0)), path)


def test_gsm8k_config_trains_a_tiny_hf_checkpoint(tmp_path):
    from grpo_jax.train import main

    tiny_hf_checkpoint(tmp_path / "ckpt")
    fixture = ROOT / "tests" / "fixtures" / "gsm8k_tiny.jsonl"
    out = tmp_path / "run"
    main([
        "--config", str(ROOT / "experiments" / "configs" / "gsm8k.py"),
        "--set", f"model_path={tmp_path / 'ckpt'}", "--set", f"task.path={fixture}",
        "--set", f"task.eval_path={fixture}", "--set", f"train.out_dir={out}",
        "--set", "mesh.data=2", "--set", "mesh.tensor=4", "--set", "sampling.max_new_tokens=6",
        "--set", "sampling.group_size=2", "--set", "train.prompts_per_step=4", "--set", "train.steps=2",
        "--set", "train.minibatches=2", "--set", "train.micro_batches=2", "--set", "train.eval_prompts=2",
        "--set", "reward.num_workers=1", "--set", "optim.warmup_steps=0",
        "--set", "mesh.max_replicated_fraction=1",  # a tiny model: its 335-row vocabulary and 2 heads stay whole
    ])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    from grpo_jax import models

    exported_cfg, _ = models.load_hf(out / "hf")  # the exported policy loads back, tokenizer beside it
    assert exported_cfg.model_type == "qwen2" and (out / "hf" / "tokenizer.json").is_file()
    assert (out / "curves.png").is_file()
