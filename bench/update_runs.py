"""The on-policy GSPO update (fwd + bwd + AdamW, one micro-batch) and the forward of its tokens (what l^old
costs) on random rows: the two runs that sweep.py, scan_layers.py and gpu.py time."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import algorithms, models, sharding
from grpo_jax import train_step as ts
from grpo_jax.config import Config, OptimConfig, SamplingConfig, TrainConfig


def update_runs(mcfg: models.ModelConfig, params, prompts: int, group: int, prompt_len: int, new: int) -> tuple:
    """(train, forward): each runs once and blocks. `params` are copied (the update donates its state);
    the rows are random tokens with every completion token counted."""
    rows = prompts * group
    cfg = Config(model=mcfg, sampling=SamplingConfig(max_prompt_len=prompt_len, max_new_tokens=new, group_size=group),
                 algorithm=algorithms.AlgorithmConfig.from_preset("gspo"), optim=OptimConfig(learning_rate=1e-6),
                 train=TrainConfig(prompts_per_step=prompts))
    optimizer, state_sharding, _, update = ts.compiled_train_step(cfg, 100, sharding.make_mesh(cfg.mesh))
    state = [jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding)]
    rng = np.random.default_rng(0)
    tokens, positions, segments = ts.sequences(
        jnp.asarray(rng.integers(3, mcfg.vocab_size, (rows, prompt_len)), jnp.int32),
        jnp.full((rows,), prompt_len, jnp.int32), jnp.asarray(rng.integers(3, mcfg.vocab_size, (rows, new)), jnp.int32))
    mask = jnp.ones((rows, new), jnp.float32)
    batch = ts.Batch(tokens, positions, segments, mask, None, mask * 0, jnp.asarray(rng.normal(size=rows), jnp.float32))

    def train():
        state[0], metrics = update(state[0], None, batch)
        jax.block_until_ready(metrics)

    def forward():
        jax.block_until_ready(ts.completion_logprobs(mcfg, 1.0, state[0].params, tokens, positions, segments, mask))

    return train, forward
