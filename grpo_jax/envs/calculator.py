"""The calculator tool: "[12*34]" -> "408". Exact arithmetic (+ - * /, parentheses) by walking the
parsed expression (`rewards.answers.evaluate`): nothing is evaluated as code."""

import dataclasses

from grpo_jax.envs import ToolEnv, register
from grpo_jax.rewards.answers import evaluate


@register("calculator")
@dataclasses.dataclass(frozen=True)
class CalculatorConfig(ToolEnv):
    def call(self, query: str) -> str:
        return str(evaluate(query)[0])
