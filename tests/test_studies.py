"""Smoke tests of the reproductions (experiments/*.py): each study through its own code path at a tiny
size (its quick arms, one seed, 2 steps of 8 prompts x 4 samples), checking what it writes and that the
numbers are sane. Compilation dominates: about a dozen programs per study (warm start, samplers, one
train step per arm)."""

import dataclasses
import json
import pathlib
import shutil
import sys

import jax
import numpy as np
import pytest

from grpo_jax.config import AlgorithmConfig, override
from grpo_jax.rewards import functions

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "experiments"))

import gspo_vs_grpo  # noqa: E402
import length_bias  # noqa: E402
import moe_routing  # noqa: E402
import preset_table  # noqa: E402
import study  # noqa: E402

STEPS, SEEDS = 2, (0,)


def tiny(s: study.Study) -> study.Study:
    """`s` at a few seconds' size; every other field (model, task, algorithm, minibatches) as the study has it."""
    shrink = [f"train.steps={STEPS}", "train.prompts_per_step=8", "sampling.group_size=4", "train.eval_prompts=8",
              "train.eval_every=1", "train.checkpoint_every=1000", "optim.warmup_steps=0"]
    ws = {a: dataclasses.replace(s.warm_start_of(a), max_steps=2, eval_every=1, batch_size=8) for a in s.arms}
    return dataclasses.replace(s, arms={a: override(c, shrink) for a, c in s.arms.items()}, seeds=SEEDS, warm_start=ws)


def run_tiny(module, tmp_path, arms=None) -> tuple[study.Study, dict]:
    """The --quick study (only `arms`, when given) at `tiny` size, through the harness."""
    s = module.get_study(quick=True)
    s = tiny(s.only(arms) if arms else s)
    summary = study.run(s, module.claims, tmp_path / "results", tmp_path / "runs")
    assert summary == json.loads((tmp_path / "results" / "summary.json").read_text())
    return s, summary


def check_outputs(s: study.Study, summary: dict, tmp_path: pathlib.Path) -> None:
    """The output contract (issue 14 item 6) and what every study shares."""
    assert summary["claims"], "a study states at least one claim"
    for c in summary["claims"]:
        assert {"claim", "source", "paper", "measured", "verdict"} <= c.keys()
        assert c["verdict"] in study.VERDICTS and all(isinstance(c[k], str) and c[k] for k in ("claim", "measured"))
    table = (tmp_path / "results" / "table.md").read_text()
    assert all(c["claim"] in table and c["verdict"] in table for c in summary["claims"])
    assert all(f"| {arm} " in table or f" {arm} |" in table for arm in s.arms)
    for p in s.plots:
        png = (tmp_path / "results" / f"{p.file}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert summary["seeds"] == list(SEEDS) and len(summary["git"]["commit"]) == 40
    assert summary["wall_seconds"] > 0 and len(summary["load_average_1_5_15min"]["start"]) == 3
    for arm, cfg in s.arms.items():
        assert sorted(summary["runs"][arm]) == [str(x) for x in SEEDS]
        for seed, r in summary["runs"][arm].items():
            curves = r["curves"]
            assert [x for x, _ in curves["reward/mean"]] == list(range(1, STEPS + 1))
            assert [x for x, _ in curves["eval/accuracy_greedy"]] == list(range(STEPS + 1))
            per_step = cfg.algorithm.num_iterations * cfg.train.minibatches
            assert [u for _, u in curves["updates"]] == [per_step * k for k in range(STEPS + 1)]
            tokens = [t for _, t in curves["tokens"]]
            rows = cfg.train.prompts_per_step * cfg.sampling.group_size
            assert tokens[0] == 0
            assert all(0 < b - a <= rows * cfg.sampling.max_new_tokens for a, b in zip(tokens, tokens[1:]))
            for key in ("reward/mean", "accuracy", "eval/accuracy_greedy", "clip_frac_high_tokens",
                        "clip_frac_low_tokens"):
                assert all(0 <= v <= 1 for _, v in curves[key]), (arm, key)
    # Arms of a seed with the same warm start start from the same params: identical step-0 evaluations.
    for seed in map(str, SEEDS):
        warm = summary["warm_starts"][seed]
        assert sorted(a for w in warm for a in w["arms"]) == sorted(s.arms) and all(w["steps"] == 2 for w in warm)
        assert len(warm) == len({s.warm_start_of(a) for a in s.arms})
        for w in warm:
            first = {arm: step0(tmp_path, arm, seed) for arm in w["arms"]}
            assert len({json.dumps(v) for v in first.values()}) == 1, first


def step0(tmp_path, arm, seed) -> dict:
    """The evaluations before the first RL step (without the run's clock)."""
    with (tmp_path / "runs" / arm / f"seed{seed}" / "metrics.jsonl").open() as f:
        return {k: v for k, v in json.loads(f.readline()).items() if k != "time/run_s"}


def test_only_keeps_the_named_arms_and_their_plots():
    full = gspo_vs_grpo.get_study(quick=False)
    pair = full.only(["grpo_lr0.002", "gspo_lr0.002"])
    assert list(pair.arms) == ["grpo_lr0.002", "gspo_lr0.002"] and len(full.arms) == 6
    assert pair.arms["gspo_lr0.002"] is full.arms["gspo_lr0.002"]
    names = [p.file for p in pair.plots]
    assert "curves_lr0.002" in names and "curves_lr0.0003" not in names and "clipped_tokens" in names
    with pytest.raises(SystemExit):  # an arm the study does not have is a usage error, before any run
        study.main(gspo_vs_grpo.get_study, gspo_vs_grpo.claims, ["--arms", "grpo_lr9"])


def test_studies_take_the_launch_flags_of_several_processes(capsys):
    with pytest.raises(SystemExit):  # grpo_jax/distributed.py's flags, checked before any run
        study.main(gspo_vs_grpo.get_study, gspo_vs_grpo.claims, ["--num-processes", "2"])
    assert "a cluster named by hand needs all three" in capsys.readouterr().err


def test_spread_and_claim():
    assert study.spread([0.1, 0.2, 0.3]) == "0.2 ± 0.1 (3 seeds: 0.1 to 0.3)"  # sample std (ddof=1)
    with pytest.raises(ValueError, match="verdict"):
        study.claim("c", source="s", paper="p", measured="m", verdict="yes")


def test_compiled_programs_are_kept_until_half_the_map_limit(tmp_path, monkeypatch):
    double = jax.jit(lambda x: 2 * x)
    double(1.0)
    study.drop_compiled_programs_near_the_map_limit()  # this process is far below the kernel's limit
    assert double._cache_size() == 1
    (tmp_path / "max_map_count").write_text("2\n")
    monkeypatch.setattr(study, "MAP_LIMIT", tmp_path / "max_map_count")
    study.drop_compiled_programs_near_the_map_limit()
    assert double._cache_size() == 0


def test_gspo_vs_grpo(tmp_path):
    s, summary = run_tiny(gspo_vs_grpo, tmp_path)
    check_outputs(s, summary, tmp_path)
    # The paper's baseline: GRPO clips at 0.2 / 0.27 without KL; GSPO at 3e-4 / 4e-4; 4 minibatches each.
    (grpo,), (gspo,) = ([{**summary["config"], **summary["arms"][a]} for a in s.arms if a.startswith(n)]
                        for n in ("grpo", "gspo"))
    for arm, want in ((grpo, ("ppo_clip", 0.2, 0.27, 0.0)), (gspo, ("gspo", 3e-4, 4e-4, 0.0))):
        assert tuple(arm[f"algorithm.{k}"] for k in ("loss", "loss.eps_low", "loss.eps_high", "beta")) == want
    assert grpo["train.minibatches"] == gspo["train.minibatches"] == 4
    assert grpo["optim.learning_rate"] == gspo["optim.learning_rate"]
    assert [c["source"] for c in summary["claims"]] == ["arXiv 2507.18071 (GSPO), Figure 1",
                                                        "arXiv 2507.18071 (GSPO), Figure 2"]

    # --resume: a complete run is read back untouched; a run that is missing runs afresh, to the same numbers.
    grpo, gspo = (tmp_path / "runs" / arm / "seed0" for arm in s.arms)
    kept = (grpo / "metrics.jsonl").read_bytes()
    shutil.rmtree(gspo)
    again = study.run(s, gspo_vs_grpo.claims, tmp_path / "again", tmp_path / "runs", resume=True)
    assert (grpo / "metrics.jsonl").read_bytes() == kept
    (first_grpo, first_gspo), (read_grpo, rerun_gspo) = ([x["runs"][a]["0"] for a in s.arms] for x in (summary, again))
    assert read_grpo == {**first_grpo, "resumed": True} and not first_grpo["resumed"]
    assert rerun_gspo["curves"] == first_gspo["curves"] and not rerun_gspo["resumed"]
    assert "1 run(s) were continued or read back" in (tmp_path / "again" / "table.md").read_text()


def test_length_bias(tmp_path):
    s, summary = run_tiny(length_bias, tmp_path)
    check_outputs(s, summary, tmp_path)
    # Length is free: the exact reward reads the last number, wherever the filler puts it.
    rng = np.random.default_rng(0)
    targets = [length_bias.answer_in_filler({"answer": "-13"}, rng) for _ in range(200)]
    assert all(t.strip() == "-13" and functions.exact_match("7-20=", t, {"answer": "-13"}) == 1.0 for t in targets)
    filler = np.array([len(t) - 3 for t in targets])  # the warm start teaches many lengths, mostly short
    assert filler.max() >= 6 and 1.2 < filler.mean() < 2.2  # two geometric runs: 2 q / (1 - q) = 1.64 on average
    assert 0.45 < np.mean([t.startswith("-") for t in targets]) < 0.65  # no space first: 1 - q = 0.55 (greedy's pick)
    # The per-correctness lengths the trainer logs split the mean length: acc * L_c + (1 - acc) * L_i = L.
    for arm in s.arms:
        for seed in map(str, SEEDS):
            rows = [json.loads(line) for line in (tmp_path / "runs" / arm / f"seed{seed}" / "metrics.jsonl").open()]
            for r in rows[1:]:
                acc = r["accuracy"]
                correct, incorrect = (r.get(f"completion/length_{k}", 0) for k in ("correct", "incorrect"))
                parts = acc * correct + (1 - acc) * incorrect
                assert parts == pytest.approx(r["completion/length_mean"], rel=1e-5)
                assert 1 <= r["completion/length_mean"] <= s.arms[arm].sampling.max_new_tokens


def test_preset_table(tmp_path, monkeypatch):
    from grpo_jax.algorithms import PRESETS
    from grpo_jax.algorithms.presets_doc import study_table

    # The full study: every preset, each as registered plus only what `special` adds, and said.
    arms, notes, not_run = preset_table.arms_and_notes(quick=False)
    assert list(arms) == list(PRESETS) and not not_run
    assert all(cfg.algorithm == AlgorithmConfig.from_preset(name) for name, cfg in arms.items())
    assert {a for a, c in arms.items() if c.train.minibatches == 1} == {"gpg", "opo", "rloo", "gtpo"} == {
        a for a in notes if "minibatches=1" in notes[a]}  # the ratio-free losses: one update per rollout batch
    assert arms["mo_grpo"].reward.names == ("exact", "length") and arms["grpo"].reward.names == ("exact",)
    assert arms["grpo"].sampling.max_new_tokens == 5  # room past "-19" + eos: DAPO shapes only truncation
    # An arm the trainer's checks refuse is not run, with the reason.
    special = preset_table.special
    monkeypatch.setattr(preset_table, "special", lambda p: (["train.minibatches=3"], "") if p == "gspo" else special(p))
    _, _, refused = preset_table.arms_and_notes(quick=False)
    assert list(refused) == ["gspo"] and "does not split into train.minibatches=3" in refused["gspo"]
    monkeypatch.undo()

    # Two arms through the study, as the committed one (whose report rewrites docs/presets.md).
    for name in ("PRESETS_DOC",):
        copy = tmp_path / f"{name}.md"
        copy.write_text(getattr(preset_table, name).read_text())
        monkeypatch.setattr(preset_table, name, copy)
    monkeypatch.setattr(preset_table, "RESULTS", tmp_path / "results")
    s = tiny(preset_table.get_study(quick=True).only(["grpo", "gmpo"]))
    summary = study.run(s, preset_table.claims, tmp_path / "results", tmp_path / "runs")
    check_outputs(s, summary, tmp_path)
    # The area under held-out accuracy is the trapezoid over the evaluations, over the steps.
    curve = np.array(summary["runs"]["grpo"]["0"]["curves"]["eval/accuracy_greedy"])
    area = np.trapezoid(curve[:, 1], curve[:, 0]) / STEPS
    assert summary["table"]["grpo"]["held-out accuracy area"]["mean"] == pytest.approx(area, abs=1e-4)
    verdicts = {c["claim"].split()[0]: c["verdict"] for c in summary["claims"]}
    assert verdicts["s_grpo"] == "not_run" and verdicts["gmpo"] in ("reproduced", "partial", "not_reproduced")
    assert (tmp_path / "results" / "final_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("PRESETS_DOC",):
        block = study_table(getattr(preset_table, name).read_text())
        assert all(f" {arm} |" in block for arm in s.arms) and "By final held-out accuracy: " in block


def test_preset_table_tables_in_the_docs():
    """The measured table sits between the markers of docs/presets.md; rewriting it keeps the rest of
    the file, and regenerating docs/presets.md keeps the table."""
    from grpo_jax.algorithms import presets_doc

    text = f"intro\n{presets_doc.STUDY_BEGIN}\nold\n{presets_doc.STUDY_END}\nrest\n"
    new = presets_doc.with_study_table(text, "| a | b |")
    assert new == f"intro\n{presets_doc.STUDY_BEGIN}\n| a | b |\n{presets_doc.STUDY_END}\nrest\n"
    assert presets_doc.study_table(new) == "| a | b |"
    with pytest.raises(ValueError, match="needs one"):
        presets_doc.with_study_table("no markers", "| a |")
    assert presets_doc.PATH.read_text().count(presets_doc.STUDY_BEGIN) == 1
    assert presets_doc.study_table(presets_doc.presets_markdown()) == presets_doc.study_table(presets_doc.PATH.read_text())

def test_moe_routing(tmp_path):
    # A tiny Qwen3-MoE; GRPO (the paper's clip range, no KL) without replay, with R2 and R3; GSPO without.
    arms = moe_routing.get_study(quick=True).arms
    assert list(arms) == ["grpo", "grpo_r2", "grpo_r3", "gspo"]
    assert [c.algorithm.routing_replay for c in arms.values()] == ["none", "old", "sampler", "none"]
    assert {(c.algorithm.loss.name, c.algorithm.loss.eps_low, c.algorithm.loss.eps_high, c.algorithm.beta)
            for a, c in arms.items() if a.startswith("grpo")} == {("ppo_clip", 0.2, 0.27, 0.0)}
    for c in arms.values():
        m = c.model
        assert (m.model_type, m.num_experts, m.num_experts_per_tok, m.num_layers) == ("qwen3_moe", 8, 2, 4)
        assert c.train.minibatches == 4
    # The arms every claim needs run (R3's sampler routes train in test_routing).
    s, summary = run_tiny(moe_routing, tmp_path, arms=("grpo", "grpo_r2", "gspo"))
    check_outputs(s, summary, tmp_path)
    # The routing metrics are logged every step for every arm, as fractions.
    for arm in s.arms:
        curves = summary["runs"][arm]["0"]["curves"]
        for key in ("routing/changed_experts_frac", "routing/changed_sets_frac"):
            assert [x for x, _ in curves[key]] == list(range(1, STEPS + 1))
            assert all(0 <= v <= 1 for _, v in curves[key]), (arm, key)
        # a set that changed lost at least one of its k=2 experts: experts changed >= sets changed / 2
        # (the curves keep 5 significant digits)
        for (_, e), (_, t) in zip(curves["routing/changed_experts_frac"], curves["routing/changed_sets_frac"]):
            assert t / 2 * (1 - 1e-4) <= e <= t * (1 + 1e-4)
    assert {c["source"] for c in summary["claims"]} == {"arXiv 2507.18071 (GSPO), Section 5.3"}
    assert all(c["verdict"] != "not_run" for c in summary["claims"])


def test_moe_routing_per_update_volatility_and_collapse():
    cfg = moe_routing.get_study(quick=True).arms["grpo"]  # 4 minibatches a step

    def run(rewards, changed=0.03, skipped=0):
        rows = [{"step": i + 1, "updates": 4 * (i + 1), "reward/mean": r, "routing/changed_experts_frac": changed,
                 "skipped_updates": 0}
                for i, r in enumerate(rewards)]
        rows[-1]["skipped_updates"] = skipped
        return study.Run("grpo", 0, override(cfg, [f"train.steps={len(rows)}"]), rows)

    # updates 1-4 of a step see the drift of 0, 1, 2, 3 updates: mean 1.5 x the per-update drift
    assert moe_routing.per_update(run([0.2] * 10)) == pytest.approx(0.02)
    rise_fall = [0.2, 0.4, 0.6, 0.6, 0.6, 0.5, 0.3, 0.2, 0.1, 0.1]  # peak 0.6, last 20% at 0.1
    assert moe_routing.collapsed(run(rise_fall))
    assert not moe_routing.collapsed(run([0.2, 0.3, 0.4, 0.5, 0.5, 0.5, 0.5, 0.45, 0.4, 0.4]))  # 0.4 >= 0.25
    assert moe_routing.collapsed(run([0.2] * 10, skipped=1))  # a skipped (non-finite) update counts
