"""Helpers the benchmarks share: interleaved timing, the GSPO update and its forward on random rows,
and fresh measured processes. jax is imported inside the helpers that use it: first_step.py's and
host_memory.py's measured processes set glibc's malloc before jax loads.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def median_times(runs: dict, reps: int) -> dict:
    """{name: median seconds} of `reps` rounds of every run after a warm-up call each. The runs are
    interleaved so that a shared machine's load hits them alike."""
    for run in runs.values():
        run()
    times = {k: [] for k in runs}
    for _ in range(reps):
        for k, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def update_runs(mcfg, params, prompts: int, group: int, prompt_len: int, new: int) -> tuple:
    """(train, forward): the on-policy GSPO update (fwd + bwd + AdamW, one micro-batch) and the forward of
    its tokens (what l^old costs), each running once and blocking. `params` are copied (the update
    donates its state); the rows are random tokens with every completion token counted."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import algorithms, sharding
    from grpo_jax import train_step as ts
    from grpo_jax.config import Config, OptimConfig, SamplingConfig, TrainConfig

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
        state[0], m = update(state[0], None, batch)
        jax.block_until_ready(m)

    def forward():
        jax.block_until_ready(ts.completion_logprobs(mcfg, 1.0, state[0].params, tokens, positions, segments, mask))

    return train, forward


def temp_bytes(update, state, batch) -> int:
    """The compiled update's temporary memory (compiled, not run)."""
    return update.lower(state, None, batch).compile().memory_analysis().temp_size_in_bytes


def compare_updates(layouts: dict, params, reps: int) -> tuple[dict, dict]:
    """For layouts {name: (config, batch)} of one update (the same math in another layout): the median
    seconds of `reps` interleaved updates after a first one, whose losses must agree, and each compiled
    update's temporary bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import metrics, sharding
    from grpo_jax import train_step as ts

    runs, memory, losses = {}, {}, {}
    for name, (cfg, batch) in layouts.items():
        optimizer, state_sharding, _, update = ts.compiled_train_step(cfg, 100, sharding.make_mesh(cfg.mesh))
        state = [jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding)]  # donated
        memory[name] = temp_bytes(update, state[0], batch)
        state[0], m = update(state[0], None, batch)
        losses[name] = float(metrics.finalize(m)["loss"])

        def run(update=update, state=state, batch=batch):
            state[0], m = update(state[0], None, batch)
            jax.block_until_ready(m)

        runs[name] = run
    first, *others = losses.values()
    if not all(np.isclose(x, first, rtol=1e-4, atol=1e-6) for x in others):
        raise AssertionError(f"the layouts disagree: {losses}")
    return median_times(runs, reps), memory


def measured_process(module: str, args: list[str], env: dict, name: str) -> dict:
    """Runs `python -m module args` (a bench script's --child) in a fresh process and returns the JSON it
    printed after "RESULT "; exits with its output if it failed."""
    env = env | {"PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{name}: the measured process failed\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
