"""GSPO from Qwen3-1.7B on a math mixture (DAPO-Math-17k and DeepScaleR, 1:1), evaluated on MATH500,
AIME 2024 and GSM8K: the recipe of a paper table, end to end.

    python -m grpo_jax.train --config experiments/configs/qwen3_math.py --set model_path=checkpoints/Qwen3-1.7B
    python -m grpo_jax.evaluate --benchmarks experiments/configs/qwen3_math_benchmarks.py \\
        --config experiments/configs/qwen3_math.py --set model_path=checkpoints/Qwen3-1.7B [--step N]

`DATA` names each dataset on the hub, which `datasets` downloads where it is reachable; offline, download
them once and edit `DATA` to their local files (parquet, JSONL or arrow). The column mappings follow each
dataset's published layout (tests/fixtures holds a few rows of each). Every prompt goes through Qwen3's
chat template with a system prompt asking for a \\boxed{} answer without a thinking block (Qwen3's
"/no_think"), and the math reward checks it. The mixture's epoch is the run: 500 steps x 64 prompts,
half from each dataset; each logs its own rollouts (accuracy@dapo_math, accuracy@deepscaler). The run
saves every 50 steps and keeps them all, so `grpo_jax.evaluate` can score any step (`--step`).

Expected cost, from bench/scale_plan.py (bench/README.md: `scale_plan`), which compiled this run's step
and sampler (the shapes of experiments/configs/gsm8k.py, which this recipe keeps: float32 params and
Adam state, bfloat16 compute, remat "dots", layers scanned; 64 prompts x 8, prompts <= 256 and
completions <= 512 tokens, micro-batches of 32) at Qwen3-1.7B's size: per device, 13.9 GiB at peak on 8
devices (fsdp 8: params 0.8, optimizer state 1.6, train-step temporaries 11.5, sampler 10.3), 2.9 GiB on
64 (fsdp 32 x tensor 2). So 8 chips suffice on each target: TPU v5e (16 GiB), TPU v5p (95 GiB) and H100
(80 GiB); v5e with the least headroom. Completions longer than 512 tokens grow the train step's
temporaries with the sequence (its 16k-token rows need remat "full").

Expected time, from the plan's time model (`python -m bench.scale_plan --time`): modelled, not measured.
The step's FLOPs run at an assumed MFU of 0.4 of each chip's vendor bf16 peak, and decoding is bound by
reading the whole weights from HBM on every chip; communication, host work and reward checks are not
counted, and every completion runs to 512 tokens. Seconds per step (generation + training), then the
500 steps in hours, for Qwen3-1.7B:

    8 chips: v5e 8.6 s (2.2 + 6.4), 1.19 h; v5p 3.4 s (0.7 + 2.7), 0.47 h; H100 1.8 s (0.5 + 1.3), 0.25 h
    64 chips: v5e 3.0 s (2.2 + 0.8), 0.41 h; v5p 1.0 s (0.6 + 0.3), 0.14 h; H100 0.7 s (0.5 + 0.2), 0.10 h

About 10, 4 and 2 chip-hours on 8 chips. More chips shrink only the training half (each decodes with
the whole weights), so 8 chips are the economical mesh. Evaluation is on top.
"""

import dataclasses

from grpo_jax import algorithms
from grpo_jax.config import (
    Config, HFTaskConfig, MeshConfig, MixtureTaskConfig, ModelOptions, OptimConfig, Part, RewardConfig,
    SamplingConfig, TrainConfig,
)
from grpo_jax.data import PromptTemplate

DATA = {
    "dapo_math": "BytedTsinghua-SIA/DAPO-Math-17k",
    "deepscaler": "agentica-org/DeepScaleR-Preview-Dataset",
    "math500": "HuggingFaceH4/MATH-500",
    "aime2024": "HuggingFaceH4/aime_2024",
    "gsm8k": "openai/gsm8k",
}
TEMPLATE = PromptTemplate(chat=True, system="Reason step by step, then give the final answer as \\boxed{answer}. /no_think")
STEPS, PROMPTS = 500, 64


def mixture(data: dict[str, str] = DATA, size: int = STEPS * PROMPTS) -> MixtureTaskConfig:
    return MixtureTaskConfig(size=size, parts=(
        Part("dapo_math", HFTaskConfig(path=data["dapo_math"], prompt="prompt", answer="reward_model.ground_truth")),
        Part("deepscaler", HFTaskConfig(path=data["deepscaler"], prompt="problem", answer="answer")),
    ))


def benchmarks(data: dict[str, str] = DATA):
    """The evaluation: its own sampling per benchmark (Qwen3's non-thinking settings; AIME's 30 problems
    16 times each for pass@k and maj@k)."""
    from grpo_jax.evaluate import Benchmark, EvalConfig

    sampled = SamplingConfig(max_prompt_len=256, max_new_tokens=1024, temperature=0.7, top_p=0.8, top_k=20)
    return EvalConfig(mesh=MeshConfig(data=1, fsdp=-1), batch_problems=64, reward_workers=8, benchmarks=(
        Benchmark("math500", HFTaskConfig(path=data["math500"], split="test"), split="train", template=TEMPLATE,
                  sampling=dataclasses.replace(sampled, group_size=4)),
        Benchmark("aime2024", HFTaskConfig(path=data["aime2024"]), split="train", template=TEMPLATE, ks=(1, 4, 16),
                  sampling=dataclasses.replace(sampled, group_size=16)),
        Benchmark("gsm8k", HFTaskConfig(path=data["gsm8k"], name="main", split="test", prompt="question",
                                        answer_format="gsm8k"), split="train", template=TEMPLATE,
                  sampling=dataclasses.replace(sampled, max_new_tokens=512, group_size=1, greedy=True)),
    ))


def get_config(data: dict[str, str] = DATA) -> Config:
    return Config(
        model_path="checkpoints/Qwen3-1.7B",
        model_options=ModelOptions(dtype="float32", compute_dtype="bfloat16", remat="dots"),
        mesh=MeshConfig(data=1, fsdp=-1),
        task=mixture(data),
        template=TEMPLATE,
        sampling=SamplingConfig(max_prompt_len=256, max_new_tokens=512, group_size=8, temperature=1.0),
        algorithm=algorithms.AlgorithmConfig.from_preset("gspo"),
        reward=RewardConfig(names=("math",), weights=(1.0,), num_workers=8),
        optim=OptimConfig(learning_rate=1e-6, warmup_steps=10, weight_decay=0.01),
        train=TrainConfig(
            steps=STEPS, prompts_per_step=PROMPTS, minibatches=4, micro_batches=4, out_dir="runs/qwen3_math_gspo",
            checkpoint_every=50, keep_checkpoints=STEPS // 50, export_hf=True,
        ),
    )
