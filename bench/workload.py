"""The RL-step workload that rl_step.py, first_step.py, host_memory.py and the peers (peer_trl.py,
peer_tunix.py) run: a random 4.2M-parameter Qwen3 in float32 (vocab 4096, d 256, 4 layers, 4 query /
2 kv heads of 64, FFN 768, tied embeddings) written once as a local Hugging Face directory that
grpo_jax, TRL and Tunix all load, with a character tokenizer of 4096 ids (pad, bos, eos, unk, the
characters of grpo_jax.data.CharTokenizer, then filler tokens) whose encoder adds BOS. Prompts are
3-digit sums ("123+456=": 9 tokens with BOS); 16 prompts x 8 completions of 64 new tokens at
temperature 1; GSPO (clips 3e-4 / 4e-4), beta 0, one AdamW update per rollout batch (on-policy).

Imports only what every environment of bench/README.md has (torch, transformers, tokenizers) until
`config` is called: the peers import it from their own virtual environments.
"""

import pathlib

VOCAB, PROMPTS, GROUP, PROMPT_LEN, NEW = 4096, 16, 8, 9, 64
LEARNING_RATE, EPS_LOW, EPS_HIGH = 1e-5, 3e-4, 4e-4
MODEL = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, max_position_embeddings=128,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
MODEL_DIR = "/tmp/grpo_jax_bench_workload"
# grpo_jax.host_memory's malloc settings as environment variables, for the peers' processes:
# env MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1099511627776 python -m bench.peer_trl
KEEP_FREED_MEMORY = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1099511627776"}
CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ +-*/=().,?!:;'\"<>[]{}#$%\\^_\n"


def write_model(path: str | pathlib.Path = MODEL_DIR, seed: int = 0) -> pathlib.Path:
    """Writes the random model and tokenizer to `path` (once; kept if it already holds them)."""
    path = pathlib.Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    import tokenizers
    import torch
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, processors

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    pieces = specials + list(CHARS)
    pieces += [f"<t{i}>" for i in range(VOCAB - len(pieces))]
    tok = tokenizers.Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**MODEL))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def config(path: str | None = None, out_dir: str = "/tmp/grpo_jax_bench_run"):
    """The workload as a grpo_jax Config, or the Config of the experiments config file at `path`."""
    from grpo_jax import algorithms
    from grpo_jax.algorithms.losses import Gspo
    from grpo_jax.config import ArithmeticConfig, Config, OptimConfig, RewardConfig, SamplingConfig, TrainConfig
    from grpo_jax.train import load_config

    if path:
        return load_config(path)
    return Config(
        model_path=str(write_model()),
        task=ArithmeticConfig(num_operands=2, min_value=100, max_value=999, operators="+"),
        sampling=SamplingConfig(max_prompt_len=PROMPT_LEN, max_new_tokens=NEW, group_size=GROUP, temperature=1.0),
        algorithm=algorithms.AlgorithmConfig.from_preset("gspo", loss=Gspo(eps_low=EPS_LOW, eps_high=EPS_HIGH)),
        reward=RewardConfig(names=("exact",), weights=(1.0,), num_workers=2),
        optim=OptimConfig(learning_rate=LEARNING_RATE),
        train=TrainConfig(steps=100, prompts_per_step=PROMPTS, out_dir=out_dir),
    )


def prompts(n: int, seed: int = 0) -> list[dict]:
    """n problems "a+b=" with 3-digit a, b and their answers (the same for every framework)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return out


def write_peer_result(name: str, steps: list[tuple[float, float]], **fields) -> dict:
    """A peer's result from its (step s, generate s) per step: first step, medians of steps 2..N (train =
    step - generate) and the load; written to bench/results/peer_NAME.json and printed without the steps.
    Run with KEEP_FREED_MEMORY's variables set (grpo_jax.host_memory's settings, as glibc reads them at
    start), it goes to peer_NAME_kept_memory.json instead."""
    import json
    import os
    import statistics

    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    kept = malloc == KEEP_FREED_MEMORY
    later = steps[1:]
    result = dict(**fields, malloc_env=malloc, steps=steps, first_step_s=steps[0][0],
                  step_s=statistics.median(s for s, _ in later), generate_s=statistics.median(g for _, g in later),
                  train_s=statistics.median(s - g for s, g in later), load=os.getloadavg())
    out = pathlib.Path(__file__).parent / "results" / f"peer_{name}{'_kept_memory' if kept else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    return result
