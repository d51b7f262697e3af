"""The setting of the studies whose question needs no long completions (staleness.py, infra_mismatch.py,
noisy_rewards.py): the quickstart's arithmetic task and model (experiments/configs/quickstart.py), one
warm start to 25% greedy held-out accuracy, STEPS steps of 32 prompts x 8 samples at a constant rate
after 10 warm-up steps, 256 held-out prompts, no KL. The full study sweeps RATES; --quick runs QUICK_STEPS
steps at QUICK_RATE."""

from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py
from grpo_jax.config import Config, override
from warm_start import WarmStart

WARM_START = WarmStart(accuracy=0.25, batch_size=64, eval_every=25)
RATES, QUICK_RATE, STEPS, QUICK_STEPS = (2.5e-4, 5e-4, 1e-3), 5e-4, 240, 60


def base(quick: bool, minibatches: int) -> Config:
    """The setting's config; `minibatches` updates per rollout batch."""
    return override(quickstart_config(), [
        "reward.num_workers=0", "optim.schedule=constant", f"optim.learning_rate={QUICK_RATE}", "optim.warmup_steps=10",
        f"train.steps={QUICK_STEPS if quick else STEPS}", "train.prompts_per_step=32", f"train.minibatches={minibatches}",
        "train.eval_prompts=256", f"train.eval_every={20 if quick else 30}", f"train.checkpoint_every={30 if quick else 60}",
    ])
