"""experiments/configs/qwen3_math.py on CPU: the same recipe (GSPO on the DAPO-Math/DeepScaleR mixture,
then MATH500, AIME 2024 and GSM8K) with a tiny random Qwen3 saved as safetensors by transformers and the
fixtures in place of the hub datasets; only sizes are shrunk."""

import dataclasses
import importlib.util
import json
import pathlib

import pytest

from grpo_jax import evaluate as ev
from grpo_jax import run
from grpo_jax.config import override
from grpo_jax.train import load_config

ROOT = pathlib.Path(__file__).parents[1]
CONFIGS, FIXTURES = ROOT / "experiments" / "configs", ROOT / "tests" / "fixtures"
DATA = {name: str(FIXTURES / f"{name}_tiny.jsonl") for name in ("dapo_math", "deepscaler", "math500", "aime2024", "gsm8k")}

_spec = importlib.util.spec_from_file_location("qwen3_math", CONFIGS / "qwen3_math.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def tiny_qwen3(path: pathlib.Path) -> None:
    """A random 2-layer Qwen3 (transformers' own class and safetensors writer) with a byte-level BPE
    trained on the fixtures and a chat template with system turns."""
    import tokenizers
    import torch
    import transformers

    texts = [line for f in DATA.values() for line in pathlib.Path(f).read_text().splitlines()]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=512, special_tokens=["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>", pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)


def test_the_benchmarks_file_is_the_recipes():
    cfg = load_config(CONFIGS / "qwen3_math_benchmarks.py", ev.EvalConfig)
    assert [b.name for b in cfg.benchmarks] == ["math500", "aime2024", "gsm8k"] and cfg == recipe.benchmarks()
    assert load_config(CONFIGS / "qwen3_math.py") == recipe.get_config()


def test_the_recipe_trains_and_evaluates_a_tiny_qwen3_on_the_fixtures(tmp_path):
    tiny_qwen3(tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").is_file()
    out = tmp_path / "run"
    cfg = override(recipe.get_config(DATA), [
        f"model_path={tmp_path / 'model'}", f"train.out_dir={out}", "task.size=16", "train.steps=1",
        "train.prompts_per_step=4", "sampling.group_size=2", "sampling.max_new_tokens=8", "train.minibatches=1",
        "train.micro_batches=1", "reward.num_workers=0", "optim.warmup_steps=0", "mesh.max_replicated_fraction=1",
    ])
    run.train(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    parts = {k for r in rows for k in r if k.startswith("accuracy@")}
    assert parts and parts <= {"accuracy@dapo_math", "accuracy@deepscaler"}
    bench = recipe.benchmarks(DATA)
    small = dataclasses.replace(bench, reward_workers=0, benchmarks=tuple(
        dataclasses.replace(b, ks=(), sampling=dataclasses.replace(b.sampling, max_new_tokens=8,
                                                                   group_size=min(2, b.sampling.group_size)))
        for b in bench.benchmarks))
    result = ev.evaluate(small, hf=str(out / "hf"), out=tmp_path / "eval")
    sizes = {name: len(pathlib.Path(DATA[name]).read_text().splitlines()) for name in ("math500", "aime2024", "gsm8k")}
    assert {n: b["metrics"]["problems"] for n, b in result["benchmarks"].items()} == sizes
    for b in result["benchmarks"].values():
        assert b["metrics"] == ev.metrics(b["records"], b["config"]["n"], b["config"]["ks"])
    assert (tmp_path / "eval" / "results.md").read_text().count("|") > 0


@pytest.mark.parametrize("name", ["dapo_math", "deepscaler"])
def test_each_training_part_maps_its_fixture(name):
    part = next(p for p in recipe.mixture(DATA).parts if p.name == name)
    train, held_out = part.task.sources(0)
    assert held_out is None and all(train[i]["answer"] for i in range(len(train)))


def test_the_docstrings_step_times_are_the_scale_plans_time_model():
    """The recipe keeps the shapes the plan models (the gsm8k config's), and its docstring quotes the plan's
    modelled step (bench.scale_plan.step_seconds) of Qwen3-1.7B on 8 and 64 chips."""
    from bench import scale_plan

    cfg, planned = recipe.get_config(), load_config(CONFIGS / "gsm8k.py")
    assert (cfg.sampling, cfg.model_options, cfg.train.prompts_per_step, cfg.train.minibatches, cfg.train.steps) == (
        planned.sampling, planned.model_options, planned.train.prompts_per_step, planned.train.minibatches, planned.train.steps)
    for devices in (8, 64):
        times = {chip: scale_plan.step_seconds("Qwen3-1.7B", devices, chip) for chip in ("v5e", "v5p", "H100")}
        line = f"{devices} chips: " + "; ".join(
            f"{chip} {t['step_s']:.1f} s ({t['gen_s']:.1f} + {t['train_s']:.1f}), {cfg.train.steps * t['step_s'] / 3600:.2f} h"
            for chip, t in times.items())
        assert line in recipe.__doc__
