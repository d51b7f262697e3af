"""All-wrong groups: does NGRPO learn where most groups have no correct sample, and GRPO stall? (issue 42 item 4;
NGRPO, arXiv 2509.18851, "NGRPO: Negative-enhanced Group Relative Policy Optimization"), under the shared
protocol (experiments/protocol.py).

    python experiments/all_wrong_groups.py [--quick] [--resume] [--rejudge]

The mechanism. GRPO's advantage (r - mean) / std of a group whose G rewards are all 0 is 0 for every sample:
such a group adds nothing to the update (that is algebra, and is not scored here). NGRPO's "advantage
calibration" computes each group's mean and std (ddof 1) over its G rewards and one virtual sample of the
maximum reward 1, so an all-wrong group of 8 gets -1/3 on every sample (a push away from what it sampled)
and an all-correct one still gets 0; its "asymmetric clipping" clips the token ratio to [1 - 0.16, 1 + 0.24]
(looser for positive updates). The library's `ngrpo` preset (grpo_jax/algorithms/advantages/robust.py,
grpo_jax/algorithms/config.py) is checked against the authors' code (github.com/nangongrui-ngr/NGRPO:
`compute_ngrpo_outcome_advantage` in verl/trainer/ppo/core_algos.py, train_scripts/train_qwen2.5-math-7b_ngrpo.sh):
the same statistics (torch.std, ddof 1, over the rewards plus `add_max_reward_num` = 1 copies of `max_reward`
= 1.0, eps 1e-6 added to the std), the same clip range (clip_ratio_low 0.16, clip_ratio_high 0.24), token-mean
aggregation (their loss is a masked mean over all tokens) and no KL (kl_coef 0). It reproduces the paper's
worked case as summarized (a group of 8 with one correct: GRPO 2.47 / -0.35, NGRPO 1.76 / -0.50). Departures:
the authors' script also drops all-correct groups and refills the batch (filter_groups strategy
all_correct); the preset does not (those groups then train with advantage 0 and only dilute the token mean;
on the hard split they are at most the training accuracy, about 2% of groups at the start). The authors'
batch of 1024 prompts x 8 in mini-batches of 256 (4 updates per rollout batch) is kept as a ratio: 32 prompts
in 4 minibatches, so the ratio moves off 1 and the clipping can act (with one update per batch it never would).
Their GRPO baseline had kl_coef 0.001; here every arm has none.

What the paper reports: its abstract says that NGRPO "significantly outperforms" PPO, GRPO, DAPO and PSR-NSR
on MATH500, AMC23 and AIME2025 (Qwen2.5-Math-7B trained on MATH) and that it learns from homogeneous
errors. The benchmark table's numbers were not found in what could be read here (the abstract, summaries
of the paper and the authors' code), so no claim carries a number; the ablation of its two parts was not
read either. The paper runs no split chosen for all-wrong groups and compares no Dr. GRPO: both are this
study's tests of the mechanism ("carried to" in the sources).

The hard split. The quickstart's arithmetic (two operands in 0..19, "+-", 2-4-token answers) from a warm
start stopped at HARD_ACCURACY = 5% greedy held-out accuracy (20 supervised steps; the setting's is 25%):
the task knob is the warm start. Chosen before any RL run by the all-wrong fraction it gives: in a probe at
seed 0 the held-out groups of 8 samples at temperature 1 with no correct sample (1 - eval/pass@8) were 86%
(at a 10% warm start, 69%), and the first training steps had 78-94% of groups with one label, of which at
most the training accuracy (1-3%) can be all-correct. Every run evaluates 8 samples per held-out prompt
(train.eval_samples = 8), so each run measures the all-wrong fraction of its groups before the first step
and as it trains; the training rows' `groups/zero_variance_frac` (all-wrong plus all-correct) bounds it from
above, and minus the training accuracy from below (an all-correct group's rows are all correct); for NGRPO
arms it is exact (their zero-advantage rows are the all-correct groups). No library change was needed.

Arms (one warm start per split, at seed 0; the same data, held-out set and sampling keys per seed):
- grpo, ngrpo, dr_grpo: the presets on the hard split (GRPO and Dr. GRPO with beta 0);
- ngrpo_no_calibration: NGRPO with GRPO's advantage (group_std): its clipping and aggregation without the
  virtual sample, so ngrpo minus it is the virtual sample's effect alone;
- grpo_resampled: the null control, grpo again on its own rollouts (protocol);
- grpo_easy, ngrpo_easy: GRPO and NGRPO from the setting's 25% warm start, where about 12% of groups have
  one label: the contrast of the NGRPO-GRPO gap across the splits.
Every arm but the null's second chooses among RATES on the selection seeds (the training reward over the
run: on this task the training accuracy). STEPS = 240 steps of 32 prompts x 8 samples, 4 minibatches.

Claims (the rules below, declared before any RL run; held-out gain: greedy accuracy over the last 20% minus
the warm start's on the seed's held-out set; training rise: the training accuracy over the last quarter
minus the first quarter). "Progress" and "stalls" are read against STALL = 0.03, two binomial standard
errors of a 5% accuracy on 256 held-out prompts (0.027), rounded up.

Cut: a symmetric-clip NGRPO arm (the clipping's part; the no-calibration arm tests the virtual sample's),
a harder task (more operands, a wider range: the warm start already gives 86% all-wrong groups), more than
one virtual sample, DAPO and PSR-NSR (the paper's other baselines), and the authors' all-correct filter.

Cost, measured by the --quick run (results/all_wrong_groups/quick; 2 cores shared with other jobs, load 7.1 to
10.7): 434 s in all; the warm starts 55 s (hard, 20 steps, compilation included) and 63 s (easy, 350 steps); a
60-step run 14-45 s (median 17 s; about 0.2 s a step, 4 updates and rollouts of 256 rows, start-up and 4
evaluations of 256 prompts x (1 greedy + 8 sampled) besides). Full study: 6 arms x 3 rates x 2 selection seeds
= 36 selection runs + 7 arms x 8 seeds = 56 runs, 92 runs of STEPS = 240 steps, about 92 x 57 s + 2 minutes =
1.5 hours at that load (less on a quieter machine); run it with --resume. --quick: 7 arms x 2 seeds of
QUICK_STEPS = 60 steps at QUICK_RATE, no selection (not the full protocol): 14 runs, about 7 minutes.

What --quick showed (2 seeds, 60 steps, lr 5e-4; no verdict can pass at 2 seeds): the hard split's all-wrong
held-out groups 0.85 at the warm start (easy split 0.20), training groups of one label 0.84-0.90 over the
first 6 steps (easy 0.15), with at most 0.02 of them all-correct; no arm learned on the hard split in 60 steps
(training accuracy 0.022-0.023 over the run in every hard arm, held-out gain -0.008 GRPO, -0.014 NGRPO, -0.020
Dr. GRPO), while from 25% GRPO gained +0.104 and NGRPO +0.068.
"""

import math

from grpo_jax.config import override

import arithmetic_setting
import protocol
import study
from arithmetic_setting import RATES, WARM_START
from study import final_accuracy, held_out_gain
from warm_start import WarmStart

NGRPO = "arXiv 2509.18851 (NGRPO)"
HARD_ACCURACY = 0.05
HARD = WarmStart(accuracy=HARD_ACCURACY, batch_size=64, eval_every=10)  # the hard split's warm start
STALL = 0.03  # two binomial standard errors of 5% on 256 held-out prompts (0.027), rounded up
EVAL_SAMPLES = 8  # sampled completions per held-out prompt: eval/pass@8 gives the all-wrong group fraction
NULL = ("grpo", "grpo_resampled")
FAMILIES = {"grpo": ["algorithm.preset=grpo", "algorithm.beta=0"], "ngrpo": ["algorithm.preset=ngrpo"],
            "dr_grpo": ["algorithm.preset=dr_grpo"],
            "ngrpo_no_calibration": ["algorithm.preset=ngrpo", "algorithm.advantage=group_std"]}
ARMS = {  # arm -> (family, warm start)
    "grpo": ("grpo", HARD), "ngrpo": ("ngrpo", HARD), "dr_grpo": ("dr_grpo", HARD),
    "ngrpo_no_calibration": ("ngrpo_no_calibration", HARD), NULL[1]: ("grpo", HARD),
    "grpo_easy": ("grpo", WARM_START), "ngrpo_easy": ("ngrpo", WARM_START),
}


def training_rise(run: study.Run) -> float:
    """The training rows' accuracy over the last quarter of the run minus over its first quarter."""
    return run.mean("accuracy", 0.75) - run.mean("accuracy", 0.0, 0.25)


def all_wrong_held_out(row: dict) -> float | None:
    """A `Study.derive` metric: the fraction of held-out prompts whose EVAL_SAMPLES samples are all wrong
    (1 - eval/pass@8: with n = k the unbiased pass@k is whether any sample is right), in evaluation rows."""
    key = f"eval/pass@{EVAL_SAMPLES}"
    return 1.0 - row[key] if key in row else None


def all_wrong_lower(row: dict) -> float | None:
    """A `Study.derive` metric: a lower bound of the training groups with no correct sample, the groups of
    one label less the training accuracy (all-correct groups are at most the correct rows' fraction)."""
    return max(row["groups/zero_variance_frac"] - row["accuracy"], 0.0) if "accuracy" in row else None


def all_wrong_at_start(run: study.Run) -> float:
    """All-wrong held-out groups before the first RL step (the warm start's)."""
    steps, v = run.series("all_wrong_held_out", "step")
    return float(v[0]) if steps.size and steps[0] == 0 else math.nan


def all_wrong_exact(run: study.Run, start: float = 0.0, stop: float = 0.1) -> float:
    """The training groups with no correct sample over (start, stop] of the run, exact for NGRPO's advantage
    (its rows of advantage exactly 0 are the all-correct groups'; every other row is nonzero), nan otherwise."""
    if run.config.algorithm.advantage.name != "ngrpo":
        return math.nan
    steps = run.config.train.steps
    v = [r["groups/zero_variance_frac"] - r["advantage/zero_frac"] for r in run.rows
         if "advantage/zero_frac" in r and start * steps < r["step"] <= stop * steps]
    return sum(v) / len(v) if v else math.nan


def gain(label, metric, a, b):
    return protocol.Difference(label, metric, a, b)


CLAIMS = (
    protocol.Claim(
        "NGRPO makes progress on a split where most groups are all wrong",
        source=f"{NGRPO}, abstract (NGRPO converts homogeneous errors into learning signals; carried to a split "
               "chosen for all-wrong groups here)",
        paper="NGRPO learns from homogeneously incorrect groups and significantly outperforms GRPO on MATH500, "
              "AMC23, AIME2025 (no number found for it here)",
        halves=(protocol.Level(f"held-out greedy accuracy, last 20% minus the warm start's, hard split (above {STALL}: "
                               "progress)", held_out_gain, "ngrpo", STALL),
                protocol.Level(f"training accuracy, last quarter minus first quarter, hard split (above {STALL})",
                               training_rise, "ngrpo", STALL))),
    protocol.Claim(
        "GRPO stalls on a split where most groups are all wrong",
        source=f"{NGRPO}, abstract (all-wrong groups give GRPO null gradients; 'stalls' is the issue's reading)",
        paper="GRPO's advantage is zero on homogeneously incorrect groups, so it loses their learning signal "
              "(no number found for it here)",
        halves=(protocol.Level(f"held-out greedy accuracy, last 20% minus the warm start's, hard split (below {STALL}: "
                               "stalled)", held_out_gain, "grpo", STALL, above=False),
                protocol.Level(f"training accuracy, last quarter minus first quarter, hard split (below {STALL})",
                               training_rise, "grpo", STALL, above=False))),
    protocol.Claim(
        "NGRPO beats GRPO where most groups are all wrong",
        source=f"{NGRPO}, abstract (outperforms GRPO on math benchmarks; carried to the hard split here)",
        paper="NGRPO significantly outperforms PPO, GRPO, DAPO and PSR-NSR on MATH500, AMC23 and AIME2025 "
              "(Qwen2.5-Math-7B; the table's numbers were not found here)",
        halves=(gain("held-out greedy accuracy gain over the warm start, hard split", held_out_gain, "ngrpo", "grpo"),
                gain("training accuracy rise, hard split", training_rise, "ngrpo", "grpo"))),
    protocol.Claim(
        "The virtual maximum-reward sample is what helps: NGRPO beats NGRPO without advantage calibration",
        source=f"{NGRPO}, abstract (advantage calibration makes all-wrong groups' advantages nonzero; asymmetric "
               "clipping only stabilizes it)",
        paper="the calibration turns homogeneous errors into learning signals, the clipping stabilizes the exploration "
              "pressure it adds (no ablation number found here)",
        halves=(gain("held-out greedy accuracy gain over the warm start, hard split", held_out_gain, "ngrpo",
                     "ngrpo_no_calibration"),
                gain("training accuracy rise, hard split", training_rise, "ngrpo", "ngrpo_no_calibration"))),
    protocol.Claim(
        "NGRPO's edge over GRPO is larger where more groups are all wrong",
        source=f"{NGRPO}, abstract and motivation (the gain comes from homogeneously incorrect groups; carried to two "
               "warm starts here)",
        paper="the limitation is 'particularly problematic for homogeneously incorrect groups' (no number given)",
        halves=(protocol.Contrast("held-out greedy accuracy gain: NGRPO minus GRPO at the 5% warm start minus the same "
                                  "at 25%", held_out_gain,
                                  (("ngrpo", 1.0), ("grpo", -1.0), ("ngrpo_easy", -1.0), ("grpo_easy", 1.0))),
                protocol.Contrast("training accuracy rise: NGRPO minus GRPO at the 5% warm start minus the same at 25%",
                                  training_rise,
                                  (("ngrpo", 1.0), ("grpo", -1.0), ("ngrpo_easy", -1.0), ("grpo_easy", 1.0))))),
    protocol.Claim(
        "NGRPO beats Dr. GRPO where most groups are all wrong",
        source=f"{NGRPO}, abstract (carried to Dr. GRPO, arXiv 2503.20783, whose mean-only advantage is also 0 on an "
               "all-wrong group)",
        paper="the paper compares no Dr. GRPO; none",
        halves=(gain("held-out greedy accuracy gain over the warm start, hard split", held_out_gain, "ngrpo", "dr_grpo"),
                gain("training accuracy rise, hard split", training_rise, "ngrpo", "dr_grpo"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "held-out greedy accuracy, last 20% minus the warm start's": held_out_gain,
    "training accuracy, mean over the run": lambda r: r.mean("accuracy"),
    "training accuracy, last quarter minus first quarter": training_rise,
    f"all-wrong held-out groups of {EVAL_SAMPLES} at the warm start (1 - eval/pass@{EVAL_SAMPLES}, step 0)":
        all_wrong_at_start,
    f"all-wrong held-out groups of {EVAL_SAMPLES}, last 20% of the run": lambda r: r.mean("all_wrong_held_out", 0.8),
    "training groups of one label (groups/zero_variance_frac), first 10% of steps":
        lambda r: r.mean("groups/zero_variance_frac", 0.0, 0.1),
    "training groups all wrong, first 10% of steps, lower bound (one label minus accuracy)":
        lambda r: r.mean("all_wrong_lower", 0.0, 0.1),
    "training groups all wrong, first 10% of steps, exact (NGRPO arms)": all_wrong_exact,
    "training groups of one label, last 20% of steps": lambda r: r.mean("groups/zero_variance_frac", 0.8),
    "advantage std": lambda r: r.mean("advantage/std"),
    "rows with advantage 0": lambda r: r.mean("advantage/zero_frac"),
    "clipped tokens, low side": lambda r: r.mean("clip_frac_low_tokens"),
    "clipped tokens, high side": lambda r: r.mean("clip_frac_high_tokens"),
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    base = override(arithmetic_setting.base(quick, minibatches=4), [f"train.eval_samples={EVAL_SAMPLES}"])
    panels = ("accuracy", "eval/accuracy_greedy", "all_wrong_held_out", "groups/zero_variance_frac")
    hard = tuple(a for a, (_, w) in ARMS.items() if w is HARD and a != NULL[1])
    return study.Study(
        name="all_wrong_groups",
        arms={arm: override(base, FAMILIES[family]) for arm, (family, _) in ARMS.items()},
        **study.sized(quick, RATES),
        null_pair=NULL,
        warm_start={arm: w for arm, (_, w) in ARMS.items()},
        warm_start_seed=0,
        derive={"all_wrong_held_out": all_wrong_held_out, "all_wrong_lower": all_wrong_lower},
        table=TABLE,
        plots=(study.Plot("hard_split", panels, arms=hard),
               study.Plot("splits", panels, arms=("grpo", "ngrpo", "grpo_easy", "ngrpo_easy"))),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
