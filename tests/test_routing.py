"""Routing replay (R2 "old", R3 "sampler") and the routing metrics of MoE policies, on tiny Qwen3-MoE models."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import algorithms, models, routing, sharding, trainer
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import Config, MeshConfig, OptimConfig, RewardConfig, SamplingConfig, TrainConfig
from grpo_jax.data import CharTokenizer
from grpo_jax.models import decoder

K, E = 2, 8
# Layers 0 and 2 are MoE, layer 1 dense: two scanned runs, so routes must be sliced per run.
MOE = models.ModelConfig(
    model_type="qwen3_moe", vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
    num_kv_heads=2, head_dim=8, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=16,
    norm_topk_prob=True, mlp_only_layers=(1,), tie_word_embeddings=True, eos_token_id=5,
)
B, PROMPT, NEW = 8, 5, 6


@pytest.fixture(scope="module")
def params():
    return models.init(MOE, jax.random.key(0))


@pytest.fixture(scope="module")
def rollouts():
    """Left-padded prompts with completions of random lengths, as ts.sequences lays them out."""
    rng = np.random.default_rng(1)
    prompt_lengths = rng.integers(1, PROMPT + 1, B)
    prompts = np.where(np.arange(PROMPT) >= PROMPT - prompt_lengths[:, None], rng.integers(6, 48, (B, PROMPT)), 0)
    lengths = rng.integers(1, NEW + 1, B)
    mask = (np.arange(NEW) < lengths[:, None]).astype(np.float32)
    completions = np.where(mask > 0, rng.integers(6, 48, (B, NEW)), 0)
    tokens, positions, segments = ts.sequences(jnp.asarray(prompts), jnp.asarray(prompt_lengths), jnp.asarray(completions))
    return tokens, positions, segments, jnp.asarray(mask)


def least_probable(p, x, top_p, top_i):
    """A hand-built MoE block that ignores the routing it is given and runs every token on the K
    experts its router finds LEAST probable, with their renormalized probabilities as gate weights;
    expert by expert (gathered weights), unlike the dense (one-hot) and ragged (sorted) impls."""
    logits = jnp.einsum("btd,de->bte", x, p["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    chosen = jnp.argsort(logits, axis=-1)[..., :K]
    gates = jnp.take_along_axis(probs, chosen, axis=-1)
    gates = gates / gates.sum(-1, keepdims=True)
    out = jnp.zeros_like(x)
    for j in range(K):
        e = chosen[..., j]
        h = jax.nn.silu(jnp.einsum("btd,btdf->btf", x, p["gate"][e])) * jnp.einsum("btd,btdf->btf", x, p["up"][e])
        out = out + gates[..., j, None] * jnp.einsum("btf,btfd->btd", h, p["down"][e])
    return out


def test_replay_runs_exactly_the_recorded_experts(params, monkeypatch):
    """Replayed routes that the router would never pick (its K least probable experts, at every token
    and MoE layer) give the hidden states, and the router gradient, of the hand-built block that forces
    them (dense experts; ragged: hidden states); the aux still reports the router's own picks."""
    monkeypatch.setitem(decoder.MOE, "least_probable", least_probable)
    forced = dataclasses.replace(MOE, moe_impl="least_probable")
    tokens = np.random.default_rng(0).integers(0, MOE.vocab_size, (3, 7))
    probe = jax.random.normal(jax.random.key(1), (3, 7, MOE.hidden_size))

    def run(cfg, p, routes=None):
        hidden, aux = models.forward_with_aux(cfg, p, tokens, routes=routes)
        return jnp.sum(hidden * probe), (hidden, aux)

    grad = jax.jit(jax.grad(run, argnums=1, has_aux=True), static_argnums=0)
    want_grads, (want, want_aux) = grad(forced, params)
    routes = jnp.argsort(want_aux["router_logits"], axis=-1)[..., :K]  # what `least_probable` ran, per layer
    assert routes.shape == (2, 3, 7, K)
    own = np.asarray(want_aux["routes"])
    assert not (own[..., :, None] == np.asarray(routes)[..., None, :]).any()  # the router picks other experts
    unreplayed = models.forward(MOE, params, tokens)
    assert float(jnp.abs(unreplayed - want).max()) > 1e-2
    got_grads, (got, aux) = grad(MOE, params, routes)  # the dense experts
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(aux["routes"], own)
    router = got_grads["moe"]["router"]
    assert float(jnp.abs(router).max()) > 1e-4  # gate weights come from the router: it still learns
    np.testing.assert_allclose(router, want_grads["moe"]["router"], atol=1e-5)
    ragged, _ = jax.jit(models.forward_with_aux, static_argnums=0)(
        dataclasses.replace(MOE, moe_impl="ragged"), params, tokens, routes=routes)
    np.testing.assert_allclose(ragged, want, atol=1e-5)


def test_replay_rejects_wrong_routes(params):
    tokens = np.zeros((2, 4), np.int32)
    with pytest.raises(ValueError, match=r"routes \(2, 2, 4, 3\) must be \[moe_layers, batch, seq, k\] = \(2, 2, 4, 2\)"):
        models.forward_with_aux(MOE, params, tokens, routes=jnp.zeros((2, 2, 4, 3), jnp.int32))
    dense = dataclasses.replace(MOE, model_type="qwen3", num_experts=0, num_experts_per_tok=0, mlp_only_layers=())
    with pytest.raises(ValueError, match="no MoE layer"):
        models.forward_with_aux(dense, models.init(dense, jax.random.key(0)), tokens, routes=jnp.zeros((0, 2, 4, 0), jnp.int32))


def test_replaying_the_own_routes_changes_no_logprob(params, rollouts):
    """With unchanged params, l^old's recorded routes replayed give the unreplayed log-probs (ragged
    experts: their sort by expert sees the replayed routes)."""
    cfg = dataclasses.replace(MOE, moe_impl="ragged")
    tokens, positions, segments, mask = rollouts
    old, routes = ts.old_logprobs(cfg, 0.7, params, tokens, positions, segments, mask)
    assert routes.shape == (B, 2, PROMPT + NEW - 1, K)
    replayed, again = ts.old_logprobs(cfg, 0.7, params, tokens, positions, segments, mask, routes)
    np.testing.assert_array_equal(again, routes)
    np.testing.assert_allclose(replayed, old, rtol=0, atol=1e-6)


def numpy_metrics(own, entropy, recorded, mask, replay: bool) -> dict:
    """The routing metrics in float64 numpy: own [layers, batch, new, k] (the router's picks), entropy
    [layers, batch, new], recorded [batch, layers, new, k] (pi_old's), mask [batch, new]."""
    old = np.moveaxis(np.asarray(recorded), 1, 0)
    w = np.broadcast_to(np.asarray(mask, np.float64), own.shape[:3])
    shared = np.array([[[len(set(a) & set(b)) for a, b in zip(ra, rb)] for ra, rb in zip(la, lb)]
                       for la, lb in zip(own, old)])
    used = old if replay else own
    counts = np.array([[(w[l][..., None] * (used[l] == e)).sum() for e in range(E)] for l in range(len(used))])
    return {
        "routing/changed_sets_frac": (w * (shared < K)).sum() / w.sum(),
        "routing/changed_experts_frac": (w * (1 - shared / K)).sum() / w.sum(),
        "routing/entropy_mean": (w * entropy).sum() / w.sum(),
        "routing/expert_load": np.mean(counts.max(-1) / counts.mean(-1)),
    }


@pytest.mark.parametrize("replay", [False, True])
def test_routing_metrics_equal_numpy_over_micro_batches(replay):
    """Merged over two micro-batches (rows j, j+2, ...), the metrics equal numpy's on the whole batch:
    masked tokens do not count, the load's counts are summed before its max / mean."""
    layers, rows, seq, new = 2, 6, 7, 4
    rng = np.random.default_rng(0)
    sets = lambda: np.argsort(rng.random((layers, rows, seq, E)), axis=-1)[..., :K].astype(np.int32)  # noqa: E731
    own = sets()
    recorded = np.where(rng.random((layers, rows, seq, 1)) < 0.5, own, sets()).transpose(1, 0, 2, 3)
    entropy = rng.random((layers, rows, seq)).astype(np.float32)
    mask = (rng.random((rows, new)) < 0.7).astype(np.float32)
    parts, counts = [], 0
    for j in range(2):
        r = slice(j, None, 2)
        aux = {"routes": jnp.asarray(own[:, r]), "router_entropy": jnp.asarray(entropy[:, r])}
        m, c = routing.metrics(aux, jnp.asarray(recorded[r]), replay, jnp.asarray(mask[r]), E)
        parts.append(m)
        counts = counts + c
    got = metrics_lib.combine_all(parts)
    got["routing/expert_load"] = routing.expert_load(counts, jnp.asarray(mask.sum()))
    want = numpy_metrics(own[:, :, -new:], entropy[:, :, -new:], recorded[:, :, -new:], mask, replay)
    assert 0.2 < want["routing/changed_sets_frac"] < 0.8
    for name, value in want.items():
        np.testing.assert_allclose(metrics_lib.finalize(got)[name], value, rtol=1e-6, err_msg=name)


def test_routes_and_metrics_survive_micro_batches_and_a_mesh(rollouts):
    """R2 with pi_old's routes recorded under other router weights (part of the sets differ from the
    current router's picks): one update on a (2,2,2) mesh with 2 micro-batches has the loss and gradient
    norm of the unsplit single-device batch replaying the same routes (and not those of no replay), and
    routing metrics equal to numpy's on the whole batch."""
    model = dataclasses.replace(MOE, num_layers=2, mlp_only_layers=())  # one scanned run: a cheaper step
    params = models.init(model, jax.random.key(0))
    cfg = Config(
        model=model, sampling=SamplingConfig(max_prompt_len=PROMPT, max_new_tokens=NEW, group_size=4, temperature=0.7),
        algorithm=algorithms.AlgorithmConfig.from_preset("grpo", beta=0.0, routing_replay="old"),
        optim=OptimConfig(learning_rate=1e-3), train=TrainConfig(micro_batches=2, compare_routes=True),
    )
    tokens, positions, segments, mask = rollouts
    old_params = dict(params, moe=dict(params["moe"], router=params["moe"]["router"]
                                       + 0.05 * jax.random.normal(jax.random.key(2), params["moe"]["router"].shape)))
    old_logp, routes = ts.old_logprobs(model, 0.7, old_params, tokens, positions, segments, mask)
    adv = jnp.asarray(np.random.default_rng(3).normal(size=B), jnp.float32)
    batch = ts.Batch(tokens, positions, segments, mask, old_logp, old_logp, adv, routes)

    unreplayed, _ = ts.old_logprobs(model, 0.7, params, tokens, positions, segments, mask)
    replayed, _ = ts.old_logprobs(model, 0.7, params, tokens, positions, segments, mask, routes)
    assert float(jnp.abs(replayed - unreplayed).max()) > 1e-3  # the replayed experts matter

    def unsplit_loss(p):
        logp, _ = ts.completion_logprobs(model, 0.7, p, tokens, positions, segments, mask, False, routes)
        return algorithms.policy_loss(cfg.algorithm, logp, old_logp, adv, mask, sampler_logp=old_logp,
                                      normalizer=algorithms.normalizer(cfg.algorithm, mask, NEW))[0]

    loss, grads = jax.jit(jax.value_and_grad(unsplit_loss))(params)
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, 10, mesh)
    state = jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding)
    _, m = step(state, None, batch)
    m = metrics_lib.finalize(m)
    np.testing.assert_allclose(m["loss"], loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m["grad_norm"], jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))), rtol=1e-4)
    # compare_routes: the log-ratio under the router's own picks and under the replayed routes, same params and batch.
    for name, logp in (("own", unreplayed), ("replayed", replayed)):
        d = np.abs(np.asarray(logp, np.float64) - np.asarray(old_logp, np.float64))
        np.testing.assert_allclose(m[f"routing/log_ratio_abs_mean_{name}"], (d * mask).sum() / mask.sum(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(m[f"routing/log_ratio_abs_max_{name}"], d[np.asarray(mask) > 0].max(), rtol=1e-4, atol=1e-6)
    assert m["routing/log_ratio_abs_mean_own"] != m["routing/log_ratio_abs_mean_replayed"]
    _, aux = jax.jit(models.forward_with_aux, static_argnums=0)(  # the replayed forward's router
        model, params, tokens[:, :-1], positions[:, :-1], segments[:, :-1], jnp.moveaxis(routes, 1, 0))
    logits = np.asarray(aux["router_logits"], np.float64)[:, :, -NEW:]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    own, entropy = np.argsort(-probs, axis=-1)[..., :K], -(probs * np.log(probs)).sum(-1)
    want = numpy_metrics(own, entropy, np.asarray(routes)[:, :, -NEW:], mask, replay=True)
    assert 0.05 < want["routing/changed_sets_frac"] < 0.95  # the recorded sets really differ in part
    for name, value in want.items():
        np.testing.assert_allclose(m[name], value, rtol=1e-5, err_msg=name)


def test_compare_routes_under_a_scanned_layer_loop(rollouts):
    """compare_routes with the layers in one lax.scan (the TPU/GPU default; CPU unrolls): the log-ratio
    under the router's own picks and under pi_old's recorded routes, as two forwards of each give them."""
    model = dataclasses.replace(MOE, num_layers=2, mlp_only_layers=(), layer_loop="scan")
    params = models.init(model, jax.random.key(0))
    old_params = dict(params, moe=dict(params["moe"], router=params["moe"]["router"]
                                       + 0.05 * jax.random.normal(jax.random.key(2), params["moe"]["router"].shape)))
    tokens, positions, segments, mask = rollouts
    old_logp, routes = ts.old_logprobs(model, 0.7, old_params, tokens, positions, segments, mask)
    cfg = Config(
        model=model, sampling=SamplingConfig(max_prompt_len=PROMPT, max_new_tokens=NEW, group_size=4, temperature=0.7),
        algorithm=algorithms.AlgorithmConfig.from_preset("grpo", beta=0.0, routing_replay="old"),
        optim=OptimConfig(learning_rate=1e-3), train=TrainConfig(compare_routes=True),
    )
    batch = ts.Batch(tokens, positions, segments, mask, old_logp, old_logp, jnp.ones(B, jnp.float32), routes)
    optimizer, state_sharding, _, step = ts.compiled_train_step(cfg, 10, sharding.make_mesh(MeshConfig(data=-1)))
    _, m = step(jax.device_put(ts.init_state(jax.tree.map(jnp.copy, params), optimizer), state_sharding), None, batch)
    m = metrics_lib.finalize(m)
    for name, given in (("own", None), ("replayed", routes)):
        logp, _ = ts.old_logprobs(model, 0.7, params, tokens, positions, segments, mask, given)
        d = np.abs(np.asarray(logp, np.float64) - np.asarray(old_logp, np.float64))
        np.testing.assert_allclose(m[f"routing/log_ratio_abs_mean_{name}"], (d * mask).sum() / mask.sum(), rtol=1e-4, atol=1e-6)
    assert m["routing/log_ratio_abs_mean_own"] > m["routing/log_ratio_abs_mean_replayed"] + 1e-4


def test_dense_models_reject_routing_replay(tmp_path):
    dense = dataclasses.replace(MOE, model_type="qwen3", num_experts=0, num_experts_per_tok=0, mlp_only_layers=())
    replay = algorithms.AlgorithmConfig.from_preset("grpo", routing_replay="old")
    with pytest.raises(ValueError, match="routing_replay='old' replays mixture-of-experts routes.*no MoE layer"):
        Config(model=dense, algorithm=replay)
    models.save_hf(dense, models.init(dense, jax.random.key(0)), tmp_path)  # a model_path: caught before loading
    with pytest.raises(ValueError, match="no MoE layer"):
        trainer.check(Config(model_path=str(tmp_path), algorithm=replay, train=TrainConfig(out_dir=str(tmp_path / "run"))))
    with pytest.raises(ValueError, match="compare_routes=True compares mixture-of-experts routes"):
        Config(model=dense, train=TrainConfig(compare_routes=True))
    with pytest.raises(ValueError, match="routing_replay='none'"):  # a loss without ratio: R2 would do nothing
        algorithms.AlgorithmConfig.from_preset("gpg", routing_replay="old")


TINY_MOE = models.ModelConfig(
    model_type="qwen3_moe", vocab_size=CharTokenizer.vocab_size, hidden_size=32, intermediate_size=64,
    num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, num_experts=E, num_experts_per_tok=K,
    moe_intermediate_size=16, tie_word_embeddings=True, bos_token_id=CharTokenizer.bos_id,
    eos_token_id=CharTokenizer.eos_id,
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One out_dir for every tiny-MoE run, so that runs of one mode share their compiled programs."""
    return tmp_path_factory.mktemp("moe")


def moe_run(run_dir, mode: str) -> Config:
    return Config(
        # tensor=4 leaves this tiny model's attention and embedding whole: past the sharding tolerance
        model=TINY_MOE, tokenizer="char", mesh=MeshConfig(data=2, tensor=-1, max_replicated_fraction=1.0),
        sampling=SamplingConfig(max_prompt_len=6, max_new_tokens=4, group_size=4, stop_tokens=tuple(range(3, 50))),
        algorithm=algorithms.AlgorithmConfig.from_preset("grpo", beta=0.0, routing_replay=mode),
        reward=RewardConfig(names=("exact", "length"), weights=(1.0, 0.5), num_workers=1),
        optim=OptimConfig(learning_rate=3e-2),
        train=TrainConfig(steps=1, prompts_per_step=2, minibatches=2, eval_prompts=4, out_dir=str(run_dir),
                          compare_routes=True),
    )


@pytest.mark.parametrize("mode", algorithms.config.ROUTING_REPLAY)
def test_a_tiny_moe_policy_trains_with_each_routing_replay(mode, run_dir):
    """One RL step of GRPO (2 minibatches) on a char-level Qwen3-MoE: the first update runs at pi_old's
    params, so its ratio is 1 and the router's picks are the recorded ones (for R3 those of the sampler,
    which checks their packing into the batch); the routing metrics are reported."""
    t = trainer.Trainer(moe_run(run_dir, mode))
    metrics, (first, second) = t.train_step()
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert first["log_ratio_abs_max"] < 1e-5 and first["routing/changed_sets_frac"] == 0
    # compare_routes, whichever routes the update runs on: at pi_old's params both ratios are 1.
    assert max(first[f"routing/log_ratio_abs_max_{r}"] for r in ("own", "replayed")) < 1e-5
    assert second["routing/log_ratio_abs_mean_own"] > 0 and second["routing/log_ratio_abs_mean_replayed"] > 0
    assert 0 < first["routing/entropy_mean"] <= np.log(E)
    assert 1 <= metrics["routing/expert_load"] <= E / K
    assert int(t.state.step) == 2 and int(t.state.skipped) == 0
