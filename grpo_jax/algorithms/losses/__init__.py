"""Policy losses: the registry (`base`) and every loss of docs/algorithms.md as one function, by family:
`clipped` (PPO/GRPO, GSPO and the variants of the clipped ratio), `soft` (no hard min: GMPO, SAPO,
SSPO, CISPO, REINFORCE), `covariance` (Clip-Cov, KL-Cov), `group` (GVPO, DisCO, GTPO, EGSW: units
that depend on the rest of their group).

A loss is `fn(p, x: LossInputs) -> LossTerms`, registered with `@loss(name, params=P, ...)` which
declares everything the rest of the code must know about it (see `LossSpec`): its parameter
dataclass P (a `LossParams`; `p` is the instance `AlgorithmConfig.loss` holds), its unit (token: u is
[batch, seq]; sequence: u is [batch]), whether it uses l^old (then it may run several updates per
rollout batch), its fused-kernel path, its float64 reference, the parameter values its tests use,
its step statistics (decisions over the whole optimizer-step batch, run once per update by
`step_stats`) and, where its gradient at ratio 1 is not REINFORCE's, the advantages it equals.
Masking, KL, entropy, rollout correction, top-entropy selection and aggregation are applied around
it once, by `policy_loss`.

In `x`, D = logp - old_logp is 0 where mask = 0 (both are zeroed there), so padding never produces
inf/NaN and never reaches a value or a gradient; every ratio goes through `clamped_exp`.
"""

from grpo_jax.algorithms.losses import clipped, covariance, group, soft  # noqa: F401  (registers the losses)
from grpo_jax.algorithms.losses.base import (
    KERNELS, LOSSES, Clip, LossInputs, LossParams, LossSpec, LossTerms, StepBatch, loss, surrogate,
)
from grpo_jax.algorithms.losses.clipped import AbcGrpo, Dhpo, Gspo, GspoToken, Holder, Llds, PpoClip
from grpo_jax.algorithms.losses.covariance import ClipCov, KlCov
from grpo_jax.algorithms.losses.group import Disco, Egsw, Gtpo, Gvpo
from grpo_jax.algorithms.losses.soft import Cispo, Gmpo, Sapo, Sspo

__all__ = [
    "KERNELS", "LOSSES", "AbcGrpo", "Cispo", "Clip", "ClipCov", "Dhpo", "Disco", "Egsw", "Gmpo", "Gspo", "GspoToken",
    "Gtpo", "Gvpo", "Holder", "KlCov", "Llds", "LossInputs", "LossParams", "LossSpec", "LossTerms", "PpoClip", "Sapo",
    "Sspo", "StepBatch", "loss", "surrogate",
]
