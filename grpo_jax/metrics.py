"""`Metric`: a value that knows how to merge with another of its kind, so accumulation stays exact.

A metric is (value, weight, reduction): for "mean" the value is the weighted sum and the weight the
sum of weights; "sum" counts (skipped updates, dropped groups); "max"/"min" keep the extreme of the
entries with weight > 0. Micro-batches, devices and the updates of an RL step all merge with
`combine` and are read once with `finalize`, so a step metric is never an average of means and a
counter is never averaged. The reduction is static pytree metadata: metrics cross jit boundaries and
`lax.scan` as (value, weight) leaves.
"""

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

REDUCTIONS = ("mean", "sum", "max", "min")


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metric:
    value: Float[Array, ""]
    weight: Float[Array, ""]
    reduction: str = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def mean(cls, x, weight=None) -> "Metric":
        """The weighted mean of x (all entries weight 1 if `weight` is None)."""
        x, w = _with_weights(x, weight)
        return cls((x * w).sum(), w.sum(), "mean")

    @classmethod
    def sum(cls, x) -> "Metric":
        """A count or total: merged by adding, read as is."""
        x = jnp.asarray(x, jnp.float32)
        return cls(x.sum(), jnp.float32(x.size), "sum")

    @classmethod
    def max(cls, x, weight=None) -> "Metric":
        """The largest x among entries of weight > 0."""
        return cls._extreme(x, weight, "max")

    @classmethod
    def min(cls, x, weight=None) -> "Metric":
        """The smallest x among entries of weight > 0."""
        return cls._extreme(x, weight, "min")

    @classmethod
    def _extreme(cls, x, weight, reduction):
        x, w = _with_weights(x, weight)
        pick, fill = (jnp.max, -jnp.inf) if reduction == "max" else (jnp.min, jnp.inf)
        return cls(pick(jnp.where(w > 0, x, fill)), w.sum(), reduction)

    def __post_init__(self):
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"Metric.reduction={self.reduction!r}; choose one of {REDUCTIONS}")

    def merge(self, other: "Metric") -> "Metric":
        if other.reduction != self.reduction:
            raise ValueError(f"cannot merge a {self.reduction!r} metric with a {other.reduction!r} one")
        if self.reduction in ("mean", "sum"):
            value = self.value + other.value
        else:
            value = (jnp.maximum if self.reduction == "max" else jnp.minimum)(self.value, other.value)
        return Metric(value, self.weight + other.weight, self.reduction)

    def read(self) -> Float[Array, ""]:
        """The plain number: the weighted mean, the total, or the extreme; 0 where nothing counted."""
        if self.reduction == "sum":
            return jnp.asarray(self.value, jnp.float32)
        value = self.value / jnp.maximum(self.weight, 1e-30) if self.reduction == "mean" else self.value
        return jnp.where(self.weight > 0, value, 0.0)


def _with_weights(x, weight):
    x = jnp.asarray(x, jnp.float32)
    return jnp.broadcast_arrays(x, jnp.ones_like(x) if weight is None else jnp.asarray(weight, jnp.float32))


Metrics = Mapping[str, Metric]


def combine(a: Metrics, b: Metrics) -> dict[str, Metric]:
    """Merges two sets of metrics of the same names (micro-batches, devices or updates)."""
    if a.keys() != b.keys():
        raise ValueError(f"metrics differ: {sorted(set(a) ^ set(b))}")
    return {name: a[name].merge(b[name]) for name in a}


def combine_all(parts: Sequence[Metrics]) -> dict[str, Metric]:
    return functools.reduce(combine, parts)


def reduce_stacked(stacked: Metrics) -> dict[str, Metric]:
    """Merges metrics stacked along a leading axis (the outputs of `lax.scan`) into one each."""
    def one(m: Metric) -> Metric:
        if m.reduction in ("mean", "sum"):
            value = m.value.sum(0)
        else:
            value = (m.value.max if m.reduction == "max" else m.value.min)(0)
        return Metric(value, m.weight.sum(0), m.reduction)

    return {name: one(m) for name, m in stacked.items()}


def finalize(metrics: Metrics) -> dict[str, Float[Array, ""]]:
    """Plain values of every metric (see `Metric.read`)."""
    return {name: m.read() for name, m in metrics.items()}


EDGES_RULE = "must be increasing positive token counts, e.g. (32, 64)"


def edges_increase(edges: Sequence[int]) -> bool:
    """Whether `edges` are length-bucket edges (EDGES_RULE): the check of every config field that holds them."""
    return all(a < b for a, b in zip((0, *edges), edges))


def length_buckets(edges: Sequence[int]) -> list[tuple[int, float, str]]:
    """(lo, hi, name) of the length classes [0, e1), [e1, e2), ..., [ek, inf) of the token counts `edges`,
    named "LO-HI" ("LO-inf" the last): the one naming of `train.length_buckets` (the train step's ratio
    metrics) and of a task's example "bucket" (the evaluation's accuracy per class)."""
    return [(lo, math.inf if hi is None else hi, f"{lo}-{'inf' if hi is None else hi}")
            for lo, hi in zip((0, *edges), (*edges, None))]
