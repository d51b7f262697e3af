"""Any checkpointed step of a run as a Hugging Face directory (config.json, safetensors, the tokenizer):

    python -m grpo_jax.export --config experiments/configs/NAME.py [--set ...] [--step N] [--out DIR]

The run's own command (its config and `--set`s), plus the step (default: the newest intact one); the
directory defaults to `train.out_dir/hf-step-N`. A config that would make the checkpoint another run's
is refused, as on resume, before any weight loads. Under LoRA the adapters are merged into the base, as
`train.export_hf` does for the final policy. Over several processes, every process runs the same command
with `grpo_jax.train`'s launch flags; process 0 writes.
"""

import argparse
import dataclasses
import pathlib
import sys

from grpo_jax import checkpoint, distributed, run, trainer
from grpo_jax.config import Config, ModelOptions, override
from grpo_jax.train import load_config


def open_step(cfg: Config, step: int | None = None) -> tuple[checkpoint.Checkpointer, int]:
    """The run's checkpointer (close it) and its intact checkpoint `step` (None: the newest), whose config
    is checked against `cfg` as on resume: before any weight loads or anything compiles."""
    trainer.check(cfg)
    resolved = cfg if cfg.model is not None else dataclasses.replace(
        cfg, model=trainer.model_config(cfg), model_path="", model_options=ModelOptions())  # as the Trainer saves it
    tr = cfg.train
    ckpt = checkpoint.Checkpointer(pathlib.Path(tr.out_dir) / "checkpoints", tr.checkpoint_every, tr.keep_checkpoints)
    whole = lambda s: ckpt.problem(s) in (None, checkpoint.NO_CHECKSUMS)  # noqa: E731  (as latest_intact takes it)
    try:
        if step is None:
            step = ckpt.latest_intact()  # verified there
            intact = step is not None
        else:
            intact = step in ckpt.all_steps() and whole(step)
        if not intact:
            raise ValueError(f"{ckpt.directory} holds no intact checkpoint of step {step}; its intact steps: "
                             f"{[s for s in ckpt.all_steps() if whole(s)]}")
        run.check_resume(ckpt.read_meta(step)["config"], resolved, ckpt.directory)
    except BaseException:
        ckpt.close()
        raise
    return ckpt, step


def export_step(cfg: Config, step: int | None = None, out: str | pathlib.Path | None = None, params=None,
                **data) -> pathlib.Path:
    """Writes checkpoint `step` of the run `cfg` (params and data as `run.train` takes them) as an HF
    directory; returns its path."""
    ckpt, step = open_step(cfg, step)
    try:
        t = trainer.Trainer(cfg, params, **data)
        t.restore(ckpt, step)
    finally:
        ckpt.close()
    out = pathlib.Path(out) if out else pathlib.Path(cfg.train.out_dir) / f"hf-step-{step}"
    checkpoint.export_hf(t.cfg.model, t.export_params(), out, tokenizer_dir=t.source_path)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.export", description=__doc__)
    parser.add_argument("--config", required=True, help="the run's experiment file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the run's overrides")
    parser.add_argument("--step", type=int, help="the checkpointed step (default: the newest intact one)")
    parser.add_argument("--out", help="the directory to write (default: train.out_dir/hf-step-N)")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    distributed.initialize(parser, args)
    try:
        out = export_step(override(load_config(args.config), args.set), args.step, args.out)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"python -m grpo_jax.export: error: {e}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
