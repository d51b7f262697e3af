"""Benchmarks on any checkpoint: a saved step of a run, or a Hugging Face directory.

    python -m grpo_jax.evaluate --benchmarks FILE [--only NAME ...] \\
        (--config RUN.py [--set KEY=VALUE ...] [--step N] | --hf DIR) [--out DIR]

    def get_config():  # FILE
        math500 = FileTaskConfig(format="math", path="data/math500.jsonl")  # one file: its "train" split
        return EvalConfig(benchmarks=(
            Benchmark("math500", math500, split="train", reward="math", template=MATH_COT, ks=(4, 16),
                      sampling=SamplingConfig(max_prompt_len=512, max_new_tokens=4096, group_size=16,
                                              temperature=0.6, top_p=0.95)),
            Benchmark("gsm8k", FileTaskConfig(path="data/gsm8k/train.jsonl", eval_path="data/gsm8k/test.jsonl"),
                      template=MATH_COT, sampling=SamplingConfig(max_prompt_len=512, max_new_tokens=1024,
                                                                 group_size=1, greedy=True))))

FILE is config as code: its `get_config()` returns an `EvalConfig`, a tuple of named `Benchmark`s. Each
has its own problem set (a task config and which of its splits: files, TFDS or a synthetic task), answer
checker (a registered correctness reward: "math" compares numbers exactly, anything else by
math-verify) and sampling (`SamplingConfig`: n = group_size samples per problem, temperature, top_p,
max_new_tokens, prompt width). Per benchmark, and as their mean: avg@n (the mean correctness of the n
samples, which is the unbiased pass@1), the unbiased pass@k (`pass_at_k`) and maj@k (is the
most frequent answer of the first k samples right) for each k of `Benchmark.ks`.

The trainer's held-out evaluation is this harness too (`evaluate_held_out`): the run's held-out set as
two implicit benchmarks, "greedy" (n = 1) and "sampled" (n = train.eval_samples), with the run's
template, sampling and rewards (weighted by reward.weights), one generation call each with the step's
key; their metrics keep the names `eval/accuracy_greedy`, `eval/reward_sampled`, `eval/pass@k`, ... and
`eval/accuracy_MODE@BUCKET` where every example names its "bucket" (`held_out_metrics`).

Written to OUT (default: `train.out_dir/eval-step-N`; `--out` with `--hf`): results.json (the metrics,
and every problem's record with each sample's answer, correctness, reward, length and completion, from
which `metrics` recomputes them) and results.md (the table). A set of any size runs on any mesh: problems go
`EvalConfig.batch_problems` at a time (rounded up to the batch devices), the last batch padded with
copies of the first problem whose rows enter no record, so every problem is evaluated exactly once.
Every user error (an unknown benchmark, an empty set, k > n, a prompt too long, a checkpoint of another
model) is raised before anything compiles. Over several processes every process runs the same command
(with the launch flags of `grpo_jax.train`), decodes and scores only the rows its devices hold, and
gathers every problem's record; process 0 writes.

A run's checkpoint is evaluated on the run's mesh (`--set mesh.data=...` changes it, as on resume);
`EvalConfig.mesh` and `model_options` apply to an HF directory.
"""

import argparse
import dataclasses
import fractions
import json
import math
import pathlib
import sys
import zlib
from collections.abc import Sequence

import jax
import numpy as np

from grpo_jax import data, distributed, models, rewards, sampling, sharding
from grpo_jax.config import Config, MeshConfig, ModelOptions, SamplingConfig, TaskConfig, override
from grpo_jax.data.tasks import SPLITS
from grpo_jax.data.templates import PLAIN, PromptTemplate
from grpo_jax.rewards import answers


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One named problem set with its own checker and sampling."""

    name: str
    task: TaskConfig  # where the problems come from (a registered task config)
    split: str = "held_out"  # which of the task's sources is the set: "held_out" (e.g. FileTaskConfig.eval_path) or "train"
    size: int = 0  # the first `size` problems; 0: all (a generated task's endless set needs a size)
    reward: str = "math"  # a registered correctness reward: the answer checker
    template: PromptTemplate = PLAIN
    sampling: SamplingConfig = SamplingConfig(group_size=1, greedy=True)  # n = group_size samples per problem
    ks: tuple[int, ...] = ()  # of pass@k and maj@k; (): 2, 4, ... below n, and n (pass_ks)

    def __post_init__(self):
        n = self.sampling.group_size
        where = f"Benchmark {self.name!r}"
        if not self.name:
            raise ValueError("Benchmark.name is empty: name every benchmark (it is its key in the results)")
        if self.split not in SPLITS:
            raise ValueError(f"{where}.split={self.split!r}: choose from {SPLITS}")
        if self.size < 0:
            raise ValueError(f"{where}.size={self.size} must be >= 0 (0: the whole set)")
        bad = [k for k in self.ks if not 1 <= k <= n]
        if bad:
            raise ValueError(f"{where}.ks={self.ks}: k={bad[0]} is not in [1, n={n}] (n = sampling.group_size, the "
                             f"samples per problem); lower k or raise {where}.sampling.group_size")

    @property
    def pass_ks(self) -> tuple[int, ...]:
        return self.ks or tuple(pass_ks(self.sampling.group_size))


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The benchmarks and how they run."""

    benchmarks: tuple[Benchmark, ...]
    seed: int = 0  # of the sampling (and of a synthetic task's problems)
    batch_problems: int = 64  # problems per generation call, rounded up to a multiple of the batch devices
    mesh: MeshConfig = MeshConfig()  # for an HF directory (a run's checkpoint runs on the run's mesh)
    model_options: ModelOptions = ModelOptions()  # for an HF directory
    reward_workers: int = 2  # processes that check answers (0: in this process; rewards.score)
    reward_timeout_s: float = 10.0  # a check that takes longer counts as wrong

    def __post_init__(self):
        names = [b.name for b in self.benchmarks]
        if not names:
            raise ValueError("EvalConfig.benchmarks is empty: give at least one Benchmark")
        if len(set(names)) < len(names):
            raise ValueError(f"EvalConfig.benchmarks: the name {next(n for n in names if names.count(n) > 1)!r} is "
                             "used twice; give every benchmark its own name")
        if self.batch_problems < 1 or self.reward_workers < 0 or not 0 < self.reward_timeout_s < math.inf:
            raise ValueError("EvalConfig needs batch_problems >= 1, reward_workers >= 0 and a finite reward_timeout_s > 0")


@dataclasses.dataclass
class Problems:
    """A benchmark's set, checked and encoded, with what scores it: what `sample_set` evaluates."""

    benchmark: Benchmark
    examples: list[dict]
    texts: list[str]  # the rendered prompts
    ids: list[list[int]]  # their tokens
    rewards: tuple[rewards.Reward, ...]  # a benchmark's: its checker; the held-out set's: the run's rewards
    names: tuple[str, ...]  # of the rewards
    weights: tuple[float, ...]  # a sample's "reward": their weighted sum; "correct": by the first correctness reward


# -- checks and data (no weights, nothing compiled) -------------------------------------------------


def select(cfg: EvalConfig, only: Sequence[str] = ()) -> list[Benchmark]:
    """The benchmarks named in `only` (all when empty), in the config's order."""
    known = {b.name: b for b in cfg.benchmarks}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"--only {unknown[0]}: no such benchmark in the EvalConfig; its benchmarks: {', '.join(known)}")
    return [b for b in cfg.benchmarks if not only or b.name in only]


def load_problems(cfg: EvalConfig, benchmarks: Sequence[Benchmark], model: models.ModelConfig, tokenizer,
                  mesh) -> list[Problems]:
    """Every benchmark's problems, rendered and tokenized, with every user error raised: an unknown or
    non-correctness reward, an empty or short set, an example the checker cannot read, a prompt longer
    than sampling.max_prompt_len, a sequence longer than the model, decode slots the mesh cannot split."""
    shards = sharding.batch_shards(mesh)
    chat = getattr(tokenizer, "apply_chat_template", None)
    out = []
    for b in benchmarks:
        where, s = f"Benchmark {b.name!r}", b.sampling
        if b.reward not in rewards.REWARDS or not rewards.REWARDS[b.reward].correctness:
            checkers = sorted(n for n, r in rewards.REWARDS.items() if r.correctness)
            raise ValueError(f"{where}.reward={b.reward!r} is not a registered correctness reward; choose from {checkers}")
        if s.max_prompt_len + s.max_new_tokens > model.max_position_embeddings:
            raise ValueError(f"{where}.sampling: max_prompt_len + max_new_tokens = {s.max_prompt_len + s.max_new_tokens} "
                             f"exceeds the model's max_position_embeddings={model.max_position_embeddings}; lower them")
        if s.decode_slots % shards:
            raise ValueError(f"{where}.sampling.decode_slots={s.decode_slots} does not split over the {shards} batch "
                             "devices; make it a multiple of that (0: all rows at once)")
        source = dict(zip(SPLITS, b.task.sources(cfg.seed)))[b.split]
        described = b.task.describe(b.split)
        if source is None:
            raise ValueError(f"{where}: task {data.task_name(b.task)!r} has no {b.split} split ({described}); "
                             "give it one (FileTaskConfig.eval_path, TfdsTaskConfig.eval_split) or set split='train'")
        if b.task.generated and not b.size:
            raise ValueError(f"{where}.size=0, but task {data.task_name(b.task)!r} generates problems without end; "
                             "set size (the number of problems)")
        if len(source) == 0:
            raise ValueError(f"{where}: its set ({described}) is empty; point the task at a file with problems")
        if b.size > len(source):
            raise ValueError(f"{where}.size={b.size} exceeds its set's {len(source)} problems; lower size (0: all)")
        examples = [source[i] for i in range(b.size or len(source))]
        reward = rewards.REWARDS[b.reward]
        texts, ids = [], []
        for i, ex in enumerate(examples):
            problem = rewards.functions.example_problem(b.reward, reward, ex) if isinstance(ex, dict) else "is not a dict"
            if problem or not isinstance(ex.get("prompt"), str):
                raise ValueError(f"{where}: problem {i} {problem or 'has no str prompt'}")
            try:
                texts.append(data.render(b.template, ex, chat))
                ids.append(tokenizer.encode(texts[-1]))
            except ValueError as e:
                raise ValueError(f"{where}: problem {i}: {e}") from None
            if not 0 < len(ids[-1]) <= s.max_prompt_len:
                raise ValueError(f"{where}: problem {i} renders to {len(ids[-1])} tokens; {where}.sampling.max_prompt_len="
                                 f"{s.max_prompt_len}: raise it")
        out.append(Problems(b, examples, texts, ids, (reward,), (b.reward,), (1.0,)))
    return out


# -- metrics ----------------------------------------------------------------------------------------


def pass_at_k(n: int, correct, k: int) -> np.ndarray:
    """The unbiased estimate of pass@k per problem, from n samples of which `correct` (an array) are right:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021, arXiv:2107.03374, eq. 1), computed as the product
    1 - prod_{i = n - c + 1}^{n} (1 - k / i), which needs no large binomials."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n} samples per problem")
    c = np.asarray(correct, np.int64)
    i = np.arange(1, n + 1)
    terms = np.where(i[None, :] > (n - c.reshape(-1))[:, None], 1.0 - k / i, 1.0)
    return (1.0 - np.prod(terms, axis=1)).reshape(c.shape)


def pass_ks(n: int) -> list[int]:
    """The k of the pass@k metrics for n samples: 2, 4, 8, ... below n, and n (none for n = 1)."""
    return sorted({2**j for j in range(1, n.bit_length()) if 2**j < n} | ({n} if n > 1 else set()))


def _vote(answer: str) -> fractions.Fraction | str:
    """What a sample votes for in maj@k: the value of a plain number (so "0.5" and "1/2" agree), else the text."""
    value = answers.to_fraction(answer)
    return answer.strip() if value is None else value


def majority_correct(samples: Sequence[dict]) -> bool:
    """Is the most frequent answer among `samples` right? Ties go to the answer seen first; a sample
    without an answer does not vote; an answer is as right as its first sample was judged."""
    votes: dict = {}
    for s in samples:
        if s["answer"] is not None:
            votes.setdefault(_vote(s["answer"]), []).append(s["correct"])
    return bool(max(votes.values(), key=len)[0]) if votes else False


def metrics(records: Sequence[dict], n: int, ks: Sequence[int]) -> dict[str, float]:
    """A benchmark's metrics from its per-problem records (n samples each)."""
    correct = np.array([[s["correct"] for s in r["samples"]] for r in records], bool).reshape(len(records), n)
    lengths = np.array([[s["length"] for s in r["samples"]] for r in records], float)
    truncated = np.array([[s["truncated"] for s in r["samples"]] for r in records], float)
    out = {"problems": len(records), "n": n, "avg@n": float(correct.mean())}
    out.update({f"pass@{k}": float(pass_at_k(n, correct.sum(axis=1), k).mean()) for k in ks})
    out.update({f"maj@{k}": float(np.mean([majority_correct(r["samples"][:k]) for r in records])) for k in ks})
    out.update({"length_mean": float(lengths.mean()), "truncated_frac": float(truncated.mean())})
    return out


def mean_row(per_benchmark: dict[str, dict]) -> dict[str, float]:
    """The mean over benchmarks of each rate every one of them reports."""
    rows = list(per_benchmark.values())
    keys = [k for k in rows[0] if "@" in k and all(k in r for r in rows)]
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}


def table(result: dict) -> str:
    """The markdown table of a result: one row per benchmark, then their mean."""
    rows = {**{name: b["metrics"] for name, b in result["benchmarks"].items()}, "mean": result["mean"]}
    rates = list(dict.fromkeys(k for r in rows.values() for k in r if "@" in k))
    rates = ["avg@n"] + sorted((k for k in rates if k != "avg@n"), key=lambda k: (k.split("@")[0] != "pass", int(k.split("@")[1])))
    cols = ["benchmark", "problems", "n", *rates]
    cell = lambda r, k: "" if k not in r else f"{r[k]:.4f}" if "@" in k else str(r[k])  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join([name, *(cell(r, k) for k in cols[1:])]) + " |" for name, r in rows.items()]
    return f"{result['source']}\n\n" + "\n".join(lines) + "\n"


# -- generation ---------------------------------------------------------------------------------------


def sample_set(p: Problems, model: models.ModelConfig, params, tokenizer, mesh, key, *, batch_problems: int,
               timeout_s: float, workers: int) -> list[dict]:
    """Every problem's record under `params` (placed on `mesh`), in problem order, on every process: its n
    samples, each with its answer, correctness (None without a correctness reward), weighted reward and
    each reward, length, finish and completion. Problems go `batch_problems` at a time (rounded up to the
    batch devices; the last call padded with copies of problem 0, whose rows enter no record); call 0
    samples with `key`, call c > 0 with fold_in(key, c). Rows are problem-major, given once per row
    (`sampling.rollout_rows`, as rollouts are); each process passes, decodes and scores only the rows its
    devices hold (`sharding.process_rows`), and the records are gathered (`distributed.all_gather_json`)."""
    shards = sharding.batch_shards(mesh)
    b, n, size = p.benchmark, p.benchmark.sampling.group_size, len(p.examples)
    per_call = min(-(-batch_problems // shards), -(-size // shards)) * shards
    fns, weights = [r.fn for r in p.rewards], np.asarray(p.weights)
    checker = next((j for j, r in enumerate(p.rewards) if r.correctness), None)
    records = []
    for call, start in enumerate(range(0, size, per_call)):
        real = list(range(start, min(start + per_call, size)))
        padded = real + [0] * (per_call - len(real))  # copies of problem 0: their rows enter no record
        host = sampling.pad_prompts([p.ids[i] for i in padded], b.sampling)
        stop_ids = sampling.check_prompts(model, host, b.sampling)
        mine = sharding.process_rows(mesh, per_call * n)
        row_prompts = sharding.global_batch(jax.tree.map(lambda x: np.asarray(x)[mine // n], host), mesh, per_call * n)
        r = sampling.rollout_rows(model, b.sampling, stop_ids, mesh, params, row_prompts,
                                  key if call == 0 else jax.random.fold_in(key, call))
        keep = mine < len(real) * n  # this process's rows of real problems
        tokens, lengths, truncated = (sharding.local_rows(x, mine)[keep] for x in (r.tokens, r.lengths, r.truncated))
        # a device holds per_call / shards whole problems: this process's rows are whole groups of n
        problems = [real[j] for j in mine[keep][::n] // n]
        rows = np.repeat(problems, n)
        completions = [tokenizer.decode(t[:k]) for t, k in zip(tokens, lengths)]
        scores, _, _ = rewards.score(fns, p.weights, [p.texts[i] for i in rows], completions,
                                     [p.examples[i] for i in rows], completion_lens=lengths.tolist(),
                                     timeout_s=timeout_s, num_workers=workers)
        total = scores @ weights
        right = None if checker is None else scores[:, checker] >= 1.0
        for j, i in enumerate(problems):
            group = range(j * n, (j + 1) * n)
            records.append({
                "index": i, "prompt": p.texts[i], "reference": p.examples[i].get("answer"),
                "correct": None if right is None else int(sum(right[g] for g in group)),
                "samples": [{"answer": answers.extract_answer(completions[g]),
                             "correct": None if right is None else bool(right[g]),
                             "reward": float(total[g]), "rewards": dict(zip(p.names, scores[g].tolist())),
                             "length": int(lengths[g]), "truncated": bool(truncated[g]),
                             "completion": completions[g]} for g in group],
            })
    # processes whose devices differ only along other mesh axes hold the same problems: keep one record each
    every = {r["index"]: r for part in distributed.all_gather_json(records) for r in part}
    return [every[i] for i in range(size)]


def run_benchmarks(cfg: EvalConfig, sets: Sequence[Problems], model: models.ModelConfig, params, tokenizer,
                   mesh) -> dict[str, dict]:
    """{name: {"config", "metrics", "records"}} of each checked set (`load_problems`) under `params`
    (placed on `mesh`); a set's key is of (EvalConfig.seed, its name)."""
    out = {}
    for p in sets:
        b, n = p.benchmark, p.benchmark.sampling.group_size
        key = jax.random.fold_in(jax.random.key(cfg.seed), zlib.crc32(b.name.encode()) & 0x7FFFFFFF)
        records = sample_set(p, model, params, tokenizer, mesh, key, batch_problems=cfg.batch_problems,
                             timeout_s=cfg.reward_timeout_s, workers=cfg.reward_workers)
        config = {"task": data.task_name(b.task), "split": b.split, "reward": b.reward, "n": n, "ks": list(b.pass_ks),
                  "sampling": dataclasses.asdict(b.sampling)}
        out[b.name] = {"config": config, "metrics": metrics(records, n, b.pass_ks), "records": records}
    return out


# -- the trainer's held-out evaluation ----------------------------------------------------------------


def held_out_sets(run: Config, examples: Sequence[dict], tokenizer,
                  run_rewards: Sequence[rewards.Reward]) -> list[Problems]:
    """The run's held-out examples as two implicit benchmarks: "greedy" (n = 1) and "sampled" (n =
    train.eval_samples), rendered with the run's template, sampled with its sampling settings (less the
    sampler's compute_dtype and logit_noise: the policy is measured), scored by its rewards (the prompts
    were checked with the run's: `trainer.check_prompts`)."""
    chat = getattr(tokenizer, "apply_chat_template", None)
    texts = [data.render(run.template, ex, chat) for ex in examples]
    ids = [tokenizer.encode(t) for t in texts]
    checker = next((name for name, r in zip(run.reward.names, run_rewards) if r.correctness), "")
    return [Problems(Benchmark(mode, run.task, size=len(examples), reward=checker, template=run.template,
                               sampling=dataclasses.replace(run.sampling, group_size=g, greedy=greedy, compute_dtype=None,
                                                            logit_noise=0.0)),  # the policy's, not the sampler's
                     list(examples), texts, ids, tuple(run_rewards), tuple(run.reward.names), tuple(run.reward.weights))
            for mode, greedy, g in (("greedy", True, 1), ("sampled", False, run.train.eval_samples))]


def held_out_metrics(mode: str, records: Sequence[dict], buckets: Sequence[str] | None = None) -> dict[str, float]:
    """The eval/ metrics of one implicit benchmark ("greedy" or "sampled") from its records:
    eval/reward_MODE, eval/length_MODE and, with a correctness reward, eval/accuracy_MODE (avg@n),
    eval/pass@k for k in `pass_ks(n)` and, with `buckets` (one label per problem), eval/accuracy_MODE@BUCKET."""
    n = len(records[0]["samples"])
    samples = [s for r in records for s in r["samples"]]
    out = {f"eval/reward_{mode}": float(np.mean([s["reward"] for s in samples])),
           f"eval/length_{mode}": float(np.mean([s["length"] for s in samples]))}
    if records[0]["correct"] is not None:
        correct = np.array([s["correct"] for s in samples], bool)
        out[f"eval/accuracy_{mode}"] = float(np.mean(correct))
        if buckets is not None:
            labels = np.repeat(np.asarray(buckets, str), n)
            out.update({f"eval/accuracy_{mode}@{b}": float(np.mean(correct[labels == b]))
                        for b in sorted(set(buckets))})
        per_problem = np.array([r["correct"] for r in records], np.int64)
        out.update({f"eval/pass@{k}": float(pass_at_k(n, per_problem, k).mean()) for k in pass_ks(n)})
    return out


def evaluate_held_out(run: Config, examples: Sequence[dict], tokenizer, run_rewards: Sequence[rewards.Reward],
                      model: models.ModelConfig, params, mesh, key) -> tuple[dict[str, float], list[dict]]:
    """(the held-out metrics, one JSON-ready dict of results per example) of `held_out_sets`, each
    sampled in one call with `key` (`Trainer.evaluate_examples`)."""
    buckets = [ex["bucket"] for ex in examples] if all("bucket" in ex for ex in examples) else None
    rows = [{"index": i, "prompt": ex["prompt"], "answer": ex.get("answer")} for i, ex in enumerate(examples)]
    out = {}
    for p in held_out_sets(run, examples, tokenizer, run_rewards):
        mode, g = p.benchmark.name, p.benchmark.sampling.group_size
        records = sample_set(p, model, params, tokenizer, mesh, key, batch_problems=len(examples),
                             timeout_s=run.reward.timeout_s, workers=run.reward.num_workers)
        out.update(held_out_metrics(mode, records, buckets))
        for row, r in zip(rows, records):
            if mode == "greedy":
                row["greedy"] = {"completion": r["samples"][0]["completion"], "rewards": r["samples"][0]["rewards"]}
            else:
                row["sampled"] = {"samples": g, "reward_mean": float(np.mean([s["reward"] for s in r["samples"]])),
                                  "length_mean": float(np.mean([s["length"] for s in r["samples"]]))}
            if r["correct"] is not None:
                row[mode]["correct"] = r["correct"]
    return out, rows


# -- the whole evaluation -----------------------------------------------------------------------------


def evaluate(cfg: EvalConfig, *, run: Config | None = None, step: int | None = None, hf: str = "",
             only: Sequence[str] = (), out: str | pathlib.Path | None = None) -> dict:
    """Evaluates checkpoint `step` of the run `run` (its config; None: the newest intact step) or the
    HF directory `hf` on the benchmarks of `cfg` (those named in `only`, or all); writes
    OUT/results.json and OUT/results.md (module docstring) and returns the result."""
    if (run is None) == (not hf):
        raise ValueError("evaluate: give exactly one model: a run's config (with its --step) or an HF directory (--hf)")
    if hf and out is None:
        raise ValueError("--hf needs --out: the directory to write the results to")
    from grpo_jax import export, trainer  # they import this module (trainer: the held-out evaluation)

    benchmarks = select(cfg, only)
    if run is not None:
        trainer.check(run)
        model, tokenizer = trainer.model_config(run), trainer.load_tokenizer(run)
        mesh = sharding.make_mesh(run.mesh)
    else:
        if not (pathlib.Path(hf) / "config.json").is_file():
            raise FileNotFoundError(f"--hf {hf}: no config.json there; give a Hugging Face model directory")
        model = trainer.model_config(Config(model_path=hf, model_options=cfg.model_options))
        from grpo_jax import tokenizer as tokenizers

        tokenizer, mesh = tokenizers.load(hf), sharding.make_mesh(cfg.mesh)
    if tokenizer.vocab_size > model.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {model.vocab_size}: "
                         "they belong to different models")
    sets = load_problems(cfg, benchmarks, model, tokenizer, mesh)
    if run is not None:
        ckpt, step = export.open_step(run, step)
        try:
            t = trainer.Trainer(run)
            t.restore(ckpt, step)
        finally:
            ckpt.close()
        model, params, mesh = t.cfg.model, t.policy_params, t.mesh
        source, out = f"{run.train.out_dir} step {step}", out or pathlib.Path(run.train.out_dir) / f"eval-step-{step}"
    else:
        model, params = models.load_hf(hf, mesh=mesh, **cfg.model_options.as_dict())
        source = hf
    per = run_benchmarks(cfg, sets, model, params, tokenizer, mesh)
    result = {"source": source, "step": step, "seed": cfg.seed, "out": str(out),
              "mean": mean_row({k: v["metrics"] for k, v in per.items()}), "benchmarks": per}
    if jax.process_index() == 0:
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1))
        (out / "results.md").write_text(table(result))
    return result


def main(argv=None):
    from grpo_jax.train import load_config

    parser = argparse.ArgumentParser(prog="python -m grpo_jax.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", required=True, help="a file whose get_config() returns an EvalConfig")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="evaluate only these benchmarks")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--config", help="the run's experiment file (its checkpoints)")
    model.add_argument("--hf", help="a Hugging Face model directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the run's overrides")
    parser.add_argument("--step", type=int, help="the run's checkpointed step (default: the newest intact one)")
    parser.add_argument("--out", help="the directory to write (default: train.out_dir/eval-step-N)")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.hf and (args.set or args.step is not None):
        parser.error("--set and --step apply to a run (--config), not to --hf")
    distributed.initialize(parser, args)
    try:
        cfg = load_config(args.benchmarks, EvalConfig)
        run = override(load_config(args.config), args.set) if args.config else None
        result = evaluate(cfg, run=run, step=args.step, hf=args.hf or "", only=args.only, out=args.out)
    except (ValueError, TypeError, AttributeError, FileNotFoundError, KeyError) as e:
        sys.exit(f"python -m grpo_jax.evaluate: error: {e}")
    print(table(result) + f"\nwrote {result['out']}/results.json and results.md")


if __name__ == "__main__":  # through the imported module: a benchmarks file's EvalConfig is its, not __main__'s
    from grpo_jax import evaluate

    evaluate.main()
