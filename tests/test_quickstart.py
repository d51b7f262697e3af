"""The README's main job, run as a fresh user would (one CPU device), meets the learning target.

Minutes of CPU, so marked slow. Its wall time is recorded in summary.json and reported, not asserted.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]


@pytest.mark.slow
def test_quickstart_gains_twenty_points_of_held_out_accuracy(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as from a clean clone
    script = ROOT / "experiments" / "quickstart.py"
    subprocess.run([sys.executable, str(script), "--results-dir", str(tmp_path / "results")],
                   cwd=tmp_path, env=env, check=True, timeout=1200)  # cwd: runs/quickstart lands in tmp_path
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert 0.2 <= summary["accuracy_before"] <= 0.5, summary  # the warm start leaves room for RL
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.20, summary
    assert (tmp_path / "results" / "curves.png").stat().st_size > 0
    assert (tmp_path / "runs" / "quickstart" / "metrics.jsonl").exists()
