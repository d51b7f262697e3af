"""Float64 NumPy references: a second, independent implementation of every registered variant.

Written from the formulas of docs/algorithms.md, not by calling the jnp code: loops over groups and
over each completion's counted tokens (masking by index selection, not by multiplication), products
of probabilities where the library sums log-probs, sorts where it ranks, binomial coefficients where
it multiplies ratios. Each registration names its reference here (`reference=...`), and the
registry-wide tests compare values, gradients (central differences of `policy_loss`) and metrics
against it for every registered name. By kind: `advantages` (estimators and `compute_advantages`),
`losses` (unit losses; their conventions are in its docstring), `step` (step statistics: Clip-Cov,
KL-Cov, top-entropy and the group losses' statistics), `objective` (KL, aggregation, rollout
correction and the whole `policy_loss`).
"""

from grpo_jax.algorithms.reference.advantages import (
    batch_std,
    beta_norm,
    compute_advantages,
    gapo,
    group_mean,
    group_std,
    ngrpo,
    noise_aware,
    opo,
    pass_at_k,
    reinforce_pp,
    rloo,
    spo,
    turn_advantages,
    unlikeliness_scale,
)
from grpo_jax.algorithms.reference.common import LOG_RATIO_BOUND, exp_clamped
from grpo_jax.algorithms.reference.losses import (
    abc_grpo,
    cispo,
    clip_cov,
    dhpo,
    disco,
    egsw,
    gmpo,
    gspo,
    gspo_token,
    gtpo,
    gvpo,
    holder,
    kl_cov,
    llds,
    ppo_clip,
    reinforce,
    sapo,
    sspo,
)
from grpo_jax.algorithms.reference.objective import (
    correction_weight,
    k1,
    k2,
    k3,
    policy_loss,
    policy_loss_grad,
    seq_mean,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    step_statistics,
    token_mean,
)
from grpo_jax.algorithms.reference.step import (
    clip_cov_select,
    disco_stats,
    egsw_stats,
    entropy_keep,
    gtpo_stats,
    gvpo_stats,
    kl_cov_select,
)
