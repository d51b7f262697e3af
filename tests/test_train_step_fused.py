"""The fused rl_step: token-level exact-match reward, and whole RL steps in one jit."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import algorithms, models, rl_step, trainer
from grpo_jax.config import Config, MeshConfig, OptimConfig, SamplingConfig, TrainConfig
from grpo_jax.data import CharTokenizer
from grpo_jax.lora import LoraConfig

MODEL = models.ModelConfig(
    model_type="qwen3", vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True,
    bos_token_id=CharTokenizer.bos_id, eos_token_id=CharTokenizer.eos_id,
)


def test_exact_match_reward_by_hand():
    eos = 2
    answers = jnp.array([[7, 8, eos], [5, eos, 0], [5, eos, 0], [5, eos, 0]])
    completions = jnp.array([
        [7, 8, eos, 0],  # exact
        [5, eos, 0, 0],  # exact, shorter answer
        [5, 6, eos, 0],  # extra token before eos
        [5, 0, 0, 0],  # truncated before eos
    ])
    lengths = jnp.array([3, 2, 3, 1])
    mask = jnp.arange(4) < lengths[:, None]
    np.testing.assert_array_equal(rl_step.exact_match_reward(completions, mask, answers), [1, 1, 0, 0])


def test_fused_step_runs_whole_rl_steps(tmp_path):
    cfg = Config(
        model=MODEL, tokenizer="char", mesh=MeshConfig(data=2, tensor=-1),
        sampling=SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=4),
        algorithm=dataclasses.replace(algorithms.AlgorithmConfig.from_preset("gspo"), num_iterations=2),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(prompts_per_step=2, minibatches=2, out_dir=str(tmp_path)),
    )
    t = trainer.Trainer(cfg)
    step = rl_step.jit_rl_step(cfg, t.optimizer, t.mesh, t.state_sharding)
    tok = CharTokenizer()
    for i in range(2):
        examples = t.prompt_batches[i]
        _, prompts = t._prompts(examples)
        ids = [tok.encode(ex["answer"], add_bos=False) + [tok.eos_id] for ex in examples]
        answers = jnp.asarray([a + [0] * (4 - len(a)) for a in ids], jnp.int32)
        t.state, metrics = step(t.state, prompts, answers, jax.random.key(i))
        assert all(np.isfinite(float(v)) for v in metrics.values())
    assert int(t.state.step) == 2 * 2 * 2 and int(t.state.skipped) == 0  # mu x minibatches per step
    assert 0 <= float(metrics["reward/mean"]) <= 1 and 1 <= float(metrics["completion/length_mean"]) <= 4


def test_fused_step_rejects_host_only_options(tmp_path):
    cfg = Config(model=MODEL, tokenizer="char", algorithm=algorithms.AlgorithmConfig.from_preset("dapo"))
    with pytest.raises(ValueError, match="dynamic_sampling"):
        rl_step.jit_rl_step(cfg, optax.identity(), None, None)
    with pytest.raises(ValueError, match="LoRA"):
        rl_step.jit_rl_step(dataclasses.replace(cfg, algorithm=algorithms.AlgorithmConfig.from_preset("gspo"),
                                                lora=LoraConfig(rank=2)), optax.identity(), None, None)
    gpg = dataclasses.replace(cfg, algorithm=algorithms.AlgorithmConfig.from_preset("gpg"),
                              train=TrainConfig(minibatches=2))
    with pytest.raises(ValueError, match="no importance ratio"):
        rl_step.jit_rl_step(gpg, optax.identity(), None, None)
