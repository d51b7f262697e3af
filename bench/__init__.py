"""Speed and memory benchmarks of grpo_jax: each script prints a table and writes JSON to
bench/results/; bench/README.md keeps the latest table of each, with its command, machine and date.

Run one from the repository root as a module, e.g. `python -m bench.rl_step --help`:

    rl_step        the host loop's RL step on the RL-step workload (workload.py), against the compute limit
    first_step     a fresh process's first step (compiling), without / with a cold / warm compilation cache
    host_memory    the RL step with freed host memory kept for reuse against glibc's defaults
    peer_trl       TRL on the RL-step workload (in its own virtual environment)
    peer_tunix     Tunix on the RL-step workload (in its own virtual environment)
    sweep          train update, forward and greedy decoding around the workload's shape, vs transformers
    scan_layers    the layer scan against unrolled layers in training
    decode_depth   the sampler's program size and compile time against depth
    sampler        sampling throughput against transformers' generate
    long_tail      rollouts of long-tailed lengths: continuous batching vs lock-step and transformers
    logprobs       fused log-probs against full logits: memory and time
    prefix_grouper Prefix Grouper against the per-row update
    packing        packed rows against padded rows in the update
    scale_plan     per-device memory of the gsm8k config at Qwen3 sizes, by simulated meshes
    gpu            ceilings, Pallas kernels, train-step MFU and decode bandwidth on a GPU

Shared modules: workload.py (the RL-step workload: a 4.2M-parameter Qwen3-style model, 16 prompts x 8
completions of 64 new tokens, GSPO), roofline.py (FLOP counts and the measured matmul peak) and
common.py (interleaved timing, the update's runs, measured processes).
"""
