"""TRL's GRPOTrainer on the RL-step workload (bench/workload.py), for bench/rl_step.py's comparison.

    /work/venvs/trl/bin/python -m bench.peer_trl [--steps 6]     # venv: bench/README.md, "Peers"

GSPO as TRL spells it (importance_sampling_level="sequence", epsilon 3e-4, epsilon_high 4e-4,
beta 0), 16 prompts x 8 generations of 64 tokens at temperature 1, one AdamW update per generation
batch, float32 on CPU, the same random weights and tokenizer as grpo_jax. Step time from a trainer
callback; generation time from a timer around the model's `generate` (train = step - generate).
Medians of steps 2..N; writes bench/results/peer_trl.json.
"""

import argparse
import time

import datasets
import torch
import transformers
import trl

from bench import workload


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = workload.write_model()
    tok = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = datasets.Dataset.from_list(workload.prompts(workload.PROMPTS * (args.steps + 1)))

    def exact(completions, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    generate_s, step_s = [], []
    generate = model.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        generate_s.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            step_s.append(time.perf_counter() - self.t0)

    rows = workload.PROMPTS * workload.GROUP
    config = trl.GRPOConfig(
        output_dir="/tmp/peer_trl", max_steps=args.steps, per_device_train_batch_size=rows,
        num_generations=workload.GROUP, max_completion_length=workload.NEW, temperature=1.0,
        learning_rate=workload.LEARNING_RATE, beta=0.0, importance_sampling_level="sequence",
        epsilon=workload.EPS_LOW, epsilon_high=workload.EPS_HIGH, num_iterations=1, gradient_accumulation_steps=1,
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=0,
        dataloader_num_workers=0,
    )
    trainer = trl.GRPOTrainer(model=model, reward_funcs=exact, args=config, train_dataset=data,
                              processing_class=tok, callbacks=[StepTimer()])
    trainer.train()
    workload.write_peer_result("trl", list(zip(step_s, generate_s)),
                              framework=f"TRL {trl.__version__} (PyTorch {torch.__version__})")


if __name__ == "__main__":
    main()
