"""GSPO at the GSPO paper's scale: the GSPO arm of its main study (arXiv 2507.18071, sec. 5.1, Fig. 1).

    python -m grpo_jax.train --config experiments/configs/gspo_paper/gspo.py \
        --set model_path=checkpoints/qwen3-30b-a3b-coldstart \
        --set task.path=data/gspo_paper/train.jsonl --set task.eval_path=data/aime24/test.jsonl

The baseline arm (GRPO with routing replay) is `grpo.py` beside this file: the same run with another
`algorithm`. Run from the repository root (the baseline imports this file as a module).

What the paper states, and where it is set here:
- the policy is "a cold-start model fine-tuned from Qwen3-30B-A3B-Base" (`model_path`: neither that
  checkpoint nor its data are public, so both are placeholders; `ARCHITECTURE` is the Base model's
  config.json, for plans and the lowering test);
- "each batch of rollout data is partitioned into four minibatches for gradient updates":
  train.minibatches=4, one pass over the rollout batch (algorithm.num_iterations=1);
- GSPO's left and right clipping ranges are 3e-4 and 4e-4 (the gspo preset), on the length-normalized
  sequence ratio, averaged over sequences (its Eq. 5: aggregation seq_mean);
- GSPO needs no routing replay (sec. 5.3): algorithm.routing_replay="none";
- the baseline: GRPO with clipping ranges 0.2 and 0.27, trained with Routing Replay (`grpo.py`);
- neither objective (Eq. 2, Eq. 5) carries a KL term: beta=0.

What the paper does not state, and what we chose (change them here, or with --set):
- data and reward: math only (AIME'24 is one of its three benchmarks; LiveCodeBench and CodeForces
  need a code sandbox this repository does not have), MATH-format files, boxed-answer reward;
  evaluation on AIME'24's 30 problems (padded to the 32-way batch axis, the padding counted nowhere);
- batch: 64 prompts x G=16 completions a step (1024), so a minibatch is 256 completions, run as 8
  micro-batches of 32: one row per device of the 32-way batch axis;
- lengths: prompts <= 1024 tokens, completions <= 8192 (the paper grows its generation length during
  training and does not give it), temperature 1.0, no top-k / top-p;
- optimizer: AdamW at a constant 1e-6 after 10 warmup updates, weight decay 0.01, gradient norm
  clipped at 1.0 (the learning rate common in RL of Qwen-scale models, as in configs/gsm8k.py);
- hardware: 256 chips (a TPU v5p-512 slice), mesh fsdp=32 x tensor=2 x expert=4 (the layout
  bench/scale_plan.py found to fit Qwen3-30B-A3B on 256 devices); float32 params and Adam state,
  bfloat16 compute, remat "dots", the dense expert implementation.

tests/test_gspo_paper_configs.py builds both arms and lowers their train step with abstract arrays
on 256 simulated devices (2 of the 48 layers, every other shape real); it does not compile or run it.
Compiled once for 256 simulated CPU devices with all 48 layers (the GRPO arm, the way bench/scale_plan.py
measures), XLA's memory analysis gave 68.4 GiB per device for the train step and 17.8 GiB for the
sampler (with the optimizer state resident; measured with the lock-step sampler that continuous
batching replaced, not re-measured since): under a v5p chip's 95 GiB, over a v5e's 16. CPU buffer
assignment is an estimate of the TPU compiler's; no run on TPU was made.
"""

from grpo_jax import algorithms
from grpo_jax.config import (
    Config, FileTaskConfig, MeshConfig, ModelConfig, ModelOptions, OptimConfig, RewardConfig, SamplingConfig,
    TrainConfig,
)
from grpo_jax.data import MATH_COT

# Qwen3-30B-A3B-Base's config.json (huggingface.co/Qwen/Qwen3-30B-A3B-Base): 48 layers, all MoE with
# 128 experts of which 8 are routed per token (3.3B of 30.5B parameters active).
ARCHITECTURE = ModelConfig(
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
    num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643, num_experts=128,
    num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
)


def get_config() -> Config:
    return Config(
        model_path="checkpoints/qwen3-30b-a3b-coldstart",
        model_options=ModelOptions(dtype="float32", compute_dtype="bfloat16", remat="dots", moe_impl="dense"),
        mesh=MeshConfig(data=1, fsdp=32, tensor=2, expert=4),
        task=FileTaskConfig(format="math", path="data/gspo_paper/train.jsonl", eval_path="data/aime24/test.jsonl"),
        template=MATH_COT,
        sampling=SamplingConfig(max_prompt_len=1024, max_new_tokens=8192, group_size=16, temperature=1.0),
        algorithm=algorithms.AlgorithmConfig.from_preset("gspo"),
        reward=RewardConfig(names=("math",), weights=(1.0,), num_workers=16),
        optim=OptimConfig(learning_rate=1e-6, warmup_steps=10, weight_decay=0.01, max_grad_norm=1.0),
        train=TrainConfig(
            steps=1000, prompts_per_step=64, minibatches=4, micro_batches=8, eval_every=50, eval_prompts=30,
            out_dir="runs/gspo_paper/gspo", checkpoint_every=25, keep_checkpoints=2,
        ),
    )
