"""Greedy `generate` equals `transformers` `generate(do_sample=False)` on the same tiny random weights."""

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers

from grpo_jax import models
from grpo_jax.config import SamplingConfig
from grpo_jax.sampling import generate, pad_prompts

PROMPTS = [[3, 17, 42, 8, 99], [5], [60, 61, 62], [7, 7, 120, 33, 2, 90, 14]]
NEW = 12
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, initializer_range=0.1, pad_token_id=0, eos_token_id=None)


def hf_greedy(model, eos):
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=0,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[:, width:].numpy()


@pytest.mark.parametrize("slots", [0, 2], ids=["all-rows", "2-slots"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_equals_transformers(arch, slots, tmp_path):
    """Rows stop at different steps; with 2 decode slots for 4 rows, rows that stop early hand their
    slot to the next (continuous batching), and every row still decodes what transformers does."""
    torch.manual_seed(0)
    config_cls, model_cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                             "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[arch]
    model = model_cls(config_cls(**TINY)).eval()
    model.save_pretrained(tmp_path)
    free = hf_greedy(model, eos=None)
    eos, stop = int(free[0, 4]), int(free[2, 5])  # tokens rows 0 and 2 emit: rows must stop at either
    expected = hf_greedy(model, eos=[eos, stop])

    cfg, params = models.load_hf(tmp_path)
    cfg = dataclasses.replace(cfg, eos_token_id=eos)
    scfg = SamplingConfig(max_prompt_len=8, max_new_tokens=NEW, group_size=1, greedy=True, stop_tokens=(stop,),
                          decode_slots=slots)
    out = generate(cfg, params, pad_prompts(PROMPTS, scfg), jax.random.key(0), scfg)
    lengths = np.asarray(out.lengths)
    assert lengths[0] <= 5 and lengths[2] <= 6
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(np.asarray(out.tokens)[row, :n], expected[row, :n])
        assert out.truncated[row] == (expected[row, n - 1] not in (eos, stop))
        if n < expected.shape[1]:
            assert (expected[row, n:] == 0).all()  # transformers pads a finished row
