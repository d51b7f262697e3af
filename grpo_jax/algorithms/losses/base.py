"""The loss registry, what a loss sees (`LossInputs` per micro-batch, `StepBatch` for statistics over
the whole optimizer step) and returns (`LossTerms`), and the clipped surrogate shared by the
ratio_clip-kernel losses."""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

import kernels
from grpo_jax.algorithms.aggregation import UNITS, seq_mean_over_tokens
from grpo_jax.algorithms.ratio import clamped_exp, clipped_surrogate
from grpo_jax.algorithms.registry import Registry
from grpo_jax.metrics import Metric

if TYPE_CHECKING:
    from grpo_jax.algorithms.config import AlgorithmConfig

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
    fn: Callable[["AlgorithmConfig", LossInputs], LossTerms]
    unit: str  # "token" or "sequence"
    ratio: bool  # uses l^old (an importance ratio or a trust region): may run several updates per rollout batch
    fields: tuple[str, ...]  # the AlgorithmConfig fields it reads (the others must stay default)
    kernel: str | None  # "ratio_clip": runs through kernels.ratio_clip, as AlgorithmConfig.ratio_impl picks
    reference: Callable  # float64 unit reference, see algorithms.reference
    # Statistics over the whole optimizer-step batch, `stats(cfg, StepBatch) -> {name: per-row array}`
    # (leading axis: the rows), computed once per update by `step_stats` and split with the rows.
    stats: Callable | None = None
    stats_reference: Callable | None = None
    needs_groups: bool = False  # its statistics read whole groups: every minibatch must hold whole groups
    # At ratio 1 (l = l^old) the gradient equals REINFORCE's with the same aggregation (sequence units:
    # seq_mean_token_mean) and these per-token advantages `on_policy(cfg, x)`; None: the loss's own.
    on_policy: Callable | None = None


LOSSES: Registry[LossSpec] = Registry("loss")


def loss(name: str, *, unit: str, ratio: bool, reference: Callable, fields: tuple[str, ...] = (),
         kernel: str | None = None, stats: Callable | None = None, stats_reference: Callable | None = None,
         needs_groups: bool = False, on_policy: Callable | None = None):
    """Registers a policy loss under `name` (the value of `AlgorithmConfig.loss`); see `LossSpec`."""
    if unit not in UNITS:
        raise ValueError(f"loss {name!r}: unit={unit!r}; choose one of {UNITS}")
    if kernel not in KERNELS:
        raise ValueError(f"loss {name!r}: kernel={kernel!r}; choose one of {KERNELS}")
    if (stats is None) != (stats_reference is None):
        raise ValueError(f"loss {name!r}: step statistics `stats` need their float64 `stats_reference` (and vice versa)")
    if needs_groups and stats is None:
        raise ValueError(f"loss {name!r}: needs_groups=True is about its step statistics; declare `stats`")

    def register(fn):
        LOSSES.add(name, LossSpec(fn, unit, ratio, tuple(fields), kernel, reference, stats, stats_reference,
                                  needs_groups, on_policy))
        return fn

    return register


def surrogate(cfg, x: LossInputs, log_ratio, adv) -> LossTerms:
    """The clipped surrogate through `cfg.ratio_impl`: the fused kernel (`kernels.ratio_clip`, same
    values and gradients) or the jnp reference it replaces; counts the units capped by `delta`."""
    if cfg.ratio_impl == "reference":
        u, low, high = clipped_surrogate(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c)
    else:
        impl = None if cfg.ratio_impl == "auto" else cfg.ratio_impl
        u, low, high = kernels.ratio_clip(log_ratio, adv, cfg.eps_low, cfg.eps_high, cfg.delta, cfg.clip_c, impl=impl)
    metrics = {}
    if cfg.delta is not None:
        capped = clamped_exp(sg(log_ratio)) > cfg.delta
        metrics["delta_capped_frac"] = Metric.mean(capped, x.unit_weight(log_ratio))
    return LossTerms(u, low, high, metrics)


SURROGATE_FIELDS = ("eps_low", "eps_high", "delta", "clip_c")
SURROGATE = dict(ratio=True, fields=SURROGATE_FIELDS, kernel="ratio_clip")
