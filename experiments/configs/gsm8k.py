"""GSPO on GSM8K-format data from a real Hugging Face checkpoint (for GPU/TPU users).

Point it at a local HF directory and local JSONL / parquet files, e.g.

    python -m grpo_jax.train --config experiments/configs/gsm8k.py \
        --set model_path=checkpoints/Qwen2.5-1.5B-Instruct \
        --set task.path=data/gsm8k/train.jsonl --set task.eval_path=data/gsm8k/test.jsonl

Parameters and Adam state stay float32 (bf16 would round away 1e-6 updates); matmuls run in
bfloat16 with per-layer rematerialization of everything but the weight matmuls. The tokenizer is
the checkpoint's; prompts go through its chat template with an R1-style
"\\boxed{}" instruction, and the reward checks the boxed (or last) number against "#### N".
"""

from grpo_jax import algorithms
from grpo_jax.config import (
    Config, FileTaskConfig, MeshConfig, ModelOptions, OptimConfig, RewardConfig, SamplingConfig,
    TrainConfig,
)
from grpo_jax.data import MATH_COT


def get_config() -> Config:
    return Config(
        model_path="checkpoints/Qwen2.5-1.5B-Instruct",
        model_options=ModelOptions(dtype="float32", compute_dtype="bfloat16", remat="dots"),
        mesh=MeshConfig(data=-1),
        task=FileTaskConfig(format="gsm8k", path="data/gsm8k/train.jsonl", eval_path="data/gsm8k/test.jsonl"),
        template=MATH_COT,
        sampling=SamplingConfig(max_prompt_len=256, max_new_tokens=512, group_size=8, temperature=1.0),
        algorithm=algorithms.AlgorithmConfig.from_preset("gspo"),
        reward=RewardConfig(names=("math",), weights=(1.0,), num_workers=8),
        optim=OptimConfig(learning_rate=1e-6, warmup_steps=10, weight_decay=0.01),
        train=TrainConfig(
            steps=500, prompts_per_step=64, minibatches=4, micro_batches=4, eval_every=50,
            eval_prompts=256, out_dir="runs/gsm8k_gspo", checkpoint_every=50, keep_checkpoints=2,
            export_hf=True,
        ),
    )
