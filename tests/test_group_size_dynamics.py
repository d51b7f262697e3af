"""experiments/group_size_dynamics.py and its parts: the softmax-bandit toy's exact expected GRPO gradient
(against a sum over every group, each differentiated numerically, and against Monte Carlo), its linear
theory (against its own exact dynamics), the reward-curve fits (recovering known parameters), the toy-only
study's output contract, the language-model analysis on synthetic runs whose truth is known, and the
--lm path through the study harness at a tiny size."""

import dataclasses
import itertools
import json
import math
import pathlib
import sys

import numpy as np
import pytest
from scipy import stats

from grpo_jax.config import override

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "experiments"))

import group_size_dynamics as gsd  # noqa: E402
import reward_curves as rc  # noqa: E402
import softmax_bandit as sb  # noqa: E402
import study  # noqa: E402

BANDIT = sb.Bandit(answers=4, correct=1, p0=0.3)
THETA, OLD, REF = np.array([0.4, -0.2, 0.1, -0.5]), np.array([0.1, 0.2, -0.1, -0.3]), np.array([0.0, 0.3, 0.2, -0.1])


def group_loss(theta, answers, alg: sb.Grpo) -> float:
    """GRPO's loss on one group, written out from docs/algorithms.md (group_std with ddof=1, ppo_clip,
    k3 to REF, mean over completions)."""
    pi, old, ref = sb.softmax(theta), sb.softmax(OLD), sb.softmax(REF)
    r = BANDIT.rewards[answers]
    std = r.std(ddof=1)
    adv = (r - r.mean()) / (std + alg.adv_eps) if std > 0 else np.zeros_like(r)
    ratio = pi[answers] / old[answers]
    clipped = np.clip(ratio, 1 - alg.eps_low, 1 + alg.eps_high)
    k3 = ref[answers] / pi[answers] - np.log(ref[answers] / pi[answers]) - 1
    return float(np.mean(-np.minimum(ratio * adv, clipped * adv) + alg.beta * k3))


@pytest.mark.parametrize("g", [2, 3, 5])
def test_expected_grad_is_the_sum_over_every_group(g):
    """The closed form = sum over every multiset of G answers of its multinomial probability times the
    central-difference gradient of that group's loss; ratios of THETA/OLD lie on both sides of the clip."""
    alg = sb.Grpo(group_size=g, beta=0.3, eps_low=0.1, eps_high=0.1)
    ratio = sb.softmax(THETA) / sb.softmax(OLD)
    assert (ratio > 1.1).any() and (ratio < 0.9).any()
    total = np.zeros(BANDIT.answers)
    for answers in itertools.combinations_with_replacement(range(BANDIT.answers), g):
        answers = np.asarray(answers)
        counts = np.bincount(answers, minlength=BANDIT.answers)
        prob = stats.multinomial.pmf(counts, g, sb.softmax(OLD))
        h = 1e-6
        grad = [(group_loss(THETA + h * e, answers, alg) - group_loss(THETA - h * e, answers, alg)) / (2 * h)
                for e in np.eye(BANDIT.answers)]
        total += prob * np.asarray(grad)
    np.testing.assert_allclose(sb.expected_grad(THETA, OLD, REF, BANDIT, alg), total, atol=1e-8)


def test_expected_grad_matches_monte_carlo():
    """`sampled_grad`'s per-group gradients (what a run computes) average to the exact expectation within
    4.5 standard errors per component (400k groups of 4)."""
    alg = sb.Grpo(group_size=4, beta=0.3)
    rng = np.random.default_rng(0)
    answers = rng.choice(BANDIT.answers, size=(400_000, 4), p=sb.softmax(OLD))
    grads = sb.group_grads(THETA, OLD, REF, BANDIT, alg, answers)
    se = grads.std(0) / math.sqrt(len(grads))
    exact = sb.expected_grad(THETA, OLD, REF, BANDIT, alg)
    assert np.all(np.abs(grads.mean(0) - exact) < 4.5 * se), (grads.mean(0), exact, se)
    assert np.abs(exact).max() > 20 * se.max()  # the test can tell a wrong expectation from noise


def test_group_weight():
    """s_G(p): G=2 has one informative outcome (k=1, advantages +-0.5/std, std = 1/sqrt 2); G -> infinity
    tends to sqrt(p(1-p)) from below."""
    p = 0.3
    assert sb.group_weight(p, sb.Grpo(group_size=2)) == pytest.approx(2 * p * (1 - p) * 0.25 / (0.5 ** 0.5 + 1e-6))
    weights = [sb.group_weight(p, sb.Grpo(group_size=g)) for g in (2, 4, 16, 256)]
    assert np.all(np.diff(weights) > 0) and weights[-1] < math.sqrt(p * (1 - p)) < weights[-1] * 1.01
    assert sb.group_weight(p, sb.Grpo(group_size=None)) == math.sqrt(p * (1 - p))


def test_symmetric_start_stays_symmetric_and_reaches_the_fixed_point():
    bandit, alg = sb.Bandit(), sb.Grpo(group_size=8, beta=0.5)
    p, states = sb.run(bandit, alg, sb.Adam(0.05), 400)
    assert p[0] == pytest.approx(bandit.p0) and p[-1] == pytest.approx(sb.fixed_point(bandit, alg), abs=1e-6)
    assert len(states) == 400
    assert sb.drift(sb.fixed_point(bandit, alg), bandit, alg) == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="beta > 0"):
        sb.fixed_point(bandit, sb.Grpo(beta=0))


def test_linear_theory_predicts_the_exact_dynamics():
    """SGD with momentum 0.5 diverges just past 2 (1 + mu) / kappa and not just below it; one rollout batch of
    n updates from a stale theta_old multiplies the displacement by `batch_multiplier`."""
    bandit, alg = sb.Bandit(), sb.Grpo(group_size=8, beta=0.5)
    limit = sb.stability_limit(0.5) / sb.stiffness(bandit, alg)
    for factor, grows in ((0.98, False), (1.02, True)):
        assert gsd.diverges(gsd.displaced(sb.Sgd(factor * limit, 0.5), alg, 600)) is grows
    a, b = sb.gains(bandit, alg)
    for lr, n in ((2.0, 3), (8.0, 2)):
        dev = gsd.displaced(sb.Sgd(lr), sb.Grpo(group_size=8, beta=0.5, updates_per_batch=n), 1, du=1e-6)
        assert dev[1] / dev[0] == pytest.approx(sb.batch_multiplier(lr, a, b, n), rel=1e-3, abs=1e-4)


def test_fits_recover_known_parameters():
    t = np.arange(300.0)
    rng = np.random.default_rng(0)
    for truth in ((0.8, 0.2, 0.05, 0.4), (0.7, 0.2, 0.03, 2.0)):
        y = rc.damped(t, *truth) + rng.normal(0, 0.01, t.size)
        f = rc.fit("damped", t + 5, y)  # t is taken from its first value
        np.testing.assert_allclose(list(f.params.values()), truth, rtol=0.05)
        assert f.rms == pytest.approx(0.01, rel=0.15) and 0.9 < f.r2 <= 1
    y = rc.single_exponential(t, 0.7, 0.2, 0.02) + rng.normal(0, 0.01, t.size)
    single, damped = rc.fit("single_exponential", t, y), rc.fit("damped", t, y)
    np.testing.assert_allclose(list(single.params.values()), (0.7, 0.2, 0.02), rtol=0.05)
    assert damped.rate == pytest.approx(0.02, rel=0.05)  # the overdamped limit
    oscillating = rc.damped(t, 0.8, 0.2, 0.05, 0.3) + rng.normal(0, 0.01, t.size)
    assert rc.fit("damped", t, oscillating).bic < rc.fit("single_exponential", t, oscillating).bic - 100
    assert rc.damped(0.0, 0.8, 0.2, 0.1, 1.0) == pytest.approx(0.2)  # critical damping: the limit formula
    exponent, se = rc.power_law([2, 4, 8, 16], [3 / g for g in (2, 4, 8, 16)])
    assert exponent == pytest.approx(-1) and se == pytest.approx(0, abs=1e-12)


# Short curves fit slowly (the laws' parameters are ill-determined): the fits keep their full length.
TINY_TOY = gsd.ToySize(trajectory=40, fit=300, bisection=4, threshold=60, adam=300, refresh=20, monte_carlo=80)


def test_toy_only_run_writes_the_output_contract(tmp_path, monkeypatch):
    """Without --lm: summary.json, table.md and toy.png, every claim with a rule; the language-model claims
    not_run (never a number), the toy ones scored."""
    monkeypatch.setattr(gsd, "TOY_SIZE", TINY_TOY)
    summary = gsd.main(["--results-dir", str(tmp_path)])
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["claims"]) == 9 and len(summary["git"]["commit"]) == 40
    for c in summary["claims"]:
        assert c["verdict"] in study.VERDICTS and c["measured"] and c["rule"] and c["source"].startswith("arXiv 2")
        lm = "(language model)" in c["claim"] or c["claim"].startswith("2-GRPO")
        assert (c["verdict"] == "not_run") is lm and (c["measured"] == gsd.LM_NOT_RUN) is lm
    table = (tmp_path / "table.md").read_text()
    assert all(c["claim"] in table for c in summary["claims"]) and "## The toy" in table
    assert (tmp_path / "toy.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        gsd.main(["--seeds", "0", "--results-dir", str(tmp_path)])  # --seeds is for the language-model runs


def synthetic_results(plateau_g2: float, steps: int = 60, seeds=(0, 1, 2)) -> study.Results:
    """Fake language-model runs of the fixed-prompts scan (no training): each G follows the same damped
    curve (G=2's plateau `plateau_g2`), its training reward and held-out accuracy with noise of variance
    1e-3 x 2 / G; G=2 runs in 20% of G=16's wall time."""
    arms = {g: gsd.scan_arm(g, gsd.PROMPTS) for g in gsd.GROUP_SIZES}
    config = gsd.get_study(quick=False).arms
    results = study.Results()
    for g, arm in arms.items():
        for seed in seeds:
            rng = np.random.default_rng(100 * g + seed)
            cfg = study.with_seed(override(config[arm], [f"train.steps={steps}"]), seed, pathlib.Path(f"/fake/{arm}/{seed}"))
            curve = rc.damped(np.arange(steps + 1), plateau_g2 if g == 2 else 0.6, 0.2, 0.08, 1.5)
            noise = rng.normal(0, math.sqrt(2e-3 / g), (2, steps + 1))
            rows = [{"step": 0, "eval/accuracy_greedy": 0.2}] + [
                {"step": i, "reward/mean": curve[i] + noise[0, i], "eval/accuracy_greedy": curve[i] + noise[1, i],
                 "groups/gen_rounds": 1, "completion/length_mean": 3.0} for i in range(1, steps + 1)]
            rows[-1]["time/run_s"] = 10.0 if g == 2 else 50.0
            results.setdefault(arm, []).append(study.Run(arm, seed, cfg, study.with_axes(rows, cfg, {})))
    return results


def lm_verdicts(results) -> dict:
    return {c["claim"]: c["verdict"] for c in gsd.claims(results) if "(language model)" in c["claim"]
            or c["claim"].startswith("2-GRPO")}


def test_lm_claims_follow_their_rules_on_synthetic_runs(tmp_path, monkeypatch):
    """The language-model analysis on runs whose truth is known: the same damped curve at every G with
    noise ~ 1/G reads reproduced (law, invariance, 1/G, 2-GRPO); a G=2 plateau 0.2 lower breaks invariance
    and 2-GRPO's accuracy. With the --lm harness's writer: the table, plots and figures."""
    monkeypatch.setattr(gsd, "TOY_SIZE", TINY_TOY)
    same = synthetic_results(0.6)
    assert set(lm_verdicts(same).values()) == {"reproduced"}
    worse = lm_verdicts(synthetic_results(0.4))
    assert worse[f"{gsd.INVARIANCE} (language model)"] == "not_reproduced"
    assert worse["2-GRPO: G=2 matches G=16 with 1/8 of the rollouts and over 70% less training time"] == "partial"
    s = dataclasses.replace(gsd.get_study(quick=False), seeds=(0, 1, 2))
    s = dataclasses.replace(s, arms={a: runs[0].config for a, runs in same.items()}, plots=gsd.plots(same))
    stored = {"selection": {}, "runs": {a: {str(r.seed): {"rows": r.rows, "resumed": False, "wall_seconds": 1.0}
                                            for r in runs} for a, runs in same.items()}}
    summary = study.write(s, gsd.claims, stored, tmp_path, 1.0, [[0.0] * 3] * 2, {}, study.git_state())
    row = {k: v["mean"] for k, v in summary["table"]["g4_p32"].items()}
    assert row["R^2, damped law"] > 0.9 and row["rollouts sampled (thousands)"] == pytest.approx(60 * 32 * 4 / 1e3)
    assert row["training reward fluctuation (residual variance x 1e3)"] == pytest.approx(0.5, rel=0.5)
    assert [p.file for p in s.plots] == ["scan_fixed_prompts", "two_grpo_vs_tokens"]
    for png in ("scan_fixed_prompts", "two_grpo_vs_tokens", "toy", "lm_fits", "lm_fluctuation"):
        assert (tmp_path / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    assert "## The toy" in (tmp_path / "table.md").read_text()


def test_lm_study_runs_through_the_harness_at_a_tiny_size(tmp_path, monkeypatch):
    """--lm's path end to end: the --quick study's two end arms (G=2 and G=16, 4 prompts a step: 8 rows
    split over the 8 test devices), one seed of 2 steps after a 2-step warm start, through study.run with the script's own claims, table and figures.
    Each arm keeps its group size; every language-model claim whose arms ran is scored (not not_run)."""
    monkeypatch.setattr(gsd, "TOY_SIZE", TINY_TOY)
    s = gsd.get_study(quick=True).only(gsd.ENDS)
    shrink = ["train.steps=2", "train.prompts_per_step=4", "train.eval_prompts=8", "train.eval_every=1"]
    s = dataclasses.replace(s, seeds=(0,), arms={a: override(c, shrink) for a, c in s.arms.items()},
                            warm_start=dataclasses.replace(s.warm_start, max_steps=2, eval_every=1, batch_size=8))
    summary = study.run(s, gsd.claims, tmp_path / "results", tmp_path / "runs")
    stored = study.read_curves(tmp_path / "results" / study.CURVES)["runs"]
    for g, arm in zip((2, 16), gsd.ENDS):
        rows = study.with_axes(stored[arm]["0"]["rows"], s.arms[arm], {})
        assert 0 < rows[-1]["tokens"] <= 2 * 4 * g * s.arms[arm].sampling.max_new_tokens  # 2 steps of 4 prompts x G
        assert s.arms[arm].sampling.group_size == g
    lm = [c for c in summary["claims"] if "(language model)" in c["claim"] or c["claim"].startswith("2-GRPO")]
    assert lm and all(c["verdict"] in study.VERDICTS for c in summary["claims"])
    needs_only_the_ends = [c for c in lm if "not run: the arms" not in c["measured"]]
    assert needs_only_the_ends and all(c["verdict"] != "not_run" for c in needs_only_the_ends)
    table = (tmp_path / "results" / "table.md").read_text()
    assert "## The toy" in table and all(f"| {a} " in table for a in gsd.ENDS)
    for png in ("toy", "lm_fits", "lm_fluctuation"):
        assert (tmp_path / "results" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
