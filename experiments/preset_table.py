"""Every preset on one task and budget: the preset table (issue 15, item 3).

    python experiments/preset_table.py [--quick] [--results-dir DIR] [--seeds 0 1 2] [--arms grpo gspo ...]

One arm per preset of `grpo_jax.algorithms.PRESETS`, named after it, each run as registered (its own
advantage, loss, aggregation, clip range, KL coefficient, dynamic sampling). The shared setting is the
quickstart's (experiments/configs/quickstart.py): the tiny character-level Qwen3-style policy on
two-operand arithmetic ("13-7=" -> "6"), exact-match reward, 64 prompts x 8 samples a step, 2
minibatches (the second update of a rollout batch is off-policy, so ratios and clipping act), Adam
with a cosine learning rate. Changed from it: 60 steps at learning rate 2e-3 (gspo_vs_grpo's rate: the
runs are short), max_new_tokens=5 (the longest answer, "-19" and the end token, is 4 tokens: at 4,
DAPO's overlong shaping would score a correct "-13" as 0; at 5 it penalizes only completions without
an end token), 256 held-out prompts evaluated every 10 steps, rewards scored in-process. Every seed
starts every arm from one supervised warm start (experiments/warm_start.py, to 20% greedy held-out
accuracy), and draws the same prompts.

What a preset needs beyond the shared setting is set here (`special`), and the table's notes say it:
losses without an importance ratio run one update per rollout batch (train.minibatches=1: the trainer
refuses an uncorrected off-policy update), and a preset that normalizes each reward component
(MO-GRPO) gets two components (exact and a small length cost), as with one it would be GRPO without
KL. An arm that still fails the trainer's checks (made before anything compiles) is not run and gets
a row saying why.

Measured per preset (mean ± std over seeds): held-out greedy accuracy after the last step; the area
under the held-out accuracy curve (trapezoid over the evaluations, divided by the steps: the mean
accuracy over training); the clipped token fraction (clip_frac_low_tokens + clip_frac_high_tokens, a
clipped sequence counting all its tokens; 0 for losses without hard clips), mean over the run; policy
entropy over the last 10% of the steps; completion tokens sampled (DAPO's dynamic sampling draws
more); wall seconds per run (a shared machine).

Claims: where a seed paper says its method beats another on accuracy and both are presets here, the
ordering is checked (`ORDERINGS`): "reproduced" if the method is ahead of each baseline on both the
final accuracy and the area in every seed (paired by seed), "partial" if ahead on the mean over seeds
of both, "not_reproduced" otherwise; "not_run" when an arm was not run. These are toy-scale readings
(a 2-layer model, 60 steps) of claims made on 1.5B-32B models and math benchmarks.

The results of the full study (experiments/results/preset_table) also rewrite the table in
docs/presets.md, between the grpo_jax.algorithms.presets_doc.STUDY_BEGIN / STUDY_END lines.
"""

import json
import pathlib

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax import trainer
from grpo_jax import train_step as ts
from grpo_jax.algorithms import PRESETS
from grpo_jax.algorithms.presets_doc import PATH as PRESETS_DOC
from grpo_jax.algorithms.presets_doc import with_study_table
from grpo_jax.config import AlgorithmConfig, override

import study
from warm_start import WarmStart

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results" / "preset_table"  # the committed study: its report rewrites docs/presets.md
QUICK_ARMS = ("grpo", "dapo", "gmpo", "rloo", "mo_grpo")  # a clipped, a dynamic-sampling, a sequence, a
# ratio-free and a two-reward preset
PLOT_ARMS = 7  # presets per curves figure (the colour cycle has 10)
# (method, baselines, source, what the paper reports): seed-paper claims of a better accuracy
ORDERINGS = (
    ("dapo", ("grpo",), "arXiv 2503.14476 (DAPO), Table 1",
     "AIME 2024 avg@32 of Qwen2.5-32B: naive GRPO 30, DAPO 50"),
    ("gmpo", ("grpo",), "arXiv 2507.20673 (GMPO), abstract",
     "GMPO-7B outperforms GRPO by 4.1% on average on mathematical benchmarks"),
    ("sapo", ("grpo", "gspo"), "arXiv 2511.20347 (SAPO), abstract",
     "higher Pass@1 than GRPO and GSPO on mathematical reasoning under comparable training budgets"),
    ("s_grpo", ("dr_grpo",), "arXiv 2508.05928 (S-GRPO), abstract",
     "outperforms Dr. GRPO by 2.2-2.5 points (Qwen-Math-7B, Llama-3.2-3B, Qwen-Math-1.5B)"),
)


def special(preset: str) -> tuple[list[str], str]:
    """The overrides a preset needs beyond the shared setting, and why (the table's note)."""
    alg = AlgorithmConfig.from_preset(preset)
    if not alg.loss.spec.ratio:
        return ["train.minibatches=1"], (f"train.minibatches=1: its loss ({alg.loss.name}) has no importance ratio, "
                                         "so one update per rollout batch (the others make 2)")
    if alg.reward_combine == "normalize_each":
        return ["reward.names=exact,length", "reward.weights=1,0.1"], (
            "rewards exact + 0.1 x length (-L/L_max): it normalizes each reward component, and with one "
            "component it would be grpo without KL")
    return [], ""


def base_config(quick: bool):
    steps = 30 if quick else 60
    return override(quickstart_config(), [
        f"train.steps={steps}", "optim.learning_rate=2e-3", "sampling.max_new_tokens=5", "train.eval_prompts=256",
        f"train.eval_every={steps // 6}", "train.checkpoint_every=10000", "reward.num_workers=0",
    ])


def arms_and_notes(quick: bool) -> tuple[dict, dict[str, str], dict[str, str]]:
    """(arm -> Config, arm -> note, preset -> why it was not run)."""
    base, arms, notes, not_run = base_config(quick), {}, {}, {}
    for preset in QUICK_ARMS if quick else PRESETS:
        changes, note = special(preset)
        try:
            cfg = override(base, [f"algorithm.preset={preset}", *changes])
            trainer.check(cfg)
            ts.check(cfg)
        except ValueError as e:
            not_run[preset] = str(e)
            continue
        arms[preset] = cfg
        if note:
            notes[preset] = note
    return arms, notes, not_run


def get_study(quick: bool) -> study.Study:
    arms, _, _ = arms_and_notes(quick)
    names = list(arms)
    groups = [names[i:i + PLOT_ARMS] for i in range(0, len(names), PLOT_ARMS)]
    return study.Study(
        name="preset_table",
        arms=arms,
        seeds=(0, 1) if quick else (0, 1, 2),
        warm_start=WarmStart(accuracy=0.2),
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=tuple(study.Plot(f"curves_{k + 1}", ("eval/accuracy_greedy", "reward/mean", "clip_frac_tokens",
                                                   "entropy_mean"), x="step", arms=tuple(g))
                    for k, g in enumerate(groups)),
        report=report,
    )


def final_accuracy(run):
    return run.last("eval/accuracy_greedy")


def accuracy_area(run):
    """Area under held-out greedy accuracy vs step, over the steps: the mean accuracy over training."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    return float(np.trapezoid(acc, steps) / steps[-1]) if steps.size > 1 else float("nan")


TABLE = {
    "final held-out accuracy": final_accuracy,
    "held-out accuracy area": accuracy_area,
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "entropy, last 10% of steps": lambda r: r.mean("entropy_mean", 0.9),
    "tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
    "wall seconds": lambda r: r.wall_seconds,
}


def claims(results: study.Results) -> list[dict]:
    out = []
    for method, baselines, source, paper in ORDERINGS:
        claim = f"{method} reaches a higher accuracy than {' and '.join(baselines)}"
        missing = [a for a in (method, *baselines) if a not in results]
        if missing:
            out.append(study.claim(claim, source=source, paper=paper, verdict="not_run",
                                   measured=f"arm(s) {', '.join(missing)} not in this run"))
            continue
        every, mean, parts = [], [], []
        for base in baselines:
            for label, fn in (("final accuracy", final_accuracy), ("accuracy area", accuracy_area)):
                d = results.values(method, fn) - results.values(base, fn)
                every.append(bool((d > 0).all()))
                mean.append(bool(d.mean() > 0))
                parts.append(f"{label} {method} {study.spread(results.values(method, fn))} vs {base} "
                             f"{study.spread(results.values(base, fn))}, paired difference {study.spread(d)}")
        out.append(study.claim(
            claim, source=source, paper=paper, measured="; ".join(parts),
            verdict="reproduced" if all(every) else "partial" if all(mean) else "not_reproduced",
            rule="ahead of each baseline on final held-out accuracy and on its area in every seed: reproduced; "
                 "on the mean over seeds of both: partial; else not_reproduced"))
    return out


def ranking(summary: dict, label: str) -> str:
    order = sorted(summary["table"], key=lambda a: -(summary["table"][a][label]["mean"] or -1))
    return ", ".join(f"{a} {summary['table'][a][label]['mean']:.3f}" for a in order)


def report(results: study.Results, results_dir: pathlib.Path) -> str:
    """The notes beside the table and a bar chart of final accuracy; for the committed study, the
    table in docs/presets.md."""
    summary = json.loads((results_dir / "summary.json").read_text())
    _, notes, not_run = arms_and_notes(summary["quick"])
    notes = {a: n for a, n in notes.items() if a in results}
    not_run = {p: w for p, w in not_run.items() if p not in results}
    ran_with = [*(f"- `{a}`: {n}" for a, n in notes.items()), *(f"- `{p}`: not run: {w}" for p, w in not_run.items())]
    lines = ["", *(["Ran with, beyond the shared setting:", "", *ran_with, ""] if ran_with else []),
             f"By final held-out accuracy: {ranking(summary, 'final held-out accuracy')}.", "",
             f"By accuracy area: {ranking(summary, 'held-out accuracy area')}.", ""]
    bar_chart(summary, results_dir / "final_accuracy.png")
    if results_dir.resolve() == RESULTS.resolve():
        seeds = summary["seeds"]
        block = "\n".join([
            f"Every preset on the quickstart's arithmetic task, {len(seeds)} seeds {seeds}, "
            f"{summary['config']['train.steps']} steps of {summary['config']['train.prompts_per_step']} prompts x "
            f"{summary['config']['sampling.group_size']} samples from one warm start "
            "([experiments/preset_table.py](experiments/preset_table.py); the setting, the claims and the curves: "
            "[table.md](experiments/results/preset_table/table.md)). Mean ± std over seeds; accuracy is greedy, "
            "on 256 held-out prompts; the area is the mean held-out accuracy over training.",
            "",
            *study.table_rows(summary),
            *(f"| {p} | not run: {w} |" + " |" * (len(TABLE) - 1) for p, w in not_run.items()),
            *lines,
        ])
        PRESETS_DOC.write_text(with_study_table(PRESETS_DOC.read_text(), block.replace("](experiments/", "](../experiments/")))
    return "\n".join(lines)


def bar_chart(summary: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summary["table"]
    arms = sorted(table, key=lambda a: table[a]["final held-out accuracy"]["mean"] or 0)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.28 * len(arms) + 1.2), sharey=True)
    for ax, label in zip(axes, ("final held-out accuracy", "held-out accuracy area")):
        cells = [table[a][label] for a in arms]
        ax.barh(range(len(arms)), [c["mean"] or 0 for c in cells], xerr=[c["std"] for c in cells], color="C0",
                alpha=0.7)
        for i, c in enumerate(cells):
            ax.plot(c["per_seed"], [i] * len(c["per_seed"]), "k.", ms=3)
        warm = np.mean([c["warm_start_accuracy"] for c in summary["collapse"][arms[0]].values()])
        ax.axvline(warm, color="gray", ls="--", lw=1, label=f"warm start {warm:.3f}")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=7)
    axes[0].set_yticks(range(len(arms)), arms, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    study.main(get_study, claims)
