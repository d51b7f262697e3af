"""The clipped importance-ratio surrogate shared by the ratio_clip-kernel losses (ppo_clip, gspo,
gspo_token, clip_cov), and the clamped exp every ratio of the library goes through.

The reference: training runs `kernels.ratio_clip` (same values and gradients, fused) unless
`AlgorithmConfig.ratio_impl="reference"` picks this plain-autodiff version.
"""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from kernels.ratio_clip import clamped_exp


def clipped_surrogate(
    log_ratio: Float[Array, "*units"],
    advantages: Float[Array, "*units"],
    eps_low: float,
    eps_high: float,
    delta: float | None = None,
    clip_c: float | None = None,
) -> tuple[Float[Array, "*units"], Bool[Array, "*units"], Bool[Array, "*units"]]:
    """PPO-style clipped surrogate on a log-ratio, elementwise (tokens or sequences alike).

    With r = exp(log_ratio) (log_ratio clamped to +-LOG_RATIO_BOUND first), rho = min(r, delta) if
    `delta` else r, and c(r) = clip(r, 1 - eps_low, 1 + eps_high), the unit loss is
    u = -min(rho * A, c(r) * A); with dual clip (`clip_c`, used only where A < 0)
    u = min(u, -clip_c * A). Gradients flow through log_ratio (callers decide what it depends on:
    token D for ppo_clip, mean D for gspo, a stop-gradient mix for gspo_token).

    Returns (u, clipped_low, clipped_high): the flags mark units whose clipped branch is active, i.e.
    whose gradient the clip removed: low = A < 0 and r < 1 - eps_low; high = A > 0 and r > 1 + eps_high,
    or (dual clip) A < 0 and rho > clip_c. All float32; no masking here (callers pass D = 0 where
    masked so exp never overflows on padding).
    """
    ratio = clamped_exp(log_ratio)
    rho = ratio if delta is None else jnp.minimum(ratio, delta)
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    u = jnp.maximum(-rho * advantages, -clipped * advantages)
    low = (advantages < 0) & (ratio < 1.0 - eps_low)
    high = (advantages > 0) & (ratio > 1.0 + eps_high)
    if clip_c is not None:
        dual = (advantages < 0) & (rho > clip_c)
        u = jnp.where(dual, -clip_c * advantages, u)
        high = high | dual
    return u, low, high
