"""Checkpointer: interval and retention, exact restore with shardings, JSON meta, checksums and fallback."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax.checkpoint import Checkpointer
from xla_flags import xla_flags  # tests/xla_flags.py


def _state(x):
    return {"w": jnp.full((8, 4), x, jnp.float32), "step": jnp.int32(x), "key": jax.random.key_data(jax.random.key(x))}


def test_interval_retention_and_force(tmp_path):
    ckpt = Checkpointer(tmp_path, every=2, keep=2)
    saved = [ckpt.save(s, _state(s), {"position": s}) for s in range(1, 7)]
    assert saved == [False, True, False, True, False, True]
    assert ckpt.all_steps() == [4, 6]
    assert ckpt.save(7, _state(7), {"position": 7}, force=True)  # on exit
    assert not ckpt.save(7, _state(7), {"position": 7}, force=True)  # already there: no error
    assert ckpt.all_steps() == [6, 7]


def test_restore_is_exact_and_sharded(tmp_path):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharding = NamedSharding(mesh, P("data"))
    state = _state(3)
    state["w"] = jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding)
    ckpt = Checkpointer(tmp_path, every=1, keep=1)
    ckpt.save(5, state, {"position": [5, 17], "seed": 0})
    restored, meta = Checkpointer(tmp_path, every=1, keep=1).restore(state, 5)
    assert meta == {"position": [5, 17], "seed": 0}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored["w"].sharding == sharding


def _flip_a_bit(step_dir):
    data = max((p for p in (step_dir / "state").rglob("*") if p.parent.name == "d"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[-20] ^= 0x10
    data.write_bytes(bytes(raw))


def test_latest_intact_skips_damage_and_keeps_checkpoints_without_checksums(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, every=1, keep=4)
    for step in (1, 2, 3, 4):
        ckpt.save(step, _state(step), {"position": step})
    assert ckpt.latest_intact() == 4
    # Steps 4 and 3 have no checksums (an older grpo_jax wrote none, or a save stopped between orbax's
    # rename and its checksums): orbax finished them, so they are whole, kept and checksummed.
    (tmp_path / "4" / "checksums.json").unlink()
    (tmp_path / "3" / "checksums.json").unlink()
    assert ckpt.latest_intact() == 4 and (tmp_path / "4" / "checksums.json").exists()
    assert "step 4" in caplog.text and "no checksums.json" in caplog.text
    # A bit of step 4's array data flipped: set aside; step 3 is checksummed and taken.
    _flip_a_bit(tmp_path / "4")
    assert ckpt.latest_intact() == 3 and (tmp_path / "3" / "checksums.json").exists()
    assert "step 4" in caplog.text and "does not match its checksum" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3", "4.damaged"]
    restored, meta = ckpt.restore(_state(0), 3)
    assert meta == {"position": 3} and float(restored["w"][0, 0]) == 3.0


def test_a_save_cut_short_leaves_no_temporary_directory_behind(tmp_path):
    ckpt = Checkpointer(tmp_path, every=1, keep=2)
    ckpt.save(1, _state(1), {"position": 1})
    ckpt.close()
    cut = tmp_path / "3.orbax-checkpoint-tmp"  # what a save killed before orbax's rename leaves (a forced save
    (cut / "state").mkdir(parents=True)  # at exit, off the checkpoint_every grid)
    (cut / "state" / "partial").write_bytes(b"\0" * 64)
    ckpt = Checkpointer(tmp_path, every=1, keep=2)  # the resumed run's: it goes on from step 1
    assert ckpt.latest_intact() == 1
    assert ckpt.save(2, _state(2), {"position": 2})  # orbax's cleanup is done before its first save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"] and ckpt.latest_intact() == 2


def test_latest_intact_refuses_when_every_checkpoint_is_damaged(tmp_path):
    import pytest

    ckpt = Checkpointer(tmp_path, every=1, keep=2)
    assert ckpt.latest_intact() is None  # nothing saved yet: a fresh run
    ckpt.save(1, _state(1), {"position": 1})
    (tmp_path / "1" / "meta" / "metadata").write_text('{"position": 7}')  # edited by hand
    with pytest.raises(RuntimeError, match=r"every checkpoint in .* is damaged \(step 1: meta/metadata does not match"):
        ckpt.latest_intact()


def test_nonfinite_weights_are_refused_at_load_naming_file_and_tensor(tmp_path):
    """A NaN in model.safetensors used to load silently; the run then stopped on non-finite updates
    and blamed the learning rate or the rewards."""
    import pytest
    from safetensors.numpy import load_file, save_file

    from grpo_jax import models

    cfg = models.ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=16, intermediate_size=32,
                             num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
    models.save_hf(cfg, models.init(cfg, jax.random.key(0)), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name][3, 5] = np.nan
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"model.safetensors: tensor {name} holds 1 non-finite value\(s\) \(NaN or "
                                         "inf\\): the checkpoint is damaged"):
        models.load_hf(tmp_path)


RESHARD = """
import sys, numpy as np, jax
from grpo_jax import checkpoint, trainer
from grpo_jax.train import parse_args
t = trainer.Trainer(parse_args(sys.argv[1:]))
ckpt = checkpoint.Checkpointer(t.cfg.train.out_dir + "/checkpoints", 1, 10)
t.restore(ckpt, 2)
one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
whole = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), t.checkpoint_state())
saved, _ = ckpt.restore(whole, 2)  # the values as saved, whole on one device
got = jax.tree.leaves(t.checkpoint_state())
assert len(got) == len(jax.tree.leaves(saved)) and {len(x.sharding.device_set) for x in got} == {4}
for a, b in zip(jax.tree.leaves(saved), got):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
print("restored", len(got), "leaves onto", len(jax.devices()), "devices")
"""


def test_a_run_saved_on_8_devices_resumes_on_4_with_the_same_values(tmp_path):
    """Resharding resume: the checkpoint of an 8-device run restores onto a 4-device mesh bit for bit
    (orbax reads each array into the target's shardings), and the run goes on there."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parents[1]
    args = ["--config", str(root / "experiments" / "configs" / "quickstart.py"), *(
        a for s in ("model.num_layers=1", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
                    "model.num_kv_heads=1", "train.prompts_per_step=2", "sampling.group_size=4", "train.minibatches=1",
                    "train.eval_prompts=8",
                    "reward.num_workers=0", "optim.schedule=constant", "train.checkpoint_every=1",
                    "train.keep_checkpoints=2", f"train.out_dir={tmp_path}") for a in ("--set", s))]

    def run(devices, *command):
        return subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=root, timeout=600,
                              env={**os.environ, "XLA_FLAGS": xla_flags(devices)})

    first = run(8, "-m", "grpo_jax.train", *args, "--set", "train.steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    check = run(4, "-c", RESHARD, *args, "--set", "train.steps=3")
    assert check.returncode == 0 and "onto 4 devices" in check.stdout, check.stderr[-2000:]
    resumed = run(4, "-m", "grpo_jax.train", *args, "--set", "train.steps=3")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert checkpoint_steps(tmp_path) == [2, 3]


def checkpoint_steps(out):
    return Checkpointer(out / "checkpoints", 1, 2).all_steps()


def test_a_full_disk_is_one_sentence_naming_the_step_and_the_fix(tmp_path, monkeypatch):
    """Disk full used to print hundreds of lines of orbax's event-loop errors and no sentence to act on."""
    import errno

    import pytest

    ckpt = Checkpointer(tmp_path, every=1, keep=2)
    ckpt.save(1, _state(1), {"position": 1})

    def full(*args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("an orbax save failed") from e

    monkeypatch.setattr(ckpt.manager, "save", full)
    with pytest.raises(OSError, match=r"the disk of .* is full: checkpoint step 2 was not saved \(the last intact one "
                                      r"is step 1\); free space or set train.out_dir elsewhere, then rerun"):
        ckpt.save(2, _state(2), {"position": 2})


def test_any_checkpointed_step_exports_as_a_hugging_face_directory(tmp_path):
    """Not only the final policy: step 1 and step 2 of a run, each equal to its checkpoint's params."""
    import pytest

    from grpo_jax import export, models, run
    from test_trainer import config

    cfg = config(tmp_path, steps=2, checkpoint_every=1, keep_checkpoints=2)
    run.train(cfg)
    ckpt = Checkpointer(tmp_path / "checkpoints", 1, 2)
    exported = {}
    for step in (1, 2):
        path = export.export_step(cfg, step)
        assert path == tmp_path / f"hf-step-{step}"
        _, exported[step] = models.load_hf(path)
        saved = ckpt.restore(None, step)[0]["train"]["params"]
        for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(exported[step])):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(exported[1]["embed"], exported[2]["embed"])  # two different policies
    with pytest.raises(ValueError, match=r"holds no intact checkpoint of step 5; its intact steps: \[1, 2\]"):
        export.export_step(cfg, 5)
    ckpt.close()
