"""Fused `rl_step` (sample + reward + advantages + updates in one jit) against the host loop.

    python bench/rl_step.py [--steps 20]

Same model, task and config as the quickstart (experiments/configs/quickstart.py); both paths start
from the same random init; compile time is measured apart from the steady-state step time. Writes
bench/results/rl_step.json.
"""

import argparse
import datetime
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from grpo_jax import rl_step, trainer
from grpo_jax.train import load_config

ROOT = pathlib.Path(__file__).parents[1]


def answer_tokens(tok, examples, width):
    ids = [tok.encode(ex["answer"], add_bos=False) + [tok.eos_id] for ex in examples]
    return jnp.asarray([a + [0] * (width - len(a)) for a in ids], jnp.int32)


def timed(fn, steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(0))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        out = fn(i)
    jax.block_until_ready(out)
    return compile_s, (time.perf_counter() - t0) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    cfg = load_config(ROOT / "experiments" / "configs" / "quickstart.py")
    host = trainer.Trainer(cfg)
    host_compile, host_step = timed(lambda i: host.train_step()[0]["loss"], args.steps)

    fused = trainer.Trainer(cfg)  # same init, same data stream
    step = rl_step.jit_rl_step(cfg, fused.optimizer, fused.mesh, fused.state_sharding)
    tok, width = fused.task.tokenizer, cfg.sampling.max_new_tokens

    def fused_step(i):
        examples = fused.prompt_batches[i]
        _, prompts = fused._prompts(examples)
        fused.state, metrics = step(fused.state, prompts, answer_tokens(tok, examples, width), jax.random.key(i))
        return metrics["loss"]

    fused_compile, fused_step_s = timed(fused_step, args.steps)
    rows = cfg.train.prompts_per_step * cfg.sampling.group_size
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/rl_step.py --steps %d" % args.steps,
        "device": f"{jax.device_count()} x {jax.devices()[0].device_kind} (CPU shared with other jobs)",
        "config": "experiments/configs/quickstart.py",
        "completions_per_step": rows,
        "updates_per_step": cfg.train.minibatches * cfg.algorithm.num_iterations,
        "host_loop": {"compile_s": host_compile, "step_s": host_step},
        "fused_rl_step": {"compile_s": fused_compile, "step_s": fused_step_s},
        "speedup": host_step / fused_step_s,
    }
    out = ROOT / "bench" / "results" / "rl_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':16s}{'compile s':>12s}{'step ms':>12s}")
    for name in ("host_loop", "fused_rl_step"):
        print(f"{name:16s}{result[name]['compile_s']:>12.1f}{1e3 * result[name]['step_s']:>12.1f}")
    print(f"speedup of the fused step: {result['speedup']:.2f}x ({rows} completions/step); wrote {out}")


if __name__ == "__main__":
    main()
