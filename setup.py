"""grpo_jax: GRPO-family RL for language models in JAX, centred on GSPO."""

import pathlib

from setuptools import find_packages, setup

here = pathlib.Path(__file__).parent
requirements = [
    line.split("#")[0].strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]

setup(
    name="grpo_jax",
    version="0.1.0",
    description="GRPO-family reinforcement learning for language models in JAX, centred on GSPO",
    long_description=(here / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["grpo_jax", "grpo_jax.*", "kernels", "kernels.*"]),
    install_requires=requirements,
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.6",  # the suite in 2 processes (README: compiling is single-threaded)
            "hypothesis>=6",
            "torch==2.13.0",  # PyTorch `transformers` parity tests (CPU wheel)
            "gguf>=0.19",  # SmolLM2 GGUF -> safetensors conversion (slow test)
            "accelerate>=1.0",
            "wandb>=0.19",  # train.report_to=("wandb",), offline in tests
            "mlflow-skinny>=3.0",  # train.report_to=("mlflow",), a local file store in tests
        ],
    },
)
