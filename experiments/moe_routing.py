"""Mixture-of-experts RL with and without routing replay (GSPO paper, arXiv 2507.18071, sec. 5.3), on long
written-out completions, under the shared protocol (experiments/protocol.py).

    python experiments/moe_routing.py [--quick] [--resume] [--rejudge]

The paper's claims: after each gradient update about 10% of the experts activated for a token change
(48-layer Qwen3-30B-A3B), which makes GRPO's token ratios fluctuate, so GRPO needs Routing Replay (the
experts recorded with l^old replayed in every update) to converge; GSPO, whose sequence ratio averages
over tokens, trains the MoE model stably without it.

The policy is a Qwen3-MoE with churn to spare (MODEL: 4 layers, all MoE, 16 experts of which 4 are
routed per token, normalized top-k gates like Qwen3-30B-A3B; the quickstart's attention and width) on
gspo_vs_grpo's task: column addition written out (experiments/configs/long_addition.py), warm-started
on the written solutions. Each rollout batch is split into 4 minibatches, as in the paper: updates 2-4
are off-policy, so their routes can have moved since l^old. `train.compare_routes` runs every update on
both routes, so the ratio with and without replay is measured on the same parameters and batch.

Arms, on the same data, warm starts and seeds: GRPO without replay ("grpo"), with replay of pi_old's
routes ("grpo_r2"; replaying the sampler's routes, R3, is bit-identical here: sampler and trainer share
the model code), GSPO without replay ("gspo"), and the null control ("gspo_token", protocol). Learning
rates are chosen per arm. The setting in which GRPO without replay is expected to fail, declared before
any run: the "_hot" arms (grpo_hot, grpo_r2_hot, gspo_hot), each at 3x its base arm's chosen rate with
8 minibatches per rollout batch (staler ratios and larger steps: more routes move between l^old and an
update).
"""

import numpy as np
from configs.long_addition import get_config as long_addition_config  # experiments/configs/long_addition.py

from grpo_jax.config import override

import protocol
import study
from gspo_vs_grpo import WARM_START, reward

PAPER = "arXiv 2507.18071 (GSPO)"
SOURCE = f"{PAPER}, sec. 5.3"
NULL = ("gspo", "gspo_token")
MODEL = [
    "model.model_type=qwen3_moe", "model.num_layers=4", "model.num_experts=16", "model.num_experts_per_tok=4",
    "model.moe_intermediate_size=32", "model.norm_topk_prob=true",
]
GRPO = ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.27"]
ARMS = {
    "grpo": [*GRPO, "algorithm.routing_replay=none"],
    "grpo_r2": [*GRPO, "algorithm.routing_replay=old"],
    "gspo": ["algorithm.preset=gspo"],  # eps 3e-4 / 4e-4, beta=0, no replay
    "gspo_token": ["algorithm.preset=gspo_token"],
}
HOT = {"grpo_hot": "grpo", "grpo_r2_hot": "grpo_r2", "gspo_hot": "gspo"}  # arm -> its base arm
HOT_RATE, HOT_MINIBATCHES = 3.0, 8


def per_update(run) -> float:
    """The changed-expert fraction after one update: the trainer logs the mean over a step's M updates,
    whose j-th sees the drift of j - 1 updates, so one update's is that mean x 2 / (M - 1) if the drift
    grows linearly with the updates (an overestimate by up to ~1.4x if it grows like a random walk)."""
    m = run.config.algorithm.num_iterations * run.config.train.minibatches
    return run.mean("routing/changed_experts_frac") * 2 / (m - 1)


def routing_share(run) -> float:
    """log10 of the mean |token log-ratio| under the router's own picks over that under pi_old's replayed
    routes, on the same params and batch: how much the moved routes add to the ratio's drift."""
    own, replayed = (run.mean(f"routing/log_ratio_abs_mean_{r}") for r in ("own", "replayed"))
    with np.errstate(divide="ignore", invalid="ignore"):  # no drift at all (no update moved): nan, never above
        return float(np.log10(np.float64(own) / replayed))


CLAIMS = (
    protocol.Claim(
        "About 10% of the experts activated for a token change after each gradient update", source=SOURCE,
        paper="roughly 10% of the activated experts change after each RL gradient update (48-layer "
              "Qwen3-30B-A3B-Base)",
        halves=(protocol.Level("GRPO's changed-expert fraction per update, at least 5%", per_update, "grpo", 0.05),)),
    protocol.Claim(
        "Routing changes make GRPO's token ratios fluctuate", source=SOURCE,
        paper="expert-activation volatility makes token-level importance ratios fluctuate drastically; Routing "
              "Replay computes them on the same network",
        halves=(protocol.Level("log10 of GRPO's mean |token log-ratio| on its own routes over on pi_old's, same "
                               "params and batch: at least doubled", routing_share, "grpo", float(np.log10(2))),)),
    protocol.Claim(
        "GRPO needs routing replay for MoE RL to converge", source=SOURCE,
        paper="without Routing Replay GRPO's MoE training fails to converge normally",
        halves=(protocol.Level("collapsed, GRPO without replay (hot setting)", protocol.collapsed, "grpo_hot", 0.5),
                protocol.Level("collapsed, GRPO with R2 (hot setting)", protocol.collapsed, "grpo_r2_hot", 0.5,
                               above=False))),
    protocol.Claim(
        "GSPO trains MoE stably without routing replay", source=SOURCE,
        paper="GSPO converges normally without Routing Replay, with reward at least that of GRPO with it",
        halves=(protocol.Level("collapsed, GSPO without replay (hot setting)", protocol.collapsed, "gspo_hot", 0.5,
                               above=False),
                protocol.Difference("training reward over the run", reward, "gspo", "grpo_r2"))),
)


def claims(results: study.Results) -> list[dict]:
    return [protocol.judge(c, results, NULL) for c in CLAIMS]


TABLE = {
    "training reward, mean over the run": reward,
    "held-out greedy accuracy, last 20% of the run": lambda r: r.mean("eval/accuracy_greedy", 0.8),
    "changed experts per update (fraction, linear estimate)": per_update,
    "changed top-k sets, mean over a step's updates": lambda r: r.mean("routing/changed_sets_frac"),
    "mean |token log-ratio|, own routes": lambda r: r.mean("routing/log_ratio_abs_mean_own"),
    "mean |token log-ratio|, pi_old's routes": lambda r: r.mean("routing/log_ratio_abs_mean_replayed"),
    "max |token log-ratio|, own routes": lambda r: r.mean("routing/log_ratio_abs_max_own"),
    "max |token log-ratio|, pi_old's routes": lambda r: r.mean("routing/log_ratio_abs_max_replayed"),
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "router entropy": lambda r: r.mean("routing/entropy_mean"),
    "expert load (max / mean)": lambda r: r.mean("routing/expert_load"),
    "collapsed (fraction of seeds)": protocol.collapsed,
    "skipped (non-finite) updates": lambda r: float(sum(row.get("skipped_updates", 0) for row in r.rows)),
    "completion length, mean (mean over the run)": lambda r: r.mean("completion/length_mean"),
    "wall seconds per run (shared machine)": lambda r: r.wall_seconds,
}


def get_study(quick: bool) -> study.Study:
    base = override(long_addition_config(), [
        *MODEL, f"train.steps={30 if quick else 60}", "train.minibatches=4", f"train.eval_prompts={128 if quick else 256}",
        "train.eval_every=10" if quick else "train.eval_every=15", "train.checkpoint_every=15",
        "train.compare_routes=true", "train.max_skipped_steps=10000",  # a run that skips updates goes on
    ])
    arms = {name: override(base, changes) for name, changes in ARMS.items()}
    hot = {arm: override(arms[source], [f"train.minibatches={HOT_MINIBATCHES}"]) for arm, source in HOT.items()}
    return study.Study(
        name="moe_routing",
        arms=arms | hot,
        seeds=(0, 1) if quick else tuple(range(8)),
        learning_rates=() if quick else (3e-5, 1e-4, 3e-4),
        rate_from={arm: (source, HOT_RATE) for arm, source in HOT.items()},
        null_pair=NULL,
        warm_start=WARM_START,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=tuple(study.Plot(f"curves_{tag}", (
            "reward/mean", "eval/accuracy_greedy", "routing/changed_experts_frac", "routing/log_ratio_abs_mean_own",
            "routing/log_ratio_abs_mean_replayed"), arms=names)
            for tag, names in (("base", ("grpo", "grpo_r2", "gspo")), ("hot", tuple(HOT)))),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
