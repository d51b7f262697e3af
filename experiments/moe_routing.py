"""Mixture-of-experts RL with and without routing replay at toy scale (GSPO paper, arXiv 2507.18071,
sec. 5.3).

    python experiments/moe_routing.py [--quick] [--results-dir DIR] [--seeds 0 1 2] [--arms A B]

The paper's claims: after each gradient update about 10% of the experts activated for a token change
(48-layer Qwen3-30B-A3B), which makes GRPO's token ratios fluctuate, so GRPO needs Routing Replay
(the experts recorded with l^old replayed in every update) to converge; GSPO, whose sequence ratio
averages over tokens, trains the MoE model stably without it.

The policy is a tiny Qwen3-MoE (MODEL: 4 layers, all MoE, 8 experts of which 2 are routed per token,
normalized top-k gates like Qwen3-30B-A3B) on the quickstart's task (two-operand arithmetic,
characters) and schedule (64 prompts x 8 samples a step, 8e-4 cosine), warm-started until 20% greedy
held-out accuracy, each rollout batch split into 4 minibatches as in the paper (updates 2-4 of a batch
are off-policy: their routes can have moved since l^old). Arms, on the same data, warm start and seeds:
GRPO without replay ("grpo"), with replay of pi_old's routes ("grpo_r2", the paper's Routing Replay)
and of the sampler's routes ("grpo_r3", Rollout Routing Replay, arXiv 2510.11370), GSPO without replay
("gspo"); GRPO clips token ratios to [0.8, 1.27], GSPO sequence ratios to [1 - 3e-4, 1 + 4e-4], no KL.
Then two of the knobs the paper names, pushed together (the "_hot" arms: GRPO without replay and
with R2, GSPO): staler ratios (8 minibatches a rollout batch) and a 2x larger learning rate (in a
30-step probe at 4x, 3.2e-3, GRPO collapsed within 5 steps with and without R2: the step size alone
broke it). The third knob, more layers and experts, is not in the study: on this machine (2 cores
shared with other jobs) a 6-layer, 16-expert model with 8 minibatches took ~5 s a step.

Measured per arm and seed, every step: routing volatility, `routing/changed_experts_frac` (the
fraction of a token's activated experts that differ between pi_old and the params an update runs at,
over counted tokens and MoE layers; the paper's unit) and `routing/changed_sets_frac` (top-k sets that
differ at all). The trainer logs them as the mean over a step's M updates, whose j-th sees the drift of
j - 1 updates; "per update" below is that mean x 2 / (M - 1), exact if the drift grows linearly with
the updates (an overestimate by up to ~1.4x if it grows like a random walk). Also the token ratio
spread (mean over steps of max |log ratio| over tokens, `log_ratio_abs_max`, and of ratio_max -
ratio_min), the token clip fraction, skipped updates, training reward and held-out greedy accuracy.
A run collapses if its training reward over the last 20% of steps is below half its peak (the best
moving average over 10% of the steps) or it skips an update.

Verdicts (stated before running):
- "~10% of activated experts change per update": GRPO-without-replay's per-update changed-expert
  fraction (mean over seeds, base arms) in [5%, 20%]: reproduced; in [2%, 50%]: partial; else
  not_reproduced. The number depends on the scale and the step size (the paper's is for 48 layers,
  128 experts, top-8); at a toy scale only its order of magnitude is comparable.
- "routing changes make token ratios fluctuate": GRPO without replay has a larger token ratio spread
  (log_ratio_abs_max) than GRPO with R2 in every seed: reproduced; on the mean over seeds: partial;
  else not_reproduced. (With replay the top-k sets are fixed, so the spread left is the parameters'.)
- "GRPO needs routing replay": GRPO without replay collapses in a majority of seeds while GRPO with
  R2 does not, in the base or the hot setting: reproduced; no collapse, but its training reward (mean
  over the run) is below both replay arms' (R2 and R3; R2 only in the hot setting) in every seed, in
  a setting: partial; else not_reproduced.
- "GSPO trains MoE stably without routing replay": GSPO without replay never collapses and its
  training reward is at least GRPO-with-R2's minus 0.03 (means over seeds), in every setting run:
  reproduced; never collapses but its reward is lower by more than that somewhere: partial; collapses
  anywhere: not_reproduced.
"""

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax.config import override

import study
from warm_start import WarmStart

PAPER = "arXiv 2507.18071 (GSPO)"
MODEL = [  # a tiny Qwen3-MoE: the quickstart's attention and width, every MLP a mixture of 8 experts (top-2)
    "model.model_type=qwen3_moe", "model.num_layers=4", "model.num_experts=8", "model.num_experts_per_tok=2",
    "model.moe_intermediate_size=64", "model.norm_topk_prob=true",
]
HOT = ["train.minibatches=8", "optim.learning_rate=1.6e-3"]  # staler ratios and a larger step
GRPO = ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.27"]
ALGORITHMS = {  # the paper's GRPO baseline (with and without replay) and GSPO
    "grpo": [*GRPO, "algorithm.routing_replay=none"],
    "grpo_r2": [*GRPO, "algorithm.routing_replay=old"],
    "grpo_r3": [*GRPO, "algorithm.routing_replay=sampler"],
    "gspo": ["algorithm.preset=gspo", "algorithm.routing_replay=none"],  # eps 3e-4 / 4e-4, beta=0
}
HOT_ALGORITHMS = ("grpo", "grpo_r2", "gspo")


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [
        *MODEL, f"train.steps={30 if quick else 100}", "train.minibatches=4", "train.eval_prompts=256",
        "train.eval_every=25", "train.checkpoint_every=10000", "train.max_skipped_steps=10000",
    ])
    arms = {name: override(base, changes) for name, changes in ALGORITHMS.items()}
    if not quick:
        arms |= {f"{name}_hot": override(base, [*ALGORITHMS[name], *HOT]) for name in HOT_ALGORITHMS}
    settings = [("", tuple(ALGORITHMS))] + ([] if quick else [("_hot", tuple(f"{a}_hot" for a in HOT_ALGORITHMS))])
    return study.Study(
        name="moe_routing",
        arms=arms,
        seeds=(0, 1) if quick else (0, 1, 2),
        warm_start=WarmStart(accuracy=0.2),
        derive={"clip_frac_tokens": study.clip_frac_tokens,
                "ratio_spread": lambda r: r["ratio_max"] - r["ratio_min"] if "ratio_max" in r else None},
        table=TABLE,
        plots=tuple(study.Plot(f"curves{tag or '_base'}", (
            "reward/mean", "eval/accuracy_greedy", "routing/changed_experts_frac", "log_ratio_abs_max",
            "clip_frac_tokens"), arms=names) for tag, names in settings),
    )


def per_update(run) -> float:
    """The changed-expert fraction after one update (see the docstring: linear drift)."""
    m = run.config.algorithm.num_iterations * run.config.train.minibatches
    return run.mean("routing/changed_experts_frac") * 2 / (m - 1)


def reward(run):  # mean over the run: the area under reward vs updates, per update
    return run.mean("reward/mean")


def spread(run):
    return run.mean("log_ratio_abs_max")


def skipped(run):
    return float(sum(r.get("skipped_updates", 0) for r in run.rows))


def collapsed(run) -> bool:
    _, y = run.series("reward/mean")
    w = max(1, len(y) // 10)
    peak = np.convolve(y, np.ones(w) / w, mode="valid").max()
    return run.mean("reward/mean", 0.8) < 0.5 * peak or skipped(run) > 0


TABLE = {
    "training reward, mean over the run": reward,
    "training reward, last 20%": lambda r: r.mean("reward/mean", 0.8),
    "held-out greedy accuracy, last 20% of the run": lambda r: r.mean("eval/accuracy_greedy", 0.8),
    "changed experts per update (fraction, linear estimate)": per_update,
    "changed experts, mean over a step's updates": lambda r: r.mean("routing/changed_experts_frac"),
    "changed top-k sets, mean over a step's updates": lambda r: r.mean("routing/changed_sets_frac"),
    "token ratio spread: max |log ratio|": spread,
    "token ratio spread: ratio_max - ratio_min": lambda r: r.mean("ratio_spread"),
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "router entropy": lambda r: r.mean("routing/entropy_mean"),
    "expert load (max / mean)": lambda r: r.mean("routing/expert_load"),
    "skipped updates": skipped,
    "collapsed (fraction of seeds)": lambda r: float(collapsed(r)),
    "wall seconds per run (shared machine)": lambda r: r.wall_seconds,
}


def claims(results: study.Results) -> list[dict]:
    settings = [tag for tag in ("", "_hot") if all(f"{a}{tag}" in results for a in ("grpo", "grpo_r2", "gspo"))]
    if not settings:
        return [study.claim(c, source=f"{PAPER}, Section 5.3", paper=p, measured="not run", verdict="not_run",
                            rule="needs the arms grpo, grpo_r2 and gspo") for c, p in CLAIMS]

    def named(tag):
        return "base" if not tag else "hot"

    def collapses(arm):
        return np.asarray([collapsed(r) for r in results[arm]])

    volatility = results.values("grpo", per_update) if "" in settings else None
    vol_text = [f"{named(t)}: GRPO {study.spread(results.values('grpo' + t, per_update))} per update "
                f"(changed top-k sets, mean over a step's updates {study.spread(results.values('grpo' + t, lambda r: r.mean('routing/changed_sets_frac')))}); "
                f"GSPO {study.spread(results.values('gspo' + t, per_update))}" for t in settings]

    fluct, fluct_text = [], []
    for t in settings:
        none, r2 = results.values("grpo" + t, spread), results.values("grpo_r2" + t, spread)
        fluct.append("all" if (none > r2).all() else "mean" if none.mean() > r2.mean() else "no")
        fluct_text.append(f"{named(t)}: max |log ratio| GRPO {study.spread(none)} vs GRPO-R2 {study.spread(r2)} "
                          f"(ratio_max - ratio_min {study.spread(results.values('grpo' + t, lambda r: r.mean('ratio_spread')))} "
                          f"vs {study.spread(results.values('grpo_r2' + t, lambda r: r.mean('ratio_spread')))})")

    needs, needs_text = [], []
    for t in settings:
        replay = [a + t for a in ("grpo_r2", "grpo_r3") if a + t in results]
        c_none, c_r2 = collapses("grpo" + t), collapses("grpo_r2" + t)
        below = all((results.values("grpo" + t, reward) < results.values(a, reward)).all() for a in replay)
        needs.append("all" if c_none.mean() > 0.5 and not c_r2.any() else "mean" if not c_none.any() and below
                     else "no")
        needs_text.append(f"{named(t)}: collapsed seeds GRPO {c_none.sum()}/{c_none.size}, " + ", ".join(
            f"{a} {collapses(a).sum()}/{c_none.size}" for a in replay) + "; training reward GRPO "
            f"{study.spread(results.values('grpo' + t, reward))}, " + ", ".join(
            f"{a} {study.spread(results.values(a, reward))}" for a in replay))

    stable, stable_text = [], []
    for t in settings:
        c = collapses("gspo" + t)
        gap = results.values("gspo" + t, reward).mean() - results.values("grpo_r2" + t, reward).mean()
        stable.append("no" if c.any() else "all" if gap >= -0.03 else "mean")
        stable_text.append(f"{named(t)}: GSPO collapsed seeds {c.sum()}/{c.size}, training reward "
                           f"{study.spread(results.values('gspo' + t, reward))} vs GRPO-R2 "
                           f"{study.spread(results.values('grpo_r2' + t, reward))} (GSPO minus GRPO-R2 {gap:+.3f})")

    def any_level(levels):
        return "reproduced" if "all" in levels else "partial" if "mean" in levels else "not_reproduced"

    if volatility is None:
        vol_verdict = "not_run"
    else:
        v = volatility.mean()
        vol_verdict = "reproduced" if 0.05 <= v <= 0.2 else "partial" if 0.02 <= v <= 0.5 else "not_reproduced"
    (c1, p1), (c2, p2), (c3, p3), (c4, p4) = CLAIMS
    source = f"{PAPER}, Section 5.3"
    return [
        study.claim(c1, source=source, paper=p1, measured="; ".join(vol_text), verdict=vol_verdict,
                    rule="GRPO-without-replay's per-update changed-expert fraction (base arms, mean over seeds) in "
                         "[5%, 20%]: reproduced; in [2%, 50%]: partial; else not_reproduced"),
        study.claim(c2, source=source, paper=p2, measured="; ".join(fluct_text), verdict=any_level(fluct),
                    rule="GRPO's max |log ratio| above GRPO-R2's in every seed (in a setting): reproduced; on the "
                         "mean: partial; else not_reproduced"),
        study.claim(c3, source=source, paper=p3, measured="; ".join(needs_text), verdict=any_level(needs),
                    rule="in a setting, GRPO without replay collapses in a majority of seeds and GRPO-R2 in none: "
                         "reproduced; no collapse but reward below every replay arm's in every seed: partial; else "
                         "not_reproduced"),
        study.claim(c4, source=source, paper=p4, measured="; ".join(stable_text),
                    verdict="not_reproduced" if "no" in stable else "reproduced" if set(stable) == {"all"}
                    else "partial",
                    rule="GSPO never collapses and its reward >= GRPO-R2's - 0.03 in every setting: reproduced; "
                         "never collapses but lower somewhere: partial; collapses anywhere: not_reproduced"),
    ]


CLAIMS = [
    ("About 10% of the experts activated for a token change after each gradient update",
     "roughly 10% of the activated experts change after each RL gradient update (48-layer Qwen3-30B-A3B-Base)"),
    ("Routing changes make GRPO's token ratios fluctuate; routing replay removes that",
     "expert-activation volatility makes token-level importance ratios fluctuate drastically; Routing Replay "
     "replays pi_old's experts so the ratios are computed on the same network"),
    ("GRPO needs routing replay for MoE RL to converge",
     "without Routing Replay GRPO's MoE training fails to converge normally (collapse)"),
    ("GSPO trains MoE stably without routing replay",
     "GSPO converges normally without Routing Replay, with reward at least that of GRPO with it"),
]


if __name__ == "__main__":
    study.main(get_study, claims)
