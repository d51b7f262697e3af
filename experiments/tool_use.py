"""Tool use that a task needs: 4- to 6-digit multiplication with the calculator (grpo_jax/envs), under the
shared protocol (experiments/protocol.py).

    python experiments/tool_use.py [--quick] [--resume] [--rejudge]

A char-level model of the quickstart's size cannot multiply 6-digit numbers, but it can learn to ask:
"123456*654321=" -> "[123456*654321]" (a tool call, ended by "]"), the calculator answers
"80779853376", and the policy copies it and ends. Trajectories of at most 2 turns and 48 tokens;
reward "env" (1 for the right final answer). The warm start (experiments/warm_start.py) teaches the
call format: prompt, call, the answer the calculator gives and the answer again, until a fifth of
the held-out problems are solved with the tool (greedy trajectories), which leaves RL room.

Arms, on the same data, compute and seeds:
- gspo_token: trajectory-level credit (every token of a trajectory gets its advantage);
- gspo_token_turn: the same with turn-level credit (algorithm.turn_discount=0.9: GTPO, arXiv 2511.14846);
- gspo: the null partner of gspo_token (one objective at sequence-level advantages, its own rollouts);
- no_tool: gspo_token without the calculator (reward "exact" on a single turn), its own warm start
  on the answers alone (which it cannot learn): the no-tool ceiling;
- gspo_token_shaped, gspo_token_turn_shaped: the two credits again with a turn-level reward, a call that
  the calculator answers earns CALL_REWARD (`env.call_reward`; GTPO's turn-level reward assignment),
  each at its unshaped arm's rate (`rate_from`; gspo_token's is the null pair's, gspo's: the bonus is
  small beside the outcome's 1).
With rewards only at the end, turn-level credit differs from trajectory-level credit only where the
trajectories of a group differ in their number of turns (a turn's return is the final reward
discounted by the turns after it, standardized among the same turn of the group): the design lets the
GTPO claim fail. With the call reward, a call turn's return is its own reward plus the discounted
outcome, GTPO's setting; the shaped pair and its claim were added after the --quick run, before any
full run.

Measured per step: training reward, tool-call rate (env/tool_call_rate: trajectories with an observation)
and turns; held-out greedy accuracy (solved with or without the tool) every 10 steps.
"""

import dataclasses

import numpy as np
from configs.quickstart import get_config as quickstart  # experiments/configs/quickstart.py

from grpo_jax.config import ArithmeticConfig, override
from grpo_jax.envs.calculator import CalculatorConfig

import protocol
import study
from study import final_accuracy, held_out_gain
from warm_start import WarmStart, answer_only

GTPO = "arXiv 2511.14846 (GTPO)"
NULL = ("gspo", "gspo_token")
CALL_REWARD = 0.2  # a call the calculator answers, in the shaped arms
ARMS = {
    "gspo_token": ["algorithm.preset=gspo_token"],
    "gspo_token_turn": ["algorithm.preset=gspo_token", "algorithm.turn_discount=0.9"],
    "gspo": ["algorithm.preset=gspo"],
    "no_tool": ["algorithm.preset=gspo_token", "env=none", "reward.names=exact"],
    "gspo_token_shaped": ["algorithm.preset=gspo_token", f"env.call_reward={CALL_REWARD}"],
    "gspo_token_turn_shaped": ["algorithm.preset=gspo_token", "algorithm.turn_discount=0.9", f"env.call_reward={CALL_REWARD}"],
}


def tool_call(example: dict, rng: np.random.Generator) -> str:
    """The call, the calculator's answer and the answer again: what a solved trajectory writes."""
    return f"[{example['prompt'].removesuffix('=')}]{example['answer']}{example['answer']}"


WARM_START = WarmStart(accuracy=0.2, batch_size=32, eval_every=25, max_steps=400, target=tool_call)
NO_TOOL_WARM_START = WarmStart(accuracy=1.0, batch_size=32, eval_every=100, max_steps=100, target=answer_only)


CLAIMS = (
    protocol.Claim(
        "RL with the calculator raises held-out accuracy above the no-tool ceiling",
        source="issue 39; tool-integrated RL (e.g. ToRL, arXiv 2503.23383)",
        paper="a model that cannot compute the answer learns to call a tool for it, and RL raises the rate",
        halves=(protocol.Level("held-out greedy accuracy gain over the warm start, with the tool", held_out_gain, "gspo_token", 0.0),
                protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "gspo_token", "no_tool"))),
    protocol.Claim(
        "Turn-level credit (discounted turn returns) trains better than trajectory-level credit",
        source=f"{GTPO}, sec. 3 and Table 1",
        paper="GTPO above GRPO by 3.0% on average over math benchmarks",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%", final_accuracy, "gspo_token_turn",
                                    "gspo_token"),)),
    protocol.Claim(
        "With a turn-level reward (a call that the tool answers earns 0.2), turn-level credit trains better than "
        "trajectory-level credit",
        source=f"{GTPO}, sec. 3 (turn-level reward assignment and return-based advantages) and Table 1",
        paper="GTPO above GRPO by 3.0% on average over math benchmarks",
        halves=(protocol.Difference("held-out greedy accuracy, last 20%, with the call reward", final_accuracy,
                                    "gspo_token_turn_shaped", "gspo_token_shaped"),)),
)


claims = protocol.judging(CLAIMS, NULL)


TABLE = {
    "held-out greedy accuracy, last 20%": final_accuracy,
    "held-out accuracy gain over the warm start": held_out_gain,
    "training reward, mean over the run": lambda r: r.mean("reward/mean"),
    "tool-call rate, first 10% of steps": lambda r: r.mean("env/tool_call_rate", 0.0, 0.1),
    "tool-call rate, last 20%": lambda r: r.mean("env/tool_call_rate", 0.8),
    "held-out tool-call rate, last 20%": lambda r: r.mean("eval/tool_call_rate", 0.8),
    "turns per trajectory, last 20%": lambda r: r.mean("env/turns_mean", 0.8),
    "completion tokens sampled (thousands)": lambda r: r.last("tokens") / 1e3,
}


def get_study(quick: bool) -> study.Study:
    q = quickstart()
    base = dataclasses.replace(q, task=ArithmeticConfig(min_value=1000, max_value=999_999, operators="*"),
                               env=CalculatorConfig(max_turns=2), reward=dataclasses.replace(q.reward, names=("env",)))
    base = override(base, [
        "model.max_position_embeddings=64", "sampling.max_prompt_len=16", "sampling.max_new_tokens=48",
        "reward.num_workers=0", "optim.learning_rate=5e-4", "optim.schedule=constant",
        f"train.steps={20 if quick else 100}", f"train.prompts_per_step={8 if quick else 16}",
        f"train.eval_prompts={64 if quick else 256}", "train.eval_every=10", "train.checkpoint_every=20",
    ])
    return study.Study(
        name="tool_use",
        arms={name: override(base, changes) for name, changes in ARMS.items()},
        **study.sized(quick, (1.5e-4, 5e-4, 1.5e-3)),
        rate_from={"gspo_token_shaped": ("gspo", 1.0), "gspo_token_turn_shaped": ("gspo_token_turn", 1.0)},
        null_pair=NULL,
        warm_start={arm: NO_TOOL_WARM_START if arm == "no_tool" else WARM_START for arm in ARMS},
        warm_start_seed=0,
        table=TABLE,
        plots=(study.Plot("curves", ("reward/mean", "eval/accuracy_greedy", "env/tool_call_rate", "env/turns_mean"),
                          x="step"),),
    )


if __name__ == "__main__":
    study.main(get_study, claims)
