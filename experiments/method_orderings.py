"""The orderings the seed papers claim over GRPO, each its own scored claim, on the arithmetic setting under the
shared protocol (issue 42 items 6 and 7; experiments/protocol.py): GPG, DisCO, DHPO, OPO, GMPO, SAPO and DAPO
against GRPO (and GSPO, or DAPO, where the paper names them), and GMPO's stability claim, that its token
importance ratios stay in a narrower range than GRPO's, measured on the ratios themselves.

    python experiments/method_orderings.py [--quick] [--resume] [--rejudge] [--arms grpo gpg ...]

A second preset table: experiments/preset_table.py tests DAPO, GMPO and SAPO on the long written-out task;
this one is the arithmetic setting (experiments/arithmetic_setting.py: the quickstart's two-operand
arithmetic, completions of 2-4 tokens, one warm start at seed 0 to 25% greedy held-out accuracy, 256
held-out prompts, a constant rate after 10 warm-up updates), where ~11 arms fit the budget of a full study.

Updates per sampled token, stated and matched. Every arm with an importance ratio samples 32 prompts x 8 a
step and makes two updates on it (train.minibatches=2, as experiments/infra_mismatch.py): the second
update's ratios are off-policy, so clipping, GMPO's log-space clip, SAPO's gate and DHPO's branch clips act
(with one on-policy update every ratio is 1 and most of these objectives have GRPO's gradient). GPG and OPO
have no ratio (loss "reinforce"): the library refuses them a second minibatch (it would train on an older
policy's samples uncorrected). So they sample 16 prompts x 8 a step for twice the steps (480, --quick 120)
with one update each: the same updates (480), the same completions per update (128), the same sampled
tokens and the same evaluation points per update as the ratio arms; what differs is the method's own
point, every update on fresh samples (OPO's "exact on-policy training"). Evaluations and checkpoints
are every 60 steps for them (30 for the others). DAPO's dynamic sampling draws up to 3 rollout batches a
step and keeps the informative groups: it makes the same updates on more sampled tokens (its tokens are
in the table); the DAPO paper compares per step, and so do its claims here.

Arms (each an algorithm.preset of grpo_jax/algorithms/config.py), one warm start shared by all (seed 0):
- grpo (beta 0 as the others: the claims are about the objectives, and the presets compared have none);
- gpg, opo (16 prompts a step, 1 update, 480 steps: above); disco, dhpo, gmpo, sapo;
- dapo with its overlong shaping off (algorithm.overlong_buffer_frac=0): with max_new_tokens=4 the buffer
  (20% of L_max, at least one token) is the 4th token, so every complete 3-character answer ("-12" and
  its end token) would score -1 (correct: 0); its clip-higher, token-mean loss and dynamic sampling stay;
- gspo and gspo_token: the null pair (protocol), and GSPO is named by the DHPO and SAPO claims;
- gmpo_at_grpo_rate: GMPO at GRPO's chosen rate (rate_from), for the ratio-range claims: how far a token
  ratio moves in an update scales with the rate, so a comparison at each arm's own rate would measure the
  rate chosen as much as the objective (the GMPO paper compares the two at one setting). In --quick, with
  no rate selection, it is gmpo's config again (the same numbers).
Every arm but gspo_token and gmpo_at_grpo_rate chooses among RATES on the selection seeds.

KL from the warm start (OPO's "policy shift"): every arm runs with algorithm.beta = KL_PROBE = 1e-6, which
keeps the warm start as the reference so the train step logs kl_k3_mean, the k3 estimate of
KL(pi_theta || pi_warm) on the sampled tokens. Its gradient is 1e-6 of a KL penalty's, nothing beside the
policy gradient (the advantages are O(1)); the alternative, no reference, leaves the claim untestable. How
the OPO paper measures its policy shift was not read here (only its abstract); this is the shift from
the start of RL.

Ratio extremes (GMPO's claim, item 6): the train step logs, per step, `log_ratio_abs_max`, the largest
|log r_t| = |l_t - l^old_t| over the step's counted tokens and both its updates (a max over the
micro-batches and updates: grpo_jax/metrics.Metric.max; in grpo_jax/algorithms/objective.py, beside
`ratio_max` and `ratio_min`, whose logs are the signed extremes). It existed (hand numbers in
tests/test_algorithms_losses.py; tests/test_trainer.py: ~0 on a rollout batch's first update, not on its
second), so no library file changed for this study; tests/test_train_step.py's
test_log_ratio_extremes_against_float64_numpy checks the three, merged over 2 micro-batches and 2 updates as
the trainer merges a step, against float64 numpy. A ratio a loss clips still moves (the clip
stops its gradient, not the other tokens' updates that move it), so neither objective bounds it by
construction. Measured over the run after warm-up (steps past 10% of the run) and as its growth: the
mean over the last quarter minus the mean over steps 10-35%.

Claims (CLAIMS, declared before any run; "area" is the held-out accuracy averaged over training, the
trapezoid under the evaluations; "final" the held-out greedy accuracy over the last 20% of the run):
1. GPG beats GRPO, final and area (arXiv 2504.02546; "simpler" is a fact of the design, not a half);
2. DisCO beats GRPO and DAPO, final (arXiv 2505.12366, abstract: +7% over GRPO, +6% over DAPO);
3. DHPO beats GRPO and GSPO, final (arXiv 2601.05607, abstract; no number found);
4. OPO has a lower KL from the warm start and a higher entropy than GRPO, last 20% (arXiv 2505.23585);
5. GMPO beats GRPO, final and area (arXiv 2507.20673, abstract: +4.1% average Pass@1, 7B);
6. SAPO beats GRPO and GSPO, final (arXiv 2511.20347, abstract; no number in it);
7. DAPO beats GRPO, final and area (arXiv 2503.14476, Table 1: AIME 2024 avg@32, naive GRPO 30, DAPO 50);
8. GMPO's token log-ratio extremes are smaller than GRPO's, at GRPO's rate and at each one's own;
9. GRPO's extremes grow over training, and more than GMPO's at GRPO's rate (the GMPO paper's Figure 1:
   GRPO's ratio range widens during training, GMPO's stays narrower).
Numbers are the papers' on math benchmarks with 1.5-32B models; a claim's rule asks for the direction only
(a difference above 0 beyond the null pair's noise floor), as the toy's accuracy is not a benchmark's.

Cut (cost): GRPO on-policy at GPG's batch (16 prompts, 1 update: which of GPG's differences from GRPO
acts, advantage and scale or on-policy updates), DAPO with its overlong shaping at a longer L_max, and
any claim over a longer task (experiments/preset_table.py has DAPO, GMPO and SAPO there).

Cost, measured by the --quick run (results/method_orderings/quick; 2 cores shared with other helpers' jobs,
load average 9.0 at the start, up to 9.8): 729 s in all, the warm start 168 s (350 steps); a run of 120
updates 13-58 s, the first of each config compiling (5-40 s), then about 0.2 s per step of two updates
(0.09 s per step of one, GPG and OPO), evaluations included. Full study: 9 selecting arms x 3 rates x 2
seeds = 54 selection runs + 11 arms x 8 seeds = 88, 142 runs of 240 updates, at that load about 55 s each
once compiled plus ~40 compilations of ~20 s: about 2.4 hours at load 9, less on a quieter machine (the
brief's 2 hours); run it with --resume. --quick: the 11 arms x 2 seeds of 120 updates (60 steps; 120 for
GPG and OPO) at QUICK_RATE, no selection (not the full protocol): 22 runs, 12 minutes at load 9.
"""

import numpy as np

from grpo_jax.config import override

import arithmetic_setting
import protocol
import study
from arithmetic_setting import QUICK_STEPS, RATES, STEPS, WARM_START
from study import final_accuracy, reward

GPG = "arXiv 2504.02546 (GPG)"
DISCO = "arXiv 2505.12366 (DisCO)"
DHPO = "arXiv 2601.05607 (DHPO)"
OPO = "arXiv 2505.23585 (OPO)"
GMPO = "arXiv 2507.20673 (GMPO)"
SAPO = "arXiv 2511.20347 (SAPO)"
DAPO = "arXiv 2503.14476 (DAPO)"
NULL = ("gspo", "gspo_token")
KL_PROBE = 1e-6  # algorithm.beta of every arm: keeps the warm start as the reference, for kl_k3_mean
NO_RATIO = ("gpg", "opo")  # reinforce losses: one update per rollout batch of half the prompts, twice the steps
PRESETS = {"grpo": "grpo", "gpg": "gpg", "opo": "opo", "disco": "disco", "dhpo": "dhpo", "gmpo": "gmpo",
           "sapo": "sapo", "dapo": "dapo", "gspo": "gspo", "gspo_token": "gspo_token", "gmpo_at_grpo_rate": "gmpo"}
EXTRA = {"dapo": ["algorithm.overlong_buffer_frac=0"]}  # the buffer would fall on complete answers (docstring)
RATIO = "log_ratio_abs_max"
FINAL = "held-out greedy accuracy, last 20%"
AREA = "held-out accuracy area (mean over training)"


def accuracy_area(run: study.Run) -> float:
    """Held-out greedy accuracy averaged over training: the trapezoid under the evaluations (warm start
    included, the same for every arm) over the run's steps, so arms of other step counts compare."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    return float(np.trapezoid(acc, steps) / steps[-1]) if steps.size > 1 else float("nan")


def kl_from_start(run: study.Run) -> float:
    """k3 estimate of KL(pi_theta || pi_warm) on the sampled tokens, mean over the last 20% of the run."""
    return run.mean("kl_k3_mean", 0.8)


def entropy(run: study.Run) -> float:
    """The policy's entropy on the sampled tokens, mean over the last 20% of the run."""
    return run.mean("entropy_mean", 0.8)


def ratio_extreme(run: study.Run) -> float:
    """max |log r_t| per step (over its tokens and updates), averaged over the steps past 10% of the run
    (the warm-up's 10 updates end by then)."""
    return run.mean(RATIO, 0.1)


def ratio_growth(run: study.Run) -> float:
    """max |log r_t| per step: mean over the last quarter of the run minus over steps 10-35%."""
    return run.mean(RATIO, 0.75) - run.mean(RATIO, 0.1, 0.35)


def beats(label: str, metric, method: str, *others: str) -> tuple[protocol.Difference, ...]:
    return tuple(protocol.Difference(label, metric, method, other) for other in others)


CLAIMS = (
    protocol.Claim(
        "GPG reaches a higher held-out accuracy than GRPO (at the same updates per sampled token)",
        source=f"{GPG}, abstract; the authors' README (github.com/AMAP-ML/GPG), Qwen2.5-Math-7B table",
        paper="GPG consistently outperforms GRPO; Qwen2.5-Math-7B, average pass@1 over AIME24, MATH-500, AMC23, "
              "Minerva and OlympiadBench: GRPO 43.7, GPG (F_norm = 1, alpha = B/(B-M), the preset) 47.8",
        halves=(protocol.Difference(FINAL, final_accuracy, "gpg", "grpo"),
                protocol.Difference(AREA, accuracy_area, "gpg", "grpo"))),
    protocol.Claim(
        "DisCO reaches a higher held-out accuracy than GRPO and than DAPO",
        source=f"{DISCO}, abstract",
        paper="average gains of 7% over GRPO and 6% over DAPO across six math benchmarks for a 1.5B model",
        halves=beats(FINAL, final_accuracy, "disco", "grpo", "dapo")),
    protocol.Claim(
        "DHPO reaches a higher held-out accuracy than GRPO and than GSPO",
        source=f"{DHPO}, abstract",
        paper="consistently outperforms GRPO and GSPO across seven math benchmarks (Qwen3 dense and MoE); no "
              "number found in what could be read (the abstract)",
        halves=beats(FINAL, final_accuracy, "dhpo", "grpo", "gspo")),
    protocol.Claim(
        "OPO's policy shifts less from its start than GRPO's, and keeps a higher entropy",
        source=f"{OPO}, abstract",
        paper="OPO achieves lower policy shifts and higher output entropy (exact on-policy training); no number "
              "found in what could be read (the abstract); how it measures the shift was not read",
        halves=(protocol.Difference("KL(pi || pi_warm) k3 on sampled tokens, last 20%: GRPO's minus OPO's",
                                    kl_from_start, "grpo", "opo"),
                protocol.Difference("entropy on sampled tokens, last 20%", entropy, "opo", "grpo"))),
    protocol.Claim(
        "GMPO reaches a higher held-out accuracy than GRPO",
        source=f"{GMPO}, abstract",
        paper="GMPO-7B outperforms GRPO by 4.1% average Pass@1 on math benchmarks (AIME24, AMC, MATH500, "
              "OlympiadBench, Minerva)",
        halves=(protocol.Difference(FINAL, final_accuracy, "gmpo", "grpo"),
                protocol.Difference(AREA, accuracy_area, "gmpo", "grpo"))),
    protocol.Claim(
        "SAPO reaches a higher held-out accuracy than GRPO and than GSPO",
        source=f"{SAPO}, abstract",
        paper="higher Pass@1 than GRPO and GSPO on math reasoning under comparable training budgets; no number "
              "in the abstract",
        halves=beats(FINAL, final_accuracy, "sapo", "grpo", "gspo")),
    protocol.Claim(
        "DAPO reaches a higher held-out accuracy than GRPO (per update; its overlong shaping off here)",
        source=f"{DAPO}, Table 1",
        paper="AIME 2024 avg@32 of Qwen2.5-32B: naive GRPO 30, DAPO 50",
        halves=(protocol.Difference(FINAL, final_accuracy, "dapo", "grpo"),
                protocol.Difference(AREA, accuracy_area, "dapo", "grpo"))),
    protocol.Claim(
        "GMPO keeps its token importance ratios in a narrower range than GRPO",
        source=f"{GMPO}, abstract and Figure 1",
        paper="GMPO maintains a more stable range of importance sampling ratio; GRPO's ratios frequently reach "
              "extreme values (a figure, no number)",
        halves=(protocol.Difference("max |log r| per step, mean after warm-up, at GRPO's rate: GRPO's minus GMPO's",
                                    ratio_extreme, "grpo", "gmpo_at_grpo_rate"),
                protocol.Difference("max |log r| per step, mean after warm-up, each at its own rate: GRPO's minus "
                                    "GMPO's", ratio_extreme, "grpo", "gmpo"))),
    protocol.Claim(
        "GRPO's range of token importance ratios widens over training, more than GMPO's",
        source=f"{GMPO}, Figure 1 and sec. 3 (the range of GRPO's ratios expands as training goes on)",
        paper="GRPO's importance-sampling ratio range widens during training while GMPO's stays narrower (a figure, "
              "no number)",
        halves=(protocol.Level("max |log r| per step, last quarter minus steps 10-35%, GRPO", ratio_growth, "grpo", 0.0),
                protocol.Difference("max |log r| per step, last quarter minus steps 10-35%, at GRPO's rate: GRPO's "
                                    "minus GMPO's", ratio_growth, "grpo", "gmpo_at_grpo_rate"))),
)


claims = protocol.judging(CLAIMS, NULL)


def log_of(key: str):
    """A table row: the log of a positive per-step metric, mean over the steps past 10% of the run."""
    return lambda run: float(np.log(run.mean(key, 0.1))) if run.mean(key, 0.1) > 0 else float("nan")


TABLE = {
    FINAL: final_accuracy,
    AREA: accuracy_area,
    "training reward, mean over the run": reward,
    "entropy on sampled tokens, last 20%": entropy,
    "KL(pi || pi_warm), k3, last 20%": kl_from_start,
    "max |log r| per step, mean after warm-up": ratio_extreme,
    "max |log r| per step, growth (last quarter minus steps 10-35%)": ratio_growth,
    "log of ratio_max per step, mean after warm-up": log_of("ratio_max"),
    "log of ratio_min per step, mean after warm-up": log_of("ratio_min"),
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "optimizer updates": lambda r: r.last("updates"),
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    steps = QUICK_STEPS if quick else STEPS
    ratio, no_ratio = arithmetic_setting.base(quick, minibatches=2), arithmetic_setting.base(quick, minibatches=1)
    no_ratio = override(no_ratio, [  # half the prompts a step, twice the steps: the ratio arms' updates and tokens
        "train.prompts_per_step=16", f"train.steps={2 * steps}", f"train.eval_every={2 * ratio.train.eval_every}",
        f"train.checkpoint_every={2 * ratio.train.checkpoint_every}"])
    arms = {arm: override(no_ratio if preset in NO_RATIO else ratio,
                          [f"algorithm.preset={preset}", f"algorithm.beta={KL_PROBE}", *EXTRA.get(arm, [])])
            for arm, preset in PRESETS.items()}
    return study.Study(
        name="method_orderings",
        arms=arms,
        **study.sized(quick, RATES),
        rate_from={"gmpo_at_grpo_rate": ("grpo", 1.0)},
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(study.Plot("curves", ("eval/accuracy_greedy", "reward/mean", "entropy_mean", "kl_k3_mean")),
               study.Plot("ratios", ("log_ratio_abs_max", "ratio_max", "ratio_min", "clip_frac_tokens"),
                          arms=("grpo", "gmpo", "gmpo_at_grpo_rate", "sapo", "dhpo", "gspo"), logy=True)),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
