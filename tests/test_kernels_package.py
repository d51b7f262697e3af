"""`import kernels` must be this repository's package, not Hugging Face's PyPI `kernels`."""

import pathlib
import subprocess
import sys

import pytest

import kernels

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_project_kernels_is_imported():
    assert pathlib.Path(kernels.__file__).resolve() == REPO / "kernels" / "__init__.py"
    assert kernels.GRPO_JAX_KERNELS is True
    assert callable(kernels.fused_logprobs) and callable(kernels.ratio_clip)


def test_installed_kernels_resolves_to_this_repo(tmp_path):
    """Outside the repo root, as an installed user sees it (the editable finder comes after
    site-packages, so an installed HF `kernels` would win there and this test would fail)."""
    code = "import grpo_jax, kernels; print(kernels.__file__, getattr(kernels, 'GRPO_JAX_KERNELS', None))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    if "No module named 'grpo_jax'" in out.stderr:
        pytest.skip("grpo_jax is not installed (pip install -e .)")
    path, marker = out.stdout.split()
    assert pathlib.Path(path).resolve() == REPO / "kernels" / "__init__.py" and marker == "True"
