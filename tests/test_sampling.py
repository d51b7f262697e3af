"""Sampler pieces: truncation, token draws (chi-square), the slots' schedule and stop logic with dictated
tokens, prompt checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from grpo_jax import models
from grpo_jax.config import ModelConfig, SamplingConfig
from grpo_jax.sampling import check_prompts, lane_prompts, pad_prompts, rollout, row_keys, sample

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


def noisy_logits_simulation(scale, temperature, seed):
    """float64 NumPy: DRAWS tokens from softmax((LOGITS + scale N(0, 1)) / T), with the shift d of each
    one's log-prob under the noisy logits from its log-prob under the clean ones."""
    rng = np.random.default_rng(seed)
    noisy = (LOGITS + scale * rng.standard_normal((DRAWS, len(LOGITS)))) / temperature
    logp = noisy - np.log(np.exp(noisy).sum(1, keepdims=True))
    tokens = (rng.random(DRAWS)[:, None] > np.cumsum(np.exp(logp), 1)).sum(1)
    clean = LOGITS / temperature - np.log(np.exp(LOGITS / temperature).sum())
    return tokens, logp[np.arange(DRAWS), tokens] - clean[tokens]


def test_logit_noise_shifts_the_reported_logprobs_as_a_float64_simulation():
    """SamplingConfig.logit_noise = s draws each token from, and reports l^samp under, (logits + s N(0, 1))
    / T: the shift d of l^samp from the clean log-prob of the drawn token has the mean and std of an
    independent float64 simulation (5 standard errors; std to 3%, its error about 0.5%), the tokens its
    frequencies, and noise of 1.2 s or added after the temperature is rejected; s = 0 is the default."""
    s, t = 0.5, 0.7
    counts, logprobs, tokens = draw(SamplingConfig(logit_noise=s, temperature=t))
    clean = LOGITS / t - np.log(np.exp(LOGITS / t).sum())
    d = logprobs - clean[tokens]
    sim_tokens, sim_d = noisy_logits_simulation(s, t, 0)
    assert abs(d.mean() - sim_d.mean()) < 5 * np.sqrt((d.var() + sim_d.var()) / DRAWS)
    assert abs(d.std() / sim_d.std() - 1) < 0.03 and 0.3 * s < d.std() < s / t
    assert stats.chi2_contingency([counts, np.bincount(sim_tokens, minlength=len(LOGITS))])[1] > 1e-3
    for bug_scale, bug_t in ((1.2 * s, t), (s * t, t)):  # too much noise; noise added to the tempered logits
        assert abs(d.std() / noisy_logits_simulation(bug_scale, bug_t, 1)[1].std() - 1) > 0.03
    assert SamplingConfig(logit_noise=0.0) == SamplingConfig()


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


# A one-layer model whose sampled tokens the tests dictate through the `processor` hook: row r's token i
# is (START[r] + i) % 12, whatever the model's logits.
TINY = ModelConfig(model_type="qwen3", vocab_size=12, hidden_size=8, intermediate_size=8, num_layers=1,
                   num_heads=1, num_kv_heads=1, head_dim=8, eos_token_id=9)
START = jnp.array([7, 4, 9, 8])


def counting(steps: list):
    """A processor forcing token i of row r to (START[r] + i) % 12, recording each call's token indices."""
    def processor(logits, rows, index):
        jax.debug.callback(lambda i: steps.append(np.asarray(i).tolist()), index)
        return jnp.where(jnp.arange(12) == ((START[rows] + index) % 12)[:, None], 0.0, -jnp.inf)
    return processor


def forced(scfg, steps, stop_ids=(9,)):
    prompts = pad_prompts([[1]] * 4, scfg)
    params = models.init(TINY, jax.random.key(0))
    return rollout(TINY, scfg, stop_ids, None, params, prompts, jax.random.key(0), processor=counting(steps))


@pytest.mark.parametrize("slots,iterations", [(0, 5), (2, 5), (1, 8)])
def test_slots_take_the_next_row_as_theirs_finish_and_the_loop_ends_with_the_last(slots, iterations):
    """Rows of 3, 6, 1 and 2 tokens (stop id 9). Token 0 of every row comes from the prefill (row 2 ends
    there); each loop iteration feeds one token per busy slot. 4 slots: the loop ends with the longest
    row, after 5 iterations. 2 slots: rows 0 and 1 start; row 0 ends after 2 and its slot takes row 3
    (1 more), row 1 ends after 5: 5 iterations, not 5 + 1. One slot: 2 + 5 + 1 = 8. The rows' tokens are
    the same in every case."""
    steps = []
    scfg = SamplingConfig(greedy=True, max_new_tokens=8, max_prompt_len=1, group_size=1, decode_slots=slots)
    out = forced(scfg, steps)
    assert len(steps) == 1 + iterations  # the first tokens, then one call per iteration
    np.testing.assert_array_equal(out.lengths, [3, 6, 1, 2])
    np.testing.assert_array_equal(out.truncated, [False] * 4)
    np.testing.assert_array_equal(out.tokens[1], [4, 5, 6, 7, 8, 9, 0, 0])
    np.testing.assert_array_equal(out.mask[1], [1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(out.logprobs[1, 6:], 0.0)
    if slots == 1:  # one row at a time: row 0's tokens 1, 2, then row 1's 1..5, then row 3's 1
        assert [i for call in steps[1:] for i in call] == [1, 2, 1, 2, 3, 4, 5, 1]


def test_a_row_that_reaches_max_new_tokens_is_truncated_unless_its_last_token_stops_it():
    steps = []
    scfg = SamplingConfig(greedy=True, max_new_tokens=8, max_prompt_len=1, group_size=1, decode_slots=2)
    out = forced(scfg, steps, stop_ids=(2,))
    np.testing.assert_array_equal(out.lengths, [8, 8, 6, 7])  # row 0 stops on its last token: not truncated
    np.testing.assert_array_equal(out.truncated, [False, True, False, False])


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
    """With ignore_eos the sampler checks no stop id (not eos, whatever the model declares): the rows
    of the tests above run through their eos 9 to max_new_tokens."""
    scfg = SamplingConfig(greedy=True, max_new_tokens=8, max_prompt_len=1, group_size=1, ignore_eos=True)
    prompts = pad_prompts([[1]] * 4, scfg)
    assert check_prompts(TINY, prompts, SamplingConfig(max_prompt_len=1)) == (9,)
    stop_ids = check_prompts(TINY, prompts, scfg)
    assert stop_ids == ()
    out = forced(scfg, [], stop_ids)
    np.testing.assert_array_equal(out.lengths, [8] * 4)
    np.testing.assert_array_equal(out.tokens[0], [7, 8, 9, 10, 11, 0, 1, 2])
    assert out.mask.all() and out.truncated.all()
    with pytest.raises(ValueError, match="stop_tokens.*ignore_eos"):
        SamplingConfig(ignore_eos=True, stop_tokens=(3,))


@pytest.mark.parametrize("prompts,group,lanes,want", [
    (4, 3, 1, [[0, 1, 2, 3]]),  # one device: every prompt once
    (4, 16, 8, [[0], [0], [1], [1], [2], [2], [3], [3]]),  # a prompt spans two devices: one copy on each
    (3, 2, 2, [[0, 1], [1, 2]]),  # rows 0-2 and 3-5: prompt 1 on both
    (3, 4, 4, [[0, 1], [0, 1], [1, 2], [2, 2]]),  # 3 rows a lane; the last repeats its prompt (never read)
])
def test_each_lane_encodes_the_prompts_of_its_rows(prompts, group, lanes, want):
    np.testing.assert_array_equal(lane_prompts(prompts, group, lanes), want)
