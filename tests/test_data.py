"""Tasks, loaders (jsonl, parquet, a TFDS build made here without TensorFlow), grain sharding and
resume, templates and the char tokenizer."""

import json
import pathlib
import sys

import pytest

from grpo_jax import data
from grpo_jax.rewards import functions

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
GSM8K_ANSWERS = ["15", "72", "210", "90", "20", "29", "15", "35", "270", "18",
                 "81", "6000", "1.5", "-7", "25", "15", "380", "23", "375", "4725"]  # fmt: skip


def _prompts(source):
    return [source[i]["prompt"] for i in range(len(source))]


def test_arithmetic_is_deterministic_and_correct():
    cfg = data.ArithmeticConfig(num_operands=3, min_value=-20, max_value=99, operators="+-*")
    a = data.Arithmetic(cfg, "train", 50, seed=3)
    assert [a[i] for i in range(50)] == [data.Arithmetic(cfg, "train", 50, seed=3)[i] for i in range(50)]
    assert _prompts(a) != _prompts(data.Arithmetic(cfg, "train", 50, seed=4))
    for i in range(50):  # Python's own evaluation of the prompt as an independent reference
        assert int(a[i]["answer"]) == eval(a[i]["prompt"].rstrip("="))  # noqa: S307 (our own digits and ops)
    with pytest.raises(IndexError):
        a[50]


def test_arithmetic_quickstart_default_fits_the_char_tokenizer():
    tok = data.CharTokenizer()
    a = data.Arithmetic(data.ArithmeticConfig(), "train", 20)
    for i in range(20):
        e = a[i]
        assert len(e["prompt"]) <= 4 and tok.decode(tok.encode(e["prompt"] + e["answer"])) == e["prompt"] + e["answer"]


@pytest.mark.parametrize("task, cfg", [(data.Arithmetic, data.ArithmeticConfig()),
                                       (data.Countdown, data.CountdownConfig(max_number=5, held_out_fraction=0.3))])  # fmt: skip
def test_train_and_held_out_never_overlap(task, cfg):
    """Small problem spaces (200 arithmetic problems), so random splits would collide many times."""
    train = set(_prompts(task(cfg, "train", 1500, seed=0))) | set(_prompts(task(cfg, "train", 500, seed=1)))
    held_out = set(_prompts(task(cfg, "held_out", 200, seed=0)))
    assert train and held_out and not train & held_out
    if task is data.Arithmetic:  # together they cover every problem a+b and a-b with digits a, b
        assert train | held_out == {f"{a}{op}{b}=" for a in range(10) for b in range(10) for op in "+-"}


def test_countdown_problems_are_solvable():
    cd = data.Countdown(data.CountdownConfig(num_numbers=4, max_number=50), "train", 30, seed=7)
    for i in range(30):
        e = cd[i]
        assert e["answer"] == str(e["target"]) and 1 <= e["target"] <= 100 and str(e["numbers"]) in e["prompt"]
        assert functions.countdown(e["prompt"], f"<answer>{e['solution']}</answer>", e) == 1.0
    assert cd[3] == data.Countdown(data.CountdownConfig(num_numbers=4, max_number=50), "train", 30, seed=7)[3]


def test_task_config_errors():
    with pytest.raises(ValueError, match="operators"):
        data.ArithmeticConfig(operators="+/")
    with pytest.raises(ValueError, match="held_out_fraction"):
        data.Arithmetic(data.ArithmeticConfig(held_out_fraction=0.0), "train", 4)
    with pytest.raises(ValueError, match="split"):
        data.Countdown(data.CountdownConfig(), "test", 4)


def test_load_jsonl_fixtures():
    gsm = data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")
    assert [e["answer"] for e in gsm] == GSM8K_ANSWERS
    assert gsm[0]["prompt"].startswith("Mia has 12 apples") and gsm[0]["solution"].endswith("#### 15")
    math = data.load_examples(FIXTURES / "math_tiny.jsonl", "math")
    assert len(math) == 10 and math[0]["answer"] == "\\frac{5}{6}" and math[2]["answer"] == "5\\sqrt{2}"
    # Each reference solution earns the full math reward against its own answer.
    for e in gsm + math:
        assert functions.math_equal(e["prompt"], e["solution"], e) == 1.0


def test_load_parquet_matches_jsonl(tmp_path):
    import pyarrow
    import pyarrow.parquet

    records = [json.loads(line) for line in (FIXTURES / "gsm8k_tiny.jsonl").read_text().splitlines()]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), tmp_path / "gsm.parquet")
    assert data.load_examples(tmp_path / "gsm.parquet", "gsm8k") == data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        data.load_examples(tmp_path / "missing.jsonl", "gsm8k")
    with pytest.raises(ValueError, match="choose from"):
        data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm9k")
    with pytest.raises(ValueError, match="record 1 is not math format"):
        data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "math")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a\\n#### 1"}\n{"question": "q", "answer": "no final line"}\n')
    with pytest.raises(ValueError, match="bad.jsonl record 2"):
        data.load_examples(bad, "gsm8k")


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory):
    """A real TFDS dataset (array_record files + dataset_info) of the GSM8K fixture, built with the TFDS
    builder API, which needs no TensorFlow; returns its data_dir."""
    import tensorflow_datasets as tfds

    records = [json.loads(line) for line in (FIXTURES / "gsm8k_tiny.jsonl").read_text().splitlines()]

    class GrpoJaxGsm8kTiny(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            text = tfds.features.Text()
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"question": text, "answer": text}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(records[:16]), "test": self._generate_examples(records[16:])}

        def _generate_examples(self, rows):
            yield from enumerate(rows)

    data_dir = tmp_path_factory.mktemp("tfds")
    GrpoJaxGsm8kTiny(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


def _pairs(source):
    """(prompt, answer) of every example, sorted: TFDS stores examples in its own (hashed) order."""
    return sorted((source[i]["prompt"], source[i]["answer"]) for i in range(len(source)))


def test_load_tfds_built_without_tensorflow(tiny_tfds):
    """Read back through tfds.data_source: random access, no TensorFlow."""
    source = data.load_tfds("grpo_jax_gsm8k_tiny", split="train", data_dir=tiny_tfds, format="gsm8k")
    assert len(source) == 16
    assert _pairs(source) == _pairs(data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")[:16])
    batch = data.batches(source, batch_size=4, seed=0)[0]
    assert len(batch) == 4 and all(isinstance(e["prompt"], str) for e in batch)
    assert "tensorflow" not in sys.modules
    with pytest.raises(FileNotFoundError, match="no TFDS dataset"):
        data.load_tfds("nope", split="train", data_dir=tiny_tfds, format="gsm8k")


def test_a_tfds_task_from_the_command_line_reaches_the_trainer(tiny_tfds):
    from grpo_jax import trainer
    from grpo_jax.config import override
    from grpo_jax.train import load_config

    quickstart = load_config(pathlib.Path(__file__).parents[1] / "experiments" / "configs" / "quickstart.py")
    sets = ["task=tfds", "task.builder=grpo_jax_gsm8k_tiny", f"task.data_dir={tiny_tfds}", "reward.names=math",
            "train.prompts_per_step=8", "train.minibatches=1", "train.eval_prompts=4"]  # 16 and 4 examples
    cfg = override(quickstart, sets)
    task = trainer.build_task(cfg)
    records = data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")
    assert task.held_out is None and _pairs(task.train) == _pairs(records[:16])  # no eval_split: no evaluation
    task = trainer.build_task(override(cfg, ["task.eval_split=test"]))
    assert _pairs(task.held_out) == _pairs(records[16:])
    with pytest.raises(ValueError, match="the tfds task needs task.builder"):
        trainer.build_task(override(quickstart, ["task=tfds"]))


def test_tasks_are_registered_by_name():
    assert {"arithmetic", "countdown", "file", "tfds", "examples"} <= set(data.TASKS)
    assert data.TaskConfig.from_name("countdown") == data.CountdownConfig()
    assert data.task_name(data.CountdownConfig(max_number=5)) == "countdown"
    with pytest.raises(ValueError, match="task 'countdown' is already registered"):
        data.register("countdown")(data.CountdownConfig)
    with pytest.raises(TypeError, match="must be a frozen dataclass subclassing data.TaskConfig"):
        data.register("not_a_task")(dict)


def test_a_file_task_without_eval_path_has_no_held_out_set():
    train, held_out = data.FileTaskConfig(path=str(FIXTURES / "gsm8k_tiny.jsonl")).sources(seed=0)
    assert len(train) == 20 and held_out is None
    with pytest.raises(ValueError, match="the file task needs task.path"):
        data.FileTaskConfig().sources(seed=0)


def test_a_task_registered_by_a_fork(monkeypatch):
    import dataclasses

    monkeypatch.setattr(data.tasks, "TASKS", type(data.TASKS)("task"))  # a fresh registry, left as it was after

    @data.register("echo")
    @dataclasses.dataclass(frozen=True)
    class Echo(data.TaskConfig):
        words: tuple[str, ...] = ("a", "b")

        def sources(self, seed):
            return [{"prompt": w, "answer": w} for w in self.words], None

    from grpo_jax.config import Config, flatten, override

    cfg = override(Config(model_path="m"), ["task=echo", "task.words=x,y,z"])
    assert cfg.task == Echo(("x", "y", "z")) and flatten(cfg)["task"] == "echo"
    assert cfg.task.sources(0)[0][2] == {"prompt": "z", "answer": "z"}


def _ids(batch):
    return [e["prompt"] for e in batch]


class Counted(list):
    """A list that counts the examples read from it."""

    reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


def test_batches_cut_each_epoch_in_order_and_read_only_what_is_indexed():
    source = Counted(data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")[:10])
    batches = data.batches(source, batch_size=5, seed=1)
    epoch = [q for step in range(2) for q in _ids(batches[step])]
    assert sorted(epoch) == sorted(e["prompt"] for e in source)  # every example once per epoch...
    second = [q for step in range(2, 4) for q in _ids(batches[step])]
    assert sorted(second) == sorted(epoch) and second != epoch  # ...in a new order each epoch
    # A process reads only the examples of its rows: indexing one position of a batch reads one example.
    source.reads = 0
    assert batches[3][4]["prompt"] == second[-1] and source.reads == 1


def test_batches_resume_the_same_order():
    source = data.Arithmetic(data.ArithmeticConfig(), "train", 64, seed=0)
    first = data.batches(source, batch_size=8, seed=5)
    order = [_ids(b) for b, _ in zip(first, range(12))]  # plain iteration, 1.5 epochs
    resumed = data.batches(source, batch_size=8, seed=5)  # a fresh pipeline after a restart at step 7
    assert [_ids(resumed[step]) for step in range(7, 12)] == order[7:]
    assert _ids(data.batches(source, batch_size=8, seed=6)[0]) != order[0]
    with pytest.raises(ValueError, match="fewer than one batch of 80"):
        data.batches(source, batch_size=80, seed=0)


def test_templates():
    example = {"prompt": "2+3=", "answer": "5"}
    assert data.render(data.PLAIN, example) == "2+3="
    assert data.render(data.PromptTemplate("Q: {question}\nA:"), example) == "Q: 2+3=\nA:"

    def chat(messages):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

    template = data.PromptTemplate("{question} Answer in \\boxed{{}}.", chat=True, system="Be brief.")
    assert data.render(template, example, chat) == "<system>Be brief.</system><user>2+3= Answer in \\boxed{}.</user><assistant>"
    assert data.render(data.MATH_COT, example, chat).startswith("<user>2+3=\nThink step by step")
    with pytest.raises(ValueError, match="apply_chat_template"):
        data.render(data.MATH_COT, example)
    with pytest.raises(ValueError, match="lacks"):
        data.render(data.PromptTemplate("{solution}"), example)


def test_char_tokenizer():
    tok = data.CharTokenizer()
    text = "Using the numbers [3, 5], reach 8.\n<answer>(3+5)*1/1</answer> #### -8 \\boxed{x^2}"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and tok.encode(text, continuation=True) == ids[1:]
    assert all(0 <= i < tok.vocab_size for i in ids) and len(set(ids)) > 20
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    with pytest.raises(ValueError, match="cannot encode"):
        tok.encode("café")
