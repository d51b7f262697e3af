"""GSM8K- and MATH-format datasets from local files or a local TFDS build, and the grain pipeline.

Every source becomes examples {"prompt", "answer", "solution"}: "answer" is the canonical final
answer the rewards compare against. Nothing here downloads: files and TFDS data_dir are local.
The tasks "file" (`FileTaskConfig`) and "tfds" (`TfdsTaskConfig`) read them from a config.
"""

import dataclasses
import json
import pathlib
import sys

import grain

from grpo_jax.data.samplers import Picked, batch_indices
from grpo_jax.data.tasks import Source, Sources, TaskConfig, register
from grpo_jax.rewards.answers import last_boxed


def parse_gsm8k(record: dict) -> dict:
    """{"question", "answer": "...reasoning...\\n#### 1,234"} -> answer "1234" (commas dropped)."""
    solution = record["answer"]
    if not record["question"].strip():
        raise ValueError("the question is empty")
    if "####" not in solution:
        raise ValueError("GSM8K answer has no '#### <final answer>' line")
    return {"prompt": record["question"], "answer": solution.rsplit("####", 1)[1].strip().replace(",", ""), "solution": solution}


def parse_math(record: dict) -> dict:
    """{"problem", "solution": "... \\boxed{x} ..."} -> answer "x" (the last \\boxed{})."""
    answer = last_boxed(record["solution"])
    if not record["problem"].strip():
        raise ValueError("the problem is empty")
    if answer is None:
        raise ValueError("MATH solution has no \\boxed{...} final answer")
    return {"prompt": record["problem"], "answer": answer, "solution": record["solution"]}


FORMATS = {"gsm8k": parse_gsm8k, "math": parse_math}


def _parser(format: str):
    if format not in FORMATS:
        raise ValueError(f"data format {format!r} is unknown; choose from {sorted(FORMATS)}")
    return FORMATS[format]


def load_examples(path: str | pathlib.Path, format: str) -> list[dict]:
    """All examples of a local .jsonl or .parquet file in `format` ("gsm8k" or "math")."""
    path, parse = pathlib.Path(path), _parser(format)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist; give a local .jsonl or .parquet path")
    if path.suffix == ".jsonl":
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        records = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n} is not JSON ({e.msg}, column {e.colno}): fix or delete the line") from None
    elif path.suffix == ".parquet":
        import pyarrow.parquet  # only parquet users need pyarrow

        records = list(enumerate(pyarrow.parquet.read_table(path).to_pylist(), 1))
    else:
        raise ValueError(f"dataset file {path}: expected a .jsonl or .parquet suffix")
    examples = []
    for n, record in records:
        try:
            examples.append(parse(record))
        except KeyError as e:
            raise ValueError(f"{path} record {n} is not {format} format: it has no field {e}") from None
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"{path} record {n} is not {format} format ({type(e).__name__}: {e})") from None
    return examples


def _decode(record: dict) -> dict:
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in record.items()}


def load_tfds(name: str, *, split: str, data_dir: str | pathlib.Path, format: str) -> grain.MapDataset:
    """A prepared TFDS dataset (array_record files under `data_dir`) read lazily through
    `tfds.data_source`: no TensorFlow, random access, nothing loaded up front."""
    import tensorflow_datasets as tfds  # slow import; only TFDS users pay for it

    parse = _parser(format)
    if not (pathlib.Path(data_dir) / name.split(":")[0]).is_dir():
        raise FileNotFoundError(f"no TFDS dataset {name!r} under data_dir={data_dir}; prepare it there first")
    source = tfds.data_source(name, split=split, data_dir=str(data_dir), download=False)
    return grain.MapDataset.source(source).map(lambda r: parse(_decode(r)))


@register("file")
@dataclasses.dataclass(frozen=True)
class FileTaskConfig(TaskConfig):
    """A dataset in local files: GSM8K-format or MATH-format JSONL / parquet (`FORMATS`).
    Without `eval_path` the run has no held-out set and does not evaluate."""

    format: str = "gsm8k"
    path: str = ""  # training examples
    eval_path: str = ""  # held-out examples ("": no evaluation)

    def sources(self, seed: int) -> Sources:
        if not self.path:
            raise ValueError("Config.task: the file task needs task.path (a local .jsonl or .parquet training file)")
        return load_examples(self.path, self.format), load_examples(self.eval_path, self.format) if self.eval_path else None

    def describe(self, split: str) -> str:
        return self.path if split == "train" else self.eval_path


@register("tfds")
@dataclasses.dataclass(frozen=True)
class TfdsTaskConfig(TaskConfig):
    """A TFDS dataset prepared (array_record files) under the local `data_dir`, read lazily through
    `tfds.data_source` and grain: no TensorFlow. Without `eval_split` the run does not evaluate."""

    builder: str = ""  # the TFDS name, e.g. "gsm8k" or "gsm8k:1.0.0"
    data_dir: str = ""
    format: str = "gsm8k"
    split: str = "train"
    eval_split: str = ""  # e.g. "test" ("": no evaluation)

    def sources(self, seed: int) -> Sources:
        if not self.builder or not self.data_dir:
            raise ValueError("Config.task: the tfds task needs task.builder (the TFDS name) and task.data_dir "
                             "(where it is prepared)")
        load = lambda split: load_tfds(self.builder, split=split, data_dir=self.data_dir, format=self.format)  # noqa: E731
        return load(self.split), load(self.eval_split) if self.eval_split else None

    def describe(self, split: str) -> str:
        return f"TFDS {self.builder}[{self.split if split == 'train' else self.eval_split}] in {self.data_dir}"


def batches(source: Source, *, batch_size: int, seed: int) -> grain.MapDataset:
    """The run's global prompt batches, endless: element `step` is a random-access view of the
    `batch_size` examples of training step `step`, read only where indexed, so that each process reads
    just the examples of its own rows (`grpo_jax.sharding.process_rows`). Resuming is indexing:
    checkpoint the step, continue at `batches(...)[step]`.

    The whole source is shuffled with `seed` (a new permutation each epoch) and cut into consecutive
    batches: which example sits at which position of a batch depends on nothing else, in particular
    not on the number of processes.
    """
    if batch_size < 1:
        raise ValueError(f"batches: batch_size={batch_size}; need at least 1")
    if len(source) < batch_size:
        raise ValueError(f"batches: the source has {len(source)} examples, fewer than one batch of {batch_size}; "
                         "lower the batch size")
    return grain.MapDataset.range(sys.maxsize // batch_size).map(
        lambda step: Picked(source, batch_indices(len(source), batch_size, seed, step)))
