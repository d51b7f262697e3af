"""Command line: `python -m grpo_jax.train --config experiments/configs/NAME.py --set key.path=value ...`.

An experiment config is a Python file whose `get_config()` returns a `grpo_jax.config.Config`
(config as code); `--set` overrides any field, parsed by the field's type. A config builds on
another of its folder by a relative import (`from .gsm8k import get_config as base`), with no
sys.path edits. A run resumes from the latest intact checkpoint in `train.out_dir` if there is one
(grpo_jax/run.py); Ctrl-C or SIGTERM saves the step in flight and exits with 130 or 143. Over several
processes (hosts), every process runs the same command with `--distributed` (a cluster JAX detects: TPU
VM pods, SLURM) or `--coordinator HOST:PORT --num-processes N --process-id I` (grpo_jax/distributed.py).
"""

import argparse
import errno
import hashlib
import importlib.util
import pathlib
import sys
import types

from grpo_jax import distributed
from grpo_jax.config import Config, override


def _config_package(directory: pathlib.Path) -> str:
    """The name of a package standing for a config folder (created once): config files load as its
    modules, so `from .base import get_config` finds base.py beside them."""
    name = "grpo_jax_configs_" + hashlib.sha256(str(directory).encode()).hexdigest()[:12]
    if name not in sys.modules:
        package = types.ModuleType(name, f"the config folder {directory}")
        package.__path__ = [str(directory)]
        sys.modules[name] = package
    return name


def load_config(path: str | pathlib.Path, kind: type = Config):
    """The Config (or other `kind`, e.g. evaluate.EvalConfig) that `get_config()` of the Python file
    `path` returns. The file runs once per content in a process (what it registers, e.g. a reward, is
    registered once)."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"--config {path}: no such file (configs live in experiments/configs/)")
    name = f"{_config_package(path.parent)}.{path.stem}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    module = sys.modules.get(name)
    if module is not None and not hasattr(module, "__digest__"):  # imported by a sibling config just now
        module.__digest__ = digest
    if getattr(module, "__digest__", None) != digest:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module.__digest__ = digest
        sys.modules[name] = module  # the module a sibling's relative import of it finds
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    if not hasattr(module, "get_config"):
        raise AttributeError(f"{path}: define get_config() returning a {kind.__module__}.{kind.__name__}")
    cfg = module.get_config()
    if not isinstance(cfg, kind):
        raise TypeError(f"{path}: get_config() returned {type(cfg).__name__}, not a {kind.__name__}")
    return cfg


def parse_args(argv=None) -> Config:
    """The run's Config; with the launch flags of several processes, joins them first
    (`grpo_jax.distributed`)."""
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.train", description=__doc__)
    parser.add_argument("--config", required=True, help="experiment file defining get_config()")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a field, e.g. --set algorithm.preset=gspo --set train.steps=100",
    )
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    distributed.initialize(parser, args)
    return override(load_config(args.config), args.set)


def main(argv=None):
    from grpo_jax import run, trainer
    from grpo_jax import train_step as ts

    try:  # the config's own errors (a field, a shape, a path) end in their message, not a traceback
        cfg = parse_args(argv)
        trainer.check(cfg)
        ts.check(cfg)
    except (ValueError, TypeError, AttributeError, FileNotFoundError) as e:
        sys.exit(f"python -m grpo_jax.train: error: {e}")
    try:
        run.train(cfg)
    except run.Stop:  # the driver has said what it saved
        sys.exit(130)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        sys.exit(f"python -m grpo_jax.train: error: {e.strerror}")  # one sentence, not orbax's threads' noise
    except KeyboardInterrupt:  # while starting (loading, compiling): no step to save
        print("\npython -m grpo_jax.train: interrupted while starting, before any step; nothing new was saved. "
              "Rerun the same command to start (or resume)", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
