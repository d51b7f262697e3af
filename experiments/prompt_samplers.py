"""Prompt samplers against the uniform shuffle (issue 41 item 3), under the shared protocol
(experiments/protocol.py): SPO's degenerate groups and value tracker, VADE, GDRO and a difficulty-pool
curriculum per sampled token, AR3PO's and RePO's rollouts to a set accuracy.

    python experiments/prompt_samplers.py [--quick] [--resume] [--rejudge]

The task has a real mix of difficulties and a finite pool, so that per-prompt state sees each prompt
again: the quickstart's two-operand "+-" arithmetic on 0 to 19 (TASK: single digits and teens, results
-19 to 38), answer-only (2 to 4 tokens), from a pool of its first POOL training prompts per seed
(PoolConfig; held-out problems from the whole task); in --quick about a fifth of GRPO's groups were all
right or all wrong. Operands of 1 or 2 digits up to
99 were tried first: after the same warm start RL lowered held-out accuracy at every rate (seed 100,
300 steps: 0.21 to about 0.12 at 1e-3, 0.03 at 2e-3; flat at 5e-4 over 100 steps). The quickstart's
2-layer char-level model is warm-started once (seed 0, shared by every run: `Study.warm_start_seed`) on
the whole task (not the pool, which it would memorize) to WARM_START's held-out accuracy. 32 prompts x 8 samples a
step, one on-policy update per rollout batch, no KL.

Arms, on the same warm start, data and seeds (each a preset of docs/presets.md, beta 0):
- grpo: the uniform shuffle (preset grpo, beta 0), the reference of every comparison;
- grpo_null: the same, on its own rollouts: the null pair (protocol), whose spread is the noise floor;
- vade (2511.18902), curriculum (prime-rl's pools), gdro (2601.19280): which prompts (GDRO: and how
  many samples each); the update is GRPO's;
- spo (2509.13232): the value tracker's baseline and batch-normalized advantages, prioritized prompts.
  It keeps G = 8 samples a prompt (the paper samples one): the same shapes and sample budget as GRPO,
  and a round's G samples estimate each prompt's success rate without bias, which the tracker's
  error needs (`tracker_error`);
- ar3po (2509.25808), repo (2506.09340): their rollouts spent differently at one batch size (AR3PO:
  more slots to prompts with no correct answer, correct answers lent; RePO: half the slots replayed).
The trainer logs what the claims read: advantage/zero_frac (trained samples whose advantage is 0), and
for a sampler with a baseline sampler/baseline_sq_error (its squared error against each prompt's true
success rate, unbiased) beside sampler/group_mean_var (the variance of the round's own group mean).
Costs count the completions generated (`rollouts`: RePO's replayed groups are not generated again) and
their tokens. A sampler's training reward is on the prompts it chose (VADE's and the curriculum's lie
nearer 0.5 by design), so the held-out half of its claim is the one about learning. SPO's own
zero-advantage share is 0 by design (but for a batch of equal rewards): its half fails when GRPO's
degenerate groups are rare, the paper's premise.

Learning rates: grpo and spo choose theirs among RATES on the selection seeds (protocol); the others
take grpo's (`rate_from`): a sampler changes which samples an update sees, not the update, and a rate
chosen per sampler would cost 15 runs more, a quarter of the budget. (RePO's and AR3PO's replayed
samples are off-policy, weighed by token TIS: the same loss.)

Measured in --quick (commit ef2ebf7, 2 cores shared with another study, load average 7 to 10): runs
of 100 steps with 6 evaluations of 256 prompts took 14 to 22 s (SPO and AR3PO the slowest: the drift
forward, the store), about 0.18 s a step; the warm start 275 steps, 58 s; the whole quick study 373 s.
So a run of STEPS = 400 steps takes about 75 s, and the full study, 12 selection runs + 8 arms x 8
seeds = 76 runs and one warm start, about 95 minutes. Cut for it: ERPO (no claim of the issue), a rate
chosen per sampler, per-seed warm starts. --quick: 2 seeds of 100 steps, every arm at QUICK_RATE (no
selection: not under the full protocol).
"""

import dataclasses

import numpy as np
from configs.quickstart import get_config as quickstart_config  # experiments/configs/quickstart.py

from grpo_jax import data
from grpo_jax.config import override
from grpo_jax.data.tasks import Arithmetic, ArithmeticConfig

import protocol
import study
from study import final_accuracy
from warm_start import WarmStart

POOL = 512  # training prompts per seed: 32 a step see each about every 16 steps (25 times in a full run)


@data.register("arithmetic_pool")
@dataclasses.dataclass(frozen=True)
class PoolConfig(ArithmeticConfig):
    """Arithmetic whose training split is a pool of its first `pool` examples (those of the unbounded
    task), so that a sampler's per-prompt state sees each prompt again; the held-out split is the task's."""

    pool: int = 512

    def sources(self, seed):
        return Arithmetic(self, "train", self.pool, seed), super().sources(seed)[1]


# The quickstart's operands 0 to 19 ("+-"): single digits are easy, teens with a borrow or a carry hard.
TASK = ArithmeticConfig(max_value=19)
# On the whole task, not the pool (which it would memorize), to a fifth of the held-out problems.
WARM_START = WarmStart(accuracy=0.2, task=TASK)
RATES, QUICK_RATE, STEPS = (2.5e-4, 5e-4, 1e-3), 5e-4, 400
NULL = ("grpo", "grpo_null")
GRPO = ["algorithm.preset=grpo", "algorithm.beta=0"]
ARMS = {"grpo": GRPO, "grpo_null": GRPO, **{p: [f"algorithm.preset={p}"] for p in
                                              ("vade", "curriculum", "gdro", "spo", "ar3po", "repo")}}
FOLLOW_GRPO = ("vade", "curriculum", "gdro", "ar3po", "repo")
TARGET_GAIN = 0.1  # AR3PO's and RePO's set accuracy: the warm start's held-out accuracy + this


def rollouts(run) -> np.ndarray:
    """Completions generated up to each step (step 0 first): every slot of every round, less the stored
    groups RePO trains on again (AR3PO's lent answers replace samples that were generated)."""
    cfg = run.config
    replays = cfg.algorithm.sampler.spec.replays and not cfg.algorithm.sampler.spec.reuse
    fresh = [0.0] + [cfg.train.prompts_per_step * cfg.sampling.group_size * r["groups/gen_rounds"]
                     - (r.get("replay/rows", 0.0) if replays else 0.0) for r in run.rows if "groups/gen_rounds" in r]
    return np.cumsum(fresh)


def tokens(run) -> float:
    """Completion tokens generated over the run (replayed groups are not generated again)."""
    rows = [r for r in run.rows if "groups/gen_rounds" in r]
    return float(np.diff(rollouts(run)) @ np.array([r["completion/length_mean"] for r in rows]))


def warm_accuracy(run) -> float:
    steps, acc = run.series("eval/accuracy_greedy", "step")
    return float(acc[steps == 0][0]) if acc.size else float("nan")


def reward_per_token(run) -> float:
    """Training reward earned per thousand completion tokens generated: the sum over steps of the mean
    reward times the fresh samples, over the tokens."""
    rows = [r for r in run.rows if "groups/gen_rounds" in r]
    return float(np.diff(rollouts(run)) @ np.array([r["reward/mean"] for r in rows])) / tokens(run) * 1e3


def gain_per_token(run) -> float:
    """Held-out greedy accuracy gained (last 20% of the run less the warm start) per million tokens generated."""
    return (final_accuracy(run) - warm_accuracy(run)) / tokens(run) * 1e6


def rollouts_to_target(run) -> float:
    """Completions generated until held-out greedy accuracy first reaches the warm start's + TARGET_GAIN. A
    run that never does counts as one cap for every arm: a uniform run's completions over train.steps plus
    one evaluation interval, so two runs that both miss tie (a run's own total would let the arm that
    generates less per step win without reaching the target)."""
    steps, acc = run.series("eval/accuracy_greedy", "step")
    hit = np.flatnonzero((steps > 0) & (acc >= warm_accuracy(run) + TARGET_GAIN))
    if hit.size:
        return float(rollouts(run)[int(steps[hit[0]])])
    tr = run.config.train
    return float(tr.prompts_per_step * run.config.sampling.group_size * (tr.steps + tr.eval_every))


def zero_share(run) -> float:
    """The share of trained samples whose advantage is 0 (a degenerate group's, for GRPO), over the run."""
    return run.mean("advantage/zero_frac")


def tracker_error(run) -> float:
    """log10 of the value tracker's mean squared error against each prompt's true success rate (unbiased:
    the round's G samples estimate it) over the variance of a G-sample group mean (GRPO's baseline), the
    second half of the run: below 0, the tracker knows a prompt's success rate better than a fresh group."""
    mse, var = run.mean("sampler/baseline_sq_error", 0.5), run.mean("sampler/group_mean_var", 0.5)
    return float(np.log10(max(mse, 1e-12) / var)) if var > 0 else float("nan")


CLAIMS = (
    protocol.Claim(
        "SPO has no degenerate groups: fewer samples with zero advantage than GRPO at an equal sample budget",
        source="arXiv 2509.13232 (SPO), abstract",
        paper="frequent degenerate groups erase GRPO's learning signal; SPO's tracker baseline and batch-global "
              "normalization give every sample a signal, eliminating computation wasted on degenerate groups",
        halves=(protocol.Difference("share of trained samples with zero advantage", zero_share, "grpo", "spo"),)),
    protocol.Claim(
        "SPO's persistent value tracker estimates each prompt's success rate", source="arXiv 2509.13232 (SPO), abstract",
        paper="a persistent, KL-adaptive value tracker gives a stable, low-variance baseline",
        halves=(protocol.Level("log10 of the tracker's squared error against the true success rate over a G-sample "
                               "group mean's variance, second half of the run", tracker_error, "spo", 0.0, above=False),)),
    protocol.Claim(
        "SPO attains higher accuracy than GRPO", source="arXiv 2509.13232 (SPO), abstract",
        paper="+3.4 pp average maj@32 over GRPO on five hard math benchmarks (Qwen3-8B)",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "spo", "grpo"),)),
    *(protocol.Claim(
        f"{name} learns more per sampled token than the uniform shuffle", source=source, paper=paper,
        halves=(protocol.Difference("training reward per thousand tokens generated", reward_per_token, arm, "grpo"),
                protocol.Difference("held-out accuracy gain per million tokens generated", gain_per_token, arm, "grpo")))
      for arm, name, source, paper in (
          ("vade", "VADE", "arXiv 2511.18902 (VADE)",
           "Thompson sampling of a per-prompt Beta posterior toward prompts of high reward variance makes better "
           "use of rollouts than uniform sampling"),
          ("gdro", "GDRO", "arXiv 2601.19280 (GDRO)",
           "a bandit over difficulty bins and square-root rollout allocation improve accuracy over uniform sampling "
           "at the same rollout budget"),
          ("curriculum", "A difficulty-pool curriculum", "prime-rl difficulty pools (issue 41)",
           "easy / normal / hard pools by recent success rate spend rollouts where groups learn"))),
    *(protocol.Claim(
        f"{name} reaches a set accuracy with fewer rollouts than GRPO", source=source, paper=paper,
        halves=(protocol.Ratio(f"completions generated to reach the warm start's held-out accuracy + {TARGET_GAIN}, "
                               "GRPO's over the arm's", rollouts_to_target, "grpo", arm, at_least=1.0),
                protocol.Difference("held-out greedy accuracy, last 20%, no more than 0.02 below GRPO's",
                                    final_accuracy, arm, "grpo", at_least=-0.02)))
      for arm, name, source, paper in (
          ("ar3po", "AR3PO", "arXiv 2509.25808 (AR3PO)",
           "adaptive rollout and response reuse outperform GRPO and match or surpass DAPO, with rollout cost "
           "up to 4.2x lower (than DAPO's)"),
          ("repo", "RePO", "arXiv 2506.09340 (RePO)",
           "off-policy samples replayed beside on-policy ones: +4.1 points over GRPO (Qwen3-1.7B) at 15% more "
           "compute, 48% more effective optimization steps"))),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "training reward, mean over the run": lambda r: r.mean("reward/mean"),
    "held-out greedy accuracy, last 20% of the run": final_accuracy,
    "held-out accuracy gain per million tokens": gain_per_token,
    "training reward per thousand tokens": reward_per_token,
    "samples with zero advantage (share)": zero_share,
    "groups without variance (share)": lambda r: r.mean("groups/zero_variance_frac"),
    "log10 tracker MSE / group-mean variance (spo)": tracker_error,
    "completions to reach warm start + 0.1 (thousands)": lambda r: rollouts_to_target(r) / 1e3,
    "completions generated (thousands)": lambda r: rollouts(r)[-1] / 1e3,
    "completion tokens generated (thousands)": lambda r: tokens(r) / 1e3,
    "collapsed (fraction of seeds)": protocol.collapsed,
}


def get_study(quick: bool) -> study.Study:
    base = override(quickstart_config(), [
        "reward.num_workers=0", "optim.schedule=constant", f"optim.learning_rate={QUICK_RATE}", "optim.warmup_steps=10",
        f"train.steps={100 if quick else STEPS}", "train.prompts_per_step=32", "train.minibatches=1",
        "train.eval_prompts=256", "train.eval_every=20", "train.checkpoint_every=100",
    ])
    base = dataclasses.replace(base, task=PoolConfig(**dataclasses.asdict(TASK), pool=POOL))
    return study.Study(
        name="prompt_samplers",
        arms={name: override(base, changes) for name, changes in ARMS.items()},
        **study.sized(quick, RATES),
        rate_from={arm: ("grpo", 1.0) for arm in FOLLOW_GRPO},
        null_pair=NULL,
        warm_start=WARM_START,
        warm_start_seed=0,
        table=TABLE,
        plots=(
            study.Plot("curves", ("reward/mean", "eval/accuracy_greedy", "advantage/zero_frac")),
            study.Plot("tracker", ("sampler/baseline_sq_error", "sampler/group_mean_var"), arms=("spo",)),
        ),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
