"""GSPO vs GRPO on long written-out completions (GSPO paper, arXiv 2507.18071): training efficiency
(Figure 1), clipped tokens (Figure 2) and the mechanism of sec. 3 (token-ratio noise that grows with
length and hurts long responses most), under the shared protocol (experiments/protocol.py).

    python experiments/gspo_vs_grpo.py [--quick] [--resume] [--rejudge]

The task is column addition written out column by column (grpo_jax/data/reasoning.py): reference
completions of 24 to 182 tokens (median 41, p95 107: a long tail), and a tiny char-level model that
fails the long problems more (experiments/configs/long_addition.py, warm-started on the written
solutions to 25% greedy held-out accuracy). Arms, on the same data,
compute and seeds:
- grpo: token ratios clipped to [1 - 0.2, 1 + 0.27], no KL (the paper's baseline);
- gspo: length-normalized sequence ratios clipped to [1 - 3e-4, 1 + 4e-4];
- gspo_token: GSPO-token, the same objective as gspo at sequence-level advantages, on its own rollouts
  (the harness reseeds the null pair's second arm's sampling): the null control, whose paired
  differences from gspo are the noise floor of every claim.
Each rollout batch is split into 4 minibatches, so updates 2-4 of a batch are off-policy and the
ratios (and clipping) act. Learning rates are chosen per arm on separate seeds (the protocol).

Measured per run: training reward over the run, held-out greedy accuracy (last 20%, overall and per
problem-length bucket), the fraction of tokens clipped (a clipped sequence counts all its tokens: the
paper's unit), and per completion-length bucket the within-completion variance of the token
log-ratios (algorithms.ratio_by_length, unbiased: a longer completion is not noisier by construction).
"""

import numpy as np
from configs.long_addition import get_config as long_addition_config  # experiments/configs/long_addition.py

from grpo_jax.config import override

import protocol
import study
from study import final_accuracy, reward
from warm_start import WarmStart, written_solution

PAPER = "arXiv 2507.18071 (GSPO)"
NULL = ("gspo", "gspo_token")
ARMS = {  # the paper's settings; the rest of the config is shared
    "grpo": ["algorithm.preset=grpo", "algorithm.beta=0", "algorithm.loss.eps_low=0.2", "algorithm.loss.eps_high=0.27"],
    "gspo": ["algorithm.preset=gspo"],  # eps_low=3e-4, eps_high=4e-4, beta=0
    "gspo_token": ["algorithm.preset=gspo_token"],
}
# Supervised on the written solutions until a quarter of the held-out problems are right (the short
# ones: experiments/configs/long_addition.py).
WARM_START = WarmStart(accuracy=0.25, batch_size=16, eval_every=50, target=written_solution)
# Buckets by completion length (tokens, with eos): the train step's (ratio noise) and the task's
# (held-out accuracy). 2-digit problems fill the first, 3 to 5 digits the second; the warm start solves
# almost none of the third, so the accuracy claim compares the second with the first.
BUCKETS = ("0-32", "32-64", "64-inf")
SHORT, LONG = "0-32", "32-64"


def gain(run, bucket: str) -> float:
    """Held-out greedy accuracy on the bucket's problems: the last 20% of the run minus the warm start."""
    steps, acc = run.series(f"eval/accuracy_greedy@{bucket}", "step")
    return final_accuracy(run, bucket) - float(acc[steps == 0][0]) if acc.size else float("nan")


def clipped(run):
    return run.mean("clip_frac_tokens")


def token_log_var(run, bucket: str) -> float:
    """The within-completion token log-ratio variance of the bucket, over every update of the run
    (each step's value weighted by its completions in the bucket)."""
    rows = [r for r in run.rows if r.get(f"length/sequences@{bucket}", 0) > 0]
    weights = np.array([r[f"length/sequences@{bucket}"] for r in rows])
    values = np.array([r[f"ratio/token_log_var@{bucket}"] for r in rows])
    return float(values @ weights / weights.sum()) if rows else float("nan")


def noise_growth(run) -> float:
    """log10 of the longest completions' token log-ratio variance over the shortest's (nan where either is
    missing or zero: no update moved the ratio, a seed that cannot count as growth)."""
    short, long = token_log_var(run, BUCKETS[0]), token_log_var(run, BUCKETS[-1])
    return float(np.log10(long / short)) if short > 0 and long > 0 else float("nan")


def long_minus_short_gain(run) -> float:
    return gain(run, LONG) - gain(run, SHORT)


CLAIMS = (
    protocol.Claim(
        "GSPO trains more efficiently than GRPO: higher training reward and held-out accuracy for the same "
        "training compute", source=f"{PAPER}, Figure 1",
        paper="GSPO's training reward and benchmark accuracy (AIME'24, LiveCodeBench, CodeForces) above GRPO's "
              "throughout, at equal training compute",
        halves=(protocol.Difference("training reward over the run", reward, "gspo", "grpo"),
                protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "gspo", "grpo"))),
    protocol.Claim(
        "GSPO clips about two orders of magnitude more tokens than GRPO", source=f"{PAPER}, Figure 2",
        paper="clipped token fraction ~0.15 (GSPO) vs ~0.0013 (GRPO), ~100x",
        halves=(protocol.Ratio("clipped token fraction", clipped, "gspo", "grpo", at_least=10 ** 1.5),)),
    protocol.Claim(
        "Token-level importance ratios are noisier in longer responses", source=f"{PAPER}, sec. 3.1",
        paper="token-level weights are single-sample estimates whose high-variance noise accumulates with "
              "increasing response length",
        halves=(protocol.Level("log10 of GRPO's token log-ratio variance in the longest bucket over the shortest",
                               noise_growth, "grpo", 0.0),)),
    protocol.Claim(
        "GRPO's token-level noise hurts long responses most: GSPO's accuracy gain over GRPO is larger on long "
        "problems than on short ones", source=f"{PAPER}, sec. 3.1",
        paper="the accumulated noise, amplified by clipping, leads to model collapse, most with long responses",
        halves=(protocol.Difference(f"held-out accuracy gain on problems of {LONG} minus {SHORT} tokens", long_minus_short_gain,
                                    "gspo", "grpo"),)),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "training reward, mean over the run": reward,
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    **{f"held-out accuracy gain, problems of {b} tokens": (lambda r, b=b: gain(r, b)) for b in BUCKETS},
    "clipped token fraction": clipped,
    "sequences clipped (fraction)": lambda r: r.mean("clip_frac_low") + r.mean("clip_frac_high"),
    **{f"token log-ratio variance, completions of {b} tokens": (lambda r, b=b: token_log_var(r, b)) for b in BUCKETS},
    **study.LENGTH_DISTRIBUTION,
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
}


def get_study(quick: bool) -> study.Study:
    base = override(long_addition_config(), [
        f"train.steps={40 if quick else 100}", "train.minibatches=4", f"train.eval_prompts={128 if quick else 256}",
        f"train.eval_every={10 if quick else 20}", "train.checkpoint_every=20", "train.length_buckets=32,64",
    ])
    return study.Study(
        name="gspo_vs_grpo",
        arms={name: override(base, changes) for name, changes in ARMS.items()},
        **study.sized(quick, (3e-5, 1e-4, 3e-4)),
        null_pair=NULL,
        warm_start=WARM_START,
        derive={"clip_frac_tokens": study.clip_frac_tokens},
        table=TABLE,
        plots=(
            study.Plot("curves", ("reward/mean", "eval/accuracy_greedy", "clip_frac_tokens", "completion/length_mean")),
            study.Plot("accuracy_by_length", tuple(f"eval/accuracy_greedy@{b}" for b in BUCKETS)),
            study.Plot("token_ratio_noise", tuple(f"ratio/token_log_var@{b}" for b in BUCKETS), logy=True),
        ),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
