"""Noisy rewards: GRPO, Dr. GRPO and S-GRPO trained on exact-match labels flipped at random (issue 42 item
2; S-GRPO, arXiv 2508.05928, "Mitigating Think-Answer Mismatch in LLM Reasoning Through Noise-Aware
Advantage Reweighting"), under the shared protocol (experiments/protocol.py).

    python experiments/noisy_rewards.py [--quick] [--resume] [--rejudge]

`reward.label_noise = p` flips each exact-match correctness label (0 <-> 1) with probability p, drawn from
the round's key, before anything reads it: the advantages, `reward/mean` and `accuracy` see the flipped
labels (`reward/label_flip_frac` counts the flips), `accuracy_clean` the true ones, and the held-out
evaluation (`eval/accuracy_greedy`) never sees a flip. Every claim is judged on the true labels: held-out
greedy accuracy, and the training rows' true accuracy (`accuracy_true` below: `accuracy_clean` under
noise, `accuracy` without).

S-GRPO (the library's `s_grpo` preset: group_std advantages times the paper's optimal weight w(q, p) of a
group whose observed success rate is q, with Dr. GRPO's aggregation, as the authors' --critic_type drgrpo)
runs with its noise parameter p = S_GRPO_P = 0.15 in every arm: the value the authors' released training
script sets and calls the paper's (github.com/shenpeijun0212/S-GRPO, train/Qwen2.5-math-1.5B_S-GRPO.sh).
So S-GRPO is not told the injected rate: its objective is the same at 0, 10 and 20% noise, and only the
rewards change (which is also why its noisy arms follow its noiseless arm's rate). Its weight is 0 for a
group with q <= p or q >= 1 - p: at G = 8 a group with 1 (or 7) positive labels of 8 does not train.
Whether the paper's 20%-noise run set p to 0.2 was not found in what could be read here (its abstract
and the authors' code); S-GRPO told the true rate (p = 0.1 and 0.2) is cut (cost), as is noise on a task
with a longer answer.

What the paper reports, and what is tested: its abstract says that standard GRPO fails to learn under 20%
synthetic reward noise while S-GRPO keeps learning, and that S-GRPO beats Dr. GRPO by +2.5 points
(Qwen-Math-7B-Base), +2.2 (Llama-3.2-3B-Base) and +2.4 (Qwen-Math-1.5B-Instruct) averaged over math
benchmarks, trained on the benchmarks' own (noisy, think-answer-mismatched) verifier labels. No number for
10% or 20% injected noise was found in what could be read here (the abstract, summaries and the authors'
code; not the body's figures), so the noise claims carry no number. The paper claims no Dr. GRPO vs GRPO
ordering, so none is scored.

Task, base and batch as experiments/staleness.py (the quickstart's arithmetic, 2-4-token answers, one warm
start at seed 0 to WARM_START's held-out accuracy, 32 prompts x 8 samples, one update per rollout batch as
the authors' num_ppo_epochs 1 with one minibatch, constant rate, no KL).

Arms, on the same warm start, data, sampling keys and (per noise level) flip draws per seed:
- {grpo,dr_grpo,s_grpo}_nK for K in 0, 10, 20 (label noise K%);
- grpo_n0_resampled: the null control, grpo_n0 again on its own rollouts (protocol).
grpo_n0, dr_grpo_n0 and s_grpo_n0 each choose among RATES on the selection seeds; the family's noisy arms
take its rate (`rate_from`).

Cost, measured by the --quick run (results/noisy_rewards/quick; 2 cores shared with other jobs, load 4.1
to 5.6): 212 s in all, the warm start 64 s (350 steps), a 60-step run 5.4-12.8 s (mean 6.7 s, start-up
and 4 evaluations of 256 prompts included). Full study: 3 families x 3 rates x 2 seeds = 18 selection runs
+ 10 arms x 8 seeds = 98 runs of STEPS = 240 steps, about 98 x 4 x 6.7 s + 64 s = 45 minutes at that
load (staleness.py's step times at load 6-9, 0.16-0.22 s, would make it about 85); run it with --resume.
--quick: 10 arms x 2 seeds of 60 steps at QUICK_RATE, no selection (not the full protocol): 20 runs,
about 4 minutes.
"""

from grpo_jax.config import override

import arithmetic_setting
import protocol
import study
from arithmetic_setting import RATES, WARM_START
from study import final_accuracy, held_out_gain, reward

S_GRPO = "arXiv 2508.05928 (S-GRPO)"
S_GRPO_P = 0.15  # the authors' train/Qwen2.5-math-1.5B_S-GRPO.sh
NOISE = {0: 0.0, 10: 0.1, 20: 0.2}  # arm suffix nK -> reward.label_noise
NULL = ("grpo_n0", "grpo_n0_resampled")
FAMILIES = {"grpo": ["algorithm.preset=grpo", "algorithm.beta=0"], "dr_grpo": ["algorithm.preset=dr_grpo"],
            "s_grpo": ["algorithm.preset=s_grpo", f"algorithm.advantage.noise_rate={S_GRPO_P}"]}
ARMS = {**{f"{f}_n{k}": (f, k) for f in FAMILIES for k in NOISE}, NULL[1]: ("grpo", 0)}


def true_accuracy(row: dict) -> float | None:
    """A `Study.derive` metric: the training rows' accuracy on the true labels (accuracy_clean under label
    noise, accuracy without, where the two are one), None in rows without it (evaluations)."""
    return row.get("accuracy_clean", row.get("accuracy"))


def training_accuracy(run: study.Run) -> float:
    """The training rows' true accuracy averaged over the run."""
    return run.mean("accuracy_true")


def training_rise(run: study.Run) -> float:
    """The training rows' true accuracy over the last quarter of the run minus over its first quarter."""
    return run.mean("accuracy_true", 0.75) - run.mean("accuracy_true", 0.0, 0.25)


def retention(k: int) -> protocol.Contrast:
    """S-GRPO's change in held-out accuracy from 0 to k% noise minus GRPO's: above 0, S-GRPO keeps more."""
    return protocol.Contrast(
        f"held-out greedy accuracy, last 20%: S-GRPO's change from 0 to {k}% label noise minus GRPO's",
        final_accuracy, ((f"s_grpo_n{k}", 1.0), ("s_grpo_n0", -1.0), ("grpo_n0", 1.0), (f"grpo_n{k}", -1.0)))


CLAIMS = (
    protocol.Claim(
        "S-GRPO keeps learning under 20% symmetric label noise",
        source=f"{S_GRPO}, abstract",
        paper="under 20% synthetic reward noise S-GRPO maintains stable learning progress (no number given for it)",
        halves=(protocol.Level("held-out greedy accuracy, last 20% minus the warm start's, at 20% noise", held_out_gain,
                               "s_grpo_n20", 0.0),
                protocol.Level("true training accuracy, last quarter minus first quarter, at 20% noise", training_rise,
                               "s_grpo_n20", 0.0))),
    protocol.Claim(
        "Standard GRPO fails to learn under 20% symmetric label noise",
        source=f"{S_GRPO}, abstract",
        paper="standard GRPO fails to learn under 20% synthetic reward noise (no number given for it)",
        halves=(protocol.Level("held-out greedy accuracy, last 20% minus the warm start's, at 20% noise (below 0: "
                               "no learning)", held_out_gain, "grpo_n20", 0.0, above=False),
                protocol.Difference("held-out greedy accuracy, last 20%, noiseless minus 20% noise (the noise costs "
                                    "GRPO)", final_accuracy, "grpo_n0", "grpo_n20"))),
    protocol.Claim(
        "S-GRPO loses less held-out accuracy to label noise than GRPO, at 20% and at 10%",
        source=f"{S_GRPO}, abstract (at 20%; carried to 10% here)",
        paper="GRPO fails to learn under 20% synthetic reward noise while S-GRPO maintains stable learning progress; "
              "no number for either noise level",
        halves=(retention(20), retention(10))),
    protocol.Claim(
        "S-GRPO beats Dr. GRPO: on the verifier's own labels, and under 20% label noise",
        source=f"{S_GRPO}, abstract (its verifier's labels; carried to injected noise here)",
        paper="S-GRPO outperforms Dr. GRPO by +2.5 (Qwen-Math-7B-Base), +2.2 (Llama-3.2-3B-Base) and +2.4 "
              "(Qwen-Math-1.5B-Instruct) points of benchmark accuracy",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%, noiseless", final_accuracy,
                                    "s_grpo_n0", "dr_grpo_n0"),
                protocol.Difference("held-out greedy accuracy, last 20%, at 20% label noise", final_accuracy,
                                    "s_grpo_n20", "dr_grpo_n20"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "held-out greedy accuracy, last 20% minus the warm start's": held_out_gain,
    "true training accuracy, mean over the run": training_accuracy,
    "true training accuracy, last quarter minus first quarter": training_rise,
    "training reward as trained on (flipped labels), mean over the run": reward,
    "flipped label fraction (reward/label_flip_frac)": lambda r: r.mean("reward/label_flip_frac"),
    "groups with one label (zero reward variance), fraction": lambda r: r.mean("groups/zero_variance_frac"),
    "advantage std": lambda r: r.mean("advantage/std"),
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    base = arithmetic_setting.base(quick, minibatches=1)
    panels = ("reward/mean", "accuracy_true", "eval/accuracy_greedy", "advantage/std")
    return study.Study(
        name="noisy_rewards",
        arms={arm: override(base, [*FAMILIES[family], f"reward.label_noise={NOISE[k]}"])
              for arm, (family, k) in ARMS.items()},
        **study.sized(quick, RATES),
        rate_from={f"{f}_n{k}": (f"{f}_n0", 1.0) for f in FAMILIES for k in NOISE if k},
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        derive={"accuracy_true": true_accuracy},
        table=TABLE,
        plots=tuple(study.Plot(f"noise_{k}", panels, arms=tuple(f"{f}_n{k}" for f in FAMILIES)) for k in NOISE),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
