"""Command line: `python -m grpo_jax.train --config experiments/configs/NAME.py --set key.path=value ...`.

An experiment config is a Python file whose `get_config()` returns a `grpo_jax.config.Config`
(config as code); `--set` overrides any field, parsed by the field's type. A run resumes from the
latest intact checkpoint in `train.out_dir` if there is one (grpo_jax/run.py); Ctrl-C or SIGTERM
saves the step in flight and exits with 130 or 143.
"""

import argparse
import importlib.util
import pathlib
import sys

from grpo_jax.config import Config, override


def load_config(path: str | pathlib.Path) -> Config:
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config {path}: no such file (configs live in experiments/configs/)")
    spec = importlib.util.spec_from_file_location(f"grpo_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"--config {path}: define get_config() returning a grpo_jax.config.Config")
    cfg = module.get_config()
    if not isinstance(cfg, Config):
        raise TypeError(f"--config {path}: get_config() returned {type(cfg).__name__}, not a Config")
    return cfg


def parse_args(argv=None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.train", description=__doc__)
    parser.add_argument("--config", required=True, help="experiment file defining get_config()")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a field, e.g. --set algorithm.preset=gspo --set train.steps=100",
    )
    args = parser.parse_args(argv)
    return override(load_config(args.config), args.set)


def main(argv=None):
    from grpo_jax import run

    try:
        run.train(parse_args(argv))
    except KeyboardInterrupt:  # the driver has said what it saved
        sys.exit(130)


if __name__ == "__main__":
    main()
