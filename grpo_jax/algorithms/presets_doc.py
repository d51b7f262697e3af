"""Renders the presets table of docs/presets.md from PRESETS, so the docs cannot drift.

Regenerate with `python -m grpo_jax.algorithms.presets_doc`; tests/test_algorithms_presets.py
asserts the committed file equals `presets_markdown()`.
"""

import dataclasses
import pathlib

from grpo_jax.algorithms.config import PRESETS, AlgorithmConfig, clip_fields
from grpo_jax.algorithms.losses import LOSSES

COLUMNS = ("advantage", "loss", "aggregation", "beta")
PATH = pathlib.Path(__file__).parents[2] / "docs" / "presets.md"


def presets_markdown() -> str:
    default = AlgorithmConfig()
    clip_all = set(clip_fields())
    rows = []
    for name in PRESETS:
        cfg = AlgorithmConfig.from_preset(name)
        others = [
            f"{f.name}={getattr(cfg, f.name)!r}"
            for f in dataclasses.fields(cfg)
            if f.name not in COLUMNS and f.name not in clip_all and getattr(cfg, f.name) != getattr(default, f.name)
        ]
        clip = ", ".join(f"{f}={getattr(cfg, f)}" for f in LOSSES[cfg.loss].clip_fields if getattr(cfg, f) is not None)
        cells = [f"`{name}`", *(str(getattr(cfg, c)) for c in COLUMNS), clip or "-", ", ".join(others)]
        rows.append("| " + " | ".join(cells) + " |")
    header = "| preset | " + " | ".join(COLUMNS) + " | clip | other fields (vs. defaults) |"
    return "\n".join([
        "# Algorithm presets",
        "",
        "Generated from `grpo_jax.algorithms.config.PRESETS` by `python -m grpo_jax.algorithms.presets_doc`;",
        "do not edit by hand. A preset is only a set of `AlgorithmConfig` fields; override any of them:",
        '`AlgorithmConfig.from_preset("gspo", beta=0.01)`. For gmpo, eps_low/eps_high are log-space clips.',
        "The clip column lists the fields the preset's loss reads (its registration's `clip_fields`).",
        "",
        "`bnpo` is TRL's `loss_type=\"bnpo\"`: token-mean aggregation of group_std advantages. The BNPO paper",
        "(arXiv 2506.02864) is a Beta-normalized advantage instead: `advantage=\"beta_norm\"` with any preset.",
        "Losses without an importance ratio (" + ", ".join(n for n, sp in LOSSES.items() if not sp.ratio)
        + ") run exactly one update per rollout batch: num_iterations=1 and train.minibatches=1.",
        "Formulas and sources: [algorithms.md](algorithms.md).",
        "",
        header,
        "|" + "---|" * (len(COLUMNS) + 3),
        *rows,
        "",
        "Defaults (the fields not listed in a row): "
        + ", ".join(f"{f.name}={getattr(default, f.name)!r}" for f in dataclasses.fields(default) if f.name not in COLUMNS and f.name not in clip_all)
        + ".",
        "",
    ])


if __name__ == "__main__":
    PATH.write_text(presets_markdown())
    print(f"wrote {PATH}")
