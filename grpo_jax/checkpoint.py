"""Checkpoints with orbax, verified: the whole train state plus the host-side position of the run.

A checkpoint holds two items: `state` (any pytree of arrays: params, optimizer state, step
counters, the raw random key) written by every process as one global array set, and `meta` (a
small JSON dict: the data position, the run's config and anything else the host loop needs to
continue the same trajectory). Restoring takes an abstract target (shapes, dtypes, shardings) so
that arrays land directly with their shardings on the current mesh.

A save is complete once the SHA-256 of every file orbax wrote is in `<step>/checksums.json`; only
then are checkpoints beyond the newest `keep` deleted, so a kill at any moment leaves the previous
complete one. `latest_intact` walks back from the newest: one whose files no longer match (a flipped
bit, a truncated or missing file) is renamed `<step>.damaged` with a warning, and the next older one
is tried. Nothing is ever deleted that cannot be proven an unfinished save: orbax renames a save into
`<step>/` only once it is whole (a save cut short leaves only its temporary directory, which orbax
removes), so a step without checksums was finished, by a grpo_jax that wrote none yet or by a save
stopped before its checksums: it is checksummed then and used.

Over several processes every process saves and restores its shards of the global arrays (orbax);
process 0 writes the checksums and judges which checkpoint is intact, for all.
"""

import errno
import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from grpo_jax import models, sharding

CHECKSUMS = "checksums.json"
NO_CHECKSUMS = f"no {CHECKSUMS}"  # whole (orbax finished it), not yet checksummed: `latest_intact` checksums it
log = logging.getLogger(__name__)


def _disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or an exception it was raised from, is "no space left on device"."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _digests(directory: pathlib.Path) -> dict[str, str]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    out = {}
    for p in files:
        with open(p, "rb") as f:
            out[str(p.relative_to(directory))] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


class Checkpointer:
    """Saves every `every` steps (and whenever `force`d, e.g. on exit) and keeps the last `keep`."""

    def __init__(self, directory: str | pathlib.Path, every: int, keep: int):
        if every < 1 or keep < 1:
            raise ValueError(
                f"checkpoint interval and count must be >= 1, got every={every}, keep={keep}; "
                "set train.checkpoint_every / train.keep_checkpoints"
            )
        self.every, self.keep = every, keep
        self.directory = pathlib.Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            # Retention is ours. A save cut short by a kill leaves orbax's temporary directory: removed
            # before this manager's first save.
            options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False, cleanup_tmp_directories=True),
            item_names=("state", "meta"),
        )

    def save(self, step: int, state: Any, meta: dict, force: bool = False) -> bool:
        if (not force and step % self.every) or step in self.manager.all_steps():
            return False
        try:
            self.manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                force=True,
            )
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 (orbax wraps the OSError; its cause chain says what failed)
            if _disk_full(e):
                older = [s for s in self.all_steps() if s != step]
                raise OSError(errno.ENOSPC, f"the disk of {self.directory} is full: checkpoint step {step} was not "
                              f"saved ({'the last intact one is step ' + str(older[-1]) if older else 'none is'}); "
                              "free space or set train.out_dir elsewhere, then rerun the same command to resume") from None
            raise
        if jax.process_index() == 0:
            self._write_checksums(step)
        for old in self.all_steps()[: -self.keep]:  # on every process: orbax deletes behind a barrier
            self.manager.delete(old)
        return True

    def _write_checksums(self, step: int) -> None:
        path = self.directory / str(step)
        tmp = path / (CHECKSUMS + ".tmp")
        tmp.write_text(json.dumps(_digests(path), indent=0))
        os.replace(tmp, path / CHECKSUMS)  # atomic: the checkpoint is complete from here on

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def problem(self, step: int) -> str | None:
        """None if checkpoint `step` is complete and every file matches its checksum, else what is wrong."""
        path = self.directory / str(step)
        try:
            expected = json.loads((path / CHECKSUMS).read_text())
        except FileNotFoundError:
            return NO_CHECKSUMS
        except ValueError:
            return f"{CHECKSUMS} is unreadable"
        actual = _digests(path)
        for name, digest in expected.items():
            if name not in actual:
                return f"{name} is missing"
            if actual[name] != digest:
                return f"{name} does not match its checksum"
        return None

    def latest_intact(self) -> int | None:
        """The newest complete checkpoint whose files match their checksums (None: there is none yet).

        Incomplete ones above it are deleted and damaged ones renamed `<step>.damaged`, with a warning.
        Raises when checkpoints exist but every one is damaged: starting over would discard the run.
        Over several processes, process 0 checks and moves the files and the others take its verdict.
        """
        step, damaged = self._verify() if jax.process_index() == 0 else (None, "")
        if jax.process_count() > 1:  # also a barrier: no process reloads before process 0 has moved the files
            verdict = int(multihost_utils.broadcast_one_to_all(np.int32(-2 if damaged else -1 if step is None else step)))
            step = None if verdict < 0 else verdict
            damaged = damaged or ("see process 0's error" if verdict == -2 else "")
        if damaged:
            raise RuntimeError(f"every checkpoint in {self.directory} is damaged ({damaged}): restore them from a "
                               "backup, or delete the directory to start the run over")
        self.manager.reload()
        return step

    def _verify(self) -> tuple[int | None, str]:
        """`latest_intact`'s work, on process 0: (the step, or None), or (None, what damaged them all)."""
        problems = {}
        for step in reversed(self.all_steps()):
            problems[step] = self.problem(step)
            if problems[step] == NO_CHECKSUMS:  # whole: checksummed now, from the files it is taken from
                log.warning("checkpoint step %d in %s has no %s (saved by an older grpo_jax, or stopped before its "
                            "checksums): orbax finished it, so it is whole; checksumming it now", step,
                            self.directory, CHECKSUMS)
                self._write_checksums(step)
                problems[step] = None
            if problems[step] is None:
                break
        damaged = {s: p for s, p in problems.items() if p is not None}
        if damaged and None not in problems.values():
            return None, "; ".join(f"step {s}: {p}" for s, p in damaged.items())
        for step, why in problems.items():
            if why is not None:
                target = self.directory / f"{step}.damaged"
                log.warning("checkpoint step %d in %s is damaged (%s): falling back to an older one; "
                            "moved to %s", step, self.directory, why, target)
                shutil.rmtree(target, ignore_errors=True)
                (self.directory / str(step)).rename(target)
        return next((s for s, p in problems.items() if p is None), None), ""

    def read_meta(self, step: int) -> dict:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def restore(self, target: Any, step: int) -> tuple[Any, dict]:
        """Restores (state, meta) of `step` into the structure/shardings of `target` (None: as saved,
        on the default device)."""
        abstract = None if target is None else jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
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
    files of `tokenizer_dir` (the source checkpoint) copied beside it when given. Called on every
    process: the params are gathered to each host (one leaf at a time), and process 0 writes."""
    params = sharding.gather(params)
    if jax.process_index() != 0:
        return
    models.save_hf(model_cfg, params, str(path))
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        if (pathlib.Path(tokenizer_dir) / name).is_file():
            shutil.copy(pathlib.Path(tokenizer_dir) / name, pathlib.Path(path) / name)
