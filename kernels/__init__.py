"""grpo_jax's fused kernels, each with a plain-jnp reference beside it.

This is the project's own top-level `kernels` package, not Hugging Face's PyPI package of the same
name; `GRPO_JAX_KERNELS` marks it so that a test (and a user) can tell which one was imported.
"""

from kernels.logprobs import IMPLS as LOGPROBS_IMPLS
from kernels.logprobs import fused_logprobs, logprobs_reference
from kernels.ratio_clip import IMPLS as RATIO_CLIP_IMPLS
from kernels.ratio_clip import ratio_clip
from kernels.slot_attention import slot_attention

GRPO_JAX_KERNELS = True

__all__ = ["GRPO_JAX_KERNELS", "LOGPROBS_IMPLS", "fused_logprobs", "logprobs_reference", "RATIO_CLIP_IMPLS", "ratio_clip",
           "slot_attention"]
