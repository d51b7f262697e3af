"""Tasks, datasets, prompt templates and the char-level tokenizer of the tiny models."""

from grpo_jax.data.char_tokenizer import CharTokenizer  # noqa: F401
from grpo_jax.data.datasets import FORMATS, batches, load_examples, load_tfds  # noqa: F401
from grpo_jax.data.tasks import Arithmetic, ArithmeticConfig, Countdown, CountdownConfig  # noqa: F401
from grpo_jax.data.templates import MATH_COT, PLAIN, PromptTemplate, render  # noqa: F401
