"""The gsm8k config (same checkpoint, data, GSPO and rewards) training rank-32 LoRA adapters only.

    python -m grpo_jax.train --config experiments/configs/gsm8k_lora.py \
        --set model_path=checkpoints/Qwen2.5-1.5B-Instruct --set task.path=data/gsm8k/train.jsonl

The base weights stay frozen (and would be the reference if beta > 0: no second copy); the train state,
Adam's moments and the checkpoints hold the adapters only; `train.export_hf` writes the merged policy.
Evaluation draws 8 samples per held-out prompt (pass@2/4/8), and the completions of every 10th step
go to completions.jsonl.
"""

import dataclasses

from grpo_jax.config import LoraConfig

from .gsm8k import get_config as gsm8k


def get_config():
    cfg = gsm8k()
    return dataclasses.replace(
        cfg,
        lora=LoraConfig(rank=32, alpha=64.0),
        optim=dataclasses.replace(cfg.optim, learning_rate=1e-5),  # adapters take larger steps than full weights
        train=dataclasses.replace(cfg.train, out_dir="runs/gsm8k_lora", eval_samples=8, log_completions_every=10),
    )
