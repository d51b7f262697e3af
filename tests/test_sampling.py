"""Sampler pieces that need no model: truncation, token draws (chi-square), stop logic, prompt checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from grpo_jax.config import ModelConfig, SamplingConfig
from grpo_jax.sampling import decode, pad_prompts, row_keys, sample

LOGITS = np.array([2.0, 1.5, 1.1, 0.6, 0.2, -0.3, -0.9, -1.6])  # distinct: cut-offs are unambiguous
DRAWS = 40_000


def analytic(temperature=1.0, top_k=0, top_p=1.0, logits=LOGITS):
    """float64 reference: tempered softmax, keep the top k, then the smallest prefix with mass >= top_p."""
    probs = np.exp(logits / temperature - np.max(logits / temperature))
    probs /= probs.sum()
    order = np.argsort(-probs)
    kept = order[: top_k or len(probs)]
    renorm = probs[kept] / probs[kept].sum()
    above = np.cumsum(renorm) - renorm
    kept = kept[above < top_p]
    out = np.zeros_like(probs)
    out[kept] = probs[kept] / probs[kept].sum()
    return out


def chi2(counts, expected_probs):
    """Pearson statistic over the support of `expected_probs`; inf if a token outside it was drawn."""
    support = expected_probs > 0
    if counts[~support].any():
        return np.inf
    expected = expected_probs[support] * counts.sum()
    return float(np.sum((counts[support] - expected) ** 2 / expected))


def draw(scfg, logits=LOGITS):
    batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (DRAWS, len(logits)))
    keys = row_keys(jax.random.key(0), DRAWS, 1)
    tokens, logprobs = jax.jit(sample, static_argnums=2)(batch, keys, scfg)
    return np.bincount(np.asarray(tokens), minlength=len(logits)), np.asarray(logprobs), np.asarray(tokens)


# (settings, plausible bugs that must be rejected by the same test)
CASES = [
    (dict(temperature=0.6), [dict(temperature=1.0), dict(temperature=0.5)]),
    (dict(temperature=1.0, top_k=3), [dict(top_k=2), dict(top_k=4), dict()]),
    (dict(temperature=1.0, top_p=0.7), [dict(top_p=0.5), dict(), dict(top_k=2)]),
    (dict(temperature=1.5, top_k=5, top_p=0.8),
     [dict(temperature=1.5, top_p=0.8), dict(temperature=1.5, top_k=5), dict(top_k=5, top_p=0.8)]),
]


@pytest.mark.parametrize("settings,bugs", CASES)
def test_token_frequencies_match_the_analytic_distribution(settings, bugs):
    counts, logprobs, tokens = draw(SamplingConfig(**settings))
    df = int((analytic(**settings) > 0).sum()) - 1
    critical = stats.chi2.ppf(1 - 1e-3, df)
    assert chi2(counts, analytic(**settings)) < critical
    for bug in bugs:  # the sample size is large enough that each wrong implementation fails
        assert chi2(counts, analytic(**bug)) > critical, bug
    # the reported log-prob is under the tempered FULL distribution, whatever the truncation
    tempered = LOGITS / settings["temperature"]
    full = tempered - np.log(np.sum(np.exp(tempered)))
    np.testing.assert_allclose(logprobs, full[tokens], rtol=0, atol=1e-6)


def test_frequencies_over_a_vocabulary_of_several_sampling_blocks():
    """300 tokens: the draw crosses block boundaries (blocks of 128) and a padded last block."""
    logits = np.random.default_rng(0).permutation(np.linspace(0.0, 2.0, 300))
    settings = dict(temperature=0.8, top_k=250)
    counts, _, _ = draw(SamplingConfig(**settings), logits)
    critical = stats.chi2.ppf(1 - 1e-3, 249)
    assert chi2(counts, analytic(**settings, logits=logits)) < critical
    for bug in [dict(temperature=0.8), dict(temperature=0.8, top_k=249), dict(top_k=250)]:
        assert chi2(counts, analytic(**bug, logits=logits)) > critical, bug


def test_greedy_takes_the_argmax_and_reports_the_tempered_logprob():
    logits = jax.random.normal(jax.random.key(1), (5, 11))
    scfg = SamplingConfig(greedy=True, temperature=2.0)
    tokens, logprobs = sample(logits, row_keys(jax.random.key(0), 5, 1), scfg)
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))
    np.testing.assert_allclose(logprobs, np.max(jax.nn.log_softmax(logits / 2.0), -1), atol=1e-6)


@pytest.mark.parametrize("vocab", [11, 128, 300, 384])
def test_greedy_takes_numpys_argmax_across_blocks_ties_and_nans(vocab):
    """The two-level argmax (blocks of 128; a last partial block read back as the last 128 entries) against
    numpy's: the first maximum, a tie across the shared entries of the last two blocks, a NaN (numpy
    returns the first NaN), -inf everywhere but one entry, and a maximum in the very last entry."""
    logits = np.random.default_rng(vocab).normal(size=(6, vocab)).astype(np.float32)
    logits[1, [vocab // 3, vocab - 1]] = 9.0  # a tie: the lower index wins
    logits[2, [vocab // 2, vocab - 2]] = np.nan, 50.0
    logits[3] = -np.inf
    logits[3, vocab - 3] = 0.0
    logits[4, vocab - 1] = 9.0
    logits[5, max(vocab - 200, 0)] = logits[5, vocab - 1] = 9.0  # with 300: in both the 2nd and the last block
    tokens, _ = jax.jit(sample, static_argnums=2)(jnp.asarray(logits), row_keys(jax.random.key(0), 6, 1),
                                                  SamplingConfig(greedy=True))
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))


def test_row_keys_depend_only_on_prompt_and_sample_index():
    rng = jax.random.key(3)
    small, big = row_keys(rng, 2, 3), row_keys(rng, 5, 3)
    np.testing.assert_array_equal(jax.random.key_data(small), jax.random.key_data(big[:6]))
    assert len({tuple(k) for k in np.asarray(jax.random.key_data(big))}) == 15


def test_decode_stops_each_row_at_its_stop_token_and_exits_early():
    """Fake model: greedy next token = previous + 1; rows start at different tokens, 9 is the stop id."""
    vocab, calls = 12, []

    def step(carry, tokens, t):
        jax.debug.callback(lambda: calls.append(1))
        return jax.nn.one_hot((tokens + 1) % vocab, vocab) * 10.0, carry

    scfg = SamplingConfig(greedy=True, max_new_tokens=8)
    first = jax.nn.one_hot(jnp.array([7, 4, 9, 8]), vocab) * 10.0
    run = jax.jit(decode, static_argnums=(0, 4, 5))
    keys = row_keys(jax.random.key(0), 4, 1)
    out, _ = run(step, (), first, keys, (9,), scfg)
    np.testing.assert_array_equal(out.lengths, [3, 6, 1, 2])
    np.testing.assert_array_equal(out.truncated, [False] * 4)
    np.testing.assert_array_equal(out.tokens[1], [4, 5, 6, 7, 8, 9, 0, 0])
    np.testing.assert_array_equal(out.mask[1], [1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(out.logprobs[1, 6:], 0.0)
    assert len(calls) == 5  # the loop ends when the slowest row has stopped, not at max_new_tokens

    calls.clear()
    out, _ = run(step, (), first, keys, (2,), scfg)
    np.testing.assert_array_equal(out.lengths, [8, 8, 6, 7])  # row 0 stops on its last slot: not truncated
    np.testing.assert_array_equal(out.truncated, [False, True, False, False])
    assert len(calls) == 7


def test_decode_in_segments_grows_the_carry_before_each_and_still_exits_early():
    """64 new tokens in 2 segments of 32: `grow` sees the carry before each segment with its end; the
    tokens are those of one segment; once every row has stopped (step 40) no later step runs."""
    vocab, calls, grown = 64, [], []

    def step(carry, tokens, t):
        jax.debug.callback(lambda: calls.append(1))
        return jax.nn.one_hot((tokens + 1) % vocab, vocab) * 10.0, carry + 1

    def grow(carry, end):
        jax.debug.callback(lambda c: grown.append((end, int(c))), carry)
        return carry

    first = jax.nn.one_hot(jnp.array([20, 10, 30]), vocab) * 10.0
    keys = row_keys(jax.random.key(0), 3, 1)
    run = jax.jit(decode, static_argnums=(0, 4, 5, 6))
    one = SamplingConfig(greedy=True, max_new_tokens=64, cache_segments=1)
    two = SamplingConfig(greedy=True, max_new_tokens=64, cache_segments=2)
    for scfg, stop in ((one, (50,)), (two, (50,)), (two, ())):
        calls.clear()
        grown.clear()
        out, carry = run(step, jnp.int32(0), first, keys, stop, scfg, grow)
        if stop == (50,):  # rows stop after 31, 41 and 21 tokens
            np.testing.assert_array_equal(out.lengths, [31, 41, 21])
            np.testing.assert_array_equal(out.tokens[1, :41], np.arange(10, 51))
            assert len(calls) == int(carry) == 40
            assert grown == ([(64, 0)] if scfg is one else [(32, 0), (64, 31)])
        else:  # no stop id: every row runs to the end
            assert out.truncated.all() and len(calls) == 63 and grown == [(32, 0), (64, 31)]


@pytest.mark.parametrize(
    "prompts,message", [([[1, 2], []], "prompt 1 is empty"), ([[1] * 5], "max_prompt_len=4")]
)
def test_bad_prompts_are_rejected_before_compiling(prompts, message):
    with pytest.raises(ValueError, match=message):
        pad_prompts(prompts, SamplingConfig(max_prompt_len=4))


def test_pad_prompts_left_pads():
    p = pad_prompts([[5, 6], [7, 8, 9]], SamplingConfig(max_prompt_len=4))
    np.testing.assert_array_equal(p.tokens, [[0, 0, 5, 6], [0, 7, 8, 9]])
    np.testing.assert_array_equal(p.lengths, [2, 3])


def test_ignore_eos_runs_every_row_to_max_new_tokens():
    """With ignore_eos the sampler checks no stop id (not eos, whatever the model declares): the fake
    model of the test above runs through its eos 9 to max_new_tokens in every row."""
    from grpo_jax.sampling import check_prompts

    model = ModelConfig(model_type="qwen3", vocab_size=12, hidden_size=8, intermediate_size=8, num_layers=1,
                        num_heads=1, num_kv_heads=1, head_dim=8, eos_token_id=9)
    scfg = SamplingConfig(greedy=True, max_new_tokens=8, max_prompt_len=2, ignore_eos=True)
    prompts = pad_prompts([[1], [2, 3]], scfg)
    assert check_prompts(model, prompts, SamplingConfig(max_prompt_len=2)) == (9,)
    stop_ids = check_prompts(model, prompts, scfg)
    assert stop_ids == ()

    def step(carry, tokens, t):
        return jax.nn.one_hot((tokens + 1) % 12, 12) * 10.0, carry

    first = jax.nn.one_hot(jnp.array([7, 9]), 12) * 10.0
    out, _ = jax.jit(decode, static_argnums=(0, 4, 5))(step, (), first, row_keys(jax.random.key(0), 2, 1), stop_ids, scfg)
    np.testing.assert_array_equal(out.lengths, [8, 8])
    np.testing.assert_array_equal(out.tokens[0], [7, 8, 9, 10, 11, 0, 1, 2])
    assert out.mask.all() and out.truncated.all()
    with pytest.raises(ValueError, match="stop_tokens.*ignore_eos"):
        SamplingConfig(ignore_eos=True, stop_tokens=(3,))
