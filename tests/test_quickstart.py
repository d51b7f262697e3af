"""The quickstart meets its targets (minutes of CPU: marked slow) and its committed summary says so."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
SUMMARY = ROOT / "experiments" / "results" / "quickstart" / "summary.json"


def check(summary: dict) -> None:
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.20, summary
    assert 0.2 <= summary["accuracy_before"] <= 0.5, summary  # the warm start leaves room for RL
    assert summary["wall_seconds"] <= 300, summary


def test_committed_summary_meets_the_targets():
    check(json.loads(SUMMARY.read_text()))
    assert (SUMMARY.parent / "curves.png").stat().st_size > 0


@pytest.mark.slow
def test_quickstart_from_scratch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as from a clean clone
    subprocess.run([sys.executable, str(ROOT / "experiments" / "quickstart.py")], cwd=ROOT, env=env, check=True, timeout=900)
    check(json.loads(SUMMARY.read_text()))
