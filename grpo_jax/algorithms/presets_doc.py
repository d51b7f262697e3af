"""Renders the presets table of docs/presets.md from PRESETS, so the docs cannot drift.

Regenerate with `python -m grpo_jax.algorithms.presets_doc`; tests/test_algorithms_presets.py
asserts the committed file equals `presets_markdown()`.
"""

import dataclasses
import pathlib

from grpo_jax.algorithms.config import PRESETS, AlgorithmConfig

COLUMNS = ("advantage", "loss", "aggregation", "beta")
CLIP_FIELDS = {  # the clip fields each loss reads (the others do not affect it)
    "ppo_clip": ("eps_low", "eps_high", "delta", "clip_c"),
    "gspo": ("eps_low", "eps_high", "delta", "clip_c"),
    "gspo_token": ("eps_low", "eps_high", "delta", "clip_c"),
    "gmpo": ("eps_low", "eps_high"),
    "sapo": ("tau_pos", "tau_neg"),
    "cispo": ("eps_max",),
    "reinforce": (),
}
CLIP_ALL = {f for fields in CLIP_FIELDS.values() for f in fields}
PATH = pathlib.Path(__file__).parents[2] / "docs" / "presets.md"


def presets_markdown() -> str:
    default = AlgorithmConfig()
    rows = []
    for name in PRESETS:
        cfg = AlgorithmConfig.from_preset(name)
        others = [
            f"{f.name}={getattr(cfg, f.name)!r}"
            for f in dataclasses.fields(cfg)
            if f.name not in COLUMNS and f.name not in CLIP_ALL and getattr(cfg, f.name) != getattr(default, f.name)
        ]
        clip = ", ".join(f"{f}={getattr(cfg, f)}" for f in CLIP_FIELDS[cfg.loss] if getattr(cfg, f) is not None)
        cells = [f"`{name}`", *(str(getattr(cfg, c)) for c in COLUMNS), clip or "-", ", ".join(others)]
        rows.append("| " + " | ".join(cells) + " |")
    header = "| preset | " + " | ".join(COLUMNS) + " | clip | other fields (vs. defaults) |"
    return "\n".join([
        "# Algorithm presets",
        "",
        "Generated from `grpo_jax.algorithms.config.PRESETS` by `python -m grpo_jax.algorithms.presets_doc`;",
        "do not edit by hand. A preset is only a set of `AlgorithmConfig` fields; override any of them:",
        '`AlgorithmConfig.from_preset("gspo", beta=0.01)`. For gmpo, eps_low/eps_high are log-space clips.',
        "",
        header,
        "|" + "---|" * (len(COLUMNS) + 3),
        *rows,
        "",
        "Defaults (the fields not listed in a row): "
        + ", ".join(f"{f.name}={getattr(default, f.name)!r}" for f in dataclasses.fields(default) if f.name not in COLUMNS and f.name not in CLIP_ALL)
        + ".",
        "",
    ])


if __name__ == "__main__":
    PATH.write_text(presets_markdown())
    print(f"wrote {PATH}")
