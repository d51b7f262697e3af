"""Dr. GRPO's length bias on written-out column addition ("Understanding R1-Zero-Like Training",
arXiv 2503.20783), under the shared protocol (experiments/protocol.py).

    python experiments/length_bias.py [--quick] [--resume] [--rejudge]

The claim (sec. 3.1, Figure 1 right): GRPO's per-response 1/|o_i| weighting gives each token of a long
response a smaller share of its advantage, so a long incorrect response is penalized less per token
than a short one, and incorrect responses grow longer over training; Dr. GRPO (token sum over a
constant L_max, advantages r - mean) has no such preference, and keeps accuracy with fewer tokens.

Where lengths can grow: the long_addition config's model on three-digit column addition only (one
difficulty, so a change in the length of incorrect completions is not a change in which problems are
wrong), up to 128 new tokens, three times a reference completion (33 to 41 tokens with eos). The warm
start writes each column step again (a check) with probability CHECK per repeat, so the initial policy
already varies its length, by 11 tokens on average and up to 66 (greedy decoding writes no check), and RL can move
it either way: the exact reward reads only the sum after "#### ", so checks cost nothing but tokens.

Arms, on the same data, compute and seeds: grpo (the grpo preset with beta = 0: Dr. GRPO has no KL
term either, so the arms differ only in the two terms the claim is about), dr_grpo (the preset), and
the null pair gspo and gspo_token (one objective at sequence-level advantages; the second draws its own
rollouts): their paired spread is the noise floor of every comparison. Learning rates are chosen per
arm on separate seeds (the protocol). 2 minibatches per rollout batch.

Measured per step on the training rollouts: the mean length of correct and of incorrect completions.
Growth = the mean over the last 20% of steps minus the mean over the first 10%.
"""

import numpy as np
from configs.long_addition import get_config as long_addition_config  # experiments/configs/long_addition.py

from grpo_jax.config import override

import protocol
import study
from study import final_accuracy
from warm_start import WarmStart

PAPER = "arXiv 2503.20783 (Dr. GRPO)"
NULL = ("gspo", "gspo_token")
ARMS = {
    "grpo": ["algorithm.preset=grpo", "algorithm.beta=0"],
    "dr_grpo": ["algorithm.preset=dr_grpo"],
    "gspo": ["algorithm.preset=gspo"],
    "gspo_token": ["algorithm.preset=gspo_token"],
}
CHECK = 0.3  # a written step is followed by a copy of itself (a check) with this probability, repeatedly,
COPIES = 3  # up to this many copies: targets fit max_new_tokens (at most 107 tokens with eos)


def written_with_checks(example: dict, rng: np.random.Generator) -> str:
    """The written solution with each column step written 1 to COPIES times (a geometric number, capped:
    1 + CHECK + CHECK^2 on average): the same answer at many lengths."""
    *steps, answer = example["solution"].split(";")
    return ";".join([s for s in steps for _ in range(min(rng.geometric(1 - CHECK), COPIES))] + [answer])


def growth(key: str):
    return lambda run: run.mean(key, 0.8) - run.mean(key, 0.0, 0.1)


incorrect_growth, correct_growth = growth("completion/length_incorrect"), growth("completion/length_correct")


def final_length(run):
    return run.mean("completion/length_mean", 0.8)


CLAIMS = (
    protocol.Claim(
        "GRPO's 1/|o_i| weighting makes incorrect completions grow longer over training, and Dr. GRPO's does not",
        source=f"{PAPER}, sec. 3.1 and Figure 1 (right)",
        paper="under GRPO the length of incorrect responses keeps growing over training; with Dr. GRPO it does not",
        halves=(protocol.Level("growth of GRPO's incorrect completions (tokens)", incorrect_growth, "grpo", 0.0),
                protocol.Difference("growth of incorrect completions (tokens)", incorrect_growth, "grpo", "dr_grpo"))),
    protocol.Claim(
        "Dr. GRPO keeps GRPO's accuracy with shorter completions (token efficiency)",
        source=f"{PAPER}, sec. 3.1 and Figure 5",
        paper="Dr. GRPO reaches the same reasoning performance as GRPO while its responses, above all the "
              "incorrect ones, are shorter",
        halves=(protocol.Difference("held-out greedy accuracy, last 20% (at most 0.05 below)", final_accuracy,
                                    "dr_grpo", "grpo", at_least=-0.05),
                protocol.Difference("completion length, last 20% (tokens)", final_length, "grpo", "dr_grpo"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    **{f"length of {k} completions, {span}": (lambda r, k=k, a=a, b=b: r.mean(f"completion/length_{k}", a, b))
       for k in ("correct", "incorrect") for span, a, b in (("first 10% of steps", 0.0, 0.1), ("last 20%", 0.8, 1.0))},
    "growth of incorrect completions": incorrect_growth,
    "growth of correct completions": correct_growth,
    "completion length, last 20%": final_length,
    **study.LENGTH_DISTRIBUTION,
    "truncated completions, last 20% (fraction)": lambda r: r.mean("completion/truncated_frac", 0.8),
    "training accuracy, last 20%": lambda r: r.mean("accuracy", 0.8),
    "held-out greedy accuracy, last 20%": final_accuracy,
}


def get_study(quick: bool) -> study.Study:
    base = override(long_addition_config(), [
        "task.min_digits=3", "task.max_digits=3", "sampling.max_new_tokens=128", "train.minibatches=2",
        f"train.steps={40 if quick else 100}", f"train.eval_prompts={128 if quick else 256}",
        f"train.eval_every={10 if quick else 20}", "train.checkpoint_every=20",
    ])
    return study.Study(
        name="length_bias",
        arms={name: override(base, changes) for name, changes in ARMS.items()},
        **study.sized(quick, (3e-5, 1e-4, 3e-4)),
        null_pair=NULL,
        warm_start=WarmStart(accuracy=0.25, batch_size=16, eval_every=50, target=written_with_checks),
        table=TABLE,
        plots=(study.Plot("lengths", ("completion/length_correct", "completion/length_incorrect",
                                      "completion/length_mean", "eval/accuracy_greedy"), x="step"),),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
