"""A variant added outside the library in one file (experiments/configs/topr.py, the README's example):
it trains and resumes through the CLI from its config file, the registry-wide tests check it against
its own float64 reference, and docs/presets.md lists it, with no other file edited."""

import json
import subprocess
import sys
import pathlib

import pytest

import test_algorithms_losses as losses_tests
import test_algorithms_properties as property_tests
from grpo_jax.algorithms import LOSSES, PRESETS
from grpo_jax.algorithms.presets_doc import presets_markdown
from grpo_jax.config import AlgorithmConfig
from grpo_jax.train import load_config

ROOT = pathlib.Path(__file__).parents[1]
TOPR = ROOT / "experiments" / "configs" / "topr.py"


@pytest.fixture(scope="module")
def topr():
    """The file loaded as the CLI loads it (registering its loss and preset), unregistered afterwards."""
    before = set(sys.modules)
    cfg = load_config(TOPR)
    yield cfg
    del LOSSES["topr"], PRESETS["topr"]
    for name in set(sys.modules) - before:  # a later load registers it again
        del sys.modules[name]


def test_its_config_selects_it_with_its_parameters(topr):
    assert topr.algorithm.loss.name == "topr" and topr.algorithm.loss.cap == 1.0
    assert AlgorithmConfig.from_preset("topr") == topr.algorithm
    with pytest.raises(ValueError, match=r"algorithm.loss.cap=0.0 \(loss 'topr'\) must be > 0"):
        LOSSES["topr"].params(cap=0.0)


@pytest.mark.parametrize("check", [
    lambda: losses_tests.test_loss_matches_reference(0, "topr"),
    lambda: losses_tests.test_token_level_advantages_match_reference("topr"),
    lambda: property_tests.test_at_ratio_one_every_loss_has_the_reinforce_gradient("topr"),
    lambda: property_tests.test_micro_batches_accumulate_to_the_full_batch(0, "topr"),
    lambda: property_tests.test_masked_tokens_never_matter(0, "topr"),
    lambda: property_tests.test_clip_fractions_count_exactly_the_clipped_units("topr"),
], ids=["reference", "token_advantages", "ratio_one", "micro_batches", "masked_tokens", "clip_fractions"])
def test_the_registry_wide_tests_pass_on_it(topr, check):
    check()


def test_the_docs_list_it(topr):
    doc = presets_markdown()
    assert "| `topr` | cap=1.0 | `cap`: the truncation of a negative completion's importance weight" in doc
    assert "| `topr` | group_std | topr | token_mean | 0.0 |  | TOPR 2503.14286 |" in doc


def test_it_trains_and_resumes_through_the_cli(tmp_path):
    def run(steps):
        cmd = [sys.executable, "-m", "grpo_jax.train", "--config", str(TOPR), "--set", "algorithm.loss.cap=0.5",
               *(f"--set={kv}" for kv in (f"train.steps={steps}", "train.prompts_per_step=8", "train.eval_prompts=8",
                                          "train.checkpoint_every=2", "reward.num_workers=0", "optim.schedule=constant",
                                          f"train.out_dir={tmp_path}", "train.compilation_cache_dir="))]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)

    first = run(2)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.loads((tmp_path / "checkpoints" / "2" / "meta" / "metadata").read_text())["config"]
    assert (saved["algorithm.loss"], saved["algorithm.loss.cap"]) == ("topr", 0.5)
    second = run(3)
    assert second.returncode == 0, second.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 3 and 1 in steps and 2 in steps
