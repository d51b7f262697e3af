"""Seed-paper claims that one preset reaches a higher accuracy than another, on long written-out
completions, under the shared protocol (experiments/protocol.py).

    python experiments/preset_table.py [--quick] [--resume] [--rejudge] [--arms grpo dapo ...]

The presets differ where completion length matters: DAPO aggregates over tokens (a long completion
weighs more than a short one), clips higher, shapes overlong rewards and resamples groups without a
reward signal; GMPO takes the geometric mean of a completion's token ratios; SAPO replaces hard clips
by a soft gate on each token ratio. So the study runs on gspo_vs_grpo's long task: column addition
written out column by column (reference completions of 24 to 182 tokens, median 41;
experiments/configs/long_addition.py), from gspo_vs_grpo's warm start (25% greedy held-out accuracy,
solving mostly the short problems). 16 prompts x 8 samples a step, 4 minibatches (updates 2-4 of a
rollout batch are off-policy, so ratios, clips and gates act), 40 steps, held-out greedy accuracy on
256 prompts every 20 steps, overall and per problem-length bucket.

Arms: the presets of the claims, each as registered in grpo_jax.algorithms.PRESETS (grpo keeps its KL
term, beta 0.04), and GSPO-token beside GSPO: the null control, the same objective as gspo at
sequence-level advantages on its own rollouts, whose paired differences from gspo are every claim's
noise floor. DAPO's dynamic sampling draws up to 3 rollout batches a step (its tokens are in the
table; the paper compares per step, and so does this study); its overlong penalty ramps from 160
tokens (the last 20% of max_new_tokens=199), which only solutions of 14 or more digits reach (the
warm start solves none of 6 or more).

Each arm's learning rate is chosen on selection seeds 100 and 101 from 1e-4, 3e-4 and 1e-3 (40 steps
are short: in long_addition's measurements, of GSPO, 3e-4 raised accuracy fastest and 1e-3 collapsed
by step 50, so the grid brackets the best rate from both sides); gspo_token takes gspo's.

Claims (CLAIMS, declared before any run): DAPO and GMPO each above GRPO in held-out accuracy, overall
and on the long problems (reference completions of 32-64 tokens, mostly 3-5 digits: the longest the
warm start solves some of), where their length-related changes should act; SAPO above GRPO and above
GSPO. Cut for the budget: S-GRPO above Dr. GRPO (arXiv 2508.05928, abstract: "outperforms Dr. GRPO by
2.2-2.5 points"). The two differ only in the advantage's model of flipped rewards, whose purpose
neither concerns completion length nor is exercised by this task's exact, noiseless reward, and their
two arms would add 28 runs.

The budget of a full study (about 2 hours here): the selection is 5 arms (all but gspo_token) x 3
rates x 2 seeds = 30 runs, the evaluation 6 arms x 8 seeds = 48 runs, one warm start per seed (10),
shared by the arms; hence 40 steps, not gspo_vs_grpo's 100, and the S-GRPO claim cut (with it, 106
runs). --quick: the 6 arms at their config's rate (1e-4), 2 seeds, 30 steps, 128 held-out prompts.

The committed study's report also rewrites the measured table in docs/presets.md, between the
grpo_jax.algorithms.presets_doc.STUDY_BEGIN / STUDY_END lines.
"""

import json
import pathlib

import numpy as np
from configs.long_addition import get_config as long_addition_config  # experiments/configs/long_addition.py

from grpo_jax.algorithms.presets_doc import PATH as PRESETS_DOC
from grpo_jax.algorithms.presets_doc import with_study_table
from grpo_jax.config import override

import protocol
import study
from gspo_vs_grpo import BUCKETS, LONG, WARM_START, final_accuracy

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results" / "preset_table"  # the committed study: its report rewrites docs/presets.md
NULL = ("gspo", "gspo_token")
ACCURACY = "held-out greedy accuracy, last 20%"


def on_problems(bucket: str) -> str:
    return f"held-out greedy accuracy on problems of {bucket} tokens, last 20%"


LONG_ACCURACY = on_problems(LONG)


def long_accuracy(run):
    return final_accuracy(run, LONG)


def accuracy_halves(method: str) -> tuple[protocol.Difference, protocol.Difference]:
    return (protocol.Difference(ACCURACY, final_accuracy, method, "grpo"),
            protocol.Difference(LONG_ACCURACY, long_accuracy, method, "grpo"))


CLAIMS = (
    protocol.Claim(
        "DAPO reaches a higher held-out accuracy than GRPO, on the long problems too",
        source="arXiv 2503.14476 (DAPO), Table 1 and sec. 3.3",
        paper="AIME 2024 avg@32 of Qwen2.5-32B: naive GRPO 30, DAPO 50; the token-level loss is there because a "
              "sample-level loss underweights the tokens of long responses",
        halves=accuracy_halves("dapo")),
    protocol.Claim(
        "GMPO reaches a higher held-out accuracy than GRPO, on the long problems too (the more token ratios a "
        "completion has, the more outliers the geometric mean damps)",
        source="arXiv 2507.20673 (GMPO), abstract",
        paper="GMPO-7B outperforms GRPO by 4.1% on average on mathematical benchmarks; the geometric mean is less "
              "sensitive to outlier token ratios and keeps them in a more stable range",
        halves=accuracy_halves("gmpo")),
    protocol.Claim(
        "SAPO reaches a higher held-out accuracy than GRPO and than GSPO", source="arXiv 2511.20347 (SAPO), abstract",
        paper="higher Pass@1 than GRPO and GSPO on mathematical reasoning under comparable training budgets",
        halves=(protocol.Difference(ACCURACY, final_accuracy, "sapo", "grpo"),
                protocol.Difference(ACCURACY, final_accuracy, "sapo", "gspo"))),
)
ARMS = ("grpo", "dapo", "gmpo", "sapo", *NULL)  # the claims' arms and the null pair


claims = protocol.judging(CLAIMS, NULL)


def accuracy_area(run):
    """Area under held-out greedy accuracy vs step, over the steps: the mean accuracy over training."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    return float(np.trapezoid(acc, steps) / steps[-1]) if steps.size > 1 else float("nan")


TABLE = {
    ACCURACY: final_accuracy,
    **{on_problems(b): (lambda r, b=b: final_accuracy(r, b)) for b in BUCKETS},
    "held-out accuracy area (mean over training)": accuracy_area,
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "entropy, last 10% of steps": lambda r: r.mean("entropy_mean", 0.9),
    **study.LENGTH_DISTRIBUTION,
    "rollout batches drawn per step": lambda r: r.mean("groups/gen_rounds"),
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
}


def get_study(quick: bool) -> study.Study:
    base = override(long_addition_config(), [
        f"train.steps={30 if quick else 40}", "train.minibatches=4", f"train.eval_prompts={128 if quick else 256}",
        f"train.eval_every={10 if quick else 20}", "train.checkpoint_every=20",
    ])
    return study.Study(
        name="preset_table",
        arms={preset: override(base, [f"algorithm.preset={preset}"]) for preset in ARMS},
        **study.sized(quick, (1e-4, 3e-4, 1e-3)),
        null_pair=NULL,
        warm_start=WARM_START,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(study.Plot("curves", ("eval/accuracy_greedy", f"eval/accuracy_greedy@{LONG}", "reward/mean",
                                     "clip_frac_tokens", "completion/length_mean"), x="step"),),
        report=report,
    )


def ranking(summary: dict, label: str) -> str:
    order = sorted(summary["table"], key=lambda a: -(summary["table"][a][label]["mean"] or -1))
    return ", ".join(f"{a} {study.number(summary['table'][a][label]['mean'])}" for a in order)


def report(results: study.Results, results_dir: pathlib.Path) -> str:
    """The rankings beside the table and a bar chart of the claims' accuracies; for the committed
    study, the table in docs/presets.md."""
    summary = json.loads((results_dir / "summary.json").read_text())
    lines = ["", f"By held-out accuracy: {ranking(summary, ACCURACY)}.", "",
             f"By held-out accuracy on problems of {LONG} tokens: {ranking(summary, LONG_ACCURACY)}.", ""]
    bar_chart(results, results_dir / "final_accuracy.png")
    if results_dir.resolve() == RESULTS.resolve():
        cfg, rates = summary["config"], summary["learning_rate_selection"]
        block = "\n".join([
            f"The presets of seed-paper accuracy claims and the null pair on column addition written out, "
            f"{len(summary['seeds'])} seeds, {cfg['train.steps']} steps of {cfg['train.prompts_per_step']} prompts x "
            f"{cfg['sampling.group_size']} samples from one warm start per seed "
            "([experiments/preset_table.py](experiments/preset_table.py); the claims with their verdicts, the setting "
            "and the curves: [table.md](experiments/results/preset_table/table.md)). Mean ± std over seeds; accuracy "
            f"is greedy, on {cfg['train.eval_prompts']} held-out prompts"
            + (", each arm at its chosen learning rate (" + ", ".join(f"{a} {s['chosen']:g}" for a, s in rates.items())
               + ")." if rates else "."),
            "",
            *study.table_rows(summary),
            *lines,
        ])
        PRESETS_DOC.write_text(with_study_table(PRESETS_DOC.read_text(), block.replace("](experiments/", "](../experiments/")))
    return "\n".join(lines)


def bar_chart(results: study.Results, path: pathlib.Path) -> None:
    """Per arm, the claims' two accuracies: mean ± std bars, seeds as dots, the warm start's as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = sorted(results, key=lambda a: np.nanmean(results.values(a, final_accuracy)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(arms) + 1.4), sharey=True)
    for ax, (label, bucket) in zip(axes, ((ACCURACY, ""), (LONG_ACCURACY, LONG))):
        key = "eval/accuracy_greedy" + (f"@{bucket}" if bucket else "")
        values = [results.values(a, lambda r: final_accuracy(r, bucket)) for a in arms]
        ax.barh(range(len(arms)), [v.mean() for v in values], xerr=[v.std(ddof=1) if v.size > 1 else 0 for v in values],
                color="C0", alpha=0.7)
        for i, v in enumerate(values):
            ax.plot(v, [i] * len(v), "k.", ms=3)
        warm = [r.rows[0][key] for a in arms for r in results[a] if key in r.rows[0]]  # step 0: the warm start's
        if warm:  # (a bucket without held-out prompts has no accuracy)
            ax.axvline(np.mean(warm), color="gray", ls="--", lw=1, label=f"warm start {np.mean(warm):.3f}")
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    axes[0].set_yticks(range(len(arms)), arms, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    study.main(get_study, claims)
