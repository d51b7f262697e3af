"""Mixture-of-experts RL with and without routing replay (GSPO paper, arXiv 2507.18071, sec. 5.3), on long
written-out completions, under the shared protocol (experiments/protocol.py).

    python experiments/moe_routing.py [--quick] [--resume] [--rejudge]

The paper's claims: after each gradient update about 10% of the experts activated for a token change
(48-layer Qwen3-30B-A3B), which makes GRPO's token ratios fluctuate, so GRPO needs Routing Replay (the
experts recorded with pi_old replayed in every update) to converge; GSPO, whose sequence ratio averages
over tokens, trains the MoE model stably without it.

The policy is a Qwen3-MoE (MODEL: 4 layers, all MoE, 8 experts of which 2 are routed per token, the
quarter Mixtral routes; normalized top-k gates like Qwen3-30B-A3B; the quickstart's attention and
width) on gspo_vs_grpo's task: column addition written out (experiments/configs/long_addition.py). One
warm start on the written solutions is every run's base model (`Study.warm_start_seed`), as the paper's
seeds share Qwen3-30B-A3B-Base. Each rollout batch is split into 8 minibatches, declared before any run
as the setting where GRPO without replay should fail: updates 2-8 are off-policy, so the routes can
move between pi_old and an update, and the more updates the more they move.

Arms, on the same data, warm start and seeds: GRPO with replay of pi_old's routes ("grpo_r2"; replaying
the sampler's routes, R3, is bit-identical here: sampler and trainer share the model code), GRPO without
replay ("grpo") at grpo_r2's chosen learning rate (the paper's comparison: the same run with replay
removed), GSPO without replay ("gspo"), and the null control ("gspo_token", protocol). grpo_r2 and gspo
choose their rates. The GRPO arms run `train.compare_routes`: every update also computes the ratio on
the other routes, so the ratio with and without replay is measured on the same parameters and batch.

Cut for the budget (a study fits about two hours on 2 CPU cores): a per-seed warm start, the 16-expert
top-4 router (twice the expert FLOPs) and a separate "hot" setting at 3x the chosen rates.
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
    "model.model_type=qwen3_moe", "model.num_layers=4", "model.num_experts=8", "model.num_experts_per_tok=2",
    "model.moe_intermediate_size=32", "model.norm_topk_prob=true",
]
GRPO = ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.27",
        "train.compare_routes=true"]
ARMS = {
    "grpo_r2": [*GRPO, "algorithm.routing_replay=old"],
    "grpo": [*GRPO, "algorithm.routing_replay=none"],
    "gspo": ["algorithm.preset=gspo"],  # eps 3e-4 / 4e-4, beta=0, no replay
    "gspo_token": ["algorithm.preset=gspo_token"],
}
MINIBATCHES = 8


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
        halves=(protocol.Level("collapsed, GRPO without replay", protocol.collapsed, "grpo", 0.5),
                protocol.Level("collapsed, GRPO with R2", protocol.collapsed, "grpo_r2", 0.5, above=False))),
    protocol.Claim(
        "GSPO trains MoE stably without routing replay", source=SOURCE,
        paper="GSPO converges normally without Routing Replay, with reward at least that of GRPO with it",
        halves=(protocol.Level("collapsed, GSPO without replay", protocol.collapsed, "gspo", 0.5, above=False),
                protocol.Difference("training reward over the run", reward, "gspo", "grpo_r2"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "training reward, mean over the run": reward,
    "held-out greedy accuracy, last 20% of the run": lambda r: r.mean("eval/accuracy_greedy", 0.8),
    "changed experts per update (fraction, linear estimate)": per_update,
    "changed top-k sets, mean over a step's updates": lambda r: r.mean("routing/changed_sets_frac"),
    "mean |token log-ratio|, own routes (GRPO arms)": lambda r: r.mean("routing/log_ratio_abs_mean_own"),
    "mean |token log-ratio|, pi_old's routes (GRPO arms)": lambda r: r.mean("routing/log_ratio_abs_mean_replayed"),
    "max |token log-ratio|, own routes (GRPO arms)": lambda r: r.mean("routing/log_ratio_abs_max_own"),
    "max |token log-ratio|, pi_old's routes (GRPO arms)": lambda r: r.mean("routing/log_ratio_abs_max_replayed"),
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "router entropy": lambda r: r.mean("routing/entropy_mean"),
    "expert load (max / mean)": lambda r: r.mean("routing/expert_load"),
    "collapsed (fraction of seeds)": protocol.collapsed,
    "skipped (non-finite) updates": lambda r: float(sum(row.get("skipped_updates", 0) for row in r.rows)),
    **study.LENGTH_DISTRIBUTION,
}


def get_study(quick: bool) -> study.Study:
    base = override(long_addition_config(), [
        *MODEL, f"train.steps={10 if quick else 30}", f"train.minibatches={MINIBATCHES}",
        f"train.eval_prompts={128 if quick else 256}", f"train.eval_every={5 if quick else 10}",
        "train.checkpoint_every=10", "train.max_skipped_steps=10000",  # a run that skips updates goes on
    ])
    return study.Study(
        name="moe_routing",
        arms={name: override(base, changes) for name, changes in ARMS.items()},
        **study.sized(quick, (3e-5, 1e-4, 3e-4)),
        rate_from={"grpo": ("grpo_r2", 1.0)},
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(study.Plot("curves", (
            "reward/mean", "eval/accuracy_greedy", "routing/changed_experts_frac", "routing/log_ratio_abs_mean_own",
            "routing/log_ratio_abs_mean_replayed")),),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
