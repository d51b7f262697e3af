"""Smoke tests of the reproductions (experiments/*.py): each study through its own code path at a tiny
size (its quick arms, one seed, 2 steps of 8 prompts, or enough for a minibatch per device, x 4 samples),
checking what it writes and that the numbers are sane. Compilation dominates: about a dozen programs per
study (warm start, samplers, one train step per arm)."""

import dataclasses
import json
import pathlib
import re
import shutil
import sys

import jax
import numpy as np
import pytest

from grpo_jax import envs
from grpo_jax.config import AlgorithmConfig, override
from grpo_jax.rewards import functions

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "experiments"))

import all_wrong_groups  # noqa: E402
import gspo_vs_grpo  # noqa: E402
import infra_mismatch  # noqa: E402
import length_bias  # noqa: E402
import method_orderings  # noqa: E402
import moe_routing  # noqa: E402
import multi_reward  # noqa: E402
import noisy_rewards  # noqa: E402
import pass_at_n  # noqa: E402
import preset_table  # noqa: E402
import prompt_samplers  # noqa: E402
import staleness  # noqa: E402
import study  # noqa: E402
import tool_use  # noqa: E402
import warm_start  # noqa: E402

STEPS, SEEDS = 2, (0,)


def tiny(s: study.Study) -> study.Study:
    """`s` at a few seconds' size; every other field (model, task, algorithm, minibatches) as the study has it."""
    shrink = [f"train.steps={STEPS}", "sampling.group_size=4", "train.eval_prompts=8",
              "train.eval_every=1", "train.checkpoint_every=1000", "optim.warmup_steps=0"]
    ws = {a: dataclasses.replace(s.warm_start_of(a), max_steps=2, eval_every=1, batch_size=8) for a in s.arms}
    # 8 prompts, or enough for a minibatch of 8 rows (one per simulated device)
    arms = {a: override(c, [*shrink, f"train.prompts_per_step={max(8, 2 * c.train.minibatches)}"]) for a, c in s.arms.items()}
    return dataclasses.replace(s, arms=arms, seeds=SEEDS, warm_start=ws)


def run_tiny(module, tmp_path, arms=None) -> tuple[study.Study, dict]:
    """The --quick study (only `arms`, when given) at `tiny` size, through the harness."""
    s = module.get_study(quick=True)
    s = tiny(s.only(arms) if arms else s)
    summary = study.run(s, module.claims, tmp_path / "results", tmp_path / "runs")
    assert summary == json.loads((tmp_path / "results" / "summary.json").read_text())
    return s, summary


def check_outputs(s: study.Study, summary: dict, tmp_path: pathlib.Path, claims) -> None:
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
    assert len((tmp_path / "results" / "summary.json").read_bytes()) < 200_000  # lean: the curves are apart
    stored = study.read_curves(tmp_path / "results" / study.CURVES)
    for arm, cfg in s.arms.items():
        assert sorted(stored["runs"][arm]) == sorted(summary["runs"]["runs"][arm]) == [str(x) for x in SEEDS]
        for seed, r in stored["runs"][arm].items():
            run = study.Run(arm, int(seed), cfg, study.with_axes(r["rows"], cfg, s.derive))
            assert run.series("reward/mean", "step")[0].tolist() == list(range(1, STEPS + 1))
            assert run.series("eval/accuracy_greedy", "step")[0].tolist() == list(range(STEPS + 1))
            per_step = cfg.algorithm.num_iterations * cfg.train.minibatches
            assert run.series("updates", "step")[1].tolist() == [per_step * k for k in range(STEPS + 1)]
            tokens = run.series("tokens", "step")[1]
            rows = cfg.train.prompts_per_step * cfg.sampling.group_size
            assert tokens[0] == 0
            assert all(0 < b - a <= rows * cfg.sampling.max_new_tokens for a, b in zip(tokens, tokens[1:]))
            for key in ("reward/mean", "accuracy", "eval/accuracy_greedy", "clip_frac_high_tokens",
                        "clip_frac_low_tokens"):
                assert all(0 <= v <= 1 for v in run.series(key)[1]), (arm, key)
    # Every verdict, table entry and collapse check follows from curves.json.gz alone.
    assert study.rejudge(s, claims, tmp_path / "results") == []
    # Arms of a seed with the same warm start start from the same params: identical step-0 evaluations.
    for seed in map(str, SEEDS):
        warm = summary["warm_starts"][seed]
        assert sorted(a for w in warm for a in w["arms"]) == sorted(s.arms) and all(w["steps"] == 2 for w in warm)
        assert len(warm) == len({s.warm_start_of(a) for a in s.arms})
        for w in warm:
            first = {arm: step0(tmp_path, arm, seed) for arm in w["arms"]}
            assert len({json.dumps(v) for v in first.values()}) == 1, first


def step0(tmp_path, arm, seed) -> dict:
    """The greedy evaluations before the first RL step (the sampled ones follow the run's rollout seed,
    which the null control changes)."""
    with (tmp_path / "runs" / arm / f"seed{seed}" / "metrics.jsonl").open() as f:
        return {k: v for k, v in json.loads(f.readline()).items() if "greedy" in k}


def test_only_keeps_the_named_arms_and_the_null_pair_only_whole():
    full = gspo_vs_grpo.get_study(quick=False)
    assert list(full.arms) == ["grpo", "gspo", "gspo_token"] and full.null_pair == ("gspo", "gspo_token")
    assert full.protocol_errors() == [] and len(full.seeds) == 8 and len(full.learning_rates) == 3
    pair = full.only(["grpo", "gspo"])
    assert list(pair.arms) == ["grpo", "gspo"] and pair.arms["gspo"] is full.arms["gspo"]
    assert pair.null_pair is None and "no null_pair" in " ".join(pair.protocol_errors())
    with pytest.raises(SystemExit):  # an arm the study does not have is a usage error, before any run
        study.main(gspo_vs_grpo.get_study, gspo_vs_grpo.claims, ["--arms", "grpo_lr9"])
    with pytest.raises(ValueError, match="overlap the evaluation seeds"):
        dataclasses.replace(full, selection_seeds=(0, 100))


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


def without_clocks(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/")) or k.endswith("time_s"))}
            for r in rows]


def test_gspo_vs_grpo(tmp_path):
    s, summary = run_tiny(gspo_vs_grpo, tmp_path)
    check_outputs(s, summary, tmp_path, gspo_vs_grpo.claims)
    # The paper's baseline: GRPO clips at 0.2 / 0.27 without KL; GSPO at 3e-4 / 4e-4; 4 minibatches each.
    arms = {a: {**summary["config"], **summary["arms"][a]} for a in s.arms}
    for arm, want in (("grpo", ("ppo_clip", 0.2, 0.27, 0.0)), ("gspo", ("gspo", 3e-4, 4e-4, 0.0))):
        assert tuple(arms[arm][f"algorithm.{k}"] for k in ("loss", "loss.eps_low", "loss.eps_high", "beta")) == want
    assert arms["gspo_token"]["algorithm.loss"] == "gspo_token" and summary["protocol"]["null_pair"] == ["gspo", "gspo_token"]
    assert {c["train.minibatches"] for c in arms.values()} == {4}
    # The null control resamples: its rollouts (and so its curves) differ from gspo's, whose objective it shares.
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    assert stored["gspo"]["0"]["rows"][1]["completion/length_mean"] != stored["gspo_token"]["0"]["rows"][1][
        "completion/length_mean"]
    assert [c["source"] for c in summary["claims"]] == [f"arXiv 2507.18071 (GSPO), {x}" for x in
                                                        ("Figure 1", "Figure 2", "sec. 3.1", "sec. 3.1")]
    assert all(c["verdict"] in study.VERDICTS and c["halves"] for c in summary["claims"])
    rows = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]["grpo"]["0"]["rows"]
    assert {k for k in rows[1] if k.startswith("ratio/token_log_var@")} == {
        f"ratio/token_log_var@{b}" for b in gspo_vs_grpo.BUCKETS}
    assert any(k.startswith("eval/accuracy_greedy@") for k in rows[0])

    # --resume: a complete run is read back untouched; a run that is missing runs afresh, to the same numbers.
    grpo, gspo = (tmp_path / "runs" / arm / "seed0" for arm in ("grpo", "gspo"))
    kept = (grpo / "metrics.jsonl").read_bytes()
    shutil.rmtree(gspo)
    again = study.run(s, gspo_vs_grpo.claims, tmp_path / "again", tmp_path / "runs", resume=True)
    assert (grpo / "metrics.jsonl").read_bytes() == kept
    assert again["runs"]["runs"]["grpo"]["0"]["resumed"] and not again["runs"]["runs"]["gspo"]["0"]["resumed"]
    first, second = (study.read_curves(d / study.CURVES)["runs"]["gspo"]["0"]["rows"]
                     for d in (tmp_path / "results", tmp_path / "again"))
    assert without_clocks(first) == without_clocks(second)
    assert "2 run(s) were continued or read back" in (tmp_path / "again" / "table.md").read_text()


def test_one_warm_start_for_every_seed(tmp_path, monkeypatch):
    """With `Study.warm_start_seed` the warm start is trained once, with that seed, and every run (the
    selection's too) is given its params; without it, each seed trains its own."""
    trained, given = [], []

    def fake_warm_start(cfg, ws):
        trained.append(cfg.train.seed)
        return {"w": np.full(2, cfg.train.seed)}, [{"sft_step": 2, "accuracy_greedy": 0.5}]

    def fake_train(cfg, params):
        given.append((cfg.train.seed, int(params["w"][0])))
        pathlib.Path(cfg.train.out_dir).mkdir(parents=True)
        (pathlib.Path(cfg.train.out_dir) / "metrics.jsonl").write_text('{"step": 0, "time/run_s": 1.0}\n')
        return {"resumed_from": None}

    monkeypatch.setattr(study, "warm_start", fake_warm_start)
    monkeypatch.setattr(study.run_lib, "train", fake_train)
    base = gspo_vs_grpo.get_study(quick=True).only(("gspo",))
    for seed, want in ((7, [(100, 7), (0, 7), (1, 7)]), (None, [(100, 100), (0, 0), (1, 1)])):
        s, shared = dataclasses.replace(base, seeds=(0, 1), warm_start_seed=seed), {}
        trained.clear(), given.clear()
        study.train_all(s, s.arms, (100,), tmp_path / f"{seed}" / "selection", False, {}, [], shared)
        study.train_all(s, s.arms, s.seeds, tmp_path / f"{seed}", False, {}, [], shared)
        assert given == want and trained == sorted({w for _, w in want}, key=[w for _, w in want].index)


def test_rejudge_finds_a_changed_verdict_and_refuses_a_changed_study(tmp_path):
    """A study judged from hand-written curves: --rejudge agrees, finds an edited verdict, and refuses a
    study whose configs have changed since."""
    s = dataclasses.replace(gspo_vs_grpo.get_study(quick=True), seeds=(0, 1), plots=())
    base = [{"step": 0, "eval/accuracy_greedy": 0.3, "eval/accuracy_greedy@0-32": 0.5, "time/run_s": 1.0}]

    def rows(reward):
        return base + [{"step": k, "reward/mean": reward, "completion/length_mean": 40.0, "groups/gen_rounds": 1.0,
                        "clip_frac_low_tokens": 0.01, "clip_frac_high_tokens": 0.01, "time/run_s": 2.0}
                       for k in (1, 2)]

    stored = {"selection": {}, "runs": {arm: {str(seed): {"rows": rows(0.1 * (i + 1)), "resumed": False, "wall_seconds": 2.0}
                                              for seed in (0, 1)} for i, arm in enumerate(s.arms)}}
    out = tmp_path / "results"
    out.mkdir()
    study.write_curves(out / study.CURVES, stored)
    summary = study.write(s, gspo_vs_grpo.claims, study.read_curves(out / study.CURVES), out, 1.0,
                          [[0.0] * 3, [0.0] * 3], {}, study.git_state())
    assert summary["table"]["gspo"]["training reward, mean over the run"]["per_seed"] == [0.2, 0.2]
    assert study.rejudge(s, gspo_vs_grpo.claims, out) == []
    summary["claims"][0]["verdict"] = "reproduced" if summary["claims"][0]["verdict"] != "reproduced" else "partial"
    (out / "summary.json").write_text(json.dumps(summary))
    assert study.rejudge(s, gspo_vs_grpo.claims, out) == ["claims"]
    # another CPU's summation order moves a mean's last bits, never more: that agrees, a real change does not
    mean = summary["table"]["gspo"]["training reward, mean over the run"]["mean"]
    assert study.agrees({"m": [mean, "x"]}, {"m": [mean * (1 + 4e-16), "x"]})
    assert not study.agrees({"m": [mean, "x"]}, {"m": [mean * (1 + 1e-6), "x"]})
    assert not study.agrees({"m": [mean]}, {"m": [mean, mean]}) and not study.agrees({"v": "holds"}, {"v": "fails"})
    changed = dataclasses.replace(s, arms={a: override(c, ["train.steps=3"]) for a, c in s.arms.items()})
    with pytest.raises(ValueError, match="configs changed since these results were written"):
        study.rejudge(changed, gspo_vs_grpo.claims, out)


def test_length_bias(tmp_path):
    # GRPO and Dr. GRPO (the null pair, GSPO and GSPO-token, runs through the harness in test_gspo_vs_grpo)
    s, summary = run_tiny(length_bias, tmp_path, arms=("grpo", "dr_grpo"))
    check_outputs(s, summary, tmp_path, length_bias.claims)
    # Length is free: a check repeats a column step, and the exact reward reads only the sum after "#### ".
    rng = np.random.default_rng(0)
    src = s.arms["grpo"].task.sources(0)[0]
    examples = [src[i] for i in range(300)]
    targets = [length_bias.written_with_checks(ex, rng) for ex in examples]
    for ex, t in zip(examples, targets):
        assert functions.exact_match(ex["prompt"], t, ex) == 1.0 and ex["digits"] == 3
        assert list(dict.fromkeys(t.split(";"))) == ex["solution"].split(";")  # the steps in order, each repeated
    steps = np.array([len(t.split(";")) - 1 for t in targets])  # 1 to 3 copies per step, 1 + 0.3 + 0.09 on average
    assert steps.min() == 3 and abs(steps.mean() / 3 - 1.39) < 0.1 and steps.max() >= 7 and steps.max() <= 9
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


def test_tool_use(tmp_path):
    """Two of its arms (trajectory credit with the calculator, and the no-tool ceiling); the warm start's
    target is a trajectory the calculator solves, turn by turn."""
    s, summary = run_tiny(tool_use, tmp_path, arms=("gspo_token", "no_tool"))
    check_outputs(s, summary, tmp_path, tool_use.claims)
    env, src = s.arms["gspo_token"].env, s.arms["gspo_token"].task.sources(0)[0]
    for ex in (src[i] for i in range(20)):
        call, answer = tool_use.tool_call(ex, np.random.default_rng(0)).split("]", 1)
        step = env.step(envs.State(ex), call + "]")
        assert 4 <= len(ex["prompt"].split("*")[0]) <= 6 and answer == step.observation * 2 and not step.done
        assert env.step(envs.State(ex, (call + "]",), (step.observation,), last=True), answer[len(step.observation):]) == (
            "", 1.0, True)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "gspo_token" / "seed0" / "metrics.jsonl").open()]
    assert all(0 <= r["env/tool_call_rate"] <= 1 for r in rows[1:]) and "eval/tool_call_rate" in rows[0]


def test_preset_table(tmp_path, monkeypatch):
    from grpo_jax.algorithms.presets_doc import study_table

    # The full study under the protocol: the claims' arms and the null pair, each preset as registered,
    # on gspo_vs_grpo's long task and warm start; 8 seeds, 3 rates.
    full = preset_table.get_study(quick=False)
    claimed = {a for c in preset_table.CLAIMS for h in c.halves for a in h.arms}
    assert set(full.arms) == claimed | {"gspo_token"} and full.null_pair == ("gspo", "gspo_token")
    assert full.protocol_errors() == [] and len(full.seeds) == 8 and len(full.learning_rates) == 3
    assert all(cfg.algorithm == AlgorithmConfig.from_preset(name) for name, cfg in full.arms.items())
    long_task = gspo_vs_grpo.get_study(quick=False).arms["gspo"]
    assert {(c.task, c.sampling.max_new_tokens, c.train.minibatches) for c in full.arms.values()} == {
        (long_task.task, long_task.sampling.max_new_tokens, 4)}
    assert full.warm_start == gspo_vs_grpo.WARM_START
    assert [c.source.split(" (")[0] for c in preset_table.CLAIMS] == ["arXiv 2503.14476", "arXiv 2507.20673",
                                                                       "arXiv 2511.20347"]

    # Four arms through the harness, as the committed study (whose report rewrites docs/presets.md).
    docs = tmp_path / "presets.md"
    docs.write_text(preset_table.PRESETS_DOC.read_text())
    monkeypatch.setattr(preset_table, "PRESETS_DOC", docs)
    monkeypatch.setattr(preset_table, "RESULTS", tmp_path / "results")
    s, summary = run_tiny(preset_table, tmp_path, arms=("grpo", "gmpo", "gspo", "gspo_token"))
    check_outputs(s, summary, tmp_path, preset_table.claims)
    # The claims are the protocol's, as declared: GMPO's judged with the null pair's floor, the others not run.
    assert [(c["claim"], c["rule"]) for c in summary["claims"]] == [(c.claim, c.rule()) for c in preset_table.CLAIMS]
    assert [c["verdict"] for c in summary["claims"]][::2] == ["not_run", "not_run"]
    gmpo = summary["claims"][1]
    assert [h["half"] for h in gmpo["halves"]] == [h.describe() for h in preset_table.CLAIMS[1].halves]
    assert gmpo["verdict"] in study.VERDICTS[:3] and gmpo["halves"][0]["noise_floor"] is not None
    # The area under held-out accuracy is the trapezoid over the evaluations, over the steps.
    rows = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]["grpo"]["0"]["rows"]
    curve = np.array([(r["step"], r["eval/accuracy_greedy"]) for r in rows if "eval/accuracy_greedy" in r])
    area = np.trapezoid(curve[:, 1], curve[:, 0]) / STEPS
    assert summary["table"]["grpo"]["held-out accuracy area (mean over training)"]["mean"] == pytest.approx(area, abs=1e-4)
    assert (tmp_path / "results" / "final_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    block = study_table(docs.read_text())
    assert all(f" {arm} |" in block for arm in s.arms) and "By held-out accuracy: " in block


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
    # A Qwen3-MoE (8 experts, top-2); GRPO (the paper's clip range, no KL) with R2 and without replay at R2's
    # chosen rate, GSPO without, the null control; 8 minibatches a step; one warm start for every seed.
    full = moe_routing.get_study(quick=False)
    arms = full.arms
    assert list(arms) == ["grpo_r2", "grpo", "gspo", "gspo_token"]
    assert [c.algorithm.routing_replay for c in arms.values()] == ["old", "none", "none", "none"]
    assert {(c.algorithm.loss.name, c.algorithm.loss.eps_low, c.algorithm.loss.eps_high, c.algorithm.beta)
            for a, c in arms.items() if a.startswith("grpo")} == {("ppo_clip", 0.2, 0.27, 0.0)}
    assert {c.train.minibatches for c in arms.values()} == {8} and full.warm_start_seed == 0
    assert {a: c.train.compare_routes for a, c in arms.items()} == {
        "grpo_r2": True, "grpo": True, "gspo": False, "gspo_token": False}
    assert full.rate_from == {"grpo": ("grpo_r2", 1.0)}
    assert full.protocol_errors() == [] and list(study.trials(full)) == [
        f"{a}@{lr:g}" for a in ("grpo_r2", "gspo") for lr in full.learning_rates]
    for c in arms.values():
        m = c.model
        assert (m.model_type, m.num_experts, m.num_experts_per_tok, m.num_layers) == ("qwen3_moe", 8, 2, 4)
    # GRPO without replay through the harness, routes compared (an MoE arm costs a minute: R2 and GSPO
    # train MoE steps in tests/test_routing.py and tests/test_packing.py)
    s, summary = run_tiny(moe_routing, tmp_path, arms=("grpo",))
    check_outputs(s, summary, tmp_path, moe_routing.claims)
    # The routing metrics are logged every step for every arm, as fractions, with the ratio on both routes.
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm in s.arms:
        rows = [r for r in stored[arm]["0"]["rows"] if "routing/changed_experts_frac" in r]
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        for r in rows:
            e, t = r["routing/changed_experts_frac"], r["routing/changed_sets_frac"]
            assert 0 <= e <= 1 and 0 <= t <= 1, arm
            # a set that changed lost at least one of its k=2 experts: experts changed >= sets changed / 2
            # (the curves keep 4 significant digits)
            assert t / 2 * (1 - 1e-3) <= e <= t * (1 + 1e-3)
            assert r["routing/log_ratio_abs_mean_own"] >= 0 and r["routing/log_ratio_abs_mean_replayed"] >= 0
    assert {c["source"] for c in summary["claims"]} == {"arXiv 2507.18071 (GSPO), sec. 5.3"}
    verdicts = [c["verdict"] for c in summary["claims"]]
    assert "not_run" not in verdicts[:2] and verdicts[2:] == ["not_run"] * 2  # the others need R2's or GSPO's arm


def test_staleness(tmp_path):
    # GRPO and GSPO at every k (GSPO's k = 0 run is GRPO's: one on-policy update, ratio 1), the null pair
    # at k = 0, GRPO at k = 8 under the decoupled proximal with each correction, GSPO with none and the
    # sequence mask; the rate chosen once, on grpo_k0, and followed by every other arm; one on-policy
    # update per rollout batch, so staleness is all that is off-policy.
    full = staleness.get_study(quick=False)
    arms = {a: (c.algorithm.loss.name, c.train.max_staleness, c.train.proximal, c.algorithm.tis_level, c.algorithm.tis_mode)
            for a, c in full.arms.items()}
    coupled = ("sampler", None, "truncate")
    assert arms == {**{f"grpo_k{k}": ("ppo_clip", k, *coupled) for k in (0, 1, 2, 4, 8)},
                    **{f"gspo_k{k}": ("gspo", k, *coupled) for k in (1, 2, 4, 8)}, "gspo_token_k0": ("gspo_token", 0, *coupled),
                    **{f"grpo_k{k}_decoupled{c}": ("ppo_clip", k, "trainer", *tis) for k in (1, 2, 4, 8)
                       for c, tis in (("", (None, "truncate")), ("_tis", ("token", "truncate")),
                                      ("_seqmask", ("sequence", "mask")))},
                    "gspo_k8_decoupled": ("gspo", 8, "trainer", None, "truncate"),
                    "gspo_k8_decoupled_seqmask": ("gspo", 8, "trainer", "sequence", "mask")}
    assert {(c.train.minibatches, c.algorithm.num_iterations, c.algorithm.beta) for c in full.arms.values()} == {(1, 1, 0.0)}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo_k0", "gspo_token_k0")
    assert list(study.trials(full)) == [f"grpo_k0@{lr:g}" for lr in full.learning_rates]
    assert study.followers(full) == {a: ("grpo_k0", 1.0) for a in full.arms if a != "grpo_k0"}
    # Each kind of arm through the harness: on-policy, stale GRPO and GSPO, the null control, the decoupled
    # proximal with and without a correction (claims 1 and 4; 2, 3 and 5 need k = 4 and 8, GSPO decoupled)
    s, summary = run_tiny(staleness, tmp_path, arms=("grpo_k0", "grpo_k1", "grpo_k2", "gspo_k2", "gspo_token_k0",
                                                     "grpo_k8_decoupled", "grpo_k8_decoupled_tis"))
    check_outputs(s, summary, tmp_path, staleness.claims)
    # A stale arm logs its staleness and the trainer's log-prob gap to the sampler (numerics only at the first
    # step, whose rollout the initial params sampled, STEPS = 2 < k; one update's drift at the second), a
    # synchronous one neither; what a correction weighs is that drift under the decoupled proximal, else numerics.
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm, cfg in s.arms.items():
        rows = [r for r in stored[arm]["0"]["rows"] if r["step"] > 0]
        k = cfg.train.max_staleness
        assert [r.get("staleness/mean") for r in rows] == ([0.0, 1.0] if k else [None, None]), arm
        assert k == 0 or rows[0]["staleness/logprob_gap_mean"] < 1e-4 < rows[1]["staleness/logprob_gap_mean"], arm
        drift = [r["sampler_drift_mean"] for r in rows]
        if cfg.train.proximal == "trainer":
            assert drift[0] < 1e-4 < drift[1] and drift[1] == pytest.approx(rows[1]["staleness/logprob_gap_mean"]), arm
        else:
            assert max(drift) < 1e-4, arm
        weight = [r.get("tis_weight_mean") for r in rows]
        assert weight == [None, None] if cfg.algorithm.tis_level is None else abs(weight[1] - 1) > 1e-4, arm
    assert [c["source"].split(" (")[0] for c in summary["claims"]] == ["arXiv 2505.22257", "arXiv 2606.30789",
                                                                       "arXiv 2507.18071", "arXiv 2505.24298",
                                                                       "arXiv 2507.18071", "arXiv 2505.24298"]
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False, True, True, False, True, True]


def test_infra_mismatch(tmp_path):
    # GRPO and GSPO with the matched, bfloat16 and noisy sampler, each family's correction under the noise, the
    # null pair on the matched GSPO; rates chosen on grpo and gspo, followed by their mismatched arms.
    full = infra_mismatch.get_study(quick=False)
    arms = {a: (c.algorithm.loss.name, c.sampling.compute_dtype, c.sampling.logit_noise, c.algorithm.tis_level,
                c.algorithm.tis_mode) for a, c in full.arms.items()}
    plain, noise = (None, "truncate"), infra_mismatch.NOISE
    assert arms == {"grpo": ("ppo_clip", None, 0.0, *plain), "gspo": ("gspo", None, 0.0, *plain),
                    "gspo_token": ("gspo_token", None, 0.0, *plain), "grpo_bf16": ("ppo_clip", "bfloat16", 0.0, *plain),
                    "gspo_bf16": ("gspo", "bfloat16", 0.0, *plain), "grpo_noise": ("ppo_clip", None, noise, *plain),
                    "gspo_noise": ("gspo", None, noise, *plain), "grpo_noise_tis": ("ppo_clip", None, noise, "token", "truncate"),
                    "gspo_noise_seqmask": ("gspo", None, noise, "sequence", "mask"),
                    "grpo_noise_rollout": ("ppo_clip", None, noise, *plain), "gspo_noise_rollout": ("gspo", None, noise, *plain)}
    assert {a for a, c in full.arms.items() if c.train.proximal != "sampler"} == {"grpo_noise_rollout", "gspo_noise_rollout"}
    assert all(full.arms[a].train.proximal == "rollout" for a in ("grpo_noise_rollout", "gspo_noise_rollout"))
    assert {(c.train.minibatches, c.algorithm.num_iterations, c.algorithm.beta) for c in full.arms.values()} == {(2, 1, 0.0)}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("gspo", "gspo_token")
    assert sorted(study.trials(full)) == sorted(f"{a}@{lr:g}" for a in ("grpo", "gspo") for lr in full.learning_rates)
    assert study.followers(full) == {a: (a.split("_")[0], 1.0) for a in full.arms if a not in ("grpo", "gspo")}
    s, summary = run_tiny(infra_mismatch, tmp_path, ["grpo", "grpo_bf16", "grpo_noise", "grpo_noise_tis", "grpo_noise_rollout"])
    check_outputs(s, summary, tmp_path, infra_mismatch.claims)
    # The trainer sees the gap it was given: none matched, bf16's rounding, the noise's far above it; only a
    # correction logs its weight.
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    drift = {a: [r["sampler_drift_mean"] for r in stored[a]["0"]["rows"] if r["step"] > 0] for a in s.arms}
    assert max(drift["grpo"]) < 1e-6 < min(drift["grpo_bf16"]) and max(drift["grpo_bf16"]) < 1e-2
    assert min(drift["grpo_noise"] + drift["grpo_noise_tis"]) > 0.1 and max(drift["grpo_noise_rollout"]) == 0  # l^old = l^samp
    for arm in s.arms:
        weights = [r.get("tis_weight_mean") for r in stored[arm]["0"]["rows"] if r["step"] > 0]
        assert all((w is None) == (arm != "grpo_noise_tis") for w in weights), arm
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False, True, False, True]  # 2, 4 need GSPO

def test_moe_routing_per_update_volatility():
    cfg = moe_routing.get_study(quick=True).arms["grpo"]  # 8 minibatches a step
    rows = [{"step": i + 1, "routing/changed_experts_frac": 0.035, "routing/log_ratio_abs_mean_own": 0.02,
             "routing/log_ratio_abs_mean_replayed": 0.005} for i in range(10)]
    run = study.Run("grpo", 0, override(cfg, ["train.steps=10"]), rows)
    # updates 1-8 of a step see the drift of 0, 1, ..., 7 updates: mean 3.5 x the per-update drift
    assert moe_routing.per_update(run) == pytest.approx(0.01)
    assert moe_routing.routing_share(run) == pytest.approx(np.log10(4))


COMMITTED = sorted((pathlib.Path(study.HERE) / "results").glob(f"**/{study.CURVES}"))


def test_the_studies_have_committed_results():
    assert len(COMMITTED) >= 10, COMMITTED  # else the test below has (almost) nothing to check


@pytest.mark.parametrize("curves", COMMITTED, ids=lambda p: str(p.parent.relative_to(study.HERE / "results")))
def test_committed_results_rejudge_to_their_summaries(curves):
    """A committed study with its curves (experiments/results/NAME[/quick]/curves.json.gz) judged again from
    them alone gives its summary.json: every verdict, table entry, collapse check and rate choice. One test
    per study, so the workers share them."""
    summary = json.loads((curves.parent / "summary.json").read_text())
    module = __import__(summary["study"])
    assert study.rejudge(module.get_study(summary["quick"]), module.claims, curves.parent) == []


def test_learning_rates_are_chosen_per_arm_and_followed():
    """Each arm's rate is the best mean of `select` over the selection seeds (a diverged rate never wins);
    the null pair's second takes its first's, and a `rate_from` arm its source's times the factor."""
    full = gspo_vs_grpo.get_study(quick=False)
    s = dataclasses.replace(full, arms={**full.arms, "grpo_hot": full.arms["grpo"]}, rate_from={"grpo_hot": ("grpo", 3.0)})
    reward = {("grpo", 3e-5): 0.1, ("grpo", 1e-4): 0.3, ("grpo", 3e-4): float("nan"),
              ("gspo", 3e-5): 0.2, ("gspo", 1e-4): 0.2, ("gspo", 3e-4): 0.1}  # gspo: a tie, the first rate wins
    rows = lambda r: [{"step": k, "reward/mean": r, "completion/length_mean": 40.0, "groups/gen_rounds": 1.0}
                      for k in range(1, 4)]  # noqa: E731
    selection = {f"{a}@{lr:g}": {str(seed): {"rows": rows(r), "resumed": False} for seed in s.selection_seeds}
                 for (a, lr), r in reward.items()}
    assert list(study.trials(s)) == list(selection)  # the null pair's second and grpo_hot choose nothing
    chosen = study.select_rates(s, selection)
    assert {a: c["chosen"] for a, c in chosen.items()} == {"grpo": 1e-4, "gspo": 3e-5, "gspo_token": 3e-5,
                                                           "grpo_hot": pytest.approx(3e-4)}
    assert chosen["grpo"]["per_rate"]["0.0001"] == {"per_seed": [0.3, 0.3], "mean": 0.3}
    # the table marks a choice at the sweep's end (strictly ahead; not a tie, nor a followed rate)
    assert [study.sweep_edge(chosen[a]) for a in ("grpo", "gspo", "gspo_token", "grpo_hot")] == [None] * 4
    lowest = {"chosen": 3e-5, "per_rate": {"3e-05": {"mean": 0.4}, "0.0001": {"mean": 0.3}, "0.0003": {"mean": None}}}
    assert study.sweep_edge(lowest) == "lowest"
    highest = {"chosen": 3e-4, "per_rate": {"3e-05": {"mean": 0.1}, "0.0001": {"mean": 0.3}, "0.0003": {"mean": 0.31}}}
    assert study.sweep_edge(highest) == "highest"
    assert study.evaluated_arms(s, chosen)["grpo_hot"].optim.learning_rate == pytest.approx(3e-4)
    with pytest.raises(ValueError, match="rate_from\\['grpo_hot'\\] = 'gspo_hot'"):
        dataclasses.replace(s, rate_from={"grpo_hot": ("gspo_hot", 2.0)})


def test_warm_start_batches_are_as_wide_as_their_longest_rows():
    """A warm-start batch drops the padding beyond its longest prompt and target (rounded up to
    WIDTH_STEP): the target log-probs equal those of the same rows at the sampler's full widths."""
    from configs.long_addition import get_config

    from grpo_jax import models, sharding, trainer
    from grpo_jax import train_step as ts

    cfg = get_config()
    mesh = sharding.make_mesh(cfg.mesh)
    ws = dataclasses.replace(gspo_vs_grpo.WARM_START, batch_size=8)
    tokens, positions, segments, mask = map(np.asarray, next(warm_start.sft_batches(cfg, ws, trainer.build_task(cfg).tokenizer, mesh)))
    c = mask.shape[1]
    p = tokens.shape[1] - c
    P, C = cfg.sampling.max_prompt_len, cfg.sampling.max_new_tokens
    assert p % warm_start.WIDTH_STEP == 0 and c % warm_start.WIDTH_STEP == 0 and (p, c) < (P, C)
    step = warm_start.WIDTH_STEP  # the longest prompt and target each fit with less than a step to spare
    assert p - step < segments[:, :p].sum(1).max() <= p and c - step < mask.sum(1).max() <= c
    left, right = np.zeros((8, P - p), np.int32), np.zeros((8, C - c), np.int32)
    full = [np.concatenate([left, x[:, :p], x[:, p:], right], 1) for x in (tokens, positions, segments)]
    params = models.init(cfg.model, jax.random.key(0))
    trimmed, _ = ts.completion_logprobs(cfg.model, 1.0, params, tokens, positions, segments, mask, False)
    padded, _ = ts.completion_logprobs(cfg.model, 1.0, params, *full, np.concatenate([mask, right.astype(np.float32)], 1), False)
    np.testing.assert_allclose(np.asarray(trimmed) * mask, np.asarray(padded)[:, :c] * mask, atol=1e-5)


def test_prompt_samplers(tmp_path):
    # Each sampler's preset against the uniform shuffle (GRPO, beta 0) and its null copy; grpo and spo choose
    # their rates, the samplers take grpo's; one warm start, on the whole task; a pool of its first prompts.
    full = prompt_samplers.get_study(quick=False)
    arms = full.arms
    assert list(arms) == ["grpo", "grpo_null", "vade", "curriculum", "gdro", "spo", "ar3po", "repo"]
    assert [c.algorithm.sampler.name for c in arms.values()] == [
        "uniform", "uniform", "vade", "curriculum", "gdro", "spo", "ar3po", "repo"]
    assert {c.algorithm.beta for c in arms.values()} == {0.0} and arms["grpo"] == arms["grpo_null"]
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo", "grpo_null")
    assert list(study.trials(full)) == [f"{a}@{lr:g}" for a in ("grpo", "spo") for lr in full.learning_rates]
    train, whole = arms["grpo"].task.sources(0)[0], prompt_samplers.TASK.sources(0)[0]
    problems = [train[i] for i in range(len(train))]
    assert len(problems) == prompt_samplers.POOL and problems == [whole[i] for i in range(len(problems))]
    parsed = [re.fullmatch(r"(\d+)([+-])(\d+)=", p["prompt"]).groups() for p in problems]
    assert {(len(a), len(b)) for a, _, b in parsed} == {(1, 1), (1, 2), (2, 1), (2, 2)}  # easy to hard
    assert full.warm_start.task == prompt_samplers.TASK

    # the uniform pair, SPO (its tracker) and RePO (replayed groups); the stateful samplers' rounds are
    # tested in tests/test_prompt_samplers.py, GDRO's across processes too
    s, summary = run_tiny(prompt_samplers, tmp_path, arms=("grpo", "grpo_null", "spo", "repo"))
    check_outputs(s, summary, tmp_path, prompt_samplers.claims)
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False, False, False, True, True, True, True, False]
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm in s.arms:
        rows = [r for r in stored[arm]["0"]["rows"] if r["step"] > 0]
        assert all(0 <= r["advantage/zero_frac"] <= 1 for r in rows), arm
        # GRPO's zero advantages are exactly its degenerate groups' samples (every group kept, all of size G)
        if arm.startswith("grpo"):
            assert [r["advantage/zero_frac"] for r in rows] == [r["groups/zero_variance_frac"] for r in rows]
        tracked = [r for r in rows if "sampler/baseline_sq_error" in r]
        assert len(tracked) == (len(rows) if arm == "spo" else 0), arm
    first = next(r for r in stored["spo"]["0"]["rows"] if r["step"] == 1)
    # Before any round every baseline is the prior 0.5: (v - p)^2 = the error + the group mean's variance <= 1/4
    assert 0 <= first["sampler/group_mean_var"] and 0 <= first["sampler/baseline_sq_error"] + first[
        "sampler/group_mean_var"] <= 0.25 + 1e-3


def test_prompt_samplers_rollouts_and_targets():
    cfgs = prompt_samplers.get_study(quick=True).arms
    rows = [{"step": 0, "eval/accuracy_greedy": 0.2}] + [
        {"step": k, "groups/gen_rounds": 1.0, "replay/rows": 64.0, "completion/length_mean": 2.0, "reward/mean": 0.5,
         **({"eval/accuracy_greedy": 0.2 + 0.1 * k / 10} if k % 10 == 0 else {})} for k in range(1, 41)]
    per_step = 32 * 8
    repo, ar3po = (study.Run(a, 0, cfgs[a], [dict(r) for r in rows]) for a in ("repo", "ar3po"))
    # RePO does not generate the groups it replays; AR3PO's lent answers replace samples it generated
    assert prompt_samplers.rollouts(repo)[-1] == 40 * (per_step - 64)
    assert prompt_samplers.rollouts(ar3po)[-1] == 40 * per_step
    assert prompt_samplers.tokens(ar3po) == 40 * per_step * 2.0
    assert prompt_samplers.reward_per_token(ar3po) == pytest.approx(0.5 / 2.0 * 1e3)
    assert prompt_samplers.rollouts_to_target(ar3po) == 10 * per_step  # warm start 0.2 + 0.1, reached at step 10
    flat = study.Run("ar3po", 0, cfgs["ar3po"], [{**r, "eval/accuracy_greedy": 0.2} if "eval/accuracy_greedy" in r
                                                  else r for r in rows])
    # never: the cap, a uniform run's 100 steps and an interval (20) more, whatever the arm generated
    assert prompt_samplers.rollouts_to_target(flat) == 120 * per_step


def test_noisy_rewards(tmp_path):
    # GRPO, Dr. GRPO and S-GRPO (its p = 0.15 in every arm: not told the injected rate) at label noise 0, 10 and
    # 20%, the null pair on noiseless GRPO; rates chosen on each family's noiseless arm, followed by its noisy ones.
    full = noisy_rewards.get_study(quick=False)
    arms = {a: (c.algorithm.advantage.name, c.algorithm.aggregation.name, c.reward.label_noise) for a, c in full.arms.items()}
    grpo, dr, s = ("group_std", "seq_mean_token_mean"), ("group_mean", "seq_mean_token_sum_norm"), ("noise_aware",
                                                                                                   "seq_mean_token_sum_norm")
    assert arms == {**{f"{f}_n{k}": (*kind, k / 100) for f, kind in (("grpo", grpo), ("dr_grpo", dr), ("s_grpo", s))
                       for k in (0, 10, 20)}, "grpo_n0_resampled": (*grpo, 0.0)}
    assert {c.algorithm.advantage.noise_rate for a, c in full.arms.items() if a.startswith("s_grpo")} == {0.15}
    assert {(c.train.minibatches, c.algorithm.num_iterations, c.algorithm.beta) for c in full.arms.values()} == {(1, 1, 0.0)}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo_n0", "grpo_n0_resampled")
    assert sorted(study.trials(full)) == sorted(f"{f}_n0@{lr:g}" for f in ("grpo", "dr_grpo", "s_grpo")
                                                for lr in full.learning_rates)
    assert study.followers(full) == {**{f"{f}_n{k}": (f"{f}_n0", 1.0) for f in ("grpo", "dr_grpo", "s_grpo") for k in (10, 20)},
                                     "grpo_n0_resampled": ("grpo_n0", 1.0)}
    # A noiseless arm, GRPO and S-GRPO at 20% noise: claims 1 and 2 (3 and 4 need S-GRPO's noiseless and Dr. GRPO's arms)
    s, summary = run_tiny(noisy_rewards, tmp_path, arms=("grpo_n0", "grpo_n20", "s_grpo_n20"))
    check_outputs(s, summary, tmp_path, noisy_rewards.claims)
    # Under noise the flips are counted and the true labels' accuracy logged beside the flipped ones'; the claims'
    # training accuracy is the true one.
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm in s.arms:
        rows = [r for r in stored[arm]["0"]["rows"] if r["step"] > 0]
        if arm == "grpo_n0":
            assert not any("reward/label_flip_frac" in r or "accuracy_clean" in r for r in rows)
            assert [noisy_rewards.true_accuracy(r) for r in rows] == [r["accuracy"] for r in rows]
        else:
            assert 0 < np.mean([r["reward/label_flip_frac"] for r in rows]) < 0.5, arm
            assert [noisy_rewards.true_accuracy(r) for r in rows] == [r["accuracy_clean"] for r in rows], arm
            assert all(0 <= r["accuracy_clean"] <= 1 for r in rows), arm
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False, False, True, True]


def test_multi_reward(tmp_path):
    # Exact-match correctness and the format reward, weight 1 each, combined three ways: GRPO's sum then normalize,
    # GDPO's normalize then sum (batch-standardized), MO-GRPO's normalize each; the null pair on GRPO.
    full = multi_reward.get_study(quick=False)
    combine = {a: c.algorithm.reward_combine for a, c in full.arms.items()}
    assert combine == {"grpo": "sum_then_normalize", "gdpo": "normalize_then_sum", "mo_grpo": "normalize_each",
                       "grpo_resampled": "sum_then_normalize"}
    assert {(c.reward.names, c.reward.weights, c.sampling.max_new_tokens, c.algorithm.advantage.name,
             c.algorithm.aggregation.name, c.algorithm.beta) for c in full.arms.values()} == {
        (("exact", "format"), (1.0, 1.0), 8, "group_std", "seq_mean_token_mean", 0.0)}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo", "grpo_resampled")
    assert sorted(study.trials(full)) == sorted(f"{a}@{lr:g}" for a in ("grpo", "gdpo", "mo_grpo") for lr in full.learning_rates)
    assert study.followers(full) == {"grpo_resampled": ("grpo", 1.0)}
    # The warm start formats about FORMAT_P of its targets, which both rewards score as intended.
    rng = np.random.default_rng(0)
    targets = [multi_reward.formatted_sometimes({"answer": "-12"}, rng) for _ in range(2000)]
    assert set(targets) == {"-12", "####-12"} and abs(np.mean([t == "####-12" for t in targets]) - multi_reward.FORMAT_P) < 0.04
    assert [(functions.exact_match("", t, {"answer": "-12"}), functions.answer_format("", t, {})) for t in ("-12", "####-12")] \
        == [(1.0, 0.0), (1.0, 1.0)]
    s, summary = run_tiny(multi_reward, tmp_path, arms=("grpo", "gdpo", "mo_grpo"))
    check_outputs(s, summary, tmp_path, multi_reward.claims)
    assert all(c["verdict"] != "not_run" for c in summary["claims"])  # every claim's arms ran (no null pair: no floor)
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm, cfg in s.arms.items():
        rows = study.with_axes(stored[arm]["0"]["rows"], cfg, s.derive)
        train, evals = [r for r in rows if r["step"] > 0 and "reward/mean" in r], [r for r in rows if "eval/reward_greedy" in r]
        for r in train:  # per reward, and the collapse counts of every rollout batch
            assert 0 <= r["reward/exact_match/mean"] <= 1 and 0 <= r["reward/answer_format/mean"] <= 1
            assert r["merged_per_group"] == r["advantage/distinct_reward_combos"] - r["advantage/distinct_values"] >= 0
            assert 1 <= r["advantage/distinct_values"] <= r["advantage/distinct_reward_combos"] <= 4
        assert len(evals) == STEPS + 1
        for r in evals:  # the held-out format rate: the weighted total less the exact reward's mean
            assert r["format_held_out"] == r["eval/reward_greedy"] - r["eval/accuracy_greedy"] and -1e-3 <= r["format_held_out"] <= 1 + 1e-3


def test_all_wrong_groups(tmp_path):
    # GRPO, NGRPO, Dr. GRPO and NGRPO without its virtual sample from a 5% warm start (most groups all wrong), GRPO
    # and NGRPO from the setting's 25%, the null pair on hard-split GRPO; 4 minibatches (the ratio leaves 1) and 8
    # held-out samples per prompt (eval/pass@8: the all-wrong group fraction) in every arm.
    full = all_wrong_groups.get_study(quick=False)
    arms = {a: (c.algorithm.advantage.name, c.algorithm.loss.eps_low, c.algorithm.loss.eps_high, c.algorithm.aggregation.name,
                full.warm_start_of(a).accuracy) for a, c in full.arms.items()}
    grpo, ngrpo = ("group_std", 0.2, 0.2, "seq_mean_token_mean"), ("ngrpo", 0.16, 0.24, "token_mean")
    assert arms == {"grpo": (*grpo, 0.05), "ngrpo": (*ngrpo, 0.05), "dr_grpo": ("group_mean", 0.2, 0.2, "seq_mean_token_sum_norm", 0.05),
                    "ngrpo_no_calibration": ("group_std", 0.16, 0.24, "token_mean", 0.05), "grpo_resampled": (*grpo, 0.05),
                    "grpo_easy": (*grpo, 0.25), "ngrpo_easy": (*ngrpo, 0.25)}
    assert {(c.algorithm.advantage.max_reward, c.algorithm.advantage.virtual_samples) for a, c in full.arms.items()
            if a.startswith("ngrpo") and a != "ngrpo_no_calibration"} == {(1.0, 1)}
    assert {(c.train.minibatches, c.algorithm.num_iterations, c.algorithm.beta, c.train.eval_samples, c.sampling.group_size)
            for c in full.arms.values()} == {(4, 1, 0.0, 8, 8)}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo", "grpo_resampled")
    assert sorted(study.trials(full)) == sorted(f"{a}@{lr:g}" for a in full.arms if a != "grpo_resampled"
                                                for lr in full.learning_rates)
    assert study.followers(full) == {"grpo_resampled": ("grpo", 1.0)}
    # GRPO, NGRPO and the null pair's second: claims 1-3 (4-6 need the no-calibration, easy-split and Dr. GRPO arms)
    s, summary = run_tiny(all_wrong_groups, tmp_path, arms=("grpo", "ngrpo", "grpo_resampled"))
    check_outputs(s, summary, tmp_path, all_wrong_groups.claims)
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False] * 3 + [True] * 3
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm, cfg in s.arms.items():
        rows = study.with_axes(stored[arm]["0"]["rows"], cfg, s.derive)
        evals, train = [r for r in rows if "eval/pass@8" in r], [r for r in rows if r["step"] > 0 and "accuracy" in r]
        assert len(evals) == STEPS + 1 and all(r["all_wrong_held_out"] == 1 - r["eval/pass@8"] for r in evals)
        assert all(0 <= r["all_wrong_held_out"] <= 1 - r["eval/accuracy_sampled"] + 1e-6 for r in evals)
        for r in train:  # the bounds of the all-wrong training groups; NGRPO's exact value lies between them
            assert 0 <= r["all_wrong_lower"] <= r["groups/zero_variance_frac"] <= 1
            if arm == "ngrpo":
                exact = r["groups/zero_variance_frac"] - r["advantage/zero_frac"]
                assert r["all_wrong_lower"] - 1e-3 <= exact <= r["groups/zero_variance_frac"]
            else:  # GRPO's all-wrong and all-correct groups both have advantage 0
                assert r["advantage/zero_frac"] == r["groups/zero_variance_frac"]
        run = study.Run(arm, 0, cfg, rows)
        assert (all_wrong_groups.all_wrong_exact(run, 0, 1) >= 0) == (arm == "ngrpo")


def test_method_orderings(tmp_path):
    # Each paper's preset on the arithmetic setting; the ratio arms make 2 updates of 16 prompts' groups a step, GPG and
    # OPO (no ratio) 1 update of 16 prompts a step for twice the steps: the same updates, tokens and evaluation points per
    # update. Every arm keeps the warm start as a reference (beta 1e-6) for its KL; DAPO without its overlong shaping.
    full = method_orderings.get_study(quick=False)
    presets = {a: c.algorithm.loss.name for a, c in full.arms.items()}
    assert presets == {"grpo": "ppo_clip", "gpg": "reinforce", "opo": "reinforce", "disco": "disco", "dhpo": "dhpo",
                       "gmpo": "gmpo", "sapo": "sapo", "dapo": "ppo_clip", "gspo": "gspo", "gspo_token": "gspo_token",
                       "gmpo_at_grpo_rate": "gmpo"}
    assert full.arms["gpg"].algorithm.gpg_scale and full.arms["opo"].algorithm.advantage.name == "opo"
    assert full.arms["dapo"].algorithm.dynamic_sampling and full.arms["dapo"].algorithm.overlong_buffer_frac == 0
    assert full.arms["gmpo_at_grpo_rate"] == full.arms["gmpo"]
    for arm, c in full.arms.items():
        no_ratio = arm in ("gpg", "opo")
        assert (c.train.minibatches, c.train.prompts_per_step, c.train.steps, c.train.eval_every) == (
            (1, 16, 480, 60) if no_ratio else (2, 32, 240, 30)), arm
        assert c.algorithm.beta == method_orderings.KL_PROBE and c.algorithm.num_iterations == 1
        assert c.train.steps * c.train.minibatches == 480 and c.train.prompts_per_step // c.train.minibatches == 16
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("gspo", "gspo_token")
    assert study.followers(full) == {"gspo_token": ("gspo", 1.0), "gmpo_at_grpo_rate": ("grpo", 1.0)}
    assert sorted(study.trials(full)) == sorted(f"{a}@{lr:g}" for a in full.arms if a not in ("gspo_token", "gmpo_at_grpo_rate")
                                                for lr in full.learning_rates)
    # The ratio metrics read the logged rows: hand numbers (steps 1-20: max |log r| 0.1 up to step 7, then 0.2; the
    # window 10-35% is steps 3-7, the last quarter steps 16-20); the area is the trapezoid over the evaluations.
    cfg = override(full.arms["grpo"], ["train.steps=20"])
    rows = [{"step": s, "log_ratio_abs_max": 0.1 if s <= 7 else 0.2} for s in range(1, 21)]
    rows += [{"step": s, "eval/accuracy_greedy": a} for s, a in ((0, 0.2), (10, 0.4), (20, 0.4))]
    run = study.Run("grpo", 0, cfg, rows)
    assert method_orderings.ratio_growth(run) == pytest.approx(0.1)
    assert method_orderings.ratio_extreme(run) == pytest.approx((5 * 0.1 + 13 * 0.2) / 18)
    assert method_orderings.accuracy_area(run) == pytest.approx((0.3 * 10 + 0.4 * 10) / 20)
    # GRPO, OPO (no ratio: one on-policy update, log r = 0) and GMPO at GRPO's rate: claims 4 and 9 are judged.
    s, summary = run_tiny(method_orderings, tmp_path, ["grpo", "opo", "gmpo_at_grpo_rate"])
    check_outputs(s, summary, tmp_path, method_orderings.claims)
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm in s.arms:
        rows = [r for r in stored[arm]["0"]["rows"] if r["step"] > 0]
        assert all(r["kl_k3_mean"] >= 0 and r["entropy_mean"] > 0 for r in rows), arm
        assert all(r["log_ratio_abs_max"] == 0 if arm == "opo" else r["log_ratio_abs_max"] >= 0 for r in rows), arm
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [True, True, True, False, True, True, True, True, False]


def test_pass_at_n(tmp_path):
    # Rewarding the Unlikely (2506.02355) on terse countdown: GRPO, the unlikeliness reward (beta_rank 0.25), GRPO at
    # 2 epochs per rollout batch, the null pair on GRPO; groups of 32 (the paper's), held-out pass@k from 64 samples.
    full = pass_at_n.get_study(quick=False)
    arms = {a: (c.algorithm.advantage.name, c.algorithm.unlikeliness, c.algorithm.num_iterations) for a, c in full.arms.items()}
    assert arms == {"grpo": ("group_std", 0.0, 1), "unlikeliness": ("group_std", 0.25, 1),
                    "grpo_epochs2": ("group_std", 0.0, 2), "grpo_resampled": ("group_std", 0.0, 1)}
    assert {(c.train.minibatches, c.algorithm.beta, c.sampling.group_size, c.train.prompts_per_step, c.train.eval_samples,
             c.sampling.temperature, c.reward.names) for c in full.arms.values()} == {(1, 0.0, 32, 8, 64, 1.0, ("countdown",))}
    assert full.protocol_errors() == [] and full.warm_start_seed == 0 and full.null_pair == ("grpo", "grpo_resampled")
    assert sorted(study.trials(full)) == sorted(f"{a}@{lr:g}" for a in ("grpo", "unlikeliness", "grpo_epochs2")
                                                for lr in full.learning_rates)
    assert study.followers(full) == {"grpo_resampled": ("grpo", 1.0)}
    # The terse prompt is the task's problem, split and answer; several expressions are right.
    task = full.arms["grpo"].task
    terse, plain = task.sources(0)[1][3], super(pass_at_n.TerseCountdownConfig, task).sources(0)[1][3]
    assert terse == {**plain, "prompt": ",".join(map(str, plain["numbers"])) + f">{plain['target']}:"}
    a, b, c = terse["numbers"]
    ok = [functions.countdown(terse["prompt"], e, terse) for e in (terse["solution"], f"({a}+{b})+{c}", f"{c}+({b}+{a})")]
    assert ok[0] == 1.0 and ok[1] == ok[2]
    s, summary = run_tiny(pass_at_n, tmp_path, arms=("grpo", "unlikeliness", "grpo_epochs2"))
    check_outputs(s, summary, tmp_path, pass_at_n.claims)
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for arm in s.arms:
        evals = [r for r in stored[arm]["0"]["rows"] if "eval/accuracy_greedy" in r]
        assert all(0 <= r[f"eval/pass@{k}"] <= 1 for r in evals for k in (2, 4, 8, 16, 32, 64)), arm
        assert all(r["eval/accuracy_sampled"] <= r["eval/pass@2"] <= r["eval/pass@64"] for r in evals), arm
    table = (tmp_path / "results" / "table.md").read_text()
    assert "| warm start (step 0) |" in table and "N=64" in table
    assert (tmp_path / "results" / "pass_at_n.png").read_bytes()[:4] == b"\x89PNG"
    assert [c["verdict"] == "not_run" for c in summary["claims"]] == [False, False, False]
