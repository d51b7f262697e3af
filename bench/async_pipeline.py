"""Bounded staleness (train.max_staleness) against the synchronous loop: measured here, and modelled
for accelerators from the memory plan (bench/scale_plan.py).

    python -m bench.async_pipeline [--steps 6] [--set KEY=VALUE ...]

Measured: the RL-step workload (bench/workload.py, the peers' shapes; `--set` changes them) on 2
simulated CPU devices, three ways: synchronous (k = 0), pipelined on one mesh (k = 1: the next rollout
is sampled after the step's updates are dispatched, before their results are read) and pipelined on
split meshes (k = 1, mesh.sampler = 1: one device samples, one trains). Medians of steps 2..N of the
step, of the jitted sampler (time/generate_s) and of the train phase (time/train_s, less what was
sampled ahead while the updates ran). Host CPU cores are shared by both sides: overlap cannot beat the
sum of the phases by much here.

Modelled: the gsm8k config's step (64 prompts x 8, prompts <= 256, completions <= 512) for Qwen3-1.7B
and 8B on 8 and 64 H100s, the devices split in halves. Train and generation times are the memory
plan's time model (`scale_plan.step_seconds`): train = its FLOPs (bench/roofline.py) at MFU x peak over
the trainer's devices; generation = each decode step's max of reading the sampler's weights from HBM
and its FLOPs at MFU x peak (the prefill by FLOPs); transfer = the params (float32, as trained) into
each sampler device, which holds them whole (mesh.sampler splits rows only), at its ingress bandwidth
(`scale_plan.transfer`, which also models bfloat16 and LoRA's adapters on v5e, v5p and H100).
Synchronous on all devices: gen + train; pipelined on the split (sampler + trainer devices) with the
shortest step: max(gen, train) + transfer. The hardware numbers are the vendor's peak figures, the MFU
an assumption: rules of thumb, not measurements. Writes bench/results/async_pipeline[_<overrides>].json.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

from bench import roofline, scale_plan, workload  # noqa: E402
from bench.common import RESULTS  # noqa: E402

GIB = 2**30
H100 = dict(scale_plan.CHIPS["H100"], memory_gib=80)  # the time model's figures (peaks, HBM, NVLink, InfiniBand)
MFU = scale_plan.MFU


def measure(steps: int, sets: list[str]) -> list[dict]:
    from grpo_jax import trainer
    from grpo_jax.config import override

    out = []
    for name, extra in (("synchronous", ["train.max_staleness=0"]), ("pipelined, one mesh", ["train.max_staleness=1"]),
                        ("pipelined, split 1+1", ["train.max_staleness=1", "mesh.sampler=1"])):
        t = trainer.Trainer(override(workload.config(None), [*sets, f"train.steps={steps}", *extra]))
        rows = []
        for _ in range(steps):
            t0 = time.perf_counter()
            m, _ = t.train_step()
            rows.append((time.perf_counter() - t0, m["time/generate_s"], m["time/train_s"]))
        med = lambda i: statistics.median(r[i] for r in rows[1:])  # noqa: E731
        out.append(dict(name=name, overrides=extra, step_s=med(0), generate_s=med(1), train_s=med(2), steps=rows))
        print(f"{name:24s} step {out[-1]['step_s']:.3f} s  generate {out[-1]['generate_s']:.3f} s  "
              f"train {out[-1]['train_s']:.3f} s", flush=True)
    return out


def model(name: str, devices: int) -> dict:
    """The pipeline model of one (model, device count) of the memory plan."""
    gen = lambda n: scale_plan.step_seconds(name, n, "H100")["gen_s"]  # noqa: E731
    train = lambda n: scale_plan.step_seconds(name, n, "H100")["train_s"]  # noqa: E731
    move = scale_plan.transfer(name, devices, "H100")
    transfer, transfer_bytes = move["f32_s"], move["f32_bytes"]  # float32 params, whole on every sampler device
    sync = gen(devices) + train(devices)
    sampler = min((n for n in range(1, devices) if devices % n == 0),  # the split of the shortest pipelined step
                  key=lambda n: max(gen(n), train(devices - n)))
    piped = max(gen(sampler), train(devices - sampler)) + transfer
    return dict(model=name, devices=devices, split=f"{sampler}+{devices - sampler}", params=scale_plan.param_count(name),
                gen_s=gen(devices), train_s=train(devices), gen_split_s=gen(sampler), train_split_s=train(devices - sampler),
                transfer_s=transfer, transfer_gib=transfer_bytes / GIB, sampler_weights_gib_per_device=transfer_bytes / GIB,
                synchronous_step_s=sync, pipelined_step_s=piped, speedup=sync / piped)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    measured = measure(args.steps, args.set)
    modelled = [model(name, n) for name in ("Qwen3-1.7B", "Qwen3-8B") for n in (8, 64)]
    print(f"\n{'measured (2 CPU devices)':24s}{'step s':>9s}{'generate s':>12s}{'train s':>9s}")
    for r in measured:
        print(f"{r['name']:24s}{r['step_s']:>9.3f}{r['generate_s']:>12.3f}{r['train_s']:>9.3f}")
    print(f"\n{'model (H100, MFU 0.4)':22s}{'devices':>8s}{'gen s':>8s}{'train s':>8s}{'split':>8s}{'gen s':>7s}"
          f"{'train s':>8s}{'xfer s':>8s}{'xfer GiB':>9s}{'sync s':>8s}{'piped s':>8s}{'x':>6s}")
    for r in modelled:
        print(f"{r['model']:22s}{r['devices']:>8d}{r['gen_s']:>8.2f}{r['train_s']:>8.2f}{r['split']:>8s}"
              f"{r['gen_split_s']:>7.2f}{r['train_split_s']:>8.2f}{r['transfer_s']:>8.2f}{r['transfer_gib']:>9.1f}"
              f"{r['synchronous_step_s']:>8.2f}{r['pipelined_step_s']:>8.2f}{r['speedup']:>6.2f}")
    name = re.sub(r"[^\w.=-]", "_", "_".join(["async_pipeline", *args.set]))  # a value may hold a path
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(dict(
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command="python -m bench.async_pipeline "
        + " ".join(sys.argv[1:]), load=roofline.load(), cpus=os.cpu_count(), measured=measured,
        model_assumptions=dict(H100, mfu=MFU, config="experiments/configs/gsm8k.py"), modelled=modelled), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
