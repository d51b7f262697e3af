"""Packing (train.packing): the training forwards over rows laid end to end give the log-probs, entropies,
metrics and gradients of the padded rows; the host plan places every row once, apart, within its device."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import models, packing, sharding, trainer
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import MeshConfig
from test_train_step import MODEL, NEW, PROMPT, assert_same_update, config, reference_logprobs

WIDTH = PROMPT + NEW - 1  # decoder inputs per row
ROWS = 16


def test_first_fit_decreasing_by_hand():
    """Inputs 4, 5, 0, 3, 8, 2, 2, 4 into rows of 10: 8 opens row 0, 5 row 1, 4 joins it at 5, the second 4
    opens row 2, 3 joins it at 4, the 2s fill row 0 at 8 and row 2 at 7; the empty row takes no room."""
    bins, offset, used = packing.first_fit_decreasing(np.array([4, 5, 0, 3, 8, 2, 2, 4]), 10)
    np.testing.assert_array_equal(bins, [1, 1, 0, 2, 0, 0, 2, 2])
    np.testing.assert_array_equal(offset, [5, 0, 0, 4, 0, 8, 7, 0])
    assert used == 3


def test_plan_takes_the_next_bucket_when_the_smallest_is_too_small():
    # 8 rows of prompt 2: 3 packed rows needed; the buckets of 8 rows are 2, 4, 6, 8 -> 4
    p = packing.plan(np.full(8, 2), np.array([3, 4, 0, 2, 7, 1, 1, 3]), 10, shards=1, micro_batches=1)
    assert packing.buckets(8) == [2, 4, 6, 8] and p.rows == 4
    np.testing.assert_array_equal(p.length, [4, 5, 0, 3, 8, 2, 2, 4])
    np.testing.assert_array_equal(p.row, [1, 1, 0, 2, 0, 0, 2, 2])
    np.testing.assert_array_equal(p.dest, p.row)
    assert packing.plan(np.full(8, 2), np.full(8, 9), 10, 1, 1).rows == 8  # full rows: one packed row each
    assert packing.plan(np.full(8, 2), np.zeros(8, int), 10, 1, 1).rows == 2  # nothing counted: the smallest
    assert packing.plan(np.full(8, 2), np.full(8, 1), 10, 1, 1).rows == 2  # 2 inputs each: 5 per packed row
    with pytest.raises(ValueError, match="a row of 11 inputs does not fit a packed row of 10"):
        packing.plan(np.full(8, 2), np.full(8, 10), 10, 1, 1)


def random_plan(seed, minibatches=2, shards=2, micro_batches=2, rows=32, width=20):
    rng = np.random.default_rng(seed)
    prompt_lengths = rng.integers(1, 8, rows)
    completion_lengths = np.where(rng.random(rows) < 0.2, 0, rng.integers(1, width - 6, rows))
    return prompt_lengths, completion_lengths, packing.plan(prompt_lengths, completion_lengths, width, shards,
                                                            micro_batches, minibatches)


@pytest.mark.parametrize("seed", range(5))
def test_every_row_is_placed_once_apart_in_its_device_and_micro_batch(seed):
    """Each counted row gets its own span of a packed row (no overlap, within the width), in the packed rows
    that its micro-batch slice and its device hold after `train_step._micro_batches`; its span is its
    prompt and completion less the last token."""
    minibatches, shards, k, width = 2, 2, 2, 20
    prompt_lengths, completion_lengths, p = random_plan(seed, minibatches, shards, k, width=width)
    size, share = 32 // minibatches, 32 // minibatches // shards
    np.testing.assert_array_equal(p.length, np.where(completion_lengths > 0, prompt_lengths + completion_lengths - 1, 0))
    assert p.rows == min(b for b in packing.buckets(share // k) if b >= p.rows)
    taken = np.zeros((minibatches, p.packed_rows, width), int)
    assert p.packed_rows == p.rows * shards * k
    for i in np.flatnonzero(p.length):
        m, local = divmod(i, size)
        assert p.dest[i] % k == local % k  # the micro-batch slice of its row
        assert p.dest[i] // (k * p.rows) == local // share  # the device of its row
        assert p.row[i] == p.dest[i] // k  # where the split puts it
        assert 0 <= p.offset[i] and p.offset[i] + p.length[i] <= width
        taken[m, p.dest[i], p.offset[i]:p.offset[i] + p.length[i]] += 1
    assert taken.max() == 1 and taken.sum() == p.length.sum()
    micro_rows = np.asarray(ts._micro_batches(jnp.arange(size), k))  # the rows of each micro-batch slice
    for m in range(minibatches):
        for j in range(k):
            rows = m * size + micro_rows[j]  # a slice's rows: device d holds its d-th block of share // k
            assert (p.row[rows][p.length[rows] > 0] // p.rows == np.flatnonzero(p.length[rows] > 0) // (share // k)).all()


@pytest.fixture(scope="module")
def params():
    return models.init(MODEL, jax.random.key(5))


@pytest.fixture(scope="module")
def rows(params):
    """16 rows of varied prompt and completion lengths (one empty completion), with l^old off
    the true log-probs so that ratios leave 1."""
    rng = np.random.default_rng(6)
    prompt_lengths = rng.integers(1, 4, ROWS)
    lengths = rng.integers(0, 4, ROWS)  # mostly short, as completions that stop early
    prompt_lengths[0], lengths[:3] = PROMPT, (NEW, 0, 1)  # one full row, an empty and a one-token completion
    prompts = np.where(np.arange(PROMPT) >= PROMPT - prompt_lengths[:, None], rng.integers(3, 48, (ROWS, PROMPT)), 0)
    mask = (np.arange(NEW) < lengths[:, None]).astype(np.float32)
    completions = rng.integers(3, 48, (ROWS, NEW))  # tokens past the mask too: packing must leave them out
    tokens, positions, segments = ts.sequences(jnp.asarray(prompts), jnp.asarray(prompt_lengths), jnp.asarray(completions))
    logp, entropy = reference_logprobs(params, tokens, positions, segments, 0.7)
    old = np.where(mask > 0, np.asarray(logp) + rng.normal(0, 0.2, mask.shape), 0).astype(np.float32)
    batch = ts.Batch(tokens, positions, segments, jnp.asarray(mask), jnp.asarray(old), jnp.asarray(old),
                     jnp.asarray(rng.normal(size=ROWS).astype(np.float32)))
    return batch, prompt_lengths, lengths, np.asarray(logp), np.asarray(entropy)


def packed(batch, prompt_lengths, lengths, shards=1, micro_batches=1) -> ts.Batch:
    p = packing.plan(prompt_lengths, lengths, WIDTH, shards, micro_batches)
    layout = packing.pack(batch.tokens, batch.positions, batch.segment_ids, NEW, *map(jnp.asarray, p.arrays()),
                          p.packed_rows)
    return dataclasses.replace(batch, packing=layout)


def test_packed_logprobs_and_entropies_equal_full_logits(params, rows):
    batch, prompt_lengths, lengths, want_logp, want_entropy = rows
    b = packed(batch, prompt_lengths, lengths)
    assert b.packing.tokens.shape[0] == ROWS // 2  # the 16 rows share 8 packed rows
    np.testing.assert_array_equal(np.sort(np.asarray(b.packing.tokens)[np.asarray(b.packing.segment_ids) > 0]),
                                  np.sort(np.concatenate([np.asarray(batch.tokens)[i, PROMPT - p:PROMPT + n - 1]
                                                          for i, (p, n) in enumerate(zip(prompt_lengths, lengths))
                                                          if n])))
    m = np.asarray(batch.mask) > 0
    for fn in (ts.completion_logprobs, ts.old_logprobs):
        logp, entropy = fn(MODEL, 0.7, params, b.tokens, b.positions, b.segment_ids, b.mask, True, packing=b.packing)\
            if fn is ts.completion_logprobs else (fn(MODEL, 0.7, params, b.tokens, b.positions, b.segment_ids, b.mask,
                                                     packing=b.packing)[0], None)
        np.testing.assert_allclose(np.asarray(logp)[m], want_logp[m], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(logp)[~m], 0)
        if entropy is not None:
            np.testing.assert_allclose(np.asarray(entropy)[m], want_entropy[m], rtol=1e-5, atol=1e-5)


def collectives(hlo: str) -> list[str]:
    """The compiled program's cross-device operations with their result shapes, e.g. 'all-reduce f32[2]'."""
    ops = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
    return sorted(re.sub(r"\{[^}]*\}", "", f"{op} {m}") for op in ops
                  for m in re.findall(rf"= (\S+) {op}(?:-start)?\(", hlo))


def test_packed_update_equals_the_padded_update_on_two_devices(params, rows):
    """Loss, gradient (SGD at rate 1 exposes it) and every metric of one update over 2 micro-batches with
    the rows split over 2 devices, packed and padded, with step statistics (a no-grad pass over every
    micro-batch) and a reference forward (beta > 0), both packed too. The packed update moves nothing more
    between devices than the padded one (gradient reductions, the step statistics' sorts): no row leaves
    its device."""
    batch, prompt_lengths, lengths, _, _ = rows
    cfg = config("dapo", micro_batches=2, loss="clip_cov", ratio=0.2, lb=0.0, ub=10.0,
                 top_entropy_quantile=0.5, beta=0.04)
    mesh = sharding.make_mesh(MeshConfig(data=2), jax.devices()[:2])
    ref_params = jax.tree.map(lambda p: p * 1.01, params) if cfg.algorithm.beta > 0 else None
    sgd = optax.sgd(1.0)
    state = ts.init_state(params, sgd)
    state_sharding = models.param_shardings(state, MODEL, mesh)
    ref_sharding = None if ref_params is None else models.param_shardings(ref_params, MODEL, mesh)
    outs, programs = [], []
    for on, b in ((False, batch), (True, packed(batch, prompt_lengths, lengths, shards=2, micro_batches=2))):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, packing=on))
        step = ts.jit_train_step(c, sgd, mesh, state_sharding, ref_sharding).lower(state, ref_params, b).compile()
        programs.append(collectives(step.as_text()))
        new_state, m = step(jax.tree.map(jnp.copy, state), ref_params, b)
        outs.append((new_state, metrics_lib.finalize(m)))
    assert packing.plan(prompt_lengths, lengths, WIDTH, 2, 2).rows < ROWS // 4  # a micro-batch share packs
    assert programs[1] == programs[0] and "all-reduce f32[]" in programs[0]
    assert_same_update(params, *outs)


def test_packing_refuses_what_it_cannot_lay_out(tmp_path):
    cfg = config("gspo")
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, packing=True))
    ts.check(on)
    with pytest.raises(ValueError, match="train.packing=True: train.prefix_grouper=True .*set train.packing=False "
                                         "or train.prefix_grouper=False"):
        ts.check(dataclasses.replace(on, train=dataclasses.replace(on.train, prefix_grouper=True)))
    from test_trainer import config as trainer_config  # 8 rows, 2 minibatches, 2 devices on the batch axes
    with pytest.raises(ValueError, match="train.packing=True packs each device's share of each micro-batch, but a "
                                         "minibatch of 4 rows does not split over 2 devices x train.micro_batches=4"):
        trainer.Trainer(trainer_config(tmp_path, micro_batches=4, packing=True))


def test_a_trainer_step_with_packing_equals_the_padded_step(tmp_path, monkeypatch):
    """Through the trainer (host plan from the sampled lengths, rows packed on device, 2 minibatches with
    l^old from the packed forward, rows over 2 devices): every metric of a step as without packing, whose
    forwards ran on fewer rows than the padded ones."""
    from test_trainer import config as trainer_config

    forwards = []  # the packed rows of each traced packed forward (l^old, the update)
    hidden = packing.completion_hidden
    monkeypatch.setattr(packing, "completion_hidden",
                        lambda cfg, params, layout, *a: forwards.append(layout.tokens.shape) or hidden(cfg, params, layout, *a))
    timing = ("time/", "throughput/", "reward/time_s")
    steps = []
    for on in (False, True):
        cfg = trainer_config(tmp_path / str(on), "gspo", prompts_per_step=4, packing=on)
        cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, max_new_tokens=8))
        metrics, _ = trainer.Trainer(cfg).train_step()
        steps.append({k: v for k, v in metrics.items() if not k.startswith(timing)})
    padded, packed_step = steps
    rows_frac = packed_step.pop("packing/rows_frac")
    assert rows_frac < 1 and 0 < packed_step.pop("packing/fill") <= 1
    assert len(forwards) == 2 and all(shape == (rows_frac * 8, 13) for shape in forwards)  # of 8 rows of 6 + 8 - 1
    assert padded.keys() == packed_step.keys() and padded["clip_frac_high"] + padded["clip_frac_low"] > 0
    for name in padded:
        np.testing.assert_allclose(packed_step[name], padded[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("replay", ["none", "old", "sampler"])
def test_a_moe_trainer_step_with_packing_equals_the_padded_step(tmp_path, replay):
    """A Qwen3-MoE policy through the trainer, rows over 2 devices, 2 minibatches: packed, the l^old
    forward records pi_old's routes in the padded rows' layout, the update replays them (R2) or the
    sampler's (R3) on the tokens they belong to, and the routing metrics read the counted tokens: every
    metric of the padded step, on fewer rows."""
    from test_routing import moe_run

    steps = []
    for on in (False, True):
        cfg = moe_run(tmp_path / str(on), replay)
        cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, max_prompt_len=10),
                                  train=dataclasses.replace(cfg.train, packing=on))
        metrics, _ = trainer.Trainer(cfg).train_step()
        steps.append({k: v for k, v in metrics.items() if not k.startswith(("time/", "throughput/", "reward/time_s"))})
    padded, packed_step = steps
    assert packed_step.pop("packing/rows_frac") < 1 and 0 < packed_step.pop("packing/fill") <= 1
    assert padded.keys() == packed_step.keys() and "routing/changed_sets_frac" in padded
    for name in padded:
        np.testing.assert_allclose(packed_step[name], padded[name], rtol=1e-4, atol=1e-6, err_msg=name)
