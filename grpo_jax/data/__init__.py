"""Tasks (registered by name), datasets, prompt samplers, prompt templates and the char-level tokenizer of the tiny
models."""

from grpo_jax.data import curricula  # noqa: F401  (registers its samplers)
from grpo_jax.data.char_tokenizer import CharTokenizer  # noqa: F401
from grpo_jax.data.datasets import FORMATS, FileTaskConfig, TfdsTaskConfig, batches, load_examples, load_tfds  # noqa: F401
from grpo_jax.data.hf import ANSWER_FORMATS, HFTaskConfig, MixtureTaskConfig, Part, source_names  # noqa: F401
from grpo_jax.data.reasoning import ColumnAddition, ColumnAdditionConfig  # noqa: F401
from grpo_jax.data.tasks import (  # noqa: F401
    TASKS, Arithmetic, ArithmeticConfig, Countdown, CountdownConfig, Examples, Source, TaskConfig, register, task_name,
)
from grpo_jax.data.templates import MATH_COT, PLAIN, PromptTemplate, render  # noqa: F401
