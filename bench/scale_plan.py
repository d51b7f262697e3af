"""Memory plan: per-device bytes of the gsm8k config's train step and sampler at Qwen3 sizes (and a time model).

Each (model, device count) cell runs in a subprocess that simulates that many CPU devices (the count
is fixed before jax is imported). It lowers the train step (`train_step.compiled_train_step`) and the
sampler (`sampling.rollout`) with abstract inputs (`jax.ShapeDtypeStruct`s carrying their shardings)
and compiles them ahead of time, so nothing is allocated; the bytes are each program's
`compiled.memory_analysis()`, for one device.

The run is experiments/configs/gsm8k.py with its model swapped: float32 params and Adam state,
bfloat16 compute, remat "dots", the layer scan; 64 prompts x G=8 per step, prompts <= 256 and
completions <= 512 tokens, 4 minibatches of 128 completions, 4 micro-batches of 32. Per device:

- train = params + optimizer state + batch (the step's arguments; the state is donated) + the
  step's temporaries (activations saved for the backward pass, gradients, workspace);
- sample = params + optimizer state (resident while the trainer samples) + the sampler's
  temporaries (KV cache, logits, workspace) + outputs;
- peak = the larger of the two, against 16 GiB (TPU v5e), 95 GiB (TPU v5p) and 80 GiB (H100).

    python -m bench.scale_plan                    # every cell; table + results/scale_plan.json
    python -m bench.scale_plan --cell Qwen3-8B 64 # one cell, as JSON on stdout (what the driver runs)

Long rollouts: `--max-new-tokens 16384 --slots-per-device K` plans completions of up to 16k tokens,
decoded on K slots per device holding rows (`sampling.decode_slots`; 0: all rows at once), into
results/scale_plan_new16384_slotsK.json.

Time, modelled (`--time`: a table, nothing compiled; `step_seconds`): the same step on each chip's vendor
peak figures (CHIPS) at an assumed MFU. Train = its FLOPs (bench/roofline.py) at MFU x peak over the
devices; generation = the prefill by FLOPs, then per decode step the slower of reading the bf16 weights
(whole on every device: the sampler gathers them over fsdp) and its FLOPs. Rules of thumb, not
measurements: no communication, no host work, every completion at its full length.

Transfer, modelled (`transfer`; `--time` prints it and writes results/scale_plan_time.json): what each
device of a disjoint sampler mesh (mesh.sampler) receives per update. It splits rows only, so each holds
the whole weights (grpo_jax/trainer.py `_publish`): today the float32 params as trained, or under LoRA
only the float32 adapters (the float32 base moves once, at start, and is what the sampler holds besides);
bfloat16, what the sampler's matmuls read, would halve the full transfer. Seconds = bytes at the chip's
vendor ingress bandwidth, no latency or contention; modelled, not measured (issue 38).
"""

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time

from bench.common import RESULTS, ROOT

OUT = RESULTS / "scale_plan.json"
GIB = 2**30
BUDGETS_GIB = {"v5e": 16, "v5p": 95, "H100": 80}
DEVICES = (8, 64, 256)
# (fsdp, tensor, expert) per device count. fsdp <= 32: a micro-batch of 32 rows splits over it.
MESHES = {
    "dense": {8: (8, 1, 1), 64: (32, 2, 1), 256: (32, 8, 1)},
    "moe": {8: (8, 1, 1), 64: (16, 1, 4), 256: (32, 2, 4)},
}


# Per chip, vendor figures: dense bf16 FLOP/s, HBM bytes/s, and the ingress a sampler device receives the
# weights at: half the bidirectional ICI per chip of TPU v5e (400 GB/s, slices up to 256 chips) and v5p
# (1,200 GB/s; cloud.google.com/tpu/docs/v5e, /v5p), H100 SXM's NVLink among the 8 GPUs of a node (900 GB/s
# bidirectional), past a node its 400 Gb/s InfiniBand NIC. And the MFU the time model assumes.
CHIPS = {"v5e": dict(peak_flops=197e12, hbm_bytes_per_s=819e9, link_bytes_per_s=200e9),
         "v5p": dict(peak_flops=459e12, hbm_bytes_per_s=2.765e12, link_bytes_per_s=600e9),
         "H100": dict(peak_flops=989e12, hbm_bytes_per_s=3.35e12, link_bytes_per_s=450e9, node=8, network_bytes_per_s=50e9)}
MFU = 0.4
LORA_RANK = 32  # experiments/configs/gsm8k_lora.py


def model_configs():
    """The config.json fields of each model (Hugging Face model cards: huggingface.co/Qwen/<name>)."""
    from grpo_jax.config import ModelConfig

    qwen3 = dict(vocab_size=151936, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                 max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645)
    return {
        "Qwen3-1.7B": ModelConfig(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_layers=28,
                                  num_heads=16, num_kv_heads=8, tie_word_embeddings=True, **qwen3),
        "Qwen3-8B": ModelConfig(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_layers=36,
                                num_heads=32, num_kv_heads=8, tie_word_embeddings=False, **qwen3),
        "Qwen3-30B-A3B": ModelConfig(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                                     num_layers=48, num_heads=32, num_kv_heads=4, tie_word_embeddings=False,
                                     num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                     norm_topk_prob=True, **qwen3),
    }


def cell(name: str, devices: int, moe_impl: str, max_new_tokens: int = 0, slots_per_device: int = 0) -> dict:
    """Compiles both programs of one (model, mesh) and returns their per-device bytes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from grpo_jax import models, sampling, sharding
    from grpo_jax import train_step as ts
    from grpo_jax.config import MeshConfig, ModelOptions
    from grpo_jax.train import load_config

    base = load_config(ROOT / "experiments" / "configs" / "gsm8k.py")
    # layer_loop: what "auto" runs on the TPUs and GPUs planned for (on these simulated CPU devices it would unroll)
    model = dataclasses.replace(model_configs()[name], **dict(base.model_options.as_dict(), moe_impl=moe_impl,
                                                              layer_loop="scan"))
    fsdp, tensor, expert = MESHES["moe" if model.num_experts else "dense"][devices]
    mesh_cfg = MeshConfig(data=1, fsdp=fsdp, tensor=tensor, expert=expert)
    sampling_cfg = dataclasses.replace(base.sampling, max_new_tokens=max_new_tokens or base.sampling.max_new_tokens,
                                       decode_slots=slots_per_device * fsdp)  # data=1: rows split over fsdp
    cfg = dataclasses.replace(base, model=model, model_path="", model_options=ModelOptions(), mesh=mesh_cfg,
                              sampling=sampling_cfg)
    mesh = sharding.make_mesh(cfg.mesh)
    s, t = cfg.sampling, cfg.train
    rows = t.prompts_per_step * s.group_size // t.minibatches

    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, t.steps, mesh)
    params = jax.eval_shape(lambda key: models.init(model, key), jax.random.key(0))
    state = jax.eval_shape(lambda p: ts.init_state(p, optimizer), params)
    abstract = lambda tree, shard: jax.tree.map(  # noqa: E731
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), tree, shard)
    seq, new = (rows, s.max_prompt_len + s.max_new_tokens), (rows, s.max_new_tokens)
    batch = ts.Batch(*(jax.ShapeDtypeStruct(seq, jnp.int32) for _ in range(3)),
                     *(jax.ShapeDtypeStruct(new, jnp.float32) for _ in range(3)), jax.ShapeDtypeStruct((rows,), jnp.float32))
    replicated = NamedSharding(mesh, PartitionSpec())
    prompts = sampling.Prompts(jax.ShapeDtypeStruct((t.prompts_per_step, s.max_prompt_len), jnp.int32, sharding=replicated),
                               jax.ShapeDtypeStruct((t.prompts_per_step,), jnp.int32, sharding=replicated))
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)
    stop_ids = (model.eos_token_id,)

    nbytes = lambda tree, shard: sum(  # noqa: E731 — per-device bytes of a sharded pytree
        a.dtype.itemsize * math.prod(sh.shard_shape(a.shape)) for a, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shard)))
    out = dict(model=name, devices=devices, mesh=dict(fsdp=fsdp, tensor=tensor, expert=expert), moe_impl=moe_impl,
               max_new_tokens=s.max_new_tokens, decode_slots=s.decode_slots,
               params_bytes=nbytes(state.params, state_sharding.params),
               opt_state_bytes=nbytes(state.opt_state, state_sharding.opt_state))
    programs = {
        "train": lambda: step.lower(abstract(state, state_sharding), None, batch),
        "sample": lambda: sampling.rollout.lower(model, s, stop_ids, mesh, abstract(params, state_sharding.params), prompts, key),
    }
    for program, lower in programs.items():
        start = time.perf_counter()
        lowered = lower()
        lowered_s = time.perf_counter() - start
        compiled = lowered.compile()
        m = compiled.memory_analysis()
        out[program] = dict(lower_s=round(lowered_s, 1), compile_s=round(time.perf_counter() - start - lowered_s, 1),
                            argument_bytes=m.argument_size_in_bytes, output_bytes=m.output_size_in_bytes,
                            alias_bytes=m.alias_size_in_bytes, temp_bytes=m.temp_size_in_bytes,
                            hlo_lines=len(compiled.as_text().splitlines()))
    train, sample = out["train"], out["sample"]
    out["batch_bytes"] = train["argument_bytes"] - out["params_bytes"] - out["opt_state_bytes"]
    train["peak_bytes"] = train["argument_bytes"] + train["temp_bytes"] + train["output_bytes"] - train["alias_bytes"]
    sample["peak_bytes"] = sample["argument_bytes"] + out["opt_state_bytes"] + sample["temp_bytes"] + sample["output_bytes"]
    out["peak_bytes"] = max(train["peak_bytes"], sample["peak_bytes"])
    return out


def param_count(name: str, lora_rank: int = 0) -> int:
    """The model's parameters, or with `lora_rank` its adapters' (every target of `lora.TARGETS`)."""
    import jax

    from grpo_jax import lora, models

    cfg = model_configs()[name]
    tree = lora.specs(cfg, lora.LoraConfig(rank=lora_rank)) if lora_rank else jax.eval_shape(
        lambda: models.init(cfg, jax.random.key(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, models.ParamSpec)))


def transfer(name: str, devices: int, chip: str, lora_rank: int = LORA_RANK) -> dict[str, float]:
    """Per update, the bytes and seconds into each sampler device (float32 as trained, bfloat16, LoRA's
    float32 adapters), and the bytes it holds for the weights (module docstring: the transfer)."""
    hw, params, adapters = CHIPS[chip], param_count(name), param_count(name, lora_rank)
    link = hw["network_bytes_per_s"] if devices > hw.get("node", devices) else hw["link_bytes_per_s"]
    sent = dict(f32=4 * params, bf16=2 * params, lora=4 * adapters)
    held = dict(f32=4 * params, bf16=2 * params, lora=4 * (params + adapters))
    return dict(link_bytes_per_s=link, **{f"{k}_bytes": v for k, v in sent.items()},
                **{f"{k}_s": v / link for k, v in sent.items()}, **{f"{k}_held_bytes": v for k, v in held.items()})


def step_seconds(name: str, devices: int, chip: str, mfu: float = MFU) -> dict[str, float]:
    """{"gen_s", "train_s", "step_s"} of one synchronous step of the planned run on `devices` chips
    (module docstring: the time model)."""
    from bench import roofline
    from grpo_jax.train import load_config

    cfg, hw = model_configs()[name], CHIPS[chip]
    base = load_config(ROOT / "experiments" / "configs" / "gsm8k.py")
    s, prompts, flops = base.sampling, base.train.prompts_per_step, devices * hw["peak_flops"] * mfu
    params = param_count(name)
    decode = lambda new: roofline.decode_flops(cfg, prompts, s.group_size, s.max_prompt_len, new)  # noqa: E731
    gen = decode(1) / flops + (s.max_new_tokens - 1) * max(2 * params / hw["hbm_bytes_per_s"], (decode(2) - decode(1)) / flops)
    train = roofline.train_flops(cfg, prompts * s.group_size, s.max_prompt_len + s.max_new_tokens, s.max_new_tokens) / flops
    return dict(gen_s=gen, train_s=train, step_s=gen + train)


def time_plan(devices: tuple[int, ...] = (8, 64), transfer_models: tuple[str, ...] = ("Qwen3-1.7B", "Qwen3-8B")) -> dict:
    """The time model's rows: the step of every model, the transfer of `transfer_models` (issue 38's cells)."""
    cells = lambda names: [(name, n, c) for name in names for n in devices for c in CHIPS]  # noqa: E731
    return dict(mfu=MFU, chips=CHIPS, lora_rank=LORA_RANK,
                steps=[dict(model=m, devices=n, chip=c, **step_seconds(m, n, c)) for m, n, c in cells(model_configs())],
                transfer=[dict(model=m, devices=n, chip=c, **transfer(m, n, c)) for m, n, c in cells(transfer_models)])


def time_table(plan: dict) -> str:
    """`time_plan` as two tables: the step (gen + train seconds) per model, device count and chip, and 500
    steps in hours; the transfer per update to a sampler device, and the weights it holds."""
    lines = ["| model | devices | " + " | ".join(f"{c} step s (gen + train) | {c} 500 steps h" for c in CHIPS) + " |",
             "|" + "---|" * (2 + 2 * len(CHIPS))]
    for i in range(0, len(plan["steps"]), len(CHIPS)):
        row = plan["steps"][i:i + len(CHIPS)]
        lines.append(f"| {row[0]['model']} | {row[0]['devices']} | " + " | ".join(
            f"{r['step_s']:.2f} ({r['gen_s']:.2f} + {r['train_s']:.2f}) | {500 * r['step_s'] / 3600:.2f}" for r in row) + " |")
    lines += ["", f"transfer per update into each sampler device (mesh.sampler), LoRA rank {plan['lora_rank']}",
              "| model | devices | chip | link GB/s | f32 GiB | f32 s | bf16 s | LoRA MiB | LoRA s "
              "| held GiB / device (f32 / bf16 / LoRA) |", "|" + "---|" * 10]
    for r in plan["transfer"]:
        lines.append(f"| {r['model']} | {r['devices']} | {r['chip']} | {r['link_bytes_per_s'] / 1e9:.0f} "
                     f"| {r['f32_bytes'] / GIB:.1f} | {r['f32_s']:.3f} | {r['bf16_s']:.3f} | {r['lora_bytes'] / 2**20:.0f} "
                     f"| {r['lora_s']:.4f} | {r['f32_held_bytes'] / GIB:.1f} / {r['bf16_held_bytes'] / GIB:.1f} "
                     f"/ {r['lora_held_bytes'] / GIB:.1f} |")
    return f"modelled at MFU {plan['mfu']} on vendor peaks\n" + "\n".join(lines)


def run_cell(name: str, devices: int, moe_impl: str, max_new_tokens: int, slots_per_device: int) -> dict:
    """`cell` in a fresh process with `devices` simulated CPU devices; records its wall time and peak RSS."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "bench.scale_plan", "--cell", name, str(devices),
           "--moe-impl", moe_impl, "--max-new-tokens", str(max_new_tokens), "--slots-per-device", str(slots_per_device)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        return dict(model=name, devices=devices, moe_impl=moe_impl, error=proc.stderr.strip().splitlines()[-3:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(wall_s=round(time.perf_counter() - start, 1), host_peak_rss_gib=int(proc.stderr.split()[-1]) / 2**20)
    return result


def table(results: list[dict]) -> str:
    head = ("| model | devices (fsdp x tensor x expert) | moe_impl | params | opt state | train temp | sample temp "
            "| peak | fits | compile s (train / sample) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['devices']} | {r['moe_impl']} | error: {r['error'][-1]} |")
            continue
        m, gib = r["mesh"], lambda b: f"{b / GIB:.1f}"  # noqa: E731
        fits = ", ".join(k for k, v in BUDGETS_GIB.items() if r["peak_bytes"] <= v * GIB) or "none"
        lines.append(
            f"| {r['model']} | {r['devices']} ({m['fsdp']}x{m['tensor']}x{m['expert']}) | {r['moe_impl']} "
            f"| {gib(r['params_bytes'])} | {gib(r['opt_state_bytes'])} | {gib(r['train']['temp_bytes'])} "
            f"| {gib(r['sample']['temp_bytes'])} | {gib(r['peak_bytes'])} | {fits} "
            f"| {r['train']['compile_s']:.0f} / {r['sample']['compile_s']:.0f} |")
    return "\n".join(lines)


def smallest_fits(results: list[dict]) -> dict:
    """Per model and budget: the fewest devices whose mesh fits (either MoE implementation)."""
    out = {}
    for r in results:
        for budget, gib in BUDGETS_GIB.items():
            if "error" not in r and r["peak_bytes"] <= gib * GIB:
                best = out.setdefault(r["model"], {}).get(budget)
                if best is None or r["devices"] < best["devices"]:
                    out[r["model"]][budget] = dict(devices=r["devices"], mesh=r["mesh"], moe_impl=r["moe_impl"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cell", nargs=2, metavar=("MODEL", "DEVICES"))
    parser.add_argument("--moe-impl", default="dense", choices=("dense", "ragged"))
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="completion length (0: the gsm8k config's)")
    parser.add_argument("--slots-per-device", type=int, default=0, help="decode slots per device holding rows (0: all rows)")
    parser.add_argument("--time", action="store_true",
                        help="print the modelled step and transfer times, write results/scale_plan_time.json (nothing compiled)")
    args = parser.parse_args()
    if args.time:
        plan = time_plan()
        print(time_table(plan))
        out = OUT.with_name("scale_plan_time.json")
        out.write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **plan), indent=2) + "\n")
        print(f"wrote {out}")
        return
    long = (args.max_new_tokens, args.slots_per_device)
    if args.cell:  # jax is imported after this: the simulated device count takes effect
        os.environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={args.cell[1]}")
        print(json.dumps(cell(args.cell[0], int(args.cell[1]), args.moe_impl, *long)))
        return
    out = OUT if long == (0, 0) else OUT.with_name(f"scale_plan_new{long[0]}_slots{long[1]}.json")
    results = []
    for name, model in model_configs().items():
        if args.models and name not in args.models:
            continue
        for devices in DEVICES:
            for impl in ("dense", "ragged") if model.num_experts else ("dense",):
                results.append(run_cell(name, devices, impl, *long))
                print(table(results[-1:]).splitlines()[-1], f"(wall {results[-1].get('wall_s')} s)", flush=True)
    plan = smallest_fits(results)
    print("\n" + table(results) + "\n")
    for name in model_configs():
        for budget, gib in BUDGETS_GIB.items():
            best = plan.get(name, {}).get(budget)
            where = f"{best['devices']} devices ({best['moe_impl']})" if best else f"no mesh up to {DEVICES[-1]}"
            print(f"{name} on {budget} ({gib} GiB): {where}")
    out.write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=platform.processor()
                                   or platform.machine(), cpus=os.cpu_count(), budgets_gib=BUDGETS_GIB,
                                   smallest_fits=plan, cells=results), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
