"""Datasets through Hugging Face `datasets`, with a column mapping, and weighted mixtures of tasks.

The task "hf" (`HFTaskConfig`) reads a local parquet, JSONL/JSON, CSV or arrow file, a directory written
by `save_to_disk` or holding data files, or a hub name where the hub is reachable, and maps its columns
to examples {"prompt", "answer", "solution"}: `prompt` names a text column or a chat column (a list of
{"role", "content"} turns, whose last, the user's, is the question and whose earlier turns precede it
in the chat template), `answer` a column or a field inside one ("reward_model.ground_truth"), read as
is, after GSM8K's "####" or from its last \\boxed{} (`ANSWER_FORMATS`). Scalar columns ride along (a
reward may read them). Every column is checked when the task loads, before anything compiles.

    HFTaskConfig(path="openai/gsm8k", name="main", split="train", eval_split="test", prompt="question",
                 answer_format="gsm8k")
    HFTaskConfig(path="data/dapo-math-17k.parquet", prompt="prompt", answer="reward_model.ground_truth")

The task "mixture" (`MixtureTaskConfig`) draws its training set from named `Part`s by weight: an epoch
of `size` examples holds about `size * weight / sum(weights)` of each part (a part repeats, in a fresh
order each time, when it holds fewer), and the sampler shuffles them as one set. Every example carries
its part's name as "bucket", so the held-out metrics (each part's held-out set, concatenated) come per
part (`eval/accuracy_greedy@NAME`), and the trainer logs each part's rollouts (`accuracy@NAME`,
`reward/mean@NAME`, `completion/length_mean@NAME`; `source_names`).
"""

import dataclasses
import math
import pathlib

import numpy as np

from grpo_jax.data.tasks import Source, Sources, TaskConfig, register, task_name
from grpo_jax.rewards.answers import last_boxed


def _after_hashes(text: str) -> str | None:
    return text.rsplit("####", 1)[1].strip().replace(",", "") if "####" in text else None


# How the answer column holds the final answer: the whole text, GSM8K's "#### N" line, the last \boxed{}.
ANSWER_FORMATS = {"plain": lambda text: text.strip() or None, "gsm8k": _after_hashes, "boxed": last_boxed}
FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv", ".arrow": "arrow"}


def load_table(path: str, name: str = "", split: str = "train"):
    """A `datasets.Dataset`: a local file (one split: `split` does not apply), a `save_to_disk` or data
    directory, or a hub name (with config `name`), which needs the hub reachable."""
    import datasets  # only these tasks pay for its import

    p = pathlib.Path(path)
    if p.is_file():
        if p.suffix not in FILE_BUILDERS:
            raise ValueError(f"task.path={path}: expected a {', '.join(FILE_BUILDERS)} file, a directory or a hub name")
        try:
            return datasets.load_dataset(FILE_BUILDERS[p.suffix], data_files=str(p), split="train")
        except ValueError as e:  # e.g. a file without rows
            raise ValueError(f"task.path={path} yields no dataset ({e}); point it at a file of examples") from None
    if p.is_dir() and any((p / f).is_file() for f in ("dataset_dict.json", "state.json")):
        table = datasets.load_from_disk(str(p))
        if isinstance(table, datasets.DatasetDict):
            if split not in table:
                raise ValueError(f"task.path={path} has no split {split!r}; its splits: {', '.join(table)}")
            table = table[split]
        return table
    try:
        return datasets.load_dataset(path, name or None, split=split)
    except Exception as e:  # noqa: BLE001  (offline, unknown name, unknown split: all say the same fix)
        raise FileNotFoundError(f"task.path={path!r} (split {split!r}) is no local file or directory and could not be "
                                f"loaded from the hub ({type(e).__name__}: {str(e)[:200]}); download it and point "
                                "task.path at its files") from None


@register("hf")
@dataclasses.dataclass(frozen=True)
class HFTaskConfig(TaskConfig):
    """A dataset read through Hugging Face `datasets` (module docstring). The held-out set is split
    `eval_split` of `eval_path` (default: `path`); with neither set the run does not evaluate."""

    path: str = ""  # a local file or directory, or a hub name
    name: str = ""  # the hub dataset's config (e.g. "main" for openai/gsm8k)
    split: str = "train"
    eval_path: str = ""  # "": the held-out set comes from `path`
    eval_split: str = ""  # "": no held-out set unless eval_path is set (a local file has one split)
    prompt: str = "problem"  # the question: a text column, or a chat column of {"role", "content"} turns
    answer: str = "answer"  # the final answer's column; "a.b" reads field b of a struct column a
    answer_format: str = "plain"  # how that column holds it: ANSWER_FORMATS
    solution: str = ""  # a worked solution's column, if any

    def __post_init__(self):
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"HFTaskConfig.answer_format={self.answer_format!r}: choose from {sorted(ANSWER_FORMATS)}")
        if not self.prompt or not self.answer:
            raise ValueError("HFTaskConfig.prompt and .answer must name columns (the question's and the answer's)")

    def sources(self, seed: int) -> Sources:
        if not self.path:
            raise ValueError("Config.task: the hf task needs task.path (a local file or directory, or a hub name)")
        held = None
        if self.eval_path or self.eval_split:
            held = self.rows(self.eval_path or self.path, self.eval_split or "train", "held_out")
        return self.rows(self.path, self.split, "train"), held

    def describe(self, split: str) -> str:
        path, s = (self.path, self.split) if split == "train" else (self.eval_path or self.path, self.eval_split or "train")
        return f"{path}[{s}]"

    def rows(self, path: str, split: str, which: str) -> "Rows":
        """The examples of one split, with every mapped column checked on its first row."""
        table = load_table(path, self.name, split)
        where = self.describe(which)
        if len(table) == 0:
            raise ValueError(f"{where} is empty; point task.path (or eval_path) at a split with examples")
        for field in ("prompt", "answer", "solution"):
            column = getattr(self, field).split(".")[0]
            if column and column not in table.column_names:
                raise ValueError(f"task.{field}={getattr(self, field)!r}: {where} has no column {column!r}; its columns: "
                                 f"{', '.join(table.column_names)}; set task.{field}")
        rows = Rows(table, self, where)
        rows[0]  # the mapping read on one row: a nested field, a chat, the answer's format
        return rows

    def example(self, row: dict, where: str) -> dict:
        """One row as an example."""
        out = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool))}
        question = row[self.prompt]
        if isinstance(question, list):  # chat turns: the last is the user's question
            if not question or not isinstance(question[-1], dict) or question[-1].get("role") != "user":
                raise ValueError(f"{where}: column {self.prompt!r} is a chat whose last turn is not the user's")
            *history, last = question
            question = last["content"]
            if history:
                out["messages"] = [{"role": t["role"], "content": t["content"]} for t in history]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: column {self.prompt!r} holds no question text (set task.prompt)")
        value = row
        for key in self.answer.split("."):
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"{where}: task.answer={self.answer!r} finds no field {key!r} there; set task.answer")
            value = value[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        answer = ANSWER_FORMATS[self.answer_format](value) if isinstance(value, str) else None
        if answer is None:
            raise ValueError(f"{where}: column {self.answer!r} holds no {self.answer_format} answer ({str(value)[:60]!r}); "
                             f"set task.answer or task.answer_format ({', '.join(ANSWER_FORMATS)})")
        out.update(prompt=question, answer=answer)
        if self.solution:
            out["solution"] = row[self.solution]
        return out


class Rows:
    """A `datasets.Dataset`'s rows as examples, each converted when read."""

    def __init__(self, table, task: HFTaskConfig, where: str):
        self.table, self.task, self.where = table, task, where

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self.table):
            raise IndexError(i)
        return self.task.example(self.table[int(i)], f"{self.where} row {i}")


@dataclasses.dataclass(frozen=True)
class Part:
    """One named source of a mixture and its weight."""

    name: str
    task: TaskConfig
    weight: float = 1.0


@register("mixture")
@dataclasses.dataclass(frozen=True)
class MixtureTaskConfig(TaskConfig):
    """Weighted parts drawn as one training set (module docstring); their held-out sets concatenated."""

    parts: tuple[Part, ...] = ()
    size: int = 0  # examples in one epoch of the mixture; 0: the parts' sizes summed

    def __post_init__(self):
        names = [p.name for p in self.parts]
        if any(not n or "@" in n or "/" in n for n in names) or len(set(names)) < len(names):
            raise ValueError(f"MixtureTaskConfig.parts: names {names} must be distinct, non-empty, without '@' or '/' "
                             "(they key each part's metrics)")
        if not all(0 < p.weight < math.inf for p in self.parts) or self.size < 0:
            raise ValueError("MixtureTaskConfig needs each Part.weight finite and > 0 and size >= 0")

    def sources(self, seed: int) -> Sources:
        if not self.parts:
            raise ValueError("Config.task: the mixture task needs task.parts (named Parts, each a task and a weight)")
        loaded = [p.task.sources(seed) for p in self.parts]
        lengths = [len(train) for train, _ in loaded]
        total, weights = self.size or sum(lengths), np.array([p.weight for p in self.parts])
        counts = np.rint(total * weights / weights.sum()).astype(int)
        if not counts.all():
            p = self.parts[int(np.argmin(counts))]
            raise ValueError(f"MixtureTaskConfig: part {p.name!r} gets 0 of the epoch's {total} examples; raise its "
                             "weight or task.size")
        rng = np.random.default_rng((seed, len(self.parts)))
        order = [np.concatenate([rng.permutation(n) for _ in range(-(-c // n))])[:c] for n, c in zip(lengths, counts)]
        train = Mixture([p.name for p in self.parts], [t for t, _ in loaded],
                        np.repeat(np.arange(len(order)), counts), np.concatenate(order))
        held = [(p.name, h) for p, (_, h) in zip(self.parts, loaded) if h is not None]
        if not held:
            return train, None
        # interleaved by rank within each part, so that the first train.eval_prompts cover every part by its size
        part = np.concatenate([np.full(len(h), k) for k, (_, h) in enumerate(held)])
        index = np.concatenate([np.arange(len(h)) for _, h in held])
        rank = np.concatenate([(np.arange(len(h)) + 0.5) / len(h) for _, h in held])
        ranked = np.argsort(rank, kind="stable")
        return train, Mixture([n for n, _ in held], [h for _, h in held], part[ranked], index[ranked])

    def describe(self, split: str) -> str:
        return f"the {split} examples of the mixture of " + ", ".join(
            f"{p.name} ({task_name(p.task)} {p.task.describe(split)})" for p in self.parts)


class Mixture:
    """Example i is example `index[i]` of source `part[i]`, labelled with that source's name."""

    def __init__(self, names: list[str], sources: list[Source], part: np.ndarray, index: np.ndarray):
        self.names, self.sources, self.part, self.index = names, sources, part, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self.index):
            raise IndexError(i)
        k = self.part[i]
        return {**self.sources[k][int(self.index[i])], "bucket": self.names[k]}


def source_names(examples) -> np.ndarray | None:
    """The mixture part of each example of a drawn round (`samplers.Picked` over a `Mixture`), or None."""
    source = getattr(examples, "source", None)
    if not isinstance(source, Mixture):
        return None
    return np.asarray(source.names)[source.part[np.asarray(examples.indices)]]
