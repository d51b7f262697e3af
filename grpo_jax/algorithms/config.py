"""`AlgorithmConfig` and the presets of shared/ALGORITHMS.md.

A preset is only a named set of field values: `AlgorithmConfig.from_preset("gspo", beta=0.01)` or
`dataclasses.replace(cfg, ...)`. Every combination is validated at construction, before any compile.
"""

import dataclasses

import kernels
from grpo_jax.algorithms.advantages import ADVANTAGES
from grpo_jax.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS, LOSSES, SEQUENCE_LOSSES

REWARD_COMBINES = ("sum_then_normalize", "normalize_then_sum")
TIS_LEVELS = (None, "token", "sequence")
UNCORRECTED_LOSSES = ("reinforce",)  # exactly on-policy: valid only for the first pass over a batch
SURROGATE_LOSSES = ("ppo_clip", "gspo", "gspo_token")  # the clipped surrogates (delta, clip_c, ratio_impl)
RATIO_IMPLS = ("auto", "reference", *kernels.RATIO_CLIP_IMPLS)


def _one_of(field, value, known):
    if value not in known:
        raise ValueError(f"AlgorithmConfig.{field}={value!r} is unknown; known: {', '.join(map(repr, known))}.")


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Advantages, policy loss, regularizers and aggregation, plus the data-side knobs the trainer reads.

    Defaults are the grpo preset. Clip fields: eps_low/eps_high are ratio clips for ppo_clip, gspo and
    gspo_token, and log-space clips for gmpo; tau_pos/tau_neg are SAPO's; eps_max is CISPO's cap.
    """

    # advantages
    advantage: str = "group_std"
    adv_eps: float = 1e-6  # std + eps in the denominators
    gpg_scale: bool = False  # multiply A by N / N_valid (GPG)
    reward_combine: str = "sum_then_normalize"  # how the RewardConfig.weights-weighted rewards combine
    # policy loss
    loss: str = "ppo_clip"
    eps_low: float = 0.2
    eps_high: float = 0.2
    delta: float | None = None  # cap of the unclipped ratio (two-sided clip); > 1 + eps_high
    clip_c: float | None = None  # dual clip for A < 0; > 1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    eps_max: float = 5.0
    aggregation: str = "seq_mean_token_mean"
    # how the surrogate of SURROGATE_LOSSES runs: auto (kernels.ratio_clip's default: pallas on TPU,
    # else jnp), reference (algorithms.ratio, plain autodiff), or a kernels.ratio_clip impl
    ratio_impl: str = "auto"
    # regularizers
    beta: float = 0.04  # KL coefficient; 0: no reference model is kept or run
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    # sampler/trainer mismatch: truncated importance sampling w = min(exp(l_old - l_samp), tis_cap)
    tis_level: str | None = None
    tis_cap: float = 2.0
    # data side (read by the trainer)
    num_iterations: int = 1  # mu: passes over one rollout batch
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups, resample
    max_gen_batches: int = 1  # generation rounds per step when dynamic_sampling
    overlong_buffer_frac: float = 0.0  # DAPO overlong shaping buffer B = frac * L_max; 0: off
    overlong_kappa: float = 1.0  # its maximal penalty
    mask_truncated: bool = False  # m = 0 for completions that hit the limit without an end token

    def __post_init__(self):
        _one_of("advantage", self.advantage, tuple(ADVANTAGES))
        _one_of("reward_combine", self.reward_combine, REWARD_COMBINES)
        _one_of("loss", self.loss, tuple(LOSSES))
        _one_of("aggregation", self.aggregation, AGGREGATIONS)
        _one_of("ratio_impl", self.ratio_impl, RATIO_IMPLS)
        _one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _one_of("tis_level", self.tis_level, TIS_LEVELS)
        sequence = self.loss in SEQUENCE_LOSSES
        if sequence and self.aggregation != "seq_mean":
            raise ValueError(
                f"AlgorithmConfig: loss={self.loss!r} has one unit loss per completion; "
                f"aggregation={self.aggregation!r} would weight completions by length, changing the "
                "algorithm. Use aggregation='seq_mean' (or, for length weighting on purpose, "
                "loss='gspo_token' with a token aggregation)."
            )
        if not sequence and self.aggregation == "seq_mean":
            raise ValueError(
                f"AlgorithmConfig: aggregation='seq_mean' is for sequence losses ({sorted(SEQUENCE_LOSSES)}); "
                f"loss={self.loss!r} is per token: use 'seq_mean_token_mean' for the same 1/L_i weights."
            )
        if sequence and self.tis_level == "token":
            raise ValueError(f"AlgorithmConfig: loss={self.loss!r} is per completion; use tis_level='sequence'.")
        if self.loss in UNCORRECTED_LOSSES and self.num_iterations > 1:
            raise ValueError(
                f"AlgorithmConfig: loss={self.loss!r} has no importance ratio, so passes 2..{self.num_iterations} "
                "over a rollout batch would be off-policy without correction; use num_iterations=1 or a ratio "
                "loss (e.g. ppo_clip)."
            )
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"AlgorithmConfig: eps_low={self.eps_low}, eps_high={self.eps_high} must be >= 0.")
        if self.loss != "gmpo" and self.eps_low >= 1:
            raise ValueError(f"AlgorithmConfig: eps_low={self.eps_low} makes the lower ratio clip 1 - eps_low <= 0.")
        if (self.delta is not None or self.clip_c is not None) and self.loss not in SURROGATE_LOSSES:
            raise ValueError(f"AlgorithmConfig: delta/clip_c apply to {SURROGATE_LOSSES}, not loss={self.loss!r}; unset them.")
        if self.ratio_impl != "auto" and self.loss not in SURROGATE_LOSSES:
            raise ValueError(f"AlgorithmConfig: ratio_impl={self.ratio_impl!r} picks how {SURROGATE_LOSSES} run; "
                             f"loss={self.loss!r} does not use it: unset it.")
        if self.delta is not None and self.delta <= 1 + self.eps_high:
            raise ValueError(f"AlgorithmConfig: delta={self.delta} must exceed 1 + eps_high = {1 + self.eps_high}.")
        if self.clip_c is not None and self.clip_c <= 1:
            raise ValueError(f"AlgorithmConfig: clip_c={self.clip_c} must be > 1 (dual clip bounds the loss of A < 0).")
        if self.tau_pos <= 0 or self.tau_neg <= 0 or self.eps_max <= 0 or self.tis_cap <= 0:
            raise ValueError("AlgorithmConfig: tau_pos, tau_neg, eps_max and tis_cap must be > 0.")
        if self.beta < 0 or self.adv_eps < 0:
            raise ValueError(f"AlgorithmConfig: beta={self.beta} and adv_eps={self.adv_eps} must be >= 0.")
        if self.num_iterations < 1 or self.max_gen_batches < 1:
            raise ValueError("AlgorithmConfig: num_iterations and max_gen_batches must be >= 1.")
        if not 0 <= self.overlong_buffer_frac < 1 or self.overlong_kappa < 0:
            raise ValueError("AlgorithmConfig: overlong_buffer_frac must lie in [0, 1) and overlong_kappa be >= 0.")

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "AlgorithmConfig":
        """The preset `name` (see PRESETS / docs/presets.md) with `overrides` applied on top."""
        _one_of("preset", name, tuple(PRESETS))
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"AlgorithmConfig.from_preset: unknown field(s) {sorted(unknown)}.")
        return cls(**{**PRESETS[name], **overrides})


_BASE = dict(beta=0.0)
_GSPO = dict(_BASE, eps_low=3e-4, eps_high=4e-4)
PRESETS: dict[str, dict] = {
    "grpo": dict(),
    "dr_grpo": dict(_BASE, advantage="group_mean", aggregation="seq_mean_token_sum_norm"),
    "dapo": dict(_BASE, eps_high=0.28, aggregation="token_mean", dynamic_sampling=True, max_gen_batches=3,
                 overlong_buffer_frac=0.2, overlong_kappa=1.0),
    "bnpo": dict(_BASE, aggregation="token_mean"),
    "gspo": dict(_GSPO, loss="gspo", aggregation="seq_mean"),
    "gspo_token": dict(_GSPO, loss="gspo_token"),
    "gmpo": dict(_BASE, loss="gmpo", eps_low=0.4, eps_high=0.4, aggregation="seq_mean"),
    "sapo": dict(_BASE, loss="sapo"),
    "cispo": dict(_BASE, loss="cispo", aggregation="token_mean"),
    "gpg": dict(_BASE, advantage="group_mean", gpg_scale=True, loss="reinforce", aggregation="token_mean"),
    "opo": dict(_BASE, advantage="opo", loss="reinforce", aggregation="seq_mean_token_sum", num_iterations=1),
    "rloo": dict(_BASE, advantage="rloo", loss="reinforce"),
}
