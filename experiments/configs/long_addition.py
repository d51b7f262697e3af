"""GSPO on column addition written out column by column (grpo_jax/data/reasoning.py): completions of
24 to 182 char tokens (p5 24, median 41, p95 107: experiments/results/task_lengths), which a tiny
char-level model gets right only by writing every step.

The quickstart's 2-layer Qwen3-style model (d=64) on two numbers of 2 to 16 digits. Warm start:
experiments/warm_start.py with WarmStart(accuracy=0.25, batch_size=16, eval_every=50,
target=written_solution) (learning rate 3e-3). Measured on 128 held-out prompts, seeds 0 and 1: it
stops after 750 and 850 steps at 28% and 30% greedy accuracy, falling with length (2 digits 62% and
77%, 3 digits 29% and 50%, 4-5 digits 3% and 12%, 6 or more 0%). Of its wrong answers (256 held-out
prompts), 86% of those of 2-3 digits and half of those of 4-5 digits have every step right and the
"#### " line wrong (the column totals copied back in reverse); from 6 digits on, a step is wrong.
Batch 32 reached 30% in 600 steps of twice the tokens; 3 layers learned about as fast per step at 1.6
times the cost per step, and an extra labelled answer pass before "#### " no faster (62% against 70%
after 1200 steps); with 3 to 22 digits (the task's defaults) the warm start was at 13% after 1100.

RL: 16 prompts x 8 samples, 2 minibatches (the second update is off-policy, so the ratio clip acts),
packed training rows. 100 steps at a constant 1e-4 raised greedy accuracy from 28% to 37% (seed 0)
and from 30% to 44% (seed 1), sampled accuracy from 15% to 28% and from 21% to 31%, almost all of
it on 2- and 3-digit problems (seed 1 after RL: 2 digits 100%, 3 digits 82%, 4-5 digits 22%, 6 or
more 0%); 3e-4 gave a similar gain on seed 0 (28% to 34%, 40% at step 50), and 1e-3 collapsed to 1%
by step 50.
"""

from grpo_jax.config import Config, override

from .quickstart import get_config as quickstart


def get_config() -> Config:
    return override(quickstart(), [
        "model.max_position_embeddings=266", "task=column_addition", "task.min_digits=2", "task.max_digits=16",
        "sampling.max_prompt_len=67", "sampling.max_new_tokens=199", "reward.num_workers=0",
        "optim.learning_rate=1e-4", "optim.schedule=constant", "train.steps=200", "train.prompts_per_step=16",
        "train.eval_every=50", "train.out_dir=runs/long_addition", "train.checkpoint_every=50", "train.packing=true",
    ])
