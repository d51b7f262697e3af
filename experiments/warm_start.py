"""A short supervised warm start, so that RL starts from a model that knows the answer format.

Cross-entropy on the completion tokens (the answer and eos; `WarmStart.target` may write something
else, e.g. filler around the answer) until greedy held-out accuracy reaches `WarmStart.accuracy`:
the model then knows the format but not yet the task, which leaves RL room to learn. Used by the
quickstart and by every study of `experiments/study.py` (once per seed, shared by the arms).
"""

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
import optax

from grpo_jax import data, sampling, sharding, trainer
from grpo_jax import train_step as ts
from grpo_jax.config import Config
from grpo_jax.data.tasks import TaskConfig


def answer_only(example: dict, rng: np.random.Generator) -> str:
    """The reference answer, nothing else (the quickstart's target)."""
    return example["answer"]


def written_solution(example: dict, rng: np.random.Generator) -> str:
    """The reference completion with its work written out (the column_addition task's "solution")."""
    return example["solution"]


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Supervised phase before RL: stop at greedy held-out `accuracy` (checked every `eval_every`
    steps) or after `max_steps`; the training data order is seeded by train.seed + 1."""

    accuracy: float = 0.2
    batch_size: int = 64
    learning_rate: float = 3e-3
    eval_every: int = 25
    max_steps: int = 2000
    target: Callable[[dict, np.random.Generator], str] = answer_only  # completion text of an example
    # The task it trains and stops on, if not the run's: a run that draws from a finite pool warm-starts on
    # the whole problem space, so that the pool is not memorized before RL.
    task: TaskConfig | None = None


WIDTH_STEP = 16  # batch widths are rounded up to a multiple of this: a few compiled shapes, little padding


def sft_batches(cfg: Config, ws: WarmStart, tok, mesh):
    """Endless (tokens, positions, segment_ids, mask) batches of prompt + target + eos, as global arrays:
    each process builds the rows its devices hold (row r of batch i: example r, its target drawn with
    a generator seeded by (seed, i, r)). A batch is as wide as its longest prompt and its longest target
    (over every process), not the sampler's max_prompt_len and max_new_tokens: the padding left out
    would cost compute and change nothing (causal attention; the loss reads only the targets)."""
    seed = cfg.train.seed + 1
    batches = data.batches(trainer.build_task(cfg).train, batch_size=ws.batch_size, seed=seed)
    rows = sharding.process_rows(mesh, ws.batch_size)
    new = cfg.sampling.max_new_tokens
    for i in range(len(batches)):
        examples = [batches[i][int(r)] for r in rows]
        prompts = sampling.pad_prompts([tok.encode(ex["prompt"]) for ex in examples], cfg.sampling)
        targets = [tok.encode(ws.target(ex, np.random.default_rng((seed, i, int(r)))), continuation=True) + [tok.eos_id]
                   for ex, r in zip(examples, rows)]
        if max(map(len, targets)) > new:
            raise ValueError(f"a warm-start target has {max(map(len, targets))} tokens with eos > "
                             f"sampling.max_new_tokens={new}: raise it or shorten WarmStart.target")
        longest = sharding.gather(np.array([[prompts.lengths.max(), max(map(len, targets))]])).max(0)
        p, c = (min(-(-int(n) // WIDTH_STEP) * WIDTH_STEP, cap) for n, cap in zip(longest, (cfg.sampling.max_prompt_len, new)))
        completions = np.array([t + [0] * (c - len(t)) for t in targets], np.int32)
        mask = (completions > 0).astype(np.float32)
        local = (*ts.sequences(prompts.tokens[:, -p:], prompts.lengths, completions), mask)
        yield sharding.global_batch(local, mesh, ws.batch_size)


def warm_start(cfg: Config, ws: WarmStart = WarmStart(), params=None) -> tuple[object, list[dict]]:
    """(params, log) after cross-entropy on the targets until greedy held-out accuracy >= ws.accuracy.

    Starts from `params`, or from the model initialized with cfg.train.seed as a run would."""
    cfg = cfg if ws.task is None else dataclasses.replace(cfg, task=ws.task)
    t = trainer.Trainer(cfg, params)
    optimizer = optax.adamw(ws.learning_rate)
    params = t.state.params
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, tokens, positions, segment_ids, mask):
        def loss(p):
            logp, _ = ts.completion_logprobs(cfg.model, 1.0, p, tokens, positions, segment_ids, mask, False)
            return -(logp * mask).sum() / mask.sum()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    log = []
    for i, batch in enumerate(sft_batches(cfg, ws, t.task.tokenizer, t.mesh), 1):
        params, opt_state, loss = step(params, opt_state, *batch)
        if i % ws.eval_every == 0 or i == ws.max_steps:
            t.state = dataclasses.replace(t.state, params=params)
            acc = t.evaluate()["eval/accuracy_greedy"]
            log.append({"sft_step": i, "loss": float(loss), "accuracy_greedy": acc})
            print(f"warm start step {i}: loss {float(loss):.3f}, held-out greedy accuracy {acc:.1%}")
            if acc >= ws.accuracy or i == ws.max_steps:
                return params, log
