"""Metric: weighted means, sums and extremes merge exactly, across jit and scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import metrics
from grpo_jax.metrics import Metric


def test_merging_parts_equals_the_whole():
    x = np.array([1.0, 5.0, -2.0, 4.0, 3.0])
    w = np.array([1.0, 0.0, 2.0, 1.0, 1.0])  # the 5.0 has weight 0: it counts nowhere
    whole = {"m": Metric.mean(x, w), "s": Metric.sum(x > 0), "hi": Metric.max(x, w), "lo": Metric.min(x, w)}
    parts = [{"m": Metric.mean(x[i], w[i]), "s": Metric.sum(x[i] > 0), "hi": Metric.max(x[i], w[i]),
              "lo": Metric.min(x[i], w[i])} for i in range(5)]
    got, want = metrics.finalize(metrics.combine_all(parts)), metrics.finalize(whole)
    assert {k: float(v) for k, v in got.items()} == {k: float(v) for k, v in want.items()}
    assert float(want["m"]) == pytest.approx((1 - 4 + 4 + 3) / 5) and float(want["s"]) == 4
    assert float(want["hi"]) == 4 and float(want["lo"]) == -2


def test_a_mean_of_means_is_not_what_merging_gives():
    """Two updates: loss 1.0 over 1 token and 3.0 over 3 tokens merge to 2.5, not 2.0; counters add."""
    a = {"loss": Metric(jnp.float32(1.0), jnp.float32(1.0), "mean"), "skipped": Metric.sum(1.0)}
    b = {"loss": Metric(jnp.float32(9.0), jnp.float32(3.0), "mean"), "skipped": Metric.sum(1.0)}
    m = metrics.finalize(metrics.combine(a, b))
    assert float(m["loss"]) == 2.5 and float(m["skipped"]) == 2.0


def test_nothing_counted_reads_zero_and_scan_outputs_reduce():
    empty = {"m": Metric.mean(np.ones(3), np.zeros(3)), "hi": Metric.max(np.ones(3), np.zeros(3))}
    assert {k: float(v) for k, v in metrics.finalize(empty).items()} == {"m": 0.0, "hi": 0.0}

    def step(carry, x):
        return carry, {"m": Metric.mean(x, 1.0), "hi": Metric.max(x), "s": Metric.sum(x > 1)}

    _, stacked = jax.jit(lambda xs: jax.lax.scan(step, 0, xs))(jnp.array([1.0, 2.0, 4.0]))
    m = metrics.finalize(metrics.reduce_stacked(stacked))
    assert float(m["m"]) == pytest.approx(7 / 3) and (float(m["hi"]), float(m["s"])) == (4.0, 2.0)


def test_mismatched_metrics_are_errors():
    with pytest.raises(ValueError, match="cannot merge a 'mean' metric with a 'max'"):
        Metric.mean(1.0).merge(Metric.max(1.0))
    with pytest.raises(ValueError, match="metrics differ"):
        metrics.combine({"a": Metric.sum(1.0)}, {"b": Metric.sum(1.0)})
    with pytest.raises(ValueError, match="reduction='avg'"):
        Metric(jnp.float32(0), jnp.float32(0), "avg")


def test_ratio_by_length_against_float64_numpy():
    """Per length bucket: the within-completion variance of the token log-ratios, the |mean| log-ratio and
    the count, from a numpy float64 loop over completions (lengths 1, 3, 5, 9; edges (2, 6))."""
    from grpo_jax import algorithms

    rng = np.random.default_rng(0)
    lengths, width = np.array([1, 3, 5, 9]), 10
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.float32)
    logp, old = rng.normal(size=(2, 4, width)).astype(np.float32)
    got = {k: float(m.read()) for k, m in algorithms.ratio_by_length(logp, old, mask, (2, 6)).items()}
    d = [(logp[i] - old[i]).astype(np.float64)[:n] for i, n in enumerate(lengths)]
    buckets = {"0-2": [0], "2-6": [1, 2], "6-inf": [3]}
    for name, rows in buckets.items():
        assert got[f"length/sequences@{name}"] == len(rows)
        np.testing.assert_allclose(got[f"ratio/seq_log_ratio_abs@{name}"], np.mean([abs(d[i].mean()) for i in rows]),
                                   rtol=1e-5)
        var = [d[i].var(ddof=1) for i in rows if lengths[i] >= 2]
        np.testing.assert_allclose(got[f"ratio/token_log_var@{name}"], np.mean(var) if var else 0.0, rtol=1e-5)
    from grpo_jax.config import TrainConfig

    assert TrainConfig(length_buckets=(64, 128)).length_buckets == (64, 128)
    for bad in ((0,), (64, 64), (128, 64)):
        with pytest.raises(ValueError, match="length_buckets=.* must be increasing positive token counts"):
            TrainConfig(length_buckets=bad)
