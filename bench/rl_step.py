"""One RL step through the host loop (`grpo_jax.trainer`) and the fused `grpo_jax.rl_step`.

    python bench/rl_step.py [--workload issue17|quickstart] [--steps 6] [--set KEY=VALUE ...]

issue17 (default), the workload of issue 17 (bench/issue17.py: a random 4.2M-parameter Qwen3 in
float32 loaded from a local HF directory, as TRL and Tunix load it; 16 prompts x 8 completions of 64
tokens, 9-token prompts, GSPO, one AdamW update per rollout batch: on-policy). quickstart:
experiments/configs/quickstart.py. Host and fused steps alternate (same load on both); step 1
compiles; times are medians of steps 2..N; FLOPs and the fraction of the measured matmul peak as in
bench/roofline.py. Uses only public API (Trainer, its state and prompt batches, data.render,
sampling.pad_prompts, rl_step.TextMatch). `--set` overrides the config as a run's does. Writes
bench/results/rl_step_<workload>[_<overrides>].json.
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import re
import statistics
import sys
import time

import jax

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "configs"))
sys.path.insert(0, str(ROOT / "bench"))

import issue17  # noqa: E402
import roofline  # noqa: E402
from grpo_jax import algorithms, config, data, host_memory, rl_step, sampling, trainer  # noqa: E402
from grpo_jax.config import Config, OptimConfig, SamplingConfig, TrainConfig  # noqa: E402
from grpo_jax.data import ArithmeticConfig  # noqa: E402
from grpo_jax.rewards import RewardConfig  # noqa: E402

def issue17_config(out_dir: str) -> Config:
    return Config(
        model_path=str(issue17.write_model("/tmp/issue17")),
        task=ArithmeticConfig(num_operands=2, min_value=100, max_value=999, operators="+"),
        sampling=SamplingConfig(max_prompt_len=issue17.PROMPT_LEN, max_new_tokens=issue17.NEW,
                                group_size=issue17.GROUP, temperature=1.0),
        algorithm=algorithms.AlgorithmConfig.from_preset("gspo", eps_low=issue17.EPS_LOW, eps_high=issue17.EPS_HIGH),
        reward=RewardConfig(names=("exact",), weights=(1.0,), num_workers=2),
        optim=OptimConfig(learning_rate=issue17.LEARNING_RATE),
        train=TrainConfig(steps=100, prompts_per_step=issue17.PROMPTS, out_dir=out_dir),
    )


def get_config(workload: str) -> Config:
    if workload == "issue17":
        return issue17_config("/tmp/bench_rl_step")
    from quickstart import get_config as quickstart

    return quickstart()


def main():
    host_memory.keep_freed_memory()  # as every entry point does (distributed.initialize)
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=("issue17", "quickstart"), default="issue17")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides as a run's --set takes them, e.g. model_options.layer_loop=scan")
    args = parser.parse_args()
    cfg = config.override(get_config(args.workload), args.set)
    load_start = roofline.load()
    peak = roofline.matmul_peak()

    host = trainer.Trainer(cfg)
    fused = trainer.Trainer(cfg)  # same init, same data stream
    cfg = fused.cfg  # with the model loaded from model_path
    tok = fused.task.tokenizer
    reward = rl_step.TextMatch.from_tokenizer(tok, fused.cfg.model.vocab_size, width=8)
    step = rl_step.jit_rl_step(cfg, fused.optimizer, fused.mesh, fused.state_sharding, reward)

    def fused_step(i):
        examples = fused.prompt_batches[i]
        prompts = sampling.pad_prompts([tok.encode(data.render(cfg.template, ex)) for ex in examples], cfg.sampling)
        fused.state, metrics = step(fused.state, prompts, reward.answers([ex["answer"] for ex in examples]),
                                    jax.random.key(i))
        return float(metrics["loss"])

    times = {"host": [], "fused": []}
    for i in range(args.steps):
        t0 = time.perf_counter()
        metrics, _ = host.train_step()
        times["host"].append((time.perf_counter() - t0, metrics["time/generate_s"], metrics["time/train_s"],
                              metrics["completion/length_mean"]))
        t0 = time.perf_counter()
        fused_step(i)
        times["fused"].append((time.perf_counter() - t0,))
        print(f"step {i + 1}: host {times['host'][-1][0]:.2f} s, fused {times['fused'][-1][0]:.2f} s", flush=True)

    s, rows = cfg.sampling, cfg.train.prompts_per_step * cfg.sampling.group_size
    new = statistics.mean(t[3] for t in times["host"][1:])  # mean completion length drawn
    seq = s.max_prompt_len + s.max_new_tokens
    flops_train = roofline.train_flops(host.cfg.model, rows, seq - 1, s.max_new_tokens)
    flops_gen = roofline.decode_flops(host.cfg.model, cfg.train.prompts_per_step, s.group_size, s.max_prompt_len, round(new))
    med = lambda path, k: statistics.median(t[k] for t in times[path][1:])  # noqa: E731
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/rl_step.py " + " ".join(sys.argv[1:]), "overrides": args.set,
        "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "workload": args.workload, "config": dataclasses.asdict(cfg.sampling) | {"rows": rows},
        "matmul_peak_gflops": peak, "load_start": load_start, "load_end": roofline.load(),
        "mean_completion_len": new,
        "host_loop": {"first_step_s": times["host"][0][0], "generate_s": med("host", 1), "train_s": med("host", 2),
                      "step_s": med("host", 0)},
        "fused_rl_step": {"first_step_s": times["fused"][0][0], "step_s": med("fused", 0)},
        "roofline": [roofline.row("generate (host loop)", med("host", 1), flops_gen, peak),
                     roofline.row("train (host loop)", med("host", 2), flops_train, peak),
                     roofline.row("step (host loop)", med("host", 0), flops_gen + flops_train, peak),
                     roofline.row("step (fused rl_step)", med("fused", 0), flops_gen + flops_train, peak)],
        "steps": times,
    }
    name = re.sub(r"[^\w.=-]", "_", "_".join([args.workload, *args.set]))  # a value may hold a path
    out = ROOT / "bench" / "results" / f"rl_step_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{args.workload}: {rows} completions/step; matmul peak {peak:.0f} GFLOP/s; {load_start} -> {result['load_end']}")
    h, f = result["host_loop"], result["fused_rl_step"]
    print(f"{'path':22s}{'first step s':>14s}{'generate s':>12s}{'train s':>10s}{'step s':>10s}")
    print(f"{'host loop':22s}{h['first_step_s']:>14.2f}{h['generate_s']:>12.2f}{h['train_s']:>10.2f}{h['step_s']:>10.2f}")
    print(f"{'fused rl_step':22s}{f['first_step_s']:>14.2f}{'-':>12s}{'-':>10s}{f['step_s']:>10.2f}")
    print(f"\n{'roofline':24s}{'s':>8s}{'GFLOP':>9s}{'GFLOP/s':>9s}{'of peak':>9s}{'at peak s':>10s}")
    for r in result["roofline"]:
        print(f"{r['name']:24s}{r['seconds']:>8.2f}{r['gflop']:>9.1f}{r['gflops']:>9.1f}{r['peak_frac']:>9.2f}{r['limit_s']:>10.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
