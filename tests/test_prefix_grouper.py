"""Prefix Grouper (train.prefix_grouper, arXiv 2506.05433): encoding each group's prompt once in the
training forwards gives the log-probs, entropies, losses and gradients of encoding it in every row."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import metrics as metrics_lib
from grpo_jax import models, sharding
from grpo_jax import train_step as ts
from grpo_jax.config import MeshConfig
from test_train_step import MODEL, NEW, PROMPT, assert_same_update, config, reference_logprobs

G = 4  # config()'s sampling.group_size
PROMPT_LENGTHS = (PROMPT, 2)  # one full prompt, one left-padded


@pytest.fixture(scope="module")
def params():
    return models.init(MODEL, jax.random.key(3))


@pytest.fixture(scope="module")
def grouped(params):
    """Two groups of G rows, each group one prompt; completion lengths from 0 to NEW."""
    rng = np.random.default_rng(4)
    lengths = np.repeat(PROMPT_LENGTHS, G)
    prompts = np.where(np.arange(PROMPT) >= PROMPT - lengths[:, None],
                       np.repeat(rng.integers(3, 48, (len(PROMPT_LENGTHS), PROMPT)), G, axis=0), 0)
    completion_lengths = np.array([NEW, 0, 3, 1, 2, NEW, 5, NEW])
    mask = (np.arange(NEW) < completion_lengths[:, None]).astype(np.float32)
    completions = np.where(mask > 0, rng.integers(3, 48, mask.shape), 0)
    tokens, positions, segments = ts.sequences(jnp.asarray(prompts), jnp.asarray(lengths), jnp.asarray(completions))
    rows = len(lengths)
    old = np.asarray(reference_logprobs(params, tokens, positions, segments, 0.7)[0])
    old = np.where(mask > 0, old + rng.normal(0, 0.2, mask.shape), 0).astype(np.float32)  # ratios leave 1
    return ts.Batch(tokens, positions, segments, jnp.asarray(mask), jnp.asarray(old),
                    jnp.asarray(old), jnp.asarray(rng.normal(size=rows).astype(np.float32)))


def test_shared_prefix_forward_equals_the_forward_of_each_row(params, grouped):
    """models.forward_shared_prefix: the hidden states of each prompt (once) and of its G continuations
    are those `forward` gives each whole row (left padding and segment ids included), under remat too
    (the prefix reaches each layer as a scan input; without remat: the log-prob test below)."""
    cfg = dataclasses.replace(MODEL, remat="full")
    b = grouped  # continuations: the completions' first NEW - 2 tokens
    want = models.forward(cfg, params, b.tokens[:, :-2], b.positions[:, :-2], b.segment_ids[:, :-2])
    head = (x[::G, :PROMPT] for x in (b.tokens, b.positions, b.segment_ids))
    tail = (x[:, PROMPT:-2] for x in (b.tokens, b.positions, b.segment_ids))
    prefix_hidden, hidden = jax.jit(models.forward_shared_prefix, static_argnums=0)(cfg, params, *head, *tail)
    real = np.asarray(b.segment_ids[::G, :PROMPT]) > 0
    np.testing.assert_allclose(np.asarray(prefix_hidden)[real], np.asarray(want[::G, :PROMPT])[real], atol=1e-5)
    np.testing.assert_allclose(hidden, want[:, PROMPT:], atol=1e-5)
    assert hidden.shape == (len(b.tokens), NEW - 2, MODEL.hidden_size)
    with pytest.raises(ValueError, match="8 rows do not continue 3 prefixes"):
        models.forward_shared_prefix(cfg, params, *(x[:3, :PROMPT] for x in (b.tokens, b.positions, b.segment_ids)),
                                     *(x[:, PROMPT:-2] for x in (b.tokens, b.positions, b.segment_ids)))


def test_grouped_logprobs_and_entropies_equal_full_logits(params, grouped):
    b = grouped
    want_logp, want_entropy = reference_logprobs(params, b.tokens, b.positions, b.segment_ids, 0.7)
    logp, entropy = ts.completion_logprobs(MODEL, 0.7, params, b.tokens, b.positions, b.segment_ids, b.mask, True,
                                           group=G)
    m = np.asarray(b.mask) > 0
    np.testing.assert_allclose(np.asarray(logp)[m], np.asarray(want_logp)[m], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(entropy)[m], np.asarray(want_entropy)[m], rtol=1e-5, atol=1e-5)
    old, _ = ts.old_logprobs(MODEL, 0.7, params, b.tokens, b.positions, b.segment_ids, b.mask, group=G)
    np.testing.assert_allclose(np.asarray(old)[m], np.asarray(want_logp)[m], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset, micro_batches, mesh, fields", [
    ("gspo", 1, "2x2x2", {}),  # sharded (the prompt pass's 2 rows replicate over data x fsdp = 4, with a warning)
    # accumulation over micro-batches of one group each; step statistics (the no-grad pass) and a
    # reference model (beta > 0), both grouped
    ("dapo", 2, "1 device", dict(loss="clip_cov", ratio=0.2, lb=0.0, ub=10.0,
                                 top_entropy_quantile=0.5, beta=0.04)),
])
def test_grouped_update_equals_the_per_row_update(preset, micro_batches, mesh, fields, params, grouped):
    """Loss, gradient (SGD at rate 1 exposes it) and every metric of one update, with and without
    prefix grouping."""
    cfg = config(preset, micro_batches, **fields)
    ref_params = jax.tree.map(lambda p: p * 1.01, params) if cfg.algorithm.beta > 0 else None
    mesh_cfg = MeshConfig(data=2, fsdp=2, tensor=2) if mesh == "2x2x2" else MeshConfig(data=1)
    devices = jax.devices()[: math.prod(getattr(mesh_cfg, a) for a in sharding.MESH_AXES)]
    sgd = optax.sgd(1.0)
    outs = []
    for grouper in (False, True):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, prefix_grouper=grouper))
        with sharding.activation_rules(sharding.make_mesh(mesh_cfg, devices)):
            state, m = jax.jit(functools.partial(ts.train_step, c, sgd))(ts.init_state(params, sgd), ref_params, grouped)
        outs.append((state, metrics_lib.finalize(m)))
    assert_same_update(params, *outs)


def test_micro_batches_split_by_whole_groups():
    rows = jnp.arange(16)
    micro = ts._micro_batches(rows, 2, 4)
    np.testing.assert_array_equal(micro, [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]])
    np.testing.assert_array_equal(ts._unsplit(micro, 4), rows)
    np.testing.assert_array_equal(ts._micro_batches(rows, 2), [list(range(0, 16, 2)), list(range(1, 16, 2))])


def test_the_grouper_refuses_what_it_cannot_group():
    cfg = config("grpo", micro_batches=2, minibatches=2)
    grouped_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, prompts_per_step=6, prefix_grouper=True))
    with pytest.raises(ValueError, match=r"prompts_per_step=6 groups do not split into train.minibatches=2 x "
                                         r"train.micro_batches=2"):
        ts.check(grouped_cfg)
    ts.check(dataclasses.replace(grouped_cfg, train=dataclasses.replace(grouped_cfg.train, prompts_per_step=8)))
    moe = dataclasses.replace(MODEL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    with pytest.raises(ValueError, match="MoE model.*set train.prefix_grouper=False"):
        ts.check(dataclasses.replace(grouped_cfg, model=moe, train=dataclasses.replace(grouped_cfg.train, prompts_per_step=8)))
