"""Renders the presets table of docs/presets.md from PRESETS, so the docs cannot drift.

Regenerate with `python -m grpo_jax.algorithms.presets_doc`; tests/test_algorithms_presets.py
asserts the committed file equals `presets_markdown()` and that every preset names its source.
The measured table of every preset (experiments/preset_table.py) sits between STUDY_BEGIN and
STUDY_END of docs/presets.md: that script rewrites it (`with_study_table`), and
regenerating this file keeps it.
"""

import dataclasses
import pathlib

from grpo_jax.algorithms.config import PARTS, PRESETS, AlgorithmConfig
from grpo_jax.algorithms.losses import LOSSES

COLUMNS = ("advantage", "loss", "aggregation", "beta")  # a sampler other than uniform shows among the other fields
PATH = pathlib.Path(__file__).parents[2] / "docs" / "presets.md"
STUDY_BEGIN = "<!-- preset_table: begin (written by experiments/preset_table.py; do not edit by hand) -->"
STUDY_END = "<!-- preset_table: end -->"


def study_table(text: str) -> str:
    """The measured table between STUDY_BEGIN and STUDY_END in `text` (empty if it has none)."""
    if STUDY_BEGIN not in text:
        return ""
    return text.split(STUDY_BEGIN, 1)[1].split(STUDY_END, 1)[0].strip("\n")


def with_study_table(text: str, table: str) -> str:
    """`text` with `table` between its STUDY_BEGIN and STUDY_END lines (which it must have)."""
    if text.count(STUDY_BEGIN) != 1 or text.count(STUDY_END) != 1:
        raise ValueError(f"the file needs one {STUDY_BEGIN} line and one {STUDY_END} line where the table goes")
    head, rest = text.split(STUDY_BEGIN)
    return head + STUDY_BEGIN + "\n" + table.strip("\n") + "\n" + STUDY_END + rest.split(STUDY_END)[1]


def _part(params) -> str:
    """A part as its name, with the parameters that differ from its class's defaults."""
    changed = [f"{f.name}={getattr(params, f.name)!r}" for f in dataclasses.fields(params)
               if getattr(params, f.name) != f.default]
    return params.name + (f"({', '.join(changed)})" if changed else "")


def _defaults(params: type) -> str:
    return ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(params)) or "-"


def parts_markdown() -> list[str]:
    """Every registered part (advantage, loss, aggregation, sampler) with its parameters and their defaults."""
    lines = ["## Every part and its parameters", "",
             "Every registered estimator, loss, aggregation and prompt sampler, with its parameters (`--set algorithm.<part>.<field>=`)",
             "and their defaults; a variant registered by a fork's file appears here too.", ""]
    for part, base in PARTS.items():
        lines += [f"| {part} | parameters (defaults) | what they are |", "|---|---|---|"]
        for name, spec in base.registry.items():
            doc = spec.params.__doc__ if dataclasses.fields(spec.params) or not hasattr(spec, "fn") else spec.fn.__doc__
            doc = " ".join((doc or "").split()).split(". ")[0].rstrip(".").replace("|", "\\|")
            lines.append(f"| `{name}` | {_defaults(spec.params)} | {doc} |")
        lines.append("")
    return lines


def presets_markdown() -> str:
    default = AlgorithmConfig()
    rows = []
    for name, preset in PRESETS.items():
        cfg = AlgorithmConfig.from_preset(name)
        others = [f"{f.name}={_part(getattr(cfg, f.name)) if f.name in PARTS else repr(getattr(cfg, f.name))}"
                  for f in dataclasses.fields(cfg) if f.name not in COLUMNS and getattr(cfg, f.name) != getattr(default, f.name)]
        cells = [f"`{name}`", *(_part(getattr(cfg, c)) if c in PARTS else str(getattr(cfg, c)) for c in COLUMNS),
                 ", ".join(others), preset.source]
        rows.append("| " + " | ".join(cells) + " |")
    header = "| preset | " + " | ".join(COLUMNS) + " | other fields (vs. defaults) | source |"
    return "\n".join([
        "# Algorithm presets",
        "",
        "Generated from `grpo_jax.algorithms.config.PRESETS` by `python -m grpo_jax.algorithms.presets_doc`;",
        "do not edit by hand. A preset is only a set of `AlgorithmConfig` fields; override any of them:",
        '`AlgorithmConfig.from_preset("gspo", beta=0.01)`, `--set algorithm.loss.eps_high=4e-4`. The advantage,',
        "loss and aggregation columns name each part with the parameters the preset sets beyond the part's",
        "own defaults (`grpo_jax.algorithms.losses.Gspo()` holds GSPO's clip range, for example; for gmpo,",
        "eps_low/eps_high are log-space clips); the source column names the paper (arXiv id) of each.",
        "",
        "`bnpo` is TRL's `loss_type=\"bnpo\"`: token-mean aggregation of group_std advantages. The BNPO paper",
        "(arXiv 2506.02864) is a Beta-normalized advantage instead: `advantage=\"beta_norm\"` with any preset.",
        "Losses without an importance ratio (" + ", ".join(n for n, sp in LOSSES.items() if not sp.ratio)
        + ") run exactly one update per rollout batch: num_iterations=1 and train.minibatches=1.",
        "Losses over whole groups (" + ", ".join(n for n, sp in LOSSES.items() if sp.needs_groups)
        + ") need every minibatch to hold whole groups: train.prompts_per_step divisible by train.minibatches.",
        "Formulas, sources and what each implementation follows: [algorithms.md](algorithms.md).",
        "",
        header,
        "|" + "---|" * (len(COLUMNS) + 3),
        *rows,
        "",
        "Defaults (the fields not listed in a row): "
        + ", ".join(f"{f.name}={_part(getattr(default, f.name)) if f.name in PARTS else repr(getattr(default, f.name))}"
                    for f in dataclasses.fields(default) if f.name not in COLUMNS)
        + ".",
        "",
        *parts_markdown(),
        "## Presets compared on one task",
        "",
        "`python experiments/preset_table.py` runs the presets that the seed papers' accuracy claims compare, "
        "with the null pair, under the shared protocol (experiments/protocol.py), and writes the table below; "
        "its first line gives the setting.",
        "",
        STUDY_BEGIN,
        *([study_table(PATH.read_text())] if PATH.exists() and study_table(PATH.read_text()) else []),
        STUDY_END,
        "",
    ])


if __name__ == "__main__":
    PATH.write_text(presets_markdown())
    print(f"wrote {PATH}")
