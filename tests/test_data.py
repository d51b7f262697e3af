"""Tasks, loaders (jsonl, parquet, a TFDS build made here without TensorFlow), grain sharding and
resume, templates and the char tokenizer."""

import json
import pathlib

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


def test_load_tfds_built_without_tensorflow(tmp_path):
    """Builds a real TFDS dataset (array_record files + dataset_info) with the TFDS builder API, which
    needs no TensorFlow, then reads it back through tfds.data_source."""
    import tensorflow_datasets as tfds

    records = [json.loads(line) for line in (FIXTURES / "gsm8k_tiny.jsonl").read_text().splitlines()]

    class GrpoJaxGsm8kTiny(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            text = tfds.features.Text()
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"question": text, "answer": text}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(records)}

        def _generate_examples(self, rows):
            yield from enumerate(rows)

    GrpoJaxGsm8kTiny(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    source = data.load_tfds("grpo_jax_gsm8k_tiny", split="train", data_dir=tmp_path, format="gsm8k")
    assert len(source) == 20
    # TFDS stores examples in its own (hashed) order: compare as sets.
    got = sorted((source[i]["prompt"], source[i]["answer"]) for i in range(20))
    want = sorted((e["prompt"], e["answer"]) for e in data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k"))
    assert got == want
    batch = data.batches(source, batch_size=4, seed=0, process_index=0, process_count=1)[0]
    assert len(batch) == 4 and all(isinstance(e["prompt"], str) for e in batch)
    with pytest.raises(FileNotFoundError, match="no TFDS dataset"):
        data.load_tfds("nope", split="train", data_dir=tmp_path, format="gsm8k")


def _ids(batch):
    return [e["prompt"] for e in batch]


def test_batches_shard_disjointly_over_processes():
    source = data.load_examples(FIXTURES / "gsm8k_tiny.jsonl", "gsm8k")
    shards = [data.batches(source, batch_size=5, seed=1, process_index=p, process_count=2) for p in range(2)]
    epoch = [[q for step in range(2) for q in _ids(shards[p][step])] for p in range(2)]
    assert not set(epoch[0]) & set(epoch[1])  # disjoint halves...
    assert sorted(epoch[0] + epoch[1]) == sorted(e["prompt"] for e in source)  # ...covering the epoch
    second = [q for p in range(2) for step in range(2, 4) for q in _ids(shards[p][step])]
    assert sorted(second) == sorted(e["prompt"] for e in source)  # every epoch sees every example
    assert second != epoch[0] + epoch[1]  # in a new order


def test_batches_resume_the_same_order_and_default_to_jax_processes():
    source = data.Arithmetic(data.ArithmeticConfig(), "train", 64, seed=0)
    first = data.batches(source, batch_size=8, seed=5)  # process 0 of 1 under jax
    order = [_ids(b) for b, _ in zip(first, range(12))]  # plain iteration, 1.5 epochs
    resumed = data.batches(source, batch_size=8, seed=5)  # a fresh pipeline after a restart at step 7
    assert [_ids(resumed[step]) for step in range(7, 12)] == order[7:]
    assert _ids(data.batches(source, batch_size=8, seed=6)[0]) != order[0]
    with pytest.raises(ValueError, match="fewer than one global batch"):
        data.batches(source, batch_size=40, seed=0, process_index=0, process_count=2)


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
    assert ids[0] == tok.bos_id and tok.encode(text, add_bos=False) == ids[1:]
    assert all(0 <= i < tok.vocab_size for i in ids) and len(set(ids)) > 20
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    with pytest.raises(ValueError, match="cannot encode"):
        tok.encode("café")
