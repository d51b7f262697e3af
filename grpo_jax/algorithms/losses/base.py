"""The loss registry, what a loss sees (`LossInputs` per micro-batch, `StepBatch` for statistics over
the whole optimizer step) and returns (`LossTerms`), and the clipped surrogate shared by the
ratio_clip-kernel losses."""

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

import kernels
from grpo_jax.algorithms.aggregation import UNITS, seq_mean_over_tokens
from grpo_jax.algorithms.ratio import clamped_exp, clipped_surrogate
from grpo_jax.metrics import Metric
from grpo_jax.registry import Params, Registry

sg = jax.lax.stop_gradient
KERNELS = (None, "ratio_clip")


@dataclasses.dataclass(frozen=True)
class LossInputs:
    """One micro-batch as a loss sees it (float32; masked entries of logp/old_logp are 0)."""

    logp: Float[ArrayLike, "batch seq"]  # carries the gradient
    old_logp: Float[ArrayLike, "batch seq"]
    advantages: Float[ArrayLike, "batch seq"] | Float[ArrayLike, " batch"]  # per token (0 where masked) or per sequence
    mask: Float[ArrayLike, "batch seq"]
    stats: dict  # this micro-batch's rows of the loss's step statistics ({} unless it declares `stats`)

    def seq_mean(self, x):
        """(1/L_i) sum_t m x per completion."""
        return seq_mean_over_tokens(x, self.mask)

    def unit_weight(self, like):
        """Weights of the units of `like`: the mask for [batch, seq], non-empty completions for [batch]."""
        return self.mask if like.ndim == 2 else (self.mask.sum(-1) > 0).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """The whole optimizer-step batch, as a loss's step statistics see it (float32, detached, 0 where
    masked). Rows [k G, (k + 1) G) are group k (G = group_size), as the trainer lays them out."""

    logp: Float[ArrayLike, "batch seq"]
    old_logp: Float[ArrayLike, "batch seq"]
    advantages: Float[ArrayLike, "batch seq"]  # per token
    mask: Float[ArrayLike, "batch seq"]
    entropy: Float[ArrayLike, "batch seq"]
    priority: Int[ArrayLike, "batch seq"]  # a random permutation of the token slots (Clip-Cov's random choice)
    tokens: Int[ArrayLike, "batch seq"]  # the completion token ids
    group_size: int

    @property
    def counted(self) -> Bool[Array, " batch"]:
        """Completions with at least one counted token."""
        return self.mask.sum(-1) > 0

    def seq_mean(self, x) -> Float[Array, " batch"]:
        """(1/L_i) sum_t m x per completion (the completion's advantage, for x = advantages)."""
        return seq_mean_over_tokens(x, self.mask)

    def grouped(self, x):
        """[batch, ...] -> [groups, G, ...]."""
        return x.reshape(-1, self.group_size, *x.shape[1:])

    def per_row(self, x):
        """[groups, G, ...] -> [batch, ...]; [groups] -> [batch] (each row gets its group's value)."""
        x = jnp.broadcast_to(x[:, None], (x.shape[0], self.group_size)) if x.ndim == 1 else x
        return x.reshape(-1, *x.shape[2:])


class LossTerms(NamedTuple):
    u: Float[Array, "..."]  # unit losses, [batch, seq] or [batch]
    clipped_low: Bool[Array, "..."] | None = None  # None: the loss never clips
    clipped_high: Bool[Array, "..."] | None = None
    metrics: dict | None = None  # extra diagnostics, {name: Metric}


@dataclasses.dataclass(frozen=True)
class LossSpec:
    fn: Callable[["LossParams", LossInputs], LossTerms]
    params: type  # its parameter dataclass (a LossParams): the value of AlgorithmConfig.loss
    unit: str  # "token" or "sequence"
    ratio: bool  # uses l^old (an importance ratio or a trust region): may run several updates per rollout batch
    kernel: str | None  # "ratio_clip": runs through kernels.ratio_clip, as its params' ratio_impl picks
    reference: Callable  # float64 unit reference `reference(params, completion)`, see algorithms.reference
    # Statistics over the whole optimizer-step batch, `stats(params, StepBatch) -> {name: per-row array}`
    # (leading axis: the rows), computed once per update by `step_stats` and split with the rows.
    stats: Callable | None = None
    stats_reference: Callable | None = None
    needs_groups: bool = False  # its statistics read whole groups: every minibatch must hold whole groups
    # At ratio 1 (l = l^old) the gradient equals REINFORCE's with the same aggregation (sequence units:
    # seq_mean_token_mean) and these per-token advantages `on_policy(params, x)`; None: the loss's own.
    on_policy: Callable | None = None
    # Parameter values under which both branches of the loss (clipped and not, selected and not) occur
    # on the small random batches of the registry-wide tests; {}: its defaults do.
    test_params: dict = dataclasses.field(default_factory=dict)


LOSSES: Registry[LossSpec] = Registry("loss")


class LossParams(Params):
    """Base of a loss's parameters (`AlgorithmConfig.loss`)."""

    registry, path = LOSSES, "algorithm.loss"


def loss(name: str, *, unit: str, ratio: bool, reference: Callable, params: type | None = None,
         kernel: str | None = None, stats: Callable | None = None, stats_reference: Callable | None = None,
         needs_groups: bool = False, on_policy: Callable | None = None, test_params: dict | None = None):
    """Registers a policy loss under `name` with its parameter class (`AlgorithmConfig.loss`); see `LossSpec`."""
    if unit not in UNITS:
        raise ValueError(f"loss {name!r}: unit={unit!r}; choose one of {UNITS}")
    if kernel not in KERNELS:
        raise ValueError(f"loss {name!r}: kernel={kernel!r}; choose one of {KERNELS}")
    if (stats is None) != (stats_reference is None):
        raise ValueError(f"loss {name!r}: step statistics `stats` need their float64 `stats_reference` (and vice versa)")
    if needs_groups and stats is None:
        raise ValueError(f"loss {name!r}: needs_groups=True is about its step statistics; declare `stats`")
    def register(fn):
        cls = LOSSES.params_class(name, params, LossParams, fn.__module__)
        if kernel == "ratio_clip" and not issubclass(cls, Clip):
            raise ValueError(f"loss {name!r}: the ratio_clip kernel path reads a Clip's parameters; subclass Clip")
        cls(**(test_params or {}))  # the test values must be valid parameters
        LOSSES.add(name, LossSpec(fn, cls, unit, ratio, kernel, reference, stats, stats_reference, needs_groups,
                                  on_policy, dict(test_params or {})))
        return fn

    return register


RATIO_IMPLS = ("auto", "reference", *kernels.RATIO_CLIP_IMPLS)


def ratio_bounds(p, low: str = "eps_low", high: str = "eps_high") -> dict:
    """The validation rules of a ratio clip [1 - p.<low>, 1 + p.<high>] (for `Params.check`)."""
    return {low: (0 <= getattr(p, low) < 1, "must lie in [0, 1): the lower ratio bound 1 - eps must stay > 0"),
            high: (getattr(p, high) >= 0, "must be >= 0")}


@dataclasses.dataclass(frozen=True)
class Clip(LossParams):
    """The clipped importance-ratio surrogate's parameters: the ratio clip [1 - eps_low, 1 + eps_high],
    `delta` caps the unclipped ratio (two-sided clip, > 1 + eps_high), `clip_c` the dual clip for A < 0
    (> 1). `ratio_impl` picks how it runs: auto (kernels.ratio_clip's default: pallas on TPU, else
    jnp), reference (algorithms.ratio, plain autodiff), or a kernels.ratio_clip impl by name."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    delta: float | None = None
    clip_c: float | None = None
    ratio_impl: str = "auto"

    def __post_init__(self):
        self.check({
            **ratio_bounds(self),
            "delta": (self.delta is None or self.delta > 1 + self.eps_high,
                      f"must exceed 1 + eps_high = {1 + self.eps_high} (or be None)"),
            "clip_c": (self.clip_c is None or self.clip_c > 1, "must be > 1: the dual clip bounds the loss of A < 0"),
            "ratio_impl": (self.ratio_impl in RATIO_IMPLS, f"is unknown; known: {', '.join(RATIO_IMPLS)}"),
        })


def surrogate(p: Clip, x: LossInputs, log_ratio, adv) -> LossTerms:
    """The clipped surrogate through `p.ratio_impl`: the fused kernel (`kernels.ratio_clip`, same
    values and gradients) or the jnp reference it replaces; counts the units capped by `delta`."""
    if p.ratio_impl == "reference":
        u, low, high = clipped_surrogate(log_ratio, adv, p.eps_low, p.eps_high, p.delta, p.clip_c)
    else:
        impl = None if p.ratio_impl == "auto" else p.ratio_impl
        u, low, high = kernels.ratio_clip(log_ratio, adv, p.eps_low, p.eps_high, p.delta, p.clip_c, impl=impl)
    metrics = {}
    if p.delta is not None:
        capped = clamped_exp(sg(log_ratio)) > p.delta
        metrics["delta_capped_frac"] = Metric.mean(capped, x.unit_weight(log_ratio))
    return LossTerms(u, low, high, metrics)


SURROGATE = dict(ratio=True, kernel="ratio_clip")
CLIP_TEST = dict(eps_low=0.1, eps_high=0.15)  # narrower than the test batches' noise: both branches occur
