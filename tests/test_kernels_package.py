"""`import kernels` must be this repository's package, not Hugging Face's PyPI `kernels`."""

import pathlib

import kernels


def test_project_kernels_is_imported():
    repo = pathlib.Path(__file__).resolve().parents[1]
    assert pathlib.Path(kernels.__file__).resolve() == repo / "kernels" / "__init__.py"
    assert kernels.GRPO_JAX_KERNELS is True
    assert callable(kernels.fused_logprobs)
