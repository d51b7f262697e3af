"""GSPO vs GRPO at toy scale: training efficiency (GSPO paper, arXiv 2507.18071, Figure 1) and the
fraction of clipped tokens (its Figure 2).

    python experiments/gspo_vs_grpo.py [--quick] [--results-dir DIR] [--seeds 0 1 2]

The paper's two arms on the same data, compute and seeds: GRPO (token ratios clipped to
[1 - 0.2, 1 + 0.27], no KL) and GSPO (sequence ratios clipped to [1 - 3e-4, 1 + 4e-4]), each rollout
batch split into 4 minibatches (so updates 2-4 of a batch are off-policy and clipping can act). The
policy is the quickstart's tiny Qwen3-style model (2 layers, d=64, characters) on three-operand
arithmetic ("7-3+9=" -> "13"), warm-started until 20% greedy held-out accuracy: the RL phase takes
hundreds of steps (reward from ~0.15 to ~0.35 in 300 steps). The learning rate is the same for both
arms of a pair and swept over LEARNING_RATES, because the ranking of the arms changed with it in the
search (one seed, 300 steps: GRPO ahead at 3e-4 and 8e-4, GSPO ahead at 2e-3).

Measured per arm and seed: training reward (mean over the run = area under the reward-vs-updates
curve), greedy accuracy on 256 held-out problems (mean of the evaluations in the last 20% of the
run), the fraction of tokens clipped (clip_frac_low_tokens + clip_frac_high_tokens: a clipped
sequence counts all its tokens, the paper's unit), sampled tokens and wall time. Arms of a pair sample
the same prompts and as many completions, so equal updates are equal rollout compute (their token
counts are reported too).
Verdicts: Figure 1 is "reproduced" if GSPO beats GRPO on both reward and final accuracy in every
seed (paired by seed) at every learning rate, "partial" if at some, "not_reproduced" if at none.
Figure 2 is "reproduced" if GSPO clips at least 10^1.5 (~32) times GRPO's token fraction at every
learning rate ("two orders of magnitude" within a factor ~3), "partial" if it clips more but less
than that somewhere, "not_reproduced" if not more.
"""

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax.config import override

import study
from warm_start import WarmStart

PAPER = "arXiv 2507.18071 (GSPO)"
LEARNING_RATES = (3e-4, 8e-4, 2e-3)
ARMS = {  # the paper's settings; the rest of the config is shared
    "grpo": ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.27"],
    "gspo": ["algorithm.preset=gspo"],  # eps_low=3e-4, eps_high=4e-4, beta=0
}


def arm(name: str, lr: float) -> str:
    return f"{name}_lr{lr:g}"


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [  # the quickstart's model, sampling and schedule; three operands
        "task.num_operands=3", "task.max_value=9", f"train.steps={150 if quick else 300}", "train.minibatches=4",
        "train.eval_prompts=256", "train.eval_every=25", "train.checkpoint_every=10000",
    ])
    rates = (2e-3,) if quick else LEARNING_RATES
    arms = {arm(name, lr): override(base, [*changes, f"optim.learning_rate={lr}"])
            for lr in rates for name, changes in ARMS.items()}
    return study.Study(
        name="gspo_vs_grpo",
        arms=arms,
        seeds=(0, 1) if quick else (0, 1, 2),
        warm_start=WarmStart(accuracy=0.2),
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(
            *(study.Plot(f"curves_lr{lr:g}", ("reward/mean", "eval/accuracy_greedy", "clip_frac_tokens"),
                         arms=(arm("grpo", lr), arm("gspo", lr))) for lr in rates),
            study.Plot("reward_accuracy_vs_tokens", ("reward/mean", "eval/accuracy_greedy"), x="tokens"),
            study.Plot("clipped_tokens", ("clip_frac_tokens",), logy=True),
        ),
    )


def reward(run):  # mean over the run: the area under reward vs updates, per update
    return run.mean("reward/mean")


def final_accuracy(run):
    return run.mean("eval/accuracy_greedy", 0.8)


def clipped(run):
    return run.mean("clip_frac_tokens")


TABLE = {
    "training reward, mean over the run": reward,
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "clipped token fraction": clipped,
    "sequences clipped (fraction)": lambda r: r.mean("clip_frac_low") + r.mean("clip_frac_high"),
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
    "wall seconds per run (shared machine)": lambda r: r.wall_seconds,
}


def claims(results: study.Results) -> list[dict]:
    rates = [float(a.removeprefix("grpo_lr")) for a in results if a.startswith("grpo_lr")]
    fig1, fig2, better, ratios = [], [], [], []
    for lr in rates:
        grpo, gspo = arm("grpo", lr), arm("gspo", lr)
        wins = []
        parts = []
        for label, fn in (("reward", reward), ("final held-out accuracy", final_accuracy)):
            d = results.values(gspo, fn) - results.values(grpo, fn)
            wins.append(bool((d > 0).all()))
            parts.append(f"{label} GSPO {study.spread(results.values(gspo, fn))} vs GRPO "
                         f"{study.spread(results.values(grpo, fn))}, paired difference {study.spread(d)}")
        better.append(all(wins))
        tokens = np.divide(*(results.values(a, lambda r: r.last("tokens")).mean() for a in (gspo, grpo)))
        fig1.append(f"lr {lr:g}: " + "; ".join(parts) + f" (GSPO sampled {tokens:.3f}x GRPO's tokens)")
        c_gspo, c_grpo = results.values(gspo, clipped), results.values(grpo, clipped)
        ratios.append(c_gspo.mean() / max(c_grpo.mean(), 1e-12))
        fig2.append(f"lr {lr:g}: GSPO {study.spread(c_gspo)} vs GRPO {study.spread(c_grpo)} ({ratios[-1]:.0f}x)")
    best = {a: max(rates, key=lambda lr: results.values(arm(a, lr), reward).mean()) for a in ARMS}
    best_note = (f"best learning rate by reward: GRPO {best['grpo']:g} "
                 f"({results.values(arm('grpo', best['grpo']), reward).mean():.3f}), GSPO {best['gspo']:g} "
                 f"({results.values(arm('gspo', best['gspo']), reward).mean():.3f})")
    return [
        study.claim(
            "GSPO trains more efficiently than GRPO: higher training reward and held-out accuracy for the same "
            "training compute",
            source=f"{PAPER}, Figure 1",
            paper="GSPO's training reward and benchmark accuracy (AIME'24, LiveCodeBench, CodeForces) above "
                  "GRPO's throughout, at equal training compute",
            measured="; ".join(fig1) + f"; {best_note}",
            verdict="reproduced" if all(better) else "partial" if any(better) else "not_reproduced",
            rule="GSPO ahead on both reward and final accuracy in every seed: reproduced at every learning rate, "
                 "partial at some, not_reproduced at none",
            gspo_ahead_at={f"{lr:g}": b for lr, b in zip(rates, better)},
        ),
        study.claim(
            "GSPO clips about two orders of magnitude more tokens than GRPO",
            source=f"{PAPER}, Figure 2",
            paper="clipped token fraction ~0.15 (GSPO) vs ~0.0013 (GRPO), ~100x",
            measured="; ".join(fig2),
            verdict="reproduced" if min(ratios) >= 10 ** 1.5 else "partial" if min(ratios) > 1 else "not_reproduced",
            rule="GSPO's fraction >= 10^1.5 x GRPO's at every learning rate: reproduced; more but less than that "
                 "somewhere: partial; not more: not_reproduced",
            ratio_at={f"{lr:g}": float(np.round(r, 1)) for lr, r in zip(rates, ratios)},
        ),
    ]


if __name__ == "__main__":
    study.main(get_study, claims)
