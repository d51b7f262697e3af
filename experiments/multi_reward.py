"""Multi-reward normalization: GRPO's sum-then-normalize against GDPO's and MO-GRPO's per-reward
normalization on a task with two rewards (issue 42 item 3; GDPO, arXiv 2601.05242, "Group
reward-Decoupled Normalization Policy Optimization for Multi-reward RL Optimization"; MO-GRPO, arXiv
2509.22047, "Mitigating Reward Hacking of Group Relative Policy Optimization on Multi-Objective
Problems"), under the shared protocol (experiments/protocol.py).

    python experiments/multi_reward.py [--quick] [--resume] [--rejudge]

The three ways `algorithm.reward_combine` combines K weighted rewards R^k (grpo_jax/algorithms/advantages):
- sum_then_normalize (GRPO's joint normalization): A = group_std(sum_k w_k R^k);
- normalize_each (MO-GRPO, the library's `mo_grpo` preset): A = sum_k w_k group_std(R^k);
- normalize_then_sum (GDPO): normalize_each's sum, then standardized over the whole batch (GDPO's
  batch-wise normalization, the authors' NVlabs/GDPO code: (x - mean) / (std + eps) over the batch).
Every arm is GRPO otherwise (group_std advantages, token-level PPO clip 0.2, seq_mean_token_mean, no KL).

Task and rewards: the quickstart's arithmetic (two operands 0-19, "+-"), scored by two binary rewards of
weight 1 each (`reward.names = ("exact", "format")`): exact-match correctness, and the registered
`format` reward (1 if the completion marks its answer: here "####" before it, which `exact` reads as the
marked answer). That is GDPO's setting in miniature: its tool-calling and GSM8K runs train a binary
format reward beside correctness. The two can disagree: "####7" (wrong, formatted) and "12" (right,
unformatted) score (0, 1) and (1, 0), which GRPO's sum gives one advantage. The warm start teaches the
format on FORMAT_P = 30% of its targets ("####" + answer, else the answer alone; `formatted_sometimes`),
so RL starts from a policy that samples the format now and then and is greedily unformatted: both
rewards have room to rise. FORMAT_P was set by two --quick runs, before any full run: at 0.3 every arm
learns the format within about 20 steps and keeps (and raises) its held-out accuracy; at 0.1 (a warm start
of 300 steps that saw few formatted answers) every arm adopted the format within about 30 steps and then
lost its accuracy (held-out greedy accuracy from 0.27 to 0.04 grpo, 0.07 gdpo, 0.02 mo_grpo over the last
20% of 60 steps, 2 seeds each; training exact reward in the last quarter 0.02 / 0.04 / 0.01): the easy
reward taken at the hard one's cost under all three combinations, the failure both papers describe, but
one that leaves nothing to compare. The study runs at 0.3. Completions are at most 8 tokens ("####-19" and eos).

Per reward, what the claims read (nothing was missing from the library's logs):
- training: `reward/exact_match/mean`, `reward/answer_format/mean` (the trainer's per-reward means of the
  rollouts, named by the reward function) and `accuracy`;
- held out (greedy, 256 prompts): `eval/accuracy_greedy` is the exact reward's mean; the format reward's
  is derived per evaluation row as `format_held_out` = eval/reward_greedy - eval/accuracy_greedy: the
  logged reward is the weighted total (1 x exact + 1 x format) of one completion per prompt, so the
  difference is the format reward's mean exactly (algebra, not a proxy);
- collapse: the trainer logs, per rollout batch with two or more rewards, `advantage/distinct_reward_combos`
  and `advantage/distinct_values` (`algorithms.distinct_per_group`: distinct reward combinations and
  distinct advantage values per group of G = 8, averaged over the batch's groups). Their difference,
  `merged_per_group`, is the number of distinct reward combinations per group that share an advantage
  with another: 0 when no group merges anything. With two binary rewards at most one pair can merge in a
  group (below), so it is the fraction of groups whose distinct reward combinations outnumber their
  distinct advantages.

What is algebra and what is measured. Algebra (true for every batch, so never a claim's rule): under the
sum, two combinations merge iff their weighted sums are equal: with these rewards, (1, 0) with (0, 1)
whenever both are in a group, nothing else. Under per-reward normalization (both modes) (1, 0) and (0, 1)
merge only when the group's two success rates p1, p2 satisfy p1 = p2 or p1 = 1 - p2 (equal spreads),
and no other pair ever merges; so on one and the same batch the per-reward modes merge a subset of what
the sum merges. normalize_then_sum and normalize_each give the same within-group counts on the same batch
(the batch standardization is one increasing affine map for the whole batch). Checked on 2000 random
groups of 8 with random success rates: merged pairs per group 0.39 under the sum, 0.10 under either
per-reward mode (equal spreads are common at G = 8), the latter a subset of the former in every group.
Measured: how often each arm's own rollouts put such combinations in one group over training (its policy
decides: a policy that always formats never scores (1, 0)), so how many outcomes GRPO's training actually
merges compared with GDPO's. The difference can be zero (no mixed groups, e.g. once the format is learned)
or negative (if GRPO's rollouts stop mixing formatted and unformatted answers while GDPO's keep mixing
them), and it is judged against the null pair's spread like every comparison. But the arms share the warm
start and sampling keys and their rollouts stay alike (2.26 distinct combinations per group in every arm,
--quick), so claim 1 leans on the subset relation: what it tests is that the collapse is frequent enough in
training to clear the noise floor, not that the sum merges more (that is algebra). The paper's own counts
(its Figures 4 and 5: two rollouts and two binary rewards give GRPO 2 distinct advantage groups and GDPO 3;
the gap grows with rollouts and rewards) are enumerations of every possible combination, algebra: they are
cited, not tested.

Claims and sources (the numbers found, and where none was):
1. GDPO, abstract and Figures 4-5 (the paper's page, NVlabs/GDPO index.html): summing then normalizing
   collapses distinct reward combinations into identical advantages, reducing the resolution of the
   training signal. Rule: over the run, merged outcomes per group, grpo minus gdpo above 0; distinct
   advantage values per group, gdpo minus grpo above 0 (resolution, the paper's Figure 5 quantity).
   Paper: 2 vs 3 distinct advantage groups at G = 2 with two binary rewards; no number for G = 8.
2. GDPO, abstract and Figures 1 and 3 (training reward curves, tool calling and GSM8K): GDPO converges to
   higher correctness and constraint (format) rewards than GRPO. Rule: held-out greedy accuracy over the
   last 20% of the run, and the training format reward averaged over the run (its curve's area: the
   format is a one-token decision that every arm drives to 1, held out and in training, within the run,
   as the first --quick run (FORMAT_P 0.3) showed: a final format rate is a ceiling that cannot separate
   the arms, how soon the format is adopted can), gdpo minus grpo above 0. No number was read from the
   paper's body (its tables were not reachable here); a secondary summary gives "up to +6.3 points on
   AIME" for its math task.
3. MO-GRPO, abstract: GRPO optimizes one objective at the cost of the others; MO-GRPO's per-reward
   normalization makes every reward contribute evenly and outperforms GRPO. Rule: as claim 2's, mo_grpo
   minus grpo above 0. No number in the abstract (its domains: bandits, Mo-Gymnasium, WMT translation,
   instruction following). Its mechanism (rescaling rewards of different spreads) acts here only through
   the per-group success rates: both rewards are 0/1.
No claim compares gdpo with mo_grpo (normalize_then_sum against normalize_each: the batch standardization
alone): neither paper's claim about it was found; the table shows both.

Arms, on the same warm start, data and sampling keys per seed:
- grpo (sum_then_normalize), gdpo (normalize_then_sum), mo_grpo (normalize_each, the `mo_grpo` preset);
- grpo_resampled: the null control, grpo again on its own rollouts (protocol).
grpo, gdpo and mo_grpo each choose among RATES on the selection seeds (normalize_then_sum rescales the
advantages by the batch's spread, so the modes need not share a rate); the null arm follows grpo.

Cut, and why: a reward of a different scale (MO-GRPO's mechanism proper), more than two rewards (GDPO's
Figure 5's trend) and weights other than 1 (cost: each is another set of arms x 8 seeds); long
completions (the claims are about advantages, which the short task shows).

What --quick showed (2 seeds, 60 steps at QUICK_RATE, no selection: not the protocol; results/multi_reward/
quick): the format is learned in about 20 steps by every arm (training format reward 0.99-1.0 over the last
quarter, held-out 1.0); while it is being learned GRPO merges (1, 0) with (0, 1) in about 60% of its groups
and the per-reward modes in about 15-20%, after it almost none (every group then holds (1, 1) and (0, 1)
only). Over the run: merged combinations per group grpo 0.202, gdpo 0.058, mo_grpo 0.056 (null arm 0.207;
grpo - gdpo +0.145, floor 0.011); distinct advantage values per group 2.06 / 2.20 / 2.20 (+0.140, floor
0.053). Held-out greedy accuracy over the last 20% (warm start 0.27): grpo 0.379, gdpo 0.330, mo_grpo 0.387,
null arm 0.305 (floor 0.109); training format reward over the run 0.798 / 0.799 / 0.799 (floor 0.005).
Two seeds cannot pass the sign test (p = 0.25 at best): every claim not_reproduced there.

Cost, measured by that --quick run (2 cores shared with other jobs, load 5.8 to 7.0): 213 s in all, the
warm start 102 s (500 steps), a 60-step run 10.6-13.1 s (the first 23 s: compilation), evaluations of 256
prompts included. Full study: 3 arms x 3 rates x 2 seeds = 18 selection runs + 4 arms x 8 seeds = 32 runs,
50 runs of STEPS = 240 steps, about 50 x 4 x 11.5 s + 102 s = 40 minutes at that load (more under a heavier
one); run it with --resume.
"""

import numpy as np

from grpo_jax.config import override

import arithmetic_setting
import protocol
import study
from arithmetic_setting import RATES
from study import final_accuracy, reward
from warm_start import WarmStart

GDPO = "arXiv 2601.05242 (GDPO)"
MO_GRPO = "arXiv 2509.22047 (MO-GRPO)"
FORMAT_P = 0.3  # the warm start's share of formatted targets
MARK = "####"  # what the `format` reward reads as a marked answer ("#### " without its space)
NULL = ("grpo", "grpo_resampled")
REWARDS = ["reward.names=exact,format", "reward.weights=1.0,1.0", "sampling.max_new_tokens=8"]
ARMS = {
    "grpo": ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.reward_combine=sum_then_normalize"],
    "gdpo": ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.reward_combine=normalize_then_sum"],
    "mo_grpo": ["algorithm.preset=mo_grpo"],
    NULL[1]: ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.reward_combine=sum_then_normalize"],
}


def formatted_sometimes(example: dict, rng: np.random.Generator) -> str:
    """The warm start's target: "####" + the answer with probability FORMAT_P, else the answer alone."""
    return (MARK if rng.random() < FORMAT_P else "") + example["answer"]


WARM_START = WarmStart(accuracy=arithmetic_setting.WARM_START.accuracy, batch_size=64, eval_every=25,
                       target=formatted_sometimes)


def format_held_out(row: dict) -> float | None:
    """A `Study.derive` metric of evaluation rows: the held-out greedy format rate, the weighted total
    minus the exact reward's mean (weights 1, 1: exact), None in other rows."""
    if "eval/reward_greedy" in row and "eval/accuracy_greedy" in row:
        return row["eval/reward_greedy"] - row["eval/accuracy_greedy"]
    return None


def merged_per_group(row: dict) -> float | None:
    """A `Study.derive` metric of training rows: distinct reward combinations per group minus distinct
    advantage values per group (the combinations that share an advantage with another), None elsewhere."""
    if "advantage/distinct_reward_combos" in row:
        return row["advantage/distinct_reward_combos"] - row["advantage/distinct_values"]
    return None


def final_format(run: study.Run) -> float:
    """Held-out greedy format rate over the last 20% of the run."""
    return run.mean("format_held_out", 0.8)


def training_format(run: study.Run) -> float:
    """The rollouts' format reward averaged over the run: the area under its training curve per update."""
    return run.mean("reward/answer_format/mean")


def merged(run: study.Run) -> float:
    """Merged outcomes per group, averaged over the run's rollout batches."""
    return run.mean("merged_per_group")


def distinct_values(run: study.Run) -> float:
    """Distinct advantage values per group, averaged over the run's rollout batches."""
    return run.mean("advantage/distinct_values")


CLAIMS = (
    protocol.Claim(
        "Summing then normalizing (GRPO) collapses distinct reward combinations into one advantage more than "
        "GDPO's per-reward normalization, on the runs' own rollouts",
        source=f"{GDPO}, abstract; Figures 4-5",
        paper="two rollouts, two binary rewards: GRPO 2 distinct advantage groups, GDPO 3 (an enumeration); the gap "
              "widens with rollouts and rewards; no number for G = 8 or for training rollouts",
        halves=(protocol.Difference("merged reward combinations per group, mean over the run", merged, "grpo", "gdpo"),
                protocol.Difference("distinct advantage values per group, mean over the run", distinct_values,
                                    "gdpo", "grpo"))),
    protocol.Claim(
        "GDPO reaches higher correctness and higher format adherence than GRPO",
        source=f"{GDPO}, abstract; Figures 1 and 3 (tool calling, GSM8K: correctness and format rewards)",
        paper="GDPO consistently outperforms GRPO on correctness and constraint adherence (format, length); no number "
              "read from the paper's tables (a secondary summary: up to +6.3 points on AIME)",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "gdpo", "grpo"),
                protocol.Difference("training format reward, mean over the run", training_format, "gdpo", "grpo"))),
    protocol.Claim(
        "MO-GRPO's per-reward normalization beats GRPO on both rewards (GRPO optimizes one at the other's cost)",
        source=f"{MO_GRPO}, abstract",
        paper="GRPO is vulnerable to reward hacking, optimizing only one objective at the cost of the others; MO-GRPO "
              "makes every reward contribute evenly and outperforms GRPO (no number in the abstract)",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "mo_grpo", "grpo"),
                protocol.Difference("training format reward, mean over the run", training_format, "mo_grpo", "grpo"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "held-out greedy accuracy (exact reward), last 20%": final_accuracy,
    "held-out greedy format rate, last 20%": final_format,
    "training exact reward, mean over the run": lambda r: r.mean("reward/exact_match/mean"),
    "training format reward, mean over the run": training_format,
    "training exact reward, last quarter": lambda r: r.mean("reward/exact_match/mean", 0.75),
    "training format reward, last quarter": lambda r: r.mean("reward/answer_format/mean", 0.75),
    "training total reward, mean over the run": reward,
    "distinct reward combinations per group": lambda r: r.mean("advantage/distinct_reward_combos"),
    "distinct advantage values per group": distinct_values,
    "merged reward combinations per group": merged,
    "groups with zero advantage, fraction of completions": lambda r: r.mean("advantage/zero_frac"),
    "advantage std": lambda r: r.mean("advantage/std"),
    "completion length": lambda r: r.mean("completion/length_mean"),
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    base = override(arithmetic_setting.base(quick, minibatches=1), REWARDS)
    return study.Study(
        name="multi_reward",
        arms={arm: override(base, changes) for arm, changes in ARMS.items()},
        **study.sized(quick, RATES),
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        derive={"format_held_out": format_held_out, "merged_per_group": merged_per_group},
        table=TABLE,
        plots=(study.Plot("rewards", ("reward/exact_match/mean", "reward/answer_format/mean", "eval/accuracy_greedy",
                                      "format_held_out"), arms=("grpo", "gdpo", "mo_grpo")),
               study.Plot("advantages", ("advantage/distinct_reward_combos", "advantage/distinct_values",
                                         "merged_per_group", "advantage/std"), arms=("grpo", "gdpo", "mo_grpo"))),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
