"""`AlgorithmConfig`: the parts a run selects (an advantage estimator, a policy loss, an aggregation:
each a registered variant holding its own parameters) and the knobs shared by all of them; and the
presets of docs/presets.md.

A part is the instance of its variant's parameter dataclass: `AlgorithmConfig(loss=Gspo(eps_high=
4e-4))`, or by name with its defaults, `AlgorithmConfig(loss="gspo")`; on the command line
`--set algorithm.loss=gspo --set algorithm.loss.eps_high=4e-4`. A preset is a named set of field
values, registered with its source (`preset(...)`): `AlgorithmConfig.from_preset("gspo", beta=0.01)`.
Every combination is validated at construction, before any compile, from what the registrations
declare (a loss's unit and ratio, an aggregation's unit); each part validates its own parameters.
"""

import dataclasses

from grpo_jax.algorithms.advantages import AdvantageParams
from grpo_jax.algorithms.aggregation import AggregationParams
from grpo_jax.algorithms.correction import TIS_LEVELS, TIS_MODES
from grpo_jax.algorithms.kl import KL_ESTIMATORS
from grpo_jax.algorithms.losses import LOSSES, LossParams, PpoClip
from grpo_jax.data.samplers import SamplerParams
from grpo_jax.registry import Registry

REWARD_COMBINES = ("sum_then_normalize", "normalize_each", "normalize_then_sum")
ROUTING_REPLAY = ("none", "old", "sampler")
PARTS = {"advantage": AdvantageParams, "loss": LossParams, "aggregation": AggregationParams, "sampler": SamplerParams}


def _one_of(field, value, known):
    if value not in known:
        raise ValueError(f"AlgorithmConfig.{field}={value!r} is unknown; known: {', '.join(map(repr, known))}.")


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Advantages, policy loss, regularizers and aggregation, plus the data-side knobs the trainer reads.

    Defaults are the grpo preset. `advantage`, `loss` and `aggregation` hold the selected variants
    with their parameters (a name stands for the variant with its defaults); docs/algorithms.md gives
    each one's formula, source and defaults.
    """

    advantage: AdvantageParams | str = "group_std"
    loss: LossParams | str = "ppo_clip"
    aggregation: AggregationParams | str = "seq_mean_token_mean"
    gpg_scale: bool = False  # multiply A by N / N_valid (GPG)
    # Credit in multi-turn trajectories (Config.env): None, one advantage per trajectory from its return;
    # gamma in [0, 1], turn-level (`advantages.turn_advantages`, GTPO 2511.14846): each turn's return
    # discounted by gamma, estimated by `advantage` among the same turn of its group's trajectories.
    # A single-turn completion is a trajectory of one turn: there both give the same advantages.
    turn_discount: float | None = None
    reward_combine: str = "sum_then_normalize"  # how the RewardConfig.weights-weighted rewards combine
    # beta_rank of the unlikeliness reward (Rewarding the Unlikely, 2506.02355): rewards scaled by 1 - beta_rank *
    # rank / G, rank a completion's by sampler likelihood in its group (`advantages.unlikeliness_scale`); 0: off
    unlikeliness: float = 0.0
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
    # Which prompts each rollout round draws and how many samples each gets, from per-prompt state
    # (grpo_jax.data.samplers); "uniform": a shuffle, every example once per epoch.
    sampler: SamplerParams | str = "uniform"
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
        for part, base in PARTS.items():
            value = getattr(self, part)
            if isinstance(value, str):
                try:
                    value = base.from_name(value)
                except KeyError as e:
                    raise ValueError(f"AlgorithmConfig.{part}: {e.args[0]}") from None
                object.__setattr__(self, part, value)
            if not isinstance(value, base):
                raise TypeError(f"AlgorithmConfig.{part}={value!r} is not a registered {part} (a {base.__name__} "
                                f"instance or a name in {', '.join(base.registry)})")
        _one_of("reward_combine", self.reward_combine, REWARD_COMBINES)
        _one_of("kl_estimator", self.kl_estimator, tuple(KL_ESTIMATORS))
        _one_of("tis_level", self.tis_level, TIS_LEVELS)
        _one_of("tis_mode", self.tis_mode, TIS_MODES)
        _one_of("routing_replay", self.routing_replay, ROUTING_REPLAY)
        self._check_loss()
        self._check_values()

    def _check_loss(self):
        """Combinations that would silently change the algorithm, from the registrations."""
        spec, loss, aggregation = self.loss.spec, self.loss.name, self.aggregation.name
        if self.aggregation.spec.unit != spec.unit:
            if spec.unit == "sequence":
                raise ValueError(
                    f"AlgorithmConfig: loss={loss!r} has one unit loss per completion; "
                    f"aggregation={aggregation!r} would weight completions by length, changing the "
                    "algorithm. Use aggregation='seq_mean' (or, for length weighting on purpose, "
                    "loss='gspo_token' with a token aggregation)."
                )
            sequence_losses = sorted(n for n, s in LOSSES.items() if s.unit == "sequence")
            raise ValueError(
                f"AlgorithmConfig: aggregation={aggregation!r} is for sequence losses ({sequence_losses}); "
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
        if self.sampler.spec.baseline and self.reward_combine != "sum_then_normalize":
            raise ValueError(
                f"AlgorithmConfig: sampler={self.sampler.name!r} subtracts its baseline from the weighted total reward, so "
                f"reward_combine={self.reward_combine!r} (per-reward normalization) cannot apply; use 'sum_then_normalize'."
            )
        if self.unlikeliness and (self.sampler.spec.baseline or self.turn_discount is not None):
            raise ValueError(
                f"AlgorithmConfig: unlikeliness={self.unlikeliness} scales each completion's reward, which neither "
                f"turn_discount (turn returns) nor sampler={self.sampler.name!r} (a baseline subtracted) keeps; set "
                "unlikeliness=0, or turn_discount=None and a sampler without a baseline."
            )
        if self.sampler.spec.replays and (self.dynamic_sampling or self.routing_replay == "sampler"):
            raise ValueError(
                f"AlgorithmConfig: sampler={self.sampler.name!r} trains on stored groups again; it takes neither "
                "dynamic_sampling (a replayed group is always kept) nor routing_replay='sampler' (no routes are "
                "stored): unset them, or use another sampler."
            )
        if self.sampler.spec.allocates and spec.needs_groups:
            raise ValueError(
                f"AlgorithmConfig: sampler={self.sampler.name!r} may give a prompt several slots of group_size "
                f"samples (one group), but loss={loss!r} reads groups of group_size consecutive rows; use a loss "
                "without group statistics, or a sampler that gives every prompt group_size samples."
            )
        adv = self.advantage.spec
        if self.turn_discount is not None and (spec.unit == "sequence" or adv.needs_lengths or adv.learns_from_uniform_groups
                                               or adv.min_group_size or self.sampler.spec.baseline or self.gpg_scale):
            raise ValueError(
                f"AlgorithmConfig: turn_discount={self.turn_discount} gives each turn's tokens their own advantage: it "
                f"needs a token loss (not {loss!r}), an advantage of returns alone that gives uniform groups 0, in groups "
                f"of any size (not {self.advantage.name!r} if it reads lengths, learns from uniform groups or needs "
                "larger groups), a sampler without a "
                "baseline and gpg_scale=False; or set turn_discount=None (trajectory-level credit).")
        if not spec.ratio and self.num_iterations > 1:
            raise ValueError(
                f"AlgorithmConfig: loss={loss!r} has no importance ratio, so passes 2..{self.num_iterations} "
                "over a rollout batch would be off-policy without correction; use num_iterations=1 or a ratio "
                "loss (e.g. ppo_clip)."
            )

    def _check_values(self):
        if not 0 < self.top_entropy_quantile <= 1:
            raise ValueError(f"AlgorithmConfig: top_entropy_quantile={self.top_entropy_quantile} must lie in (0, 1] "
                             "(the fraction of tokens kept; 1 keeps all).")
        if self.tis_cap <= 0:
            raise ValueError(f"AlgorithmConfig: tis_cap={self.tis_cap} must be > 0.")
        default_cap = type(self).__dataclass_fields__["tis_cap"].default
        if self.tis_level is None and (self.tis_mode != "truncate" or self.tis_cap != default_cap):
            raise ValueError(f"AlgorithmConfig: tis_mode={self.tis_mode!r} / tis_cap={self.tis_cap} act only with a "
                             "tis_level ('token', 'sequence' or 'geometric'); set one or unset them.")
        if self.tis_mode == "icepop" and self.tis_cap <= 1:
            raise ValueError(f"AlgorithmConfig: tis_mode='icepop' keeps weights in [1/C, C]; tis_cap={self.tis_cap} "
                             "must be > 1.")
        if self.off_policy_threshold is not None and self.off_policy_threshold < 0:
            raise ValueError(f"AlgorithmConfig: off_policy_threshold={self.off_policy_threshold} must be >= 0.")
        if self.turn_discount is not None and not 0 <= self.turn_discount <= 1:
            raise ValueError(f"AlgorithmConfig: turn_discount={self.turn_discount} must lie in [0, 1] (or None).")
        if self.beta < 0:
            raise ValueError(f"AlgorithmConfig: beta={self.beta} must be >= 0.")
        if not 0 <= self.unlikeliness <= 1:
            raise ValueError(f"AlgorithmConfig: unlikeliness={self.unlikeliness} must lie in [0, 1] (beta_rank; 0 is off, "
                             "above 1 the likeliest correct completions could score below wrong ones).")
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
        return cls(**{**PRESETS[name].fields, **overrides})


@dataclasses.dataclass(frozen=True)
class Preset:
    fields: dict  # AlgorithmConfig field values (parts by name or with their parameters)
    source: str  # the paper it is named after (arXiv id), or the trainer whose convention it follows


PRESETS: Registry[Preset] = Registry("preset")


def preset(name: str, source: str, **fields) -> None:
    """Registers preset `name`: AlgorithmConfig `fields` (checked here) and the `source` it follows."""
    AlgorithmConfig(**fields)
    PRESETS.add(name, Preset(fields, source))


_BASE = dict(beta=0.0)
preset("grpo", "DeepSeekMath 2402.03300")
preset("dr_grpo", "Dr. GRPO 2503.20783", **_BASE, advantage="group_mean", aggregation="seq_mean_token_sum_norm")
preset("dapo", "DAPO 2503.14476", **_BASE, loss=PpoClip(eps_high=0.28), aggregation="token_mean",
       dynamic_sampling=True, max_gen_batches=3, overlong_buffer_frac=0.2, overlong_kappa=1.0)
preset("bnpo", "TRL loss_type=bnpo", **_BASE, aggregation="token_mean")
preset("gspo", "GSPO 2507.18071", **_BASE, loss="gspo", aggregation="seq_mean")
preset("gspo_token", "GSPO 2507.18071", **_BASE, loss="gspo_token")
preset("gmpo", "GMPO 2507.20673", **_BASE, loss="gmpo", aggregation="seq_mean")
preset("sapo", "SAPO 2511.20347", **_BASE, loss="sapo")
preset("cispo", "MiniMax-M1 2506.13585", **_BASE, loss="cispo", aggregation="token_mean")
preset("gpg", "GPG 2504.02546", **_BASE, advantage="group_mean", gpg_scale=True, loss="reinforce",
       aggregation="token_mean")
preset("opo", "OPO 2505.23585", **_BASE, advantage="opo", loss="reinforce", aggregation="seq_mean_token_sum")
preset("rloo", "RLOO 2402.14740", **_BASE, advantage="rloo", loss="reinforce", aggregation="seq_mean_token_sum")
preset("ngrpo", "NGRPO 2509.18851", **_BASE, advantage="ngrpo", loss=PpoClip(eps_low=0.16, eps_high=0.24),
       aggregation="token_mean")
preset("gapo", "GAPO 2510.21830", advantage="gapo", loss=PpoClip(eps_high=0.28, clip_c=10.0), beta=0.01,
       aggregation="token_mean")
preset("s_grpo", "S-GRPO 2508.05928", **_BASE, advantage="noise_aware", aggregation="seq_mean_token_sum_norm")
preset("reinforce_pp", "REINFORCE++ 2501.03262", **_BASE, advantage="reinforce_pp", aggregation="token_mean")
preset("pass_at_k", "Pass@k Training 2508.10751", **_BASE, advantage="pass_at_k")
preset("unlikeliness", "Rewarding the Unlikely 2506.02355", unlikeliness=0.25)  # the authors' examples/lean/grpo.sh
preset("mo_grpo", "MO-GRPO 2509.22047", **_BASE, reward_combine="normalize_each")
preset("abc_grpo", "ABC-GRPO 2601.03895", **_BASE, loss="abc_grpo")
preset("dhpo", "DHPO 2601.05607", **_BASE, loss="dhpo")
preset("holder_po", "HolderPO 2605.12058", **_BASE, loss="holder", aggregation="seq_mean")
preset("sspo", "SSPO 2602.19327", **_BASE, loss="sspo", aggregation="seq_mean")
preset("llds", "LLDS 2512.04220", **_BASE, loss="llds")
preset("egsw", "EGSW 2503.22456", **_BASE, loss="egsw")
preset("gvpo", "GVPO 2504.19599", **_BASE, advantage="group_mean", loss="gvpo", aggregation="seq_mean")
preset("disco", "DisCO 2505.12366", **_BASE, loss="disco", aggregation="seq_mean")
preset("gtpo", "GTPO 2508.03772", **_BASE, loss="gtpo")
preset("gtpo_turn", "GTPO (turns) 2511.14846", **_BASE, turn_discount=0.9)
preset("vade", "VADE 2511.18902", **_BASE, sampler="vade")
preset("curriculum", "prime-rl difficulty pools", **_BASE, sampler="curriculum")
preset("erpo", "ERPO 2511.04800", **_BASE, sampler="erpo", tis_level="token")
preset("gdro", "GDRO 2601.19280", **_BASE, sampler="gdro")
preset("spo", "SPO 2509.13232", **_BASE, advantage="spo", sampler="spo")
preset("repo", "RePO 2506.09340", **_BASE, sampler="repo", tis_level="token")
preset("ar3po", "AR3PO 2509.25808", **_BASE, sampler="ar3po", tis_level="token")
