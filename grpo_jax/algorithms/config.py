"""`AlgorithmConfig` and the presets of docs/algorithms.md.

A preset is only a named set of field values: `AlgorithmConfig.from_preset("gspo", beta=0.01)` or
`dataclasses.replace(cfg, ...)`. Every combination is validated at construction, before any compile,
from what the registries declare: a loss's unit, ratio, clip fields and kernel path, an
aggregation's unit.
"""

import dataclasses

import kernels
from grpo_jax.algorithms.advantages import ADVANTAGES
from grpo_jax.algorithms.aggregation import AGGREGATIONS
from grpo_jax.algorithms.correction import TIS_LEVELS, TIS_MODES
from grpo_jax.algorithms.kl import KL_ESTIMATORS
from grpo_jax.algorithms.losses import LOSSES

REWARD_COMBINES = ("sum_then_normalize", "normalize_then_sum")
ROUTING_REPLAY = ("none", "old", "sampler")
RATIO_IMPLS = ("auto", "reference", *kernels.RATIO_CLIP_IMPLS)


def _one_of(field, value, known):
    if value not in known:
        raise ValueError(f"AlgorithmConfig.{field}={value!r} is unknown; known: {', '.join(map(repr, known))}.")


def clip_fields() -> tuple[str, ...]:
    """Every field some registered loss declares it reads (the presets table's clip column)."""
    return tuple(dict.fromkeys(f for spec in LOSSES.values() for f in spec.clip_fields))


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Advantages, policy loss, regularizers and aggregation, plus the data-side knobs the trainer reads.

    Defaults are the grpo preset. Loss fields (each loss reads those its registration declares,
    `LOSSES[name].clip_fields`; the others must keep their defaults): eps_low/eps_high are ratio
    clips for the surrogates and log-space clips for gmpo; tau_pos/tau_neg are SAPO's; eps_max is
    CISPO's cap; clip_cov_* and kl_cov_* are Clip-Cov's and KL-Cov's (verl's defaults).
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
    clip_cov_ratio: float = 2e-4  # fraction of counted tokens whose gradient Clip-Cov removes
    clip_cov_lb: float = 1.0  # covariance band of its candidates
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4  # fraction of counted tokens KL-Cov penalizes
    kl_cov_coef: float = 1.0  # their |D| penalty
    aggregation: str = "seq_mean_token_mean"
    # how the losses with the ratio_clip kernel path run: auto (kernels.ratio_clip's default: pallas
    # on TPU, else jnp), reference (algorithms.ratio, plain autodiff), or a kernels.ratio_clip impl
    ratio_impl: str = "auto"
    # regularizers and token selection
    beta: float = 0.04  # KL coefficient; 0: no reference model is kept or run
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0  # train only on the top q of tokens by entropy (TRL); 1: all
    # rollout correction (sampler/trainer mismatch), from d = l^old - l^samp
    tis_level: str | None = None  # None | token | sequence | geometric
    tis_mode: str = "truncate"  # truncate: min(w, C) | mask: 0 where w > C | icepop: 0 outside [1/C, C]
    tis_cap: float = 2.0  # C
    off_policy_threshold: float | None = None  # DeepSeek-V3.2: drop A < 0 completions with mean |d| above it
    # data side (read by the trainer)
    num_iterations: int = 1  # mu: passes over one rollout batch
    dynamic_sampling: bool = False  # DAPO: drop groups all correct or all wrong, resample
    max_gen_batches: int = 1  # generation rounds per step when dynamic_sampling
    overlong_buffer_frac: float = 0.0  # DAPO overlong shaping buffer B = frac * L_max; 0: off
    overlong_kappa: float = 1.0  # its maximal penalty
    mask_truncated: bool = False  # m = 0 for completions that hit the limit without an end token
    # mixture-of-experts policies: which top-k expert sets every training forward of a rollout batch
    # uses (gate weights always come from the current router). "none": the router's own; "old"
    # (Routing Replay, GSPO arXiv 2507.18071 sec. 5.3; "R2"): those recorded when l^old is computed;
    # "sampler" (Rollout Routing Replay, arXiv 2510.11370; "R3"): those the sampler used, also in
    # the l^old forward. Here, not in the model options, because it changes the objective's ratio:
    # the GSPO paper's GRPO baseline is GRPO plus routing replay.
    routing_replay: str = "none"

    def __post_init__(self):
        _one_of("advantage", self.advantage, tuple(ADVANTAGES))
        _one_of("reward_combine", self.reward_combine, REWARD_COMBINES)
        _one_of("loss", self.loss, tuple(LOSSES))
        _one_of("aggregation", self.aggregation, tuple(AGGREGATIONS))
        _one_of("ratio_impl", self.ratio_impl, RATIO_IMPLS)
        _one_of("kl_estimator", self.kl_estimator, tuple(KL_ESTIMATORS))
        _one_of("tis_level", self.tis_level, TIS_LEVELS)
        _one_of("tis_mode", self.tis_mode, TIS_MODES)
        _one_of("routing_replay", self.routing_replay, ROUTING_REPLAY)
        self._check_loss()
        self._check_values()

    def _check_loss(self):
        """Combinations that would silently change the algorithm, from the registrations."""
        spec, loss = LOSSES[self.loss], self.loss
        if AGGREGATIONS[self.aggregation].unit != spec.unit:
            if spec.unit == "sequence":
                raise ValueError(
                    f"AlgorithmConfig: loss={loss!r} has one unit loss per completion; "
                    f"aggregation={self.aggregation!r} would weight completions by length, changing the "
                    "algorithm. Use aggregation='seq_mean' (or, for length weighting on purpose, "
                    "loss='gspo_token' with a token aggregation)."
                )
            sequence_losses = sorted(n for n, s in LOSSES.items() if s.unit == "sequence")
            raise ValueError(
                f"AlgorithmConfig: aggregation={self.aggregation!r} is for sequence losses ({sequence_losses}); "
                f"loss={loss!r} is per token: use 'seq_mean_token_mean' for the same 1/L_i weights."
            )
        if spec.unit == "sequence" and self.tis_level == "token":
            raise ValueError(f"AlgorithmConfig: loss={loss!r} is per completion; use tis_level='sequence' or 'geometric'.")
        if spec.unit == "sequence" and self.top_entropy_quantile < 1:
            raise ValueError(f"AlgorithmConfig: top_entropy_quantile selects tokens but loss={loss!r} has one unit per "
                             "completion; use a token loss (e.g. gspo_token) or top_entropy_quantile=1.")
        if not spec.ratio and self.routing_replay == "old":
            raise ValueError(
                f"AlgorithmConfig: loss={loss!r} has no importance ratio, so its one update per rollout batch "
                "runs at the params that computed l^old and routing_replay='old' replays the routes the router "
                "picks anyway; use routing_replay='none' (or 'sampler' to train on the sampler's routes)."
            )
        if not spec.ratio and self.num_iterations > 1:
            raise ValueError(
                f"AlgorithmConfig: loss={loss!r} has no importance ratio, so passes 2..{self.num_iterations} "
                "over a rollout batch would be off-policy without correction; use num_iterations=1 or a ratio "
                "loss (e.g. ppo_clip)."
            )
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in clip_fields():
            if name not in spec.clip_fields and getattr(self, name) != defaults[name]:
                readers = [n for n, s in LOSSES.items() if name in s.clip_fields]
                raise ValueError(f"AlgorithmConfig: loss={loss!r} does not read {name}={getattr(self, name)!r} "
                                 f"(only {readers} do); unset it.")
        if self.ratio_impl != "auto" and spec.kernel != "ratio_clip":
            kernel_losses = [n for n, s in LOSSES.items() if s.kernel == "ratio_clip"]
            raise ValueError(f"AlgorithmConfig: ratio_impl={self.ratio_impl!r} picks how {kernel_losses} run; "
                             f"loss={loss!r} does not use it: unset it.")
        if spec.kernel == "ratio_clip" and self.eps_low >= 1:
            raise ValueError(f"AlgorithmConfig: eps_low={self.eps_low} makes the lower ratio clip 1 - eps_low <= 0.")

    def _check_values(self):
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"AlgorithmConfig: eps_low={self.eps_low}, eps_high={self.eps_high} must be >= 0.")
        if self.delta is not None and self.delta <= 1 + self.eps_high:
            raise ValueError(f"AlgorithmConfig: delta={self.delta} must exceed 1 + eps_high = {1 + self.eps_high}.")
        if self.clip_c is not None and self.clip_c <= 1:
            raise ValueError(f"AlgorithmConfig: clip_c={self.clip_c} must be > 1 (dual clip bounds the loss of A < 0).")
        if self.tau_pos <= 0 or self.tau_neg <= 0 or self.eps_max <= 0 or self.tis_cap <= 0:
            raise ValueError("AlgorithmConfig: tau_pos, tau_neg, eps_max and tis_cap must be > 0.")
        if not (0 < self.clip_cov_ratio <= 1 and 0 < self.kl_cov_ratio <= 1):
            raise ValueError(f"AlgorithmConfig: clip_cov_ratio={self.clip_cov_ratio} and kl_cov_ratio="
                             f"{self.kl_cov_ratio} are fractions of the counted tokens, in (0, 1].")
        if self.clip_cov_lb >= self.clip_cov_ub or self.kl_cov_coef < 0:
            raise ValueError(f"AlgorithmConfig: need clip_cov_lb={self.clip_cov_lb} < clip_cov_ub={self.clip_cov_ub} "
                             f"and kl_cov_coef={self.kl_cov_coef} >= 0.")
        if not 0 < self.top_entropy_quantile <= 1:
            raise ValueError(f"AlgorithmConfig: top_entropy_quantile={self.top_entropy_quantile} must lie in (0, 1] "
                             "(the fraction of tokens kept; 1 keeps all).")
        default_cap = type(self).__dataclass_fields__["tis_cap"].default
        if self.tis_level is None and (self.tis_mode != "truncate" or self.tis_cap != default_cap):
            raise ValueError(f"AlgorithmConfig: tis_mode={self.tis_mode!r} / tis_cap={self.tis_cap} act only with a "
                             "tis_level ('token', 'sequence' or 'geometric'); set one or unset them.")
        if self.tis_mode == "icepop" and self.tis_cap <= 1:
            raise ValueError(f"AlgorithmConfig: tis_mode='icepop' keeps weights in [1/C, C]; tis_cap={self.tis_cap} "
                             "must be > 1.")
        if self.off_policy_threshold is not None and self.off_policy_threshold < 0:
            raise ValueError(f"AlgorithmConfig: off_policy_threshold={self.off_policy_threshold} must be >= 0.")
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
    "opo": dict(_BASE, advantage="opo", loss="reinforce", aggregation="seq_mean_token_sum"),
    "rloo": dict(_BASE, advantage="rloo", loss="reinforce", aggregation="seq_mean_token_sum"),
}
