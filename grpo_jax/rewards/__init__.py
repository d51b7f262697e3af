"""Verifiable rewards: answer checking, the reward registry and timed, fault-tolerant scoring."""

from grpo_jax.rewards.functions import REWARDS, Reward, RewardConfig, RewardFn, register  # noqa: F401
from grpo_jax.rewards.scoring import flip_labels, score, summarize, usable_groups  # noqa: F401
