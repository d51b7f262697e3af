"""Tunix's GRPOLearner on the RL-step workload (bench/workload.py), for bench/rl_step.py's comparison.

    /work/venvs/tunix/bin/python -m bench.peer_tunix [--steps 6]     # venv: bench/README.md, "Peers"

GSPO as Tunix spells it: GRPOConfig(loss_algo="gspo-token"), the token form of GSPO's sequence ratio
(arXiv 2507.18071, GSPO-token), equal in value and gradient to GSPO when a completion's tokens share
one advantage, as here; epsilon 3e-4, epsilon_high 4e-4 (set as an attribute: GRPOConfig reads it but
does not declare it), beta 0, sequence-mean of token-means. 16 prompts x 8 generations of 64 tokens
at temperature 1 with the vanilla (in-process JAX) rollout; one AdamW update per generation batch
(global-norm clip 1.0, no weight decay, constant lr, as grpo_jax); float32 on CPU; the same random
weights and tokenizer as grpo_jax, read by Tunix's safetensors loader. Actor and rollout share one
mesh and so one set of weights (no sync); with num_iterations 1, l^old is sg(l) (no extra forward).
Generation time from a timer around the rollout's `generate` (tokenize, prefill, decode, detokenize);
step time between the ends of consecutive actor updates (train = step - generate). Medians of steps
2..N; writes bench/results/peer_tunix.json.
"""

import argparse
import functools
import json
import pathlib
import time
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers
from flax import nnx
from tunix.models.qwen3 import model as qwen3_model
from tunix.models.qwen3 import params as qwen3_params
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from bench import workload


def load_model(path: pathlib.Path, mesh: jax.sharding.Mesh) -> qwen3_model.Qwen3:
    """The workload's Hugging Face directory as a Tunix Qwen3 (its config read from config.json)."""
    hf = json.loads((path / "config.json").read_text())
    theta = hf["rope_parameters"]["rope_theta"]
    # Tunix 0.1.7's Qwen3 attention calls apply_rope without the config's rope_theta (so always 1e6);
    # binding this model's theta makes its logits match transformers' on these weights (to 1e-6).
    # The cost is the same either way.
    qwen3_model.apply_rope = functools.partial(qwen3_model.apply_rope, rope_theta=theta)
    config = qwen3_model.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta),
        norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf["tie_word_embeddings"])
    return qwen3_params.create_model_from_safe_tensors(str(path), config, mesh, dtype=jnp.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    path = workload.write_model()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = load_model(path, mesh)
    problems = workload.prompts(workload.PROMPTS * (args.steps + 1))
    chunks = [problems[i:i + workload.PROMPTS] for i in range(0, len(problems), workload.PROMPTS)]
    batches = [{"prompts": np.array([p["prompt"] for p in c]), "answer": np.array([p["answer"] for p in c])}
               for c in chunks]

    def exact(prompts, completions, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=workload.NEW, max_prompt_length=workload.PROMPT_LEN, temperature=1.0,
        kv_cache_size=workload.PROMPT_LEN + workload.NEW)
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0),
                                    optax.adamw(workload.LEARNING_RATE, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=args.steps, mini_batch_size=workload.PROMPTS,
        train_micro_batch_size=workload.PROMPTS)
    roles = {rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.ROLLOUT: mesh}
    cluster = rl_cluster_lib.RLCluster(
        actor=model, tokenizer=tok,
        cluster_config=rl_cluster_lib.ClusterConfig(role_to_mesh=roles, rollout_engine="vanilla",
                                                    training_config=training, rollout_config=rollout))
    algo = grpo_learner.GRPOConfig(num_generations=workload.GROUP, num_iterations=1, beta=0.0,
                                   epsilon=workload.EPS_LOW, loss_algo="gspo-token")
    algo.epsilon_high = workload.EPS_HIGH  # read by Tunix's GRPO loss when present (not a GRPOConfig field)
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=exact)

    generate_s, update_ends = [], []
    generate = cluster.rollout.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        generate_s.append(time.perf_counter() - t0)
        return out

    cluster.rollout.generate = timed_generate
    update_actor = cluster.update_actor

    def timed_update_actor(*a, **kw):
        update_actor(*a, **kw)
        jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
        update_ends.append(time.perf_counter())

    cluster.update_actor = timed_update_actor
    t0 = time.perf_counter()
    learner.train(batches)
    ends = [t0] + update_ends
    step_s = [b - a for a, b in zip(ends, ends[1:])]
    workload.write_peer_result("tunix", list(zip(step_s, generate_s)),
                              framework=f"Tunix {metadata.version('google-tunix')} (JAX {jax.__version__})",
                              loss="gspo-token (GRPOConfig.loss_algo), eps 3e-4 / 4e-4, beta 0")


if __name__ == "__main__":
    main()
