"""Policy losses: the registry (`base`) and every loss of docs/algorithms.md as one function, by family:
`clipped` (PPO/GRPO, GSPO and the variants of the clipped ratio), `soft` (no hard min: GMPO, SAPO,
SSPO, CISPO, REINFORCE), `covariance` (Clip-Cov, KL-Cov), `group` (GVPO, DisCO, GTPO, EGSW: units
that depend on the rest of their group).

A loss is `fn(cfg, x: LossInputs) -> LossTerms`, registered with `@loss(name, ...)` which declares
everything the rest of the code must know about it (see `LossSpec`): its unit (token: u is
[batch, seq]; sequence: u is [batch]), whether it uses l^old (then it may run several updates per
rollout batch), the AlgorithmConfig fields it reads, its fused-kernel path, its float64 reference,
its step statistics (decisions over the whole optimizer-step batch, run once per update by
`step_stats`) and, where its gradient at ratio 1 is not REINFORCE's, the advantages it equals.
Masking, KL, entropy, rollout correction, top-entropy selection and aggregation are applied around
it once, by `policy_loss`.

In `x`, D = logp - old_logp is 0 where mask = 0 (both are zeroed there), so padding never produces
inf/NaN and never reaches a value or a gradient; every ratio goes through `clamped_exp`.
"""

from grpo_jax.algorithms.losses import clipped, covariance, group, soft  # noqa: F401  (registers the losses)
from grpo_jax.algorithms.losses.base import KERNELS, LOSSES, LossInputs, LossSpec, LossTerms, StepBatch, loss

__all__ = ["KERNELS", "LOSSES", "LossInputs", "LossSpec", "LossTerms", "StepBatch", "loss"]
