"""Dr. GRPO's length bias at toy scale ("Understanding R1-Zero-Like Training", arXiv 2503.20783).

    python experiments/length_bias.py [--quick] [--results-dir DIR] [--seeds 0 1 2]

The claim: GRPO's 1/|o_i| weighting (and its division by the group's reward std) penalizes long
incorrect completions less than short ones, so incorrect completions grow longer over training;
Dr. GRPO (sum over tokens / L_max, advantages r - mean) does not, at the same accuracy.

A task where length is free: the quickstart's arithmetic ("13+7=" -> "20", tiny char-level Qwen3-style
model), exact-match reward, which reads the last number of the completion, so spaces before and after
the answer cost nothing; max_new_tokens=32, ten times the answer. The warm start writes the answer
between runs of spaces of geometric length (mean ~0.8 each side), so the initial policy already varies
its length and RL can move it either way; it runs until 20% greedy held-out accuracy. Two layouts:
"around" (filler before and after the answer: a scratchpad the answer follows) and "after" (filler only
after the answer: the length is chosen knowing the answer, which is where the 1/|o_i| weighting can
pull wrong answers longer and right ones shorter; before the answer, length and correctness are
independent in expectation unless the filler changes the answer's accuracy).

Arms: GRPO (the grpo preset with beta=0: Dr. GRPO's preset has no KL term either, so the arms differ
only in the two terms the claim is about) and Dr. GRPO (the dr_grpo preset), per layout; same
learning rate (8e-4 cosine, Adam: insensitive to Dr. GRPO's smaller loss scale), 2 minibatches.
Measured per step on the training rollouts: mean length of correct and of incorrect completions
(completion/length_correct, completion/length_incorrect), accuracy; held-out greedy accuracy.
Growth = mean over the last 20% of steps - mean over the first 10%.
Verdicts: "GRPO grows incorrect completions" is reproduced if, in a layout, GRPO's incorrect length
grows and grows more than its correct length in every seed; partial if the mean over seeds does;
not_reproduced otherwise. "Dr. GRPO does not" is reproduced if Dr. GRPO's incorrect-length growth is
below GRPO's in every seed of that layout and its final accuracy is within 0.05 of GRPO's or above;
partial if below on the mean; not_reproduced otherwise.
"""

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax.config import override

import study
from warm_start import WarmStart

PAPER = "arXiv 2503.20783 (Dr. GRPO)"
FILLER_CONTINUE = 0.45  # each filler space is followed by another with this probability
ALGORITHMS = {
    "grpo": ["algorithm.preset=grpo", "algorithm.beta=0"],
    "dr_grpo": ["algorithm.preset=dr_grpo"],
}


def filler(rng) -> str:
    return " " * (rng.geometric(1 - FILLER_CONTINUE) - 1)


def answer_in_filler(example: dict, rng: np.random.Generator) -> str:
    """The answer between two runs of spaces of geometric length: greedy decoding writes none."""
    return filler(rng) + example["answer"] + filler(rng)


def answer_then_filler(example: dict, rng: np.random.Generator) -> str:
    """The answer, then a run of spaces of geometric length."""
    return example["answer"] + filler(rng)


LAYOUTS = {"around": answer_in_filler, "after": answer_then_filler}


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [  # the quickstart's model, task and schedule; room for filler
        "sampling.max_new_tokens=32", f"train.steps={120 if quick else 300}", "train.eval_prompts=256",
        "train.eval_every=25", "train.checkpoint_every=10000",
    ])
    layouts = ("after",) if quick else tuple(LAYOUTS)
    arms = {f"{alg}_{layout}": override(base, changes) for layout in layouts for alg, changes in ALGORITHMS.items()}
    return study.Study(
        name="length_bias",
        arms=arms,
        seeds=(0, 1) if quick else (0, 1, 2),
        warm_start={a: WarmStart(accuracy=0.2, target=LAYOUTS[a.rsplit("_", 1)[1]]) for a in arms},
        table=TABLE,
        plots=tuple(study.Plot(f"lengths_{layout}", ("completion/length_correct", "completion/length_incorrect",
                                                     "accuracy", "eval/accuracy_greedy"),
                               x="step", arms=tuple(f"{alg}_{layout}" for alg in ALGORITHMS)) for layout in layouts),
    )


def growth(key):
    return lambda run: run.mean(key, 0.8) - run.mean(key, 0.0, 0.1)


def final_accuracy(run):
    return run.mean("eval/accuracy_greedy", 0.8)


TABLE = {
    "length of correct completions, first 10% of steps": lambda r: r.mean("completion/length_correct", 0, 0.1),
    "length of correct completions, last 20%": lambda r: r.mean("completion/length_correct", 0.8),
    "length of incorrect completions, first 10%": lambda r: r.mean("completion/length_incorrect", 0, 0.1),
    "length of incorrect completions, last 20%": lambda r: r.mean("completion/length_incorrect", 0.8),
    "growth of incorrect minus growth of correct": lambda r: growth("completion/length_incorrect")(r)
    - growth("completion/length_correct")(r),
    "training accuracy, last 20%": lambda r: r.mean("accuracy", 0.8),
    "held-out greedy accuracy, last 20%": final_accuracy,
    "wall seconds per run (shared machine)": lambda r: r.wall_seconds,
}


def claims(results: study.Results) -> list[dict]:
    layouts = [a.removeprefix("grpo_") for a in results if a.startswith("grpo_")]
    grows, dr_flat, grows_text, dr_text = [], [], [], []
    for layout in layouts:
        grpo, dr = f"grpo_{layout}", f"dr_grpo_{layout}"
        inc, cor = (results.values(grpo, growth(f"completion/length_{k}")) for k in ("incorrect", "correct"))
        gap = inc - cor
        grows.append("all" if (inc > 0).all() and (gap > 0).all() else "mean" if inc.mean() > 0 and gap.mean() > 0
                     else "no")
        grows_text.append(f"{layout}: GRPO incorrect-length growth {study.spread(inc)} tokens, correct "
                          f"{study.spread(cor)}, difference {study.spread(gap)}")
        dr_inc = results.values(dr, growth("completion/length_incorrect"))
        acc_gap = results.values(dr, final_accuracy) - results.values(grpo, final_accuracy)
        below = dr_inc - inc
        dr_flat.append("all" if (below < 0).all() and acc_gap.mean() >= -0.05 else "mean" if below.mean() < 0 else "no")
        dr_text.append(f"{layout}: Dr. GRPO incorrect-length growth {study.spread(dr_inc)} tokens vs GRPO "
                       f"{study.spread(inc)} (paired difference {study.spread(below)}); held-out accuracy "
                       f"Dr. GRPO minus GRPO {study.spread(acc_gap)}")

    def verdict(levels):
        return "reproduced" if "all" in levels else "partial" if "mean" in levels else "not_reproduced"

    return [
        study.claim(
            "GRPO's 1/|o_i| weighting and std division make incorrect completions grow longer over training",
            source=f"{PAPER}, Section 3.1 and Figure 1 (right)",
            paper="under GRPO the length of incorrect responses keeps growing during training (more than that of "
                  "correct ones)",
            measured="; ".join(grows_text),
            verdict=verdict(grows),
            rule="in a layout, GRPO's incorrect length grows, and more than its correct length, in every seed: "
                 "reproduced; on the mean over seeds: partial; else not_reproduced",
        ),
        study.claim(
            "Dr. GRPO does not grow incorrect completions, at the same accuracy",
            source=f"{PAPER}, Section 3.1 and Figure 1 (right)",
            paper="with Dr. GRPO the length of incorrect responses stays controlled while accuracy is maintained",
            measured="; ".join(dr_text),
            verdict=verdict(dr_flat),
            rule="in a layout, Dr. GRPO's incorrect-length growth below GRPO's in every seed and its held-out "
                 "accuracy within 0.05 of GRPO's or above: reproduced; below on the mean: partial; else "
                 "not_reproduced",
        ),
    ]


if __name__ == "__main__":
    study.main(get_study, claims)
