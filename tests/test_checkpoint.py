"""Checkpointer: interval and retention, exact restore with shardings, JSON meta."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax.checkpoint import Checkpointer


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
    restored, meta = Checkpointer(tmp_path, every=1, keep=1).restore(state)
    assert meta == {"position": [5, 17], "seed": 0}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored["w"].sharding == sharding


def test_restore_without_checkpoint_names_directory(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match=str(tmp_path.name)):
        Checkpointer(tmp_path, every=1, keep=1).restore(_state(0))
