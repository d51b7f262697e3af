"""Infrastructure mismatch: GRPO and GSPO trained on rollouts from a sampler whose likelihoods are not the
trainer's (issue 42 item 1; GSPO, arXiv 2507.18071, abstract and sec. 5.4), under the shared protocol
(experiments/protocol.py).

    python experiments/infra_mismatch.py [--quick] [--resume] [--rejudge]

The sampler draws from, and reports l^samp under, a policy the trainer does not compute: in bfloat16 under
the float32 trainer (`sampling.compute_dtype`), or with N(0, NOISE^2) added to every logit it samples from
(`sampling.logit_noise`, a controlled perturbation: its gap is set, not whatever bf16 gives this model).
The trainer takes l^old under its own params (the recompute), so uncorrected arms train on samples of
another distribution as if on-policy; a rollout correction weighs them by exp(l^old - l^samp) (logged
as sampler_drift_mean: |l^old - l^samp| per token). The paper's mechanism proper, GSPO's ratio taken
against the sampler's own likelihoods with no recompute, is the arms {grpo,gspo}_noise_rollout
(`train.proximal=rollout`: l^old is l^samp, drift 0, the ratio carries the mismatch), claim 4. Cut (cost):
corrections under bf16 (its gap is 1/500 of the noise's), GSPO's token TIS, GRPO's sequence mask, the
geometric weight and off_policy_threshold.

Task, base and batch as experiments/staleness.py (the quickstart's arithmetic, 2-4-token answers, one
warm start at seed 0 to WARM_START's accuracy, 32 prompts x 8 samples, constant rate, no KL), but two
minibatches a step (the quickstart's): with one on-policy update GRPO's and GSPO's gradients are the same
(ratio 1, staleness.py), so the second, clipped update is where the two objectives can differ.

Arms, on the same warm start, data and sampling keys per seed:
- grpo, gspo: the matched sampler (the baselines); gspo_token: the null control with gspo (protocol);
- {grpo,gspo}_bf16: the sampler in bfloat16, uncorrected (the gap real engines have, for scale);
- {grpo,gspo}_noise: logit noise NOISE, uncorrected; grpo_noise_tis: token TIS (truncated at C = 2);
  gspo_noise_seqmask: the sequence mask (tis_level sequence, tis_mode mask: a completion whose
  exp(sum_t (l^old - l^samp)) passes C = 2 gets 0, else that weight);
- {grpo,gspo}_noise_rollout: logit noise NOISE with l^old the sampler's own log-probs (train.proximal=rollout,
  GSPO sec. 5.4: no recompute), uncorrected.
grpo and gspo each choose among RATES on the selection seeds; every mismatched arm takes its family's rate
(`rate_from`): the mismatch changes the sampler, not the objective.

Measured, not guessed (8-step runs from the quickstart init, 2 cores shared with two other studies'
runs, load 3.4-4.4): sampler_drift_mean 7e-4 per token in bfloat16, 0.40 at NOISE = 0.5 (chosen for a
gap some 500x bf16's, not to hide in its noise); a step 0.08-0.2 s after a 5-12 s start-up (compiling),
the same for every sampler. Full study: 6 x 2 selection runs + 11 arms x 8 seeds = 100 runs of STEPS = 240
steps, about 100 runs x 45 s (start-up, 240 x 0.12 s, 9 evaluations) + the warm start's 104 s
(staleness.py's): about 77 minutes, more under load; run it with --resume. --quick: 11 arms x 2 seeds of
60 steps at QUICK_RATE, no selection (not the full protocol): 22 runs x about 20 s, about 8-10 minutes.
"""

from grpo_jax.config import override

import arithmetic_setting
import protocol
import study
from arithmetic_setting import RATES, WARM_START
from study import final_accuracy, reward

GSPO = "arXiv 2507.18071 (GSPO)"
TIS = "Yao et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL Training' (truncated IS)"
NOISE = 0.5
MARGIN = 0.03  # non-inferiority in training reward, declared before any run: staleness.py's on the same task
NULL = ("gspo", "gspo_token")
FAMILIES = {"grpo": ["algorithm.preset=grpo", "algorithm.beta=0"], "gspo": ["algorithm.preset=gspo"],
            "gspo_token": ["algorithm.preset=gspo_token"]}
SAMPLERS = {"": [], "_bf16": ["sampling.compute_dtype=bfloat16"], "_noise": [f"sampling.logit_noise={NOISE}"],
            "_noise_tis": [f"sampling.logit_noise={NOISE}", "algorithm.tis_level=token"],
            "_noise_seqmask": [f"sampling.logit_noise={NOISE}", "algorithm.tis_level=sequence", "algorithm.tis_mode=mask"],
            "_noise_rollout": [f"sampling.logit_noise={NOISE}", "train.proximal=rollout"]}
ARMS = {"grpo": ("grpo", ""), "gspo": ("gspo", ""), "gspo_token": ("gspo_token", ""),
        **{f"{f}{s}": (f, s) for f in ("grpo", "gspo") for s in ("_bf16", "_noise")},
        "grpo_noise_tis": ("grpo", "_noise_tis"), "gspo_noise_seqmask": ("gspo", "_noise_seqmask"),
        **{f"{f}_noise_rollout": (f, "_noise_rollout") for f in ("grpo", "gspo")}}


CLAIMS = (
    protocol.Claim(
        "GRPO degrades when the sampler's likelihoods are not the trainer's",
        source=f"{GSPO}, sec. 5.4 (its premise: why GRPO's infrastructure recomputes the likelihoods)",
        paper="token-level importance ratios are sensitive to the precision discrepancy between the inference "
              "engine and the training engine (the reason RL infrastructure recomputes likelihoods for GRPO)",
        halves=(protocol.Difference(f"training reward over the run, matched minus logit noise {NOISE}", reward,
                                    "grpo", "grpo_noise"),
                protocol.Difference(f"held-out greedy accuracy, last 20%, matched minus logit noise {NOISE}",
                                    final_accuracy, "grpo", "grpo_noise"))),
    protocol.Claim(
        "GSPO tolerates the sampler/trainer mismatch better than GRPO: it loses less to it",
        source=f"{GSPO}, abstract and sec. 5.4, carried from the ratio's likelihoods to the samples (l^old is "
               "recomputed here)",
        paper="GSPO has the potential for simplifying the design of RL infrastructure: sequence-level likelihoods "
              "are more tolerant of the precision discrepancy, so the inference engine's likelihoods can be used "
              "directly",
        halves=(protocol.Contrast(f"training reward over the run: GRPO's loss to logit noise {NOISE} minus GSPO's",
                                  reward, (("grpo", 1.0), ("grpo_noise", -1.0), ("gspo", -1.0), ("gspo_noise", 1.0))),
                protocol.Contrast(f"held-out greedy accuracy, last 20%: GRPO's loss to logit noise {NOISE} minus GSPO's",
                                  final_accuracy,
                                  (("grpo", 1.0), ("grpo_noise", -1.0), ("gspo", -1.0), ("gspo_noise", 1.0))))),
    protocol.Claim(
        "Token TIS recovers GRPO under the mismatch: better than no correction",
        source=TIS,
        paper="truncated importance sampling on the token-level ratio pi_train / pi_sampler closes the gap the "
              "sampler/trainer mismatch opens",
        halves=(protocol.Difference(f"training reward over the run under logit noise {NOISE}, token TIS minus none",
                                    reward, "grpo_noise_tis", "grpo_noise"),
                protocol.Difference(f"held-out greedy accuracy, last 20%, under logit noise {NOISE}, token TIS minus "
                                    "none", final_accuracy, "grpo_noise_tis", "grpo_noise"))),
    protocol.Claim(
        "GSPO can take its ratio on the sampler's likelihoods, with no recompute; GRPO loses more by it",
        source=f"{GSPO}, sec. 5.4",
        paper="sequence-level likelihoods tolerate the precision discrepancy, so GSPO can optimize with the "
              "likelihoods the inference engine returns and skip the training engine's recompute",
        halves=(protocol.Difference(f"training reward over the run under logit noise {NOISE}, GSPO on the sampler's "
                                    f"likelihoods minus recomputed (at most {MARGIN} below)", reward,
                                    "gspo_noise_rollout", "gspo_noise", at_least=-MARGIN),
                protocol.Contrast(f"training reward over the run under logit noise {NOISE}: GRPO's loss from the "
                                  "sampler's likelihoods minus GSPO's", reward,
                                  (("grpo_noise", 1.0), ("grpo_noise_rollout", -1.0), ("gspo_noise", -1.0),
                                   ("gspo_noise_rollout", 1.0))))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "training reward, mean over the run": reward,
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "|l^old - l^samp| per token, mean (sampler_drift_mean)": lambda r: r.mean("sampler_drift_mean"),
    "|l^old - l^samp| per token, max": lambda r: r.mean("sampler_drift_max"),
    "clipped token fraction": lambda r: r.mean("clip_frac_tokens"),
    "correction weight, mean (where one runs)": lambda r: r.mean("tis_weight_mean"),
    "correction's zeroed fraction (where one runs)": lambda r: r.mean("tis_masked_frac"),
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    base = arithmetic_setting.base(quick, minibatches=2)
    return study.Study(
        name="infra_mismatch",
        arms={arm: override(base, [*FAMILIES[family], *SAMPLERS[sampler]]) for arm, (family, sampler) in ARMS.items()},
        **study.sized(quick, RATES),
        rate_from={arm: (family, 1.0) for arm, (family, _) in ARMS.items() if arm not in ("grpo", *NULL)},
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(study.Plot("curves", ("reward/mean", "eval/accuracy_greedy", "sampler_drift_mean", "clip_frac_tokens")),),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
