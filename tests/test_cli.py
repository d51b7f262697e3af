"""The command line: config files, --set parsing by field type, presets, typo suggestions."""

import pathlib

import pytest

from grpo_jax.config import Config, override
from grpo_jax.train import load_config, parse_args

ROOT = pathlib.Path(__file__).parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"


def test_values_parse_by_field_type():
    cfg = parse_args([
        "--config", str(QUICKSTART),
        "--set", "train.steps=7", "--set", "optim.learning_rate=2.5e-4", "--set", "train.export_hf=true",
        "--set", "sampling.stop_tokens=5,6", "--set", "algorithm.delta=none", "--set", "reward.names=exact",
        "--set", "task.max_value=99",
    ])
    assert cfg.train.steps == 7 and cfg.optim.learning_rate == 2.5e-4 and cfg.train.export_hf is True
    assert cfg.sampling.stop_tokens == (5, 6) and cfg.algorithm.delta is None
    assert cfg.reward.names == ("exact",) and cfg.task.max_value == 99


def test_preset_applies_first_and_explicit_fields_win():
    cfg = override(load_config(QUICKSTART), ["algorithm.eps_high=0.3", "algorithm.preset=dapo"])
    assert cfg.algorithm.loss == "ppo_clip" and cfg.algorithm.dynamic_sampling and cfg.algorithm.eps_high == 0.3


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("train.stpes=3", "did you mean 'steps'"),
        ("optim.learning_rat=1", "did you mean 'learning_rate'"),
        ("trian.steps=3", "did you mean 'train'"),
        ("train.steps=three", "expected a value of type int"),
        ("train.export_hf=maybe", "expected true or false"),
        ("train.steps", "expected key=value"),
        ("algorithm.preset=gspp", "known: "),
        ("algorithm.loss=nope", "AlgorithmConfig.loss='nope' is unknown"),
    ],
)
def test_user_errors_name_the_field(assignment, message):
    with pytest.raises(ValueError, match=message):
        override(load_config(QUICKSTART), [assignment])


def test_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_config(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="define get_config"):
        load_config(bad)


def test_every_experiment_config_builds():
    for path in sorted((ROOT / "experiments" / "configs").glob("*.py")):
        assert isinstance(load_config(path), Config), path
