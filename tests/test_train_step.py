"""The jitted train step against a full-logits reference on the unsplit batch with a hand-written AdamW."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _algorithm_cases import split

from grpo_jax import algorithms, models, sharding
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import Config, MeshConfig, OptimConfig, SamplingConfig, TrainConfig

MODEL = models.ModelConfig(
    model_type="qwen3", vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=True,
)
# eps=1e-4 keeps Adam's g / (|g| + eps) well conditioned, so 1e-6 on params tests the step, not noise.
OPTIM = OptimConfig(learning_rate=1e-3, weight_decay=0.1, eps=1e-4, max_grad_norm=0.05)
B, PROMPT, NEW = 8, 5, 6


# An untrained model's entropies (about log V) exceed GTPO's filter, which would zero every advantage.
PRESET_FIELDS = {"gtpo": dict(entropy_max=10.0)}


def algorithm_config(preset: str, **overrides) -> algorithms.AlgorithmConfig:
    """The preset with `overrides`: AlgorithmConfig fields by name, the others the loss's parameters."""
    fields, params = split(overrides)
    cfg = algorithms.AlgorithmConfig.from_preset(preset, **fields)
    return dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, **params))


def config(preset: str, micro_batches: int = 2, minibatches: int = 1, **algorithm) -> Config:
    return Config(
        model=MODEL,
        sampling=SamplingConfig(max_prompt_len=PROMPT, max_new_tokens=NEW, group_size=4, temperature=0.7),
        algorithm=algorithm_config(preset, **{**PRESET_FIELDS.get(preset, {}), **algorithm}),
        optim=OPTIM,
        train=TrainConfig(micro_batches=micro_batches, minibatches=minibatches),
    )


@pytest.fixture(scope="module")
def params():
    return models.init(MODEL, jax.random.key(0))


@pytest.fixture(scope="module")
def rollouts(params):
    """Random rollouts and their true log-probs under `params`."""
    rng = np.random.default_rng(1)
    prompt_lengths = rng.integers(1, PROMPT + 1, B)
    prompts = np.where(np.arange(PROMPT) >= PROMPT - prompt_lengths[:, None], rng.integers(3, 48, (B, PROMPT)), 0)
    lengths = rng.integers(0, NEW + 1, B)
    lengths[0] = NEW
    mask = (np.arange(NEW) < lengths[:, None]).astype(np.float32)
    completions = np.where(mask > 0, rng.integers(3, 48, (B, NEW)), 0)
    tokens, positions, segments = ts.sequences(jnp.asarray(prompts), jnp.asarray(prompt_lengths), jnp.asarray(completions))
    logp, _ = jax.jit(reference_logprobs, static_argnums=4)(params, tokens, positions, segments, 0.7)
    return tokens, positions, segments, mask, np.asarray(logp)


def make_batch(rollouts, noise: float, seed: int = 2) -> ts.Batch:
    """l^old is the true log-prob plus noise of about the clip range, so ratios leave 1 and some clip."""
    tokens, positions, segments, mask, logp = rollouts
    rng = np.random.default_rng(seed)
    old = np.where(mask > 0, logp + rng.normal(0, noise, (B, NEW)), 0).astype(np.float32)
    sampler = np.where(mask > 0, old + rng.normal(0, 0.05, (B, NEW)), 0).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    return ts.Batch(tokens, positions, segments, jnp.asarray(mask), jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(adv))


def reference_logprobs(params, tokens, positions, segments, temperature):
    """Full [B, S, V] logits, float32 log-softmax: the thing the train step must never build."""
    logits = models.logits(MODEL, params, tokens[:, :-1], positions[:, :-1], segments[:, :-1])[:, -NEW:]
    logz = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    logp = jnp.take_along_axis(logz, tokens[:, -NEW:, None], axis=-1)[..., 0]
    return logp, -(jnp.exp(logz) * logz).sum(-1)


def reference_loss(cfg: Config, params, ref_params, batch: ts.Batch, step: int = 0):
    """The unsplit batch's loss from full logits; step statistics (if the config needs them) from the
    same log-probs, with the documented random priority (a permutation keyed by seed and step)."""
    logp, entropy = reference_logprobs(params, batch.tokens, batch.positions, batch.segment_ids, cfg.sampling.temperature)
    ref = None
    if ref_params is not None:
        ref = reference_logprobs(ref_params, batch.tokens, batch.positions, batch.segment_ids, cfg.sampling.temperature)[0]
    stats = None
    if algorithms.needs_step_stats(cfg.algorithm):
        key = jax.random.fold_in(jax.random.key(cfg.train.seed), step)
        priority = jax.random.permutation(key, batch.mask.size).reshape(batch.mask.shape)
        stats = algorithms.step_stats(cfg.algorithm, logp, batch.old_logp, batch.advantages, batch.mask, entropy,
                                      priority, tokens=batch.tokens[:, -NEW:], group_size=cfg.sampling.group_size)
    loss, _ = algorithms.policy_loss(
        cfg.algorithm, logp, batch.old_logp, batch.advantages, batch.mask, ref_logp=ref,
        sampler_logp=batch.sampler_logp, entropy=entropy,
        normalizer=algorithms.normalizer(cfg.algorithm, batch.mask, NEW), stats=stats,
    )
    return loss


def assert_same_update(params, expected, got):
    """Two (state, finalized metrics) of one update from `params` in two layouts agree: every metric, and
    every parameter's change (under SGD at rate 1, the gradient)."""
    (state_expected, m_expected), (state_got, m_got) = expected, got
    assert m_expected.keys() == m_got.keys() and m_expected["grad_norm"] > 0
    for name in m_expected:
        np.testing.assert_allclose(m_got[name], m_expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for p, a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state_got.params), jax.tree.leaves(state_expected.params)):
        np.testing.assert_allclose(p - a, p - b, rtol=1e-4, atol=1e-7)


# Jitted whole (the step's micro-batching, chunked log-probs and optax are not in it): op by op it took
# seconds longer per preset for the same numbers.
reference_grad = jax.jit(jax.value_and_grad(reference_loss, argnums=1), static_argnums=0)


def reference_adamw(params, grads, m, v, t, o: OptimConfig):
    """Global-norm clipping, then AdamW with bias correction, in float64 numpy."""
    g = [np.asarray(x, np.float64) for x in grads]
    norm = np.sqrt(sum((x**2).sum() for x in g))
    g = [x * min(1.0, o.max_grad_norm / norm) for x in g]
    m = [o.b1 * a + (1 - o.b1) * x for a, x in zip(m, g)]
    v = [o.b2 * a + (1 - o.b2) * x**2 for a, x in zip(v, g)]
    new = [
        p - o.learning_rate * ((a / (1 - o.b1**t)) / (np.sqrt(b / (1 - o.b2**t)) + o.eps) + o.weight_decay * p)
        for p, a, b in zip(params, m, v)
    ]
    return new, m, v, norm


MESHES = {"1 device": MeshConfig(data=1), "2x2x2": MeshConfig(data=2, fsdp=2, tensor=2)}
NOISE = {"gspo": 1e-3}  # GSPO's clip range is 3e-4 / 4e-4 on the sequence ratio


def compiled(preset: str, mesh: str, params, micro_batches: int = 2):
    """(cached jitted step, fresh initial state placed as the step expects it)."""
    cfg = config(preset, micro_batches)
    devices = jax.devices()[: math.prod(getattr(MESHES[mesh], a) for a in sharding.MESH_AXES)]
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, 10, sharding.make_mesh(MESHES[mesh], devices))
    return step, jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding)


_REFERENCE: dict[str, list] = {}  # preset -> trajectory; params and rollouts are module fixtures


def reference_trajectory(preset: str, params, rollouts) -> list:
    """(loss, grad norm, params) after each of two updates: full logits, unsplit batch, numpy AdamW."""
    if preset in _REFERENCE:
        return _REFERENCE[preset]
    cfg = config(preset)
    batch = make_batch(rollouts, NOISE.get(preset, 0.2))
    ref_params = jax.tree.map(lambda p: p * 1.01, params) if cfg.algorithm.beta > 0 else None
    leaves, treedef = jax.tree.flatten(params)
    p_ref = [np.asarray(x, np.float64) for x in leaves]
    m, v = [np.zeros_like(x) for x in p_ref], [np.zeros_like(x) for x in p_ref]
    out = []
    for t in (1, 2):  # the second update sees moved params and non-zero Adam moments
        current = jax.tree.unflatten(treedef, [jnp.asarray(x, jnp.float32) for x in p_ref])
        loss, grads = reference_grad(cfg, current, ref_params, batch)
        p_ref, m, v, norm = reference_adamw(p_ref, jax.tree.leaves(grads), m, v, t, cfg.optim)
        out.append((float(loss), norm, p_ref))
    _REFERENCE[preset] = out
    return out


@pytest.mark.parametrize("preset, mesh, micro_batches", [
    ("grpo", "1 device", 2), ("gspo", "1 device", 2), ("gspo", "1 device", 1), ("dr_grpo", "1 device", 2),
    ("grpo", "2x2x2", 2), ("gtpo", "1 device", 2),
])
def test_jitted_step_equals_the_full_logits_reference(preset, mesh, micro_batches, params, rollouts):
    """Two updates with micro_batches=2 (or 1: no accumulation loop) equal the unsplit reference: exact
    accumulation, clipping, AdamW; on the (2,2,2) mesh (grpo: reference params sharded too) as on one device;
    gtpo: step statistics over groups and token ids, each group's rows in both micro-batches."""
    cfg = config(preset, micro_batches)
    batch = make_batch(rollouts, NOISE.get(preset, 0.2))
    ref_params = jax.tree.map(lambda p: p * 1.01, params) if cfg.algorithm.beta > 0 else None
    step, state = compiled(preset, mesh, params, micro_batches)
    for t, (loss, norm, p_ref) in enumerate(reference_trajectory(preset, params, rollouts), 1):
        state, metrics = step(state, ref_params, batch)
        metrics = metrics_lib.finalize(metrics)
        np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-4)
        if t == 1:  # gradient clipping and ratio clipping (for the losses that clip) are both exercised
            assert norm > cfg.optim.max_grad_norm
            assert preset == "gtpo" or 0 < metrics["clip_frac_low"] + metrics["clip_frac_high"] < 1
        for got, want in zip(jax.tree.leaves(state.params), p_ref):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    assert int(state.step) == 2 and int(state.skipped) == 0 and int(state.empty) == 0


def assert_untouched(before, after):
    """Params and optimizer state equal, bit for bit."""
    for a, b in zip(jax.tree.leaves((before.params, before.opt_state)), jax.tree.leaves((after.params, after.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_non_finite_update_is_skipped_and_counted(params, rollouts):
    step, state = compiled("gspo", "1 device", params)
    batch = make_batch(rollouts, NOISE["gspo"])
    state, _ = step(state, None, batch)
    for skipped, poison in enumerate((np.nan, np.inf), 1):
        before = jax.device_get(state)
        bad = dataclasses.replace(batch, advantages=batch.advantages.at[0].set(poison))
        state, metrics = step(state, None, bad)
        m = metrics_lib.finalize(metrics)
        assert not np.isfinite(m["loss"]) or not np.isfinite(m["grad_norm"])
        assert int(state.skipped) == skipped and int(state.step) == 1
        # one cause per skipped update, the first check that failed
        assert (m["skipped_updates"], m["nonfinite_loss"] + m["nonfinite_grad"], m["nonfinite_params"]) == (1, 1, 0)
        assert_untouched(before, state)
    state, _ = step(state, None, batch)  # and training goes on
    assert int(state.step) == 2 and int(state.skipped) == 2


def test_an_overflowing_learning_rate_never_keeps_non_finite_params(params, rollouts):
    """Issue 20.5: loss and gradient are finite, the updated parameters are not (1e39 overflows
    float32 to inf, as a learning rate of inf does); the update is skipped and named
    nonfinite_params (the old check let NaN params through)."""
    cfg = config("gspo")
    optimizer = optax.adamw(1e39)  # built directly: the run config may well refuse such a rate
    state = ts.init_state(jax.tree.map(jnp.copy, params), optimizer)
    step = jax.jit(functools.partial(ts.train_step, cfg, optimizer))
    new_state, metrics = step(state, None, make_batch(rollouts, NOISE["gspo"]))
    m = metrics_lib.finalize(metrics)
    assert np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert (m["nonfinite_loss"], m["nonfinite_grad"], m["nonfinite_params"], m["skipped_updates"]) == (0, 0, 1, 1)
    assert int(new_state.step) == 0 and int(new_state.skipped) == 1
    assert_untouched(state, new_state)


def test_a_minibatch_without_counted_tokens_is_not_an_update(params, rollouts):
    """Issue 13.3: zero loss and gradient, yet Adam's momentum (and weight decay) would move the
    params; the update is skipped: params, optimizer state and step untouched, counted as empty."""
    step, state = compiled("grpo", "1 device", params)
    batch = make_batch(rollouts, 0.2)
    ref_params = jax.tree.map(lambda p: p * 1.01, params)
    state, _ = step(state, ref_params, batch)  # a real update first: Adam has momentum now
    before = jax.device_get(state)
    empty = dataclasses.replace(batch, mask=jnp.zeros_like(batch.mask))
    state, metrics = step(state, ref_params, empty)
    m = metrics_lib.finalize(metrics)
    assert (m["empty_updates"], m["skipped_updates"], m["loss"], m["grad_norm"]) == (1, 0, 0, 0)
    assert (int(state.step), int(state.empty), int(state.skipped)) == (1, 1, 0)
    assert_untouched(before, state)


def test_a_loss_without_ratio_rejects_minibatches_before_compiling():
    """Issue 13.2: reinforce (gpg, opo, rloo) on minibatch 2 would train on the samples of an older
    policy without correction (measured log-ratio ~0.7); refused before anything compiles."""
    for preset in ("gpg", "opo", "rloo"):
        with pytest.raises(ValueError, match="has no importance ratio.*train.minibatches=1"):
            ts.compiled_train_step(config(preset, minibatches=2), 10, sharding.make_mesh(MESHES["1 device"], jax.devices()[:1]))


def test_step_statistics_are_those_of_the_whole_minibatch(params, rollouts):
    """Clip-Cov with top-entropy selection over 2 micro-batches: the decisions are taken on the whole
    minibatch by the no-grad pass, so loss and gradient equal the unsplit full-logits reference's
    with the decisions of the unsplit batch."""
    cfg = config("dapo", 2, loss="clip_cov", ratio=0.2, lb=0.0, ub=10.0,
                 top_entropy_quantile=0.5)
    batch = make_batch(rollouts, 0.2)
    loss, grads = jax.jit(jax.value_and_grad(reference_loss, argnums=1), static_argnums=(0, 2))(cfg, params, None, batch)
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, 10, sharding.make_mesh(MESHES["1 device"], jax.devices()[:1]))
    _, metrics = step(jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding), None, batch)
    m = metrics_lib.finalize(metrics)
    assert 0 < m["cov_selected_frac"] < 0.2 and m["top_entropy_kept_frac"] == pytest.approx(0.5, abs=0.05)
    np.testing.assert_allclose(m["loss"], loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m["grad_norm"], optax.tree.norm(grads), rtol=1e-4)


def test_schedule_warmup_then_cosine():
    sched = ts.learning_rate(OptimConfig(learning_rate=1.0, warmup_steps=4, schedule="cosine"), total_updates=12)
    np.testing.assert_allclose([sched(s) for s in (0, 2, 4, 8, 12)], [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
    const = ts.learning_rate(OptimConfig(learning_rate=0.3), total_updates=12)
    np.testing.assert_allclose([const(s) for s in (0, 5, 100)], 0.3)


def test_tied_unembedding_is_not_copied(rollouts):
    """Training log-probs and their gradient use the tied [V, d] table as is: no [d, V] copy (a
    vocabulary over one 2048-column tile makes the chunked path slice it inside its loops)."""
    tokens, positions, segments, mask, _ = rollouts
    cfg = dataclasses.replace(MODEL, vocab_size=2100)

    def loss(p):
        logp, ent = ts.completion_logprobs(cfg, 0.7, p, tokens, positions, segments, jnp.asarray(mask), True)
        return logp.sum() + ent.sum()

    params = jax.eval_shape(lambda: models.init(cfg, jax.random.key(0)))
    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    d, v = cfg.hidden_size, cfg.vocab_size
    assert f"[{v},{d}]" in hlo and f"[{d},{v}]" not in hlo


@pytest.mark.parametrize("impl, full_logits", [("naive", True), ("chunked", False)])
def test_logprobs_impl_switch_reaches_the_kernel(rollouts, impl, full_logits):
    """ModelConfig.logprobs_impl picks the training log-prob path: only "naive" holds [rows, V] logits."""
    tokens, positions, segments, mask, _ = rollouts
    cfg = dataclasses.replace(MODEL, vocab_size=2100, logprobs_impl=impl)
    logprobs = lambda p: ts.completion_logprobs(cfg, 1.0, p, tokens, positions, segments, jnp.asarray(mask))[0]  # noqa: E731
    params = jax.eval_shape(lambda: models.init(cfg, jax.random.key(0)))
    hlo = jax.jit(logprobs).lower(params).compile().as_text()
    assert (f"{mask.size},{cfg.vocab_size}]" in hlo) == full_logits


@pytest.mark.parametrize("preset, micro_batches, fields", [
    ("gspo", 1, {}),
    # step statistics (the no-grad pass), a reference model (beta > 0), accumulation over 2 micro-batches
    ("dapo", 2, dict(loss="clip_cov", ratio=0.2, lb=0.0, ub=10.0, top_entropy_quantile=0.5,
                  beta=0.04)),
])
def test_on_policy_update_without_old_logprobs_equals_the_two_pass_update(preset, micro_batches, fields, params, rollouts):
    """num_iterations 1, minibatches 1: with Batch.old_logp None the update takes sg(l) from its own
    forward; loss, gradient and every metric equal those of the update given l^old from a separate
    forward under the same params (the two-pass form). SGD at rate 1 exposes the raw gradient."""
    cfg = config(preset, micro_batches, **fields)
    tokens, positions, segments, mask, _ = rollouts
    two_pass = make_batch(rollouts, 0.0)
    old, _ = ts.completion_logprobs(MODEL, cfg.sampling.temperature, params, tokens, positions, segments, two_pass.mask)
    two_pass = dataclasses.replace(two_pass, old_logp=old)
    ref_params = jax.tree.map(lambda p: p * 1.01, params) if cfg.algorithm.beta > 0 else None
    sgd = optax.sgd(1.0)
    step = jax.jit(functools.partial(ts.train_step, cfg, sgd))
    outs = [step(ts.init_state(params, sgd), ref_params, b) for b in (two_pass, dataclasses.replace(two_pass, old_logp=None))]
    (state_2, m_2), (state_1, m_1) = [(s, metrics_lib.finalize(m)) for s, m in outs]
    assert ts.on_policy(cfg) and m_1.keys() == m_2.keys() and m_1["grad_norm"] > 0
    for name in m_2:
        np.testing.assert_allclose(m_1[name], m_2[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for p, a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state_1.params), jax.tree.leaves(state_2.params)):
        np.testing.assert_allclose(p - a, p - b, rtol=1e-4, atol=1e-7)  # the gradients


def test_old_logprobs_are_required_off_policy(params, rollouts):
    cfg = config("gspo", minibatches=2)
    batch = dataclasses.replace(make_batch(rollouts, 0.0), old_logp=None)
    sgd = optax.sgd(1.0)
    with pytest.raises(ValueError, match="old_logp is None.*train.minibatches=2"):
        ts.train_step(cfg, sgd, ts.init_state(params, sgd), None, batch)


def test_log_ratio_extremes_against_float64_numpy(params, rollouts):
    """The step's token log-ratio extremes (the GMPO paper's ratio range: experiments/method_orderings.py):
    log_ratio_abs_max, ratio_max and ratio_min of two updates over 2 micro-batches each, merged as the
    trainer merges a step's updates, equal max |l - l^old|, exp(max) and exp(min) over the counted tokens of
    both updates, each update's l from the full-logits reference at its params, in float64 numpy."""
    cfg = config("grpo", 2)
    batch = make_batch(rollouts, 0.2)
    ref_params = jax.tree.map(lambda p: p * 1.01, params)  # its KL term (beta 0.04) does not enter the ratios
    step, state = compiled("grpo", "1 device", params)
    mask = np.asarray(batch.mask) > 0
    parts, d = [], []
    for _ in range(2):  # each update's forward is at the params before it
        logp, _ = jax.jit(reference_logprobs, static_argnums=4)(state.params, batch.tokens, batch.positions,
                                                                batch.segment_ids, cfg.sampling.temperature)
        d.append((np.asarray(logp, np.float64) - np.asarray(batch.old_logp, np.float64))[mask])
        state, metrics = step(state, ref_params, batch)
        parts.append(metrics)
    d = np.concatenate(d)
    m = metrics_lib.finalize(metrics_lib.combine_all(parts))
    assert np.abs(d).max() > 0.3  # l^old's noise (0.2) puts ratios well away from 1
    np.testing.assert_allclose(m["log_ratio_abs_max"], np.abs(d).max(), rtol=1e-4)
    np.testing.assert_allclose(m["ratio_max"], np.exp(d.max()), rtol=1e-4)
    np.testing.assert_allclose(m["ratio_min"], np.exp(d.min()), rtol=1e-4)
