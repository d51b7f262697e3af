"""The fused rl_step: the on-device text-match reward, and whole RL steps in one jit."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import algorithms, models, rl_step, sampling, trainer
from grpo_jax.config import Config, MeshConfig, OptimConfig, SamplingConfig, TrainConfig
from grpo_jax.data import CharTokenizer
from grpo_jax.lora import LoraConfig

MODEL = models.ModelConfig(
    model_type="qwen3", vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True,
    bos_token_id=CharTokenizer.bos_id, eos_token_id=CharTokenizer.eos_id,
)


class PieceTokenizer:
    """A BPE-like vocabulary: "42" is one token and also "4" "2"; ids 0-2 are special (decode to "")."""

    pieces = ["", "", "", "4", "2", "42", " ", "x", "-"]
    vocab_size = len(pieces)

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_text_match_compares_texts_not_token_ids():
    reward = rl_step.TextMatch.from_tokenizer(PieceTokenizer(), vocab_size=12, width=4)
    answers = reward.answers(["42", "42", "42", "42", "42", " -4 ", "42", "42"])
    eos = 2
    completions = jnp.array([
        [3, 4, eos, 0],  # "4" "2": a match
        [5, eos, 0, 0],  # "42" as one token: a match
        [6, 5, 6, eos],  # " 42 ": surrounding whitespace is stripped
        [3, 7, eos, 0],  # "4x"
        [3, 4, 4, eos],  # "422": longer than the answer
        [8, 3, eos, 0],  # "-4" against the stripped answer "-4"
        [6, 6, 6, 6],  # only whitespace
        [11, 5, eos, 0],  # an id past the tokenizer's vocabulary has no text: "42"
    ])
    mask = completions != 0
    mask = mask.at[6].set(True)
    np.testing.assert_array_equal(reward(completions, mask, answers), [1, 1, 1, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(reward(completions, mask.at[1, 0].set(False), answers)[1], 0)  # masked text is no text
    with pytest.raises(ValueError, match="longer than TextMatch width=4"):
        reward.answers(["12345"])


def test_fused_step_runs_whole_rl_steps(tmp_path):
    cfg = Config(
        model=MODEL, tokenizer="char", mesh=MeshConfig(data=2, tensor=-1),
        sampling=SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=4),
        algorithm=dataclasses.replace(algorithms.AlgorithmConfig.from_preset("gspo"), num_iterations=2),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(prompts_per_step=2, minibatches=2, out_dir=str(tmp_path)),
    )
    t = trainer.Trainer(cfg)
    reward = rl_step.TextMatch.from_tokenizer(CharTokenizer(), MODEL.vocab_size, width=4)
    step = rl_step.jit_rl_step(cfg, t.optimizer, t.mesh, t.state_sharding, reward)
    tok = CharTokenizer()
    for i in range(2):
        examples = t.prompt_batches[i]
        prompts = sampling.pad_prompts([tok.encode(ex["prompt"]) for ex in examples], cfg.sampling)
        answers = reward.answers([ex["answer"] for ex in examples])
        t.state, metrics = step(t.state, prompts, answers, jax.random.key(i))
        assert all(np.isfinite(float(v)) for v in metrics.values())
    assert int(t.state.step) == 2 * 2 * 2 and int(t.state.skipped) == 0  # mu x minibatches per step
    assert 0 <= float(metrics["reward/mean"]) <= 1 and 1 <= float(metrics["completion/length_mean"]) <= 4


def test_fused_step_rejects_host_only_options(tmp_path):
    cfg = Config(model=MODEL, tokenizer="char", algorithm=algorithms.AlgorithmConfig.from_preset("dapo"))
    reward = rl_step.TextMatch.from_tokenizer(CharTokenizer(), MODEL.vocab_size, width=4)
    with pytest.raises(ValueError, match="dynamic_sampling"):
        rl_step.jit_rl_step(cfg, optax.identity(), None, None, reward)
    with pytest.raises(ValueError, match="LoRA"):
        rl_step.jit_rl_step(dataclasses.replace(cfg, algorithm=algorithms.AlgorithmConfig.from_preset("gspo"),
                                                lora=LoraConfig(rank=2)), optax.identity(), None, None, reward)
    gpg = dataclasses.replace(cfg, algorithm=algorithms.AlgorithmConfig.from_preset("gpg"),
                              train=TrainConfig(minibatches=2))
    with pytest.raises(ValueError, match="no importance ratio"):
        rl_step.jit_rl_step(gpg, optax.identity(), None, None, reward)
