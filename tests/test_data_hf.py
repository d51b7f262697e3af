"""Datasets through Hugging Face `datasets`: a fixture in each public format (GSM8K, MATH500, AIME 2024,
DAPO-Math-17k, DeepScaleR) through its column mapping, the file kinds, chat columns, bad input, and
weighted mixtures with each part's metrics in a trainer run."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from grpo_jax import data, trainer
from grpo_jax.config import HFTaskConfig, MixtureTaskConfig, Part
from grpo_jax.rewards import functions

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# Each public dataset's column layout (as published on the hub), its fixture, and the fixture's answers.
FORMATS = {
    "gsm8k": (HFTaskConfig(path=str(FIXTURES / "gsm8k_tiny.jsonl"), prompt="question", answer_format="gsm8k",
                           solution="answer"), ["15", "72", "210"]),
    "math500": (HFTaskConfig(path=str(FIXTURES / "math500_tiny.jsonl"), solution="solution"),
                ["2", "6\\sqrt{2}", "7", "\\frac{7}{12}", "9", "13", "6"]),
    "aime2024": (HFTaskConfig(path=str(FIXTURES / "aime2024_tiny.jsonl"), solution="solution"),
                 ["14", "61", "87", "50", "136"]),
    "dapo_math": (HFTaskConfig(path=str(FIXTURES / "dapo_math_tiny.jsonl"), prompt="prompt",
                               answer="reward_model.ground_truth"), ["42", "23", "49", "25", "720", "120"]),
    "deepscaler": (HFTaskConfig(path=str(FIXTURES / "deepscaler_tiny.jsonl"), solution="solution"),
                   ["13", "97", "15", "24", "9", "\\frac{1}{4}"]),
}


def _all(source):
    return [source[i] for i in range(len(source))]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_public_format_loads_through_its_column_mapping(name):
    task, answers = FORMATS[name]
    train, held_out = task.sources(seed=0)
    examples = _all(train)
    assert held_out is None and [e["answer"] for e in examples][:len(answers)] == answers
    for e in examples:
        assert isinstance(e["prompt"], str) and e["prompt"].strip() and "messages" not in e
        # the reference earns the math reward: a worked solution where the format has one, else "Answer: N"
        reference = e.get("solution", f"...\nAnswer: {e['answer']}")
        assert functions.math_equal(e["prompt"], reference, e) == 1.0
    if name == "dapo_math":  # the chat column's user turn is the question; scalar columns ride along
        assert examples[0]["prompt"].count("greatest common divisor") == 1 and examples[0]["data_source"] == "math_dapo"
    if name == "gsm8k":  # the same examples as the GSM8K-format file loader's
        assert examples == [{**e, "question": e["prompt"]} for e in data.load_examples(task.path, "gsm8k")]


def test_parquet_arrow_and_a_saved_dataset_read_alike(tmp_path):
    import datasets

    task = FORMATS["dapo_math"][0]
    want = _all(task.sources(0)[0])
    table = datasets.load_dataset("json", data_files=task.path, split="train")
    table.to_parquet(str(tmp_path / "dapo.parquet"))  # nested struct and chat columns in parquet
    datasets.DatasetDict({"train": table, "test": table.select(range(2))}).save_to_disk(str(tmp_path / "saved"))
    parquet = dataclasses.replace(task, path=str(tmp_path / "dapo.parquet"))
    assert _all(parquet.sources(0)[0]) == want
    saved = dataclasses.replace(task, path=str(tmp_path / "saved"), eval_split="test")
    train, held_out = saved.sources(0)
    assert _all(train) == want and _all(held_out) == want[:2] and saved.describe("held_out").endswith("[test]")
    arrow = next((tmp_path / "saved" / "train").glob("*.arrow"))
    assert _all(dataclasses.replace(task, path=str(arrow)).sources(0)[0]) == want
    # a held-out set from another file
    math = dataclasses.replace(FORMATS["deepscaler"][0], eval_path=FORMATS["math500"][0].path)
    assert [e["answer"] for e in _all(math.sources(0)[1])] == FORMATS["math500"][1]


def test_a_chat_column_with_earlier_turns_goes_through_the_chat_template_and_system_prompt(tmp_path):
    path = tmp_path / "chat.jsonl"
    turns = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+3=?"}]
    path.write_text(json.dumps({"messages": turns, "answer": 5}) + "\n")
    example = HFTaskConfig(path=str(path), prompt="messages").sources(0)[0][0]
    assert example["prompt"] == "2+3=?" and example["answer"] == "5" and example["messages"] == turns[:1]

    def chat(messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    template = data.PromptTemplate("{question} Box it.", chat=True, system="Think first.")
    assert data.render(template, example, chat) == "<system>Think first.<system>Be terse.<user>2+3=? Box it.<assistant>"
    with pytest.raises(ValueError, match="set PromptTemplate.chat=True"):
        data.render(data.PLAIN, example)


def test_a_hub_name_is_loaded_by_datasets_with_its_config_and_split(monkeypatch):
    """A path that is no local file or directory goes to the hub as (name, config, split); offline, the
    error names task.path and the fix. `datasets.load_dataset` is replaced: this machine has no hub."""
    import datasets

    rows, calls = datasets.Dataset.from_list([{"question": "1 + 1?", "answer": "#### 2"}]), []

    def hub(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", hub)
    task = HFTaskConfig(path="openai/gsm8k", name="main", split="train", eval_split="test", prompt="question",
                        answer_format="gsm8k")
    train, held_out = task.sources(seed=0)
    assert sorted(calls) == [("openai/gsm8k", "main", split, {}) for split in ("test", "train")]
    assert train[0]["answer"] == held_out[0]["answer"] == "2"

    def offline(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match=r"task.path='openai/gsm8k' \(split '(train|test)'\).*ConnectionError.*point "
                                                r"task.path at its files"):
        task.sources(seed=0)


def test_bad_datasets_are_refused_naming_the_field_and_the_fix(tmp_path):
    gsm8k = FORMATS["gsm8k"][0]
    with pytest.raises(ValueError, match=r"task.prompt='problem'.*no column 'problem'; its columns: question, answer"):
        dataclasses.replace(gsm8k, prompt="problem").sources(0)
    with pytest.raises(ValueError, match="task.solution='worked'.*set task.solution"):
        dataclasses.replace(gsm8k, solution="worked").sources(0)
    with pytest.raises(ValueError, match=r"row 0: column 'answer' holds no plain answer|no boxed answer"):
        dataclasses.replace(gsm8k, answer_format="boxed").sources(0)
    with pytest.raises(ValueError, match="finds no field 'truth'"):
        dataclasses.replace(FORMATS["dapo_math"][0], answer="reward_model.truth").sources(0)
    empty = tmp_path / "empty.parquet"
    import datasets

    datasets.Dataset.from_dict({"problem": [], "answer": []}).to_parquet(str(empty))
    with pytest.raises(ValueError, match="empty.parquet yields no dataset"):
        HFTaskConfig(path=str(empty)).sources(0)
    (tmp_path / "notes.txt").write_text("a")
    with pytest.raises(ValueError, match="notes.txt: expected a .parquet"):
        HFTaskConfig(path=str(tmp_path / "notes.txt")).sources(0)
    with pytest.raises(ValueError, match="answer_format='latex': choose from"):
        HFTaskConfig(answer_format="latex")
    with pytest.raises(ValueError, match="the hf task needs task.path"):
        HFTaskConfig().sources(0)
    with pytest.raises(ValueError, match="distinct"):
        MixtureTaskConfig(parts=(Part("a", gsm8k), Part("a", gsm8k)))
    with pytest.raises(ValueError, match="part 'small' gets 0 of the epoch's 40 examples"):
        MixtureTaskConfig(parts=(Part("big", gsm8k, 100.0), Part("small", gsm8k, 0.1))).sources(0)


def test_a_mixture_draws_its_parts_by_weight_and_labels_them():
    gsm8k, math500 = FORMATS["gsm8k"][0], FORMATS["math500"][0]
    mix = MixtureTaskConfig(parts=(Part("gsm8k", gsm8k, 1.0), Part("math500", math500, 3.0)), size=40)
    train, held_out = mix.sources(seed=1)
    labels = [train[i]["bucket"] for i in range(len(train))]
    assert len(train) == 40 and labels.count("gsm8k") == 10 and labels.count("math500") == 30
    # math500's 7 problems repeat (4 full passes, then 2 more); gsm8k gives 10 of its 20, none twice
    counts = {}
    for i in range(40):
        counts[train[i]["prompt"]] = counts.get(train[i]["prompt"], 0) + 1
    assert sorted(counts[e["prompt"]] for e in _all(math500.sources(0)[0])) == [4, 4, 4, 4, 4, 5, 5]
    assert all(counts[train[i]["prompt"]] == 1 for i in range(40) if labels[i] == "gsm8k")
    assert [train[i] for i in range(40)] == _all(mix.sources(seed=1)[0])  # a function of the seed
    assert [train[i]["prompt"] for i in range(40)] != [e["prompt"] for e in _all(mix.sources(seed=2)[0])]
    names = data.source_names(data.samplers.Picked(train, np.array([39, 0])))
    assert list(names) == [labels[39], labels[0]]
    assert held_out is None
    with_eval = MixtureTaskConfig(parts=(Part("a", dataclasses.replace(gsm8k, eval_path=gsm8k.path)),
                                         Part("b", dataclasses.replace(math500, eval_path=math500.path))))
    held = _all(with_eval.sources(0)[1])
    # every held-out example once, interleaved so that any first k cover both parts by their sizes
    assert len(held) == 27 and [e["bucket"] for e in held[:4]] == ["a", "b", "a", "a"]
    assert sorted(e["prompt"] for e in held) == sorted(e["prompt"] for e in _all(gsm8k.sources(0)[0]) + _all(math500.sources(0)[0]))


def test_a_mixture_trains_with_each_parts_metrics(tmp_path):
    """The char-level model of tests/test_trainer.py on GSM8K and DeepScaleR fixtures mixed 1:1."""
    from test_trainer import config

    gsm8k, deepscaler = FORMATS["gsm8k"][0], FORMATS["deepscaler"][0]
    mix = MixtureTaskConfig(parts=(Part("gsm8k", dataclasses.replace(gsm8k, eval_path=gsm8k.path)),
                                   Part("deepscaler", dataclasses.replace(deepscaler, eval_path=deepscaler.path))))
    cfg = config(tmp_path, prompts_per_step=8, minibatches=1, eval_prompts=6)
    cfg = dataclasses.replace(cfg, task=mix, reward=dataclasses.replace(cfg.reward, names=("math", "length")),
                              sampling=dataclasses.replace(cfg.sampling, max_prompt_len=256, group_size=2))
    t = trainer.Trainer(cfg)
    metrics, _ = t.train_step()
    drawn = np.concatenate([s["sources"] for s in t.last_rollout["drawn"]])
    assert set(drawn) == {"gsm8k", "deepscaler"}
    total = np.concatenate([s["rewards"] for s in t.last_rollout["drawn"]]) @ np.asarray(cfg.reward.weights)
    for name in ("gsm8k", "deepscaler"):
        assert {f"accuracy@{name}", f"completion/length_mean@{name}"} <= set(metrics)
        assert metrics[f"reward/mean@{name}"] == pytest.approx(float(total[drawn == name].mean()))
    evaluated = t.evaluate()  # the first 6 held-out examples: the parts' 20 and 6 interleaved by rank
    assert [e["bucket"] for e in t.task.held_out] == ["gsm8k", "gsm8k", "deepscaler", "gsm8k", "gsm8k", "gsm8k"]
    assert {"eval/accuracy_greedy@gsm8k", "eval/accuracy_greedy@deepscaler"} <= set(evaluated)
