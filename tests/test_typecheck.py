"""Runtime checking of the jaxtyping annotations: the tests' import hook, and the library's own entry points."""

import subprocess
import sys

import numpy as np
import pytest
from jaxtyping import TypeCheckError

from grpo_jax import algorithms


def test_the_import_hook_checks_every_annotated_function():
    """compute_advantages checks nothing itself: under the hook (tests/conftest.py) a [n, k, 2] reward
    array is refused, naming the argument."""
    cfg = algorithms.AlgorithmConfig()
    with pytest.raises(TypeCheckError, match="parameter 'rewards'"):
        algorithms.compute_advantages(cfg, np.zeros((4, 2, 2), np.float32), group_size=2)
    assert algorithms.compute_advantages(cfg, np.arange(4, dtype=np.float32), group_size=2).shape == (4,)


def test_shape_errors_at_the_entry_points_name_the_argument_and_its_axes():
    """The library checks its public entry points itself (models.forward / logits / prefill / decode, sampling's
    sequences): run in a fresh interpreter, without the tests' import hook."""
    script = r"""
import jax, numpy as np
from jaxtyping import TypeCheckError
from grpo_jax import models, train_step
cfg = models.ModelConfig(model_type="qwen3", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8)
params = models.init(cfg, jax.random.key(0))
tokens = np.zeros((2, 5), np.int32)
cases = [
    (lambda: models.forward(cfg, params, tokens[0]), "parameter 'tokens'", "batch seq"),
    (lambda: models.logits(cfg, params, tokens, segment_ids=np.ones((2, 6), np.int32)), "parameter 'segment_ids'", "seq=5"),
    (lambda: train_step.sequences(tokens, np.ones(3, np.int32), tokens), "parameter 'prompt_lengths'", "batch=2"),
]
for call, argument, axes in cases:
    try:
        call()
    except TypeCheckError as e:
        assert argument in str(e) and axes in str(e), str(e)
    else:
        raise AssertionError(f"no error naming {argument}")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]
