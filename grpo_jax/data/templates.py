"""Prompt templates: the text a policy sees for an example.

A plain template is a format string over the example's fields, with "{question}" standing for its
"prompt" (the question text). A chat template wraps that text as a user turn (after an optional
system turn and the example's earlier chat turns, its "messages", if it has any) and hands the
messages to `apply_chat_template`, the tokenizer's method (grpo_jax/tokenizer.py), passed in as a
callable so this module depends on no tokenizer.
"""

import dataclasses
from collections.abc import Callable

ChatTemplateFn = Callable[[list[dict[str, str]]], str]


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """`text` formats the example ("{question}", or any of its keys); `chat` routes it through the
    tokenizer's chat template with `system` as the system turn."""

    text: str = "{question}"
    chat: bool = False
    system: str = ""


# The R1-style instruction most math RL runs use, and the bare form for tiny char-level models.
MATH_COT = PromptTemplate(
    text="{question}\nThink step by step, then give the final answer as \\boxed{{answer}}.", chat=True
)
PLAIN = PromptTemplate()


def render(template: PromptTemplate, example: dict, apply_chat_template: ChatTemplateFn | None = None) -> str:
    """The prompt text for `example` (chat templates need `apply_chat_template`)."""
    try:
        user = template.text.format(**{**example, "question": example["prompt"]})
    except KeyError as e:
        raise ValueError(f"PromptTemplate.text refers to {e}, which the example lacks (keys: {sorted(example)})") from e
    history = example.get("messages", [])
    if not template.chat:
        if history:
            raise ValueError("the example has earlier chat turns ('messages'), which a plain template drops; set "
                             "PromptTemplate.chat=True")
        return user
    if apply_chat_template is None:
        raise ValueError("PromptTemplate.chat=True needs apply_chat_template (the tokenizer has no chat template?)")
    system = [{"role": "system", "content": template.system}] if template.system else []
    return apply_chat_template(system + history + [{"role": "user", "content": user}])
