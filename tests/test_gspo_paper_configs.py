"""The GSPO paper's two arms at scale (experiments/configs/gspo_paper/): built, and their train step lowered
(not compiled) with abstract arrays on the 256 simulated devices of their mesh, with 2 of the 48 layers.

The lowering runs in a child process: the simulated device count is fixed before jax is imported (the
suite runs with 8), as bench/scale_plan.py does."""

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.configs.gspo_paper import grpo, gspo  # noqa: E402
from grpo_jax.config import ModelOptions, flatten  # noqa: E402

LAYERS = 2  # of 48: the scanned layer stack lowers alike for any depth


def test_the_arms_differ_only_in_the_objective():
    a, b = gspo.get_config(), grpo.get_config()
    assert (a.algorithm.loss.name, a.algorithm.loss.eps_low, a.algorithm.loss.eps_high, a.algorithm.routing_replay) == (
        "gspo", 3e-4, 4e-4, "none")
    assert (b.algorithm.loss.name, b.algorithm.loss.eps_low, b.algorithm.loss.eps_high, b.algorithm.routing_replay) == (
        "ppo_clip", 0.2, 0.27, "old")
    assert a.algorithm.beta == b.algorithm.beta == 0 and a.algorithm.num_iterations == b.algorithm.num_iterations == 1
    assert a.train.minibatches == 4
    differ = {k for k, v in flatten(a).items() if flatten(b)[k] != v}
    assert differ == {k for k in differ if k.startswith("algorithm.")} | {"train.out_dir"}


def lower(module) -> dict:
    """In a process with 256 devices: the arm's train step lowered on its mesh; its argument shapes."""
    import jax
    import jax.numpy as jnp

    from grpo_jax import models, sharding, trainer
    from grpo_jax import train_step as ts

    cfg = module.get_config()
    model = dataclasses.replace(gspo.ARCHITECTURE, num_layers=LAYERS, **cfg.model_options.as_dict())
    cfg = dataclasses.replace(cfg, model=model, model_path="", model_options=ModelOptions())  # as the Trainer does
    trainer.check(cfg)
    mesh = sharding.make_mesh(cfg.mesh)
    s, t = cfg.sampling, cfg.train
    rows = t.prompts_per_step * s.group_size // t.minibatches
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, t.steps, mesh)
    state = jax.eval_shape(lambda: ts.init_state(models.init(model, jax.random.key(0)), optimizer))
    abstract = lambda tree, shard: jax.tree.map(  # noqa: E731
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), tree, shard)
    seq, new = s.max_prompt_len + s.max_new_tokens, s.max_new_tokens
    routes = None
    if cfg.algorithm.routing_replay != "none":
        routes = jax.ShapeDtypeStruct((rows, LAYERS, seq - 1, model.num_experts_per_tok), jnp.int32)
    batch = ts.Batch(*(jax.ShapeDtypeStruct((rows, seq), jnp.int32) for _ in range(3)),
                     *(jax.ShapeDtypeStruct((rows, new), jnp.float32) for _ in range(3)),
                     jax.ShapeDtypeStruct((rows,), jnp.float32), routes)
    lowered = step.lower(abstract(state, state_sharding), None, batch)
    args = jax.tree.leaves(lowered.args_info)
    return dict(devices=len(jax.devices()), mesh=dict(mesh.shape), rows=rows, micro_rows=rows // t.micro_batches,
                batch_shards=math.prod(mesh.shape[a] for a in sharding.RULES["batch"]),
                shapes=sorted({f"{a.dtype}{list(a.shape)}" for a in args}))


def test_the_arms_lower_on_their_256_device_mesh():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=256")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    e, k, d, f, v = 128, 8, 2048, 768, 151936
    for name, got in out.items():
        assert got["devices"] == 256 and got["mesh"] == {"data": 1, "fsdp": 32, "tensor": 2, "expert": 4}, name
        assert got["rows"] == 256 and got["micro_rows"] % got["batch_shards"] == 0, name  # a micro-batch splits evenly
        shapes = set(got["shapes"])
        # one layer's real weights (stacked over the 2 lowered layers), the embedding and the batch
        for want in (f"float32[{LAYERS}, {e}, {d}, {f}]", f"float32[{LAYERS}, {e}, {f}, {d}]",
                     f"float32[{LAYERS}, {d}, {e}]", f"float32[{LAYERS}, {d}, 32, 128]", f"float32[{LAYERS}, {d}, 4, 128]",
                     f"float32[{v}, {d}]", f"float32[{d}, {v}]", "int32[256, 9216]", "float32[256, 8192]"):
            assert want in shapes, (name, want)
        assert (f"int32[256, {LAYERS}, 9215, {k}]" in shapes) == (name == "grpo"), name  # R2's routes


if __name__ == "__main__":  # the child: jax sees 256 devices
    print(json.dumps({"gspo": lower(gspo), "grpo": lower(grpo)}))
