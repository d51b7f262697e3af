"""Renders the presets table of docs/presets.md from PRESETS, so the docs cannot drift.

Regenerate with `python -m grpo_jax.algorithms.presets_doc`; tests/test_algorithms_presets.py
asserts the committed file equals `presets_markdown()` and that every preset has its source here.
The measured table of every preset (experiments/preset_table.py) sits between STUDY_BEGIN and
STUDY_END, in docs/presets.md and in the README: that script rewrites it (`with_study_table`), and
regenerating this file keeps it.
"""

import dataclasses
import pathlib

from grpo_jax.algorithms.config import PRESETS, AlgorithmConfig, variant_fields
from grpo_jax.algorithms.advantages import ADVANTAGES
from grpo_jax.algorithms.losses import LOSSES

COLUMNS = ("advantage", "loss", "aggregation", "beta")
PATH = pathlib.Path(__file__).parents[2] / "docs" / "presets.md"
STUDY_BEGIN = "<!-- preset_table: begin (written by experiments/preset_table.py; do not edit by hand) -->"
STUDY_END = "<!-- preset_table: end -->"
SOURCES = {  # the paper each preset is named after (arXiv id), or the trainer whose convention it follows
    "grpo": "DeepSeekMath 2402.03300", "dr_grpo": "Dr. GRPO 2503.20783", "dapo": "DAPO 2503.14476",
    "bnpo": "TRL loss_type=bnpo", "gspo": "GSPO 2507.18071", "gspo_token": "GSPO 2507.18071",
    "gmpo": "GMPO 2507.20673", "sapo": "SAPO 2511.20347", "cispo": "MiniMax-M1 2506.13585",
    "gpg": "GPG 2504.02546", "opo": "OPO 2505.23585", "rloo": "RLOO 2402.14740",
    "ngrpo": "NGRPO 2509.18851", "gapo": "GAPO 2510.21830", "s_grpo": "S-GRPO 2508.05928",
    "reinforce_pp": "REINFORCE++ 2501.03262", "pass_at_k": "Pass@k Training 2508.10751",
    "mo_grpo": "MO-GRPO 2509.22047", "abc_grpo": "ABC-GRPO 2601.03895", "dhpo": "DHPO 2601.05607",
    "holder_po": "HolderPO 2605.12058", "sspo": "SSPO 2602.19327", "llds": "LLDS 2512.04220",
    "egsw": "EGSW 2503.22456", "gvpo": "GVPO 2504.19599", "disco": "DisCO 2505.12366", "gtpo": "GTPO 2508.03772",
}


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


def presets_markdown() -> str:
    default = AlgorithmConfig()
    read_somewhere = set(variant_fields())
    rows = []
    for name in PRESETS:
        cfg = AlgorithmConfig.from_preset(name)
        others = [
            f"{f.name}={getattr(cfg, f.name)!r}"
            for f in dataclasses.fields(cfg)
            if f.name not in COLUMNS and f.name not in read_somewhere and getattr(cfg, f.name) != getattr(default, f.name)
        ]
        reads = (*LOSSES[cfg.loss].fields, *ADVANTAGES[cfg.advantage].fields)
        fields = ", ".join(f"{f}={getattr(cfg, f)}" for f in reads if getattr(cfg, f) is not None)
        cells = [f"`{name}`", *(str(getattr(cfg, c)) for c in COLUMNS), fields or "-", ", ".join(others), SOURCES[name]]
        rows.append("| " + " | ".join(cells) + " |")
    header = "| preset | " + " | ".join(COLUMNS) + " | variant fields | other fields (vs. defaults) | source |"
    return "\n".join([
        "# Algorithm presets",
        "",
        "Generated from `grpo_jax.algorithms.config.PRESETS` by `python -m grpo_jax.algorithms.presets_doc`;",
        "do not edit by hand. A preset is only a set of `AlgorithmConfig` fields; override any of them:",
        '`AlgorithmConfig.from_preset("gspo", beta=0.01)`. For gmpo, eps_low/eps_high are log-space clips.',
        "The variant-fields column lists the fields the preset's loss and advantage read (their",
        "registrations' `fields`); the source column names the paper (arXiv id) of each.",
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
        "|" + "---|" * (len(COLUMNS) + 4),
        *rows,
        "",
        "Defaults (the fields not listed in a row): "
        + ", ".join(f"{f.name}={getattr(default, f.name)!r}" for f in dataclasses.fields(default)
                    if f.name not in COLUMNS and f.name not in read_somewhere)
        + ".",
        "",
        "## Every preset on one task",
        "",
        "`python experiments/preset_table.py` runs every preset on the quickstart's task and budget "
        "(60 steps, 3 seeds, one warm start per seed) and writes the table below.",
        "",
        STUDY_BEGIN,
        *([study_table(PATH.read_text())] if PATH.exists() and study_table(PATH.read_text()) else []),
        STUDY_END,
        "",
    ])


if __name__ == "__main__":
    PATH.write_text(presets_markdown())
    print(f"wrote {PATH}")
