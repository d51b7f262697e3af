"""Checkpoints with orbax: the whole train state plus the host-side position of the run.

A checkpoint holds two items: `state` (any pytree of arrays: params, optimizer state, step
counters, the raw random key) written by every process as one global array set, and `meta` (a
small JSON dict: the data position and anything else the host loop needs to continue the same
trajectory). Restoring takes an abstract target (shapes, dtypes, shardings) so that arrays land
directly with their shardings on the current mesh.
"""

import pathlib
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves every `every` steps (and whenever `force`d, e.g. on exit) and keeps the last `keep`."""

    def __init__(self, directory: str | pathlib.Path, every: int, keep: int):
        if every < 1 or keep < 1:
            raise ValueError(
                f"checkpoint interval and count must be >= 1, got every={every}, keep={keep}; "
                "set train.checkpoint_every / train.keep_checkpoints"
            )
        self.every = every
        self.manager = ocp.CheckpointManager(
            pathlib.Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False),
            item_names=("state", "meta"),
        )

    def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
        if (not force and step % self.every) or step in self.manager.all_steps():
            return False
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        self.manager.wait_until_finished()
        return True

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores (state, meta) of `step` (default: latest) into the structure/shardings of `target`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.manager.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return out.state, out.meta

    def close(self):
        self.manager.close()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


def export_hf(model_cfg, params, path: str | pathlib.Path, tokenizer_dir: str | pathlib.Path = "") -> None:
    """Writes the policy as a Hugging Face directory (config.json + safetensors), with the tokenizer
    files of `tokenizer_dir` (the source checkpoint) copied beside it when given."""
    from grpo_jax import models

    models.save_hf(model_cfg, jax.device_get(params), str(path))
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        if (pathlib.Path(tokenizer_dir) / name).is_file():
            shutil.copy(pathlib.Path(tokenizer_dir) / name, pathlib.Path(path) / name)
