"""THE jitted train step: policy (and reference) log-probs, the registry loss, exact accumulation, AdamW.

One call is one optimizer update on a minibatch of rollouts. The minibatch is split into
`micro_batches` slices run under `lax.scan`; each slice's loss is its exact share of the minibatch
loss (one `algorithms.Normalizer` for the whole minibatch), so gradients and metrics equal those of
the unsplit minibatch. Log-probs come from the final hidden states through
`kernels.fused_logprobs`: no [batch, seq, vocab] logits exist in training. A non-finite loss or
gradient leaves params and optimizer state untouched and increments `TrainState.skipped`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PyTree

import kernels
from grpo_jax import algorithms, models, sharding
from grpo_jax.config import Config, OptimConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """A minibatch of rollouts. `tokens` is the left-padded prompt followed by the completion."""

    tokens: Int[Array, "batch seq"]
    positions: Int[Array, "batch seq"]
    segment_ids: Int[Array, "batch seq"]  # 0 on left padding
    mask: Float[Array, "batch new"]  # m_{i,t} over the completion (the last `new` tokens)
    old_logp: Float[Array, "batch new"]  # l^old, fixed for the whole rollout batch
    sampler_logp: Float[Array, "batch new"]  # l^samp, as reported by the sampler
    advantages: Float[Array, "batch"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: PyTree
    opt_state: PyTree
    step: Int[Array, ""]  # optimizer updates applied
    skipped: Int[Array, ""]  # updates skipped for a non-finite loss or gradient


def learning_rate(cfg: OptimConfig, total_updates: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to 0 at `total_updates`."""
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    if cfg.schedule == "constant":
        after = optax.constant_schedule(cfg.learning_rate)
    else:
        after = optax.cosine_decay_schedule(cfg.learning_rate, max(total_updates - cfg.warmup_steps, 1))
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig, total_updates: int) -> optax.GradientTransformation:
    clip = [optax.clip_by_global_norm(cfg.max_grad_norm)] if cfg.max_grad_norm > 0 else []
    adamw = optax.adamw(
        learning_rate(cfg, total_updates), cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay
    )
    return optax.chain(*clip, adamw)


def init_state(params: PyTree, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def sequences(
    prompt_tokens: Int[Array, "batch prompt_len"],
    prompt_lengths: Int[Array, "batch"],
    completions: Int[Array, "batch new"],
) -> tuple[Int[Array, "batch seq"], Int[Array, "batch seq"], Int[Array, "batch seq"]]:
    """(tokens, positions, segment_ids) of left-padded prompts followed by their completions."""
    tokens = jnp.concatenate([prompt_tokens, completions], axis=1)
    real = jnp.arange(tokens.shape[1]) >= prompt_tokens.shape[1] - prompt_lengths[:, None]
    positions = jnp.maximum(jnp.cumsum(real, axis=1) - 1, 0).astype(jnp.int32)
    return tokens.astype(jnp.int32), positions, real.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1, 7))
def completion_logprobs(
    model_cfg: models.ModelConfig,
    temperature: float,
    params: PyTree,
    tokens: Int[Array, "batch seq"],
    positions: Int[Array, "batch seq"],
    segment_ids: Int[Array, "batch seq"],
    mask: Float[Array, "batch new"],
    with_entropy: bool = False,
) -> tuple[Float[Array, "batch new"], Float[Array, "batch new"] | None]:
    """log pi(y_t | x, y_<t) of the last `new` tokens under logits / temperature (and entropies).

    Jitted on its own for the trainer's one l^old pass per rollout batch; inlined inside the step.
    """
    batch, new = mask.shape
    hidden = models.forward(model_cfg, params, tokens[:, :-1], positions[:, :-1], segment_ids[:, :-1])
    hidden = hidden[:, -new:].reshape(batch * new, -1)
    tied = model_cfg.tie_word_embeddings  # the [V, d] table as is: `embed.T` would be copied
    out = kernels.fused_logprobs(
        hidden,
        params["embed"] if tied else models.unembedding(model_cfg, params),
        tokens[:, -new:].reshape(-1),
        temperature,
        mask=mask.reshape(-1) > 0,
        return_entropy=with_entropy,
        impl=None if model_cfg.logprobs_impl == "auto" else model_cfg.logprobs_impl,
        transposed=tied,
    )
    if with_entropy:
        logp, entropy = out
        return logp.reshape(batch, new), entropy.reshape(batch, new)
    return out.reshape(batch, new), None


def _loss(cfg: Config, params, ref_params, batch: Batch, normalizer):
    alg, logprobs = cfg.algorithm, functools.partial(completion_logprobs, cfg.model, cfg.sampling.temperature)
    # Entropy is reported every step, not only when it is a loss term.
    logp, entropy = logprobs(params, batch.tokens, batch.positions, batch.segment_ids, batch.mask, True)
    ref_logp = None
    if alg.beta > 0:
        ref_logp, _ = logprobs(ref_params, batch.tokens, batch.positions, batch.segment_ids, batch.mask, False)
        ref_logp = jax.lax.stop_gradient(ref_logp)
    return algorithms.policy_loss(
        alg,
        logp,
        batch.old_logp,
        batch.advantages,
        batch.mask,
        ref_logp=ref_logp,
        sampler_logp=batch.sampler_logp,
        entropy=entropy,
        normalizer=normalizer,
    )


def _micro_batches(batch: Batch, k: int) -> Batch:
    """[B, ...] -> [k, B/k, ...], slice j holding rows j, j+k, ... (each device keeps its rows)."""
    def split(x):
        return jnp.moveaxis(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 1, 0)

    return jax.tree.map(split, batch)


def _identity(name: str) -> Float[Array, ""]:
    """The neutral element of `algorithms.combine_metrics` for a metric of this name."""
    return jnp.float32(-jnp.inf if name.endswith("_max") else jnp.inf if name.endswith("_min") else 0.0)


def train_step(
    cfg: Config,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    ref_params: PyTree | None,
    batch: Batch,
) -> tuple[TrainState, dict[str, Float[Array, ""]]]:
    """One optimizer update on `batch` (pure; `jit_train_step` compiles it)."""
    k = cfg.train.micro_batches
    if batch.advantages.shape[0] % k:
        raise ValueError(
            f"a minibatch of {batch.advantages.shape[0]} completions does not split into "
            f"train.micro_batches={k}; choose a divisor"
        )
    normalizer = algorithms.normalizer(cfg.algorithm, batch.mask, cfg.sampling.max_new_tokens)
    grad_fn = jax.value_and_grad(functools.partial(_loss, cfg), has_aux=True)

    def accumulate(carry, micro):
        grads, loss, metrics = carry
        (l, m), g = grad_fn(state.params, ref_params, micro, normalizer)
        return (
            jax.tree.map(jnp.add, grads, g),
            loss + l,
            algorithms.combine_metrics(metrics, m),
        ), None

    micro = _micro_batches(batch, k)
    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    shapes = jax.eval_shape(grad_fn, state.params, ref_params, jax.tree.map(lambda x: x[0], micro), normalizer)
    metrics0 = {name: (_identity(name), jnp.zeros((), jnp.float32)) for name in shapes[0][1]}
    (grads, loss, metrics), _ = jax.lax.scan(
        accumulate, (zero_grads, jnp.zeros((), jnp.float32), metrics0), micro
    )

    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
    new_state = TrainState(
        params=keep(params, state.params),
        opt_state=keep(opt_state, state.opt_state),
        step=state.step + finite.astype(jnp.int32),
        skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    metrics = {
        **algorithms.finalize_metrics(metrics),
        "loss": loss,
        "grad_norm": grad_norm,
        "skipped_updates": new_state.skipped.astype(jnp.float32),
    }
    return new_state, metrics


def batch_shardings(mesh: jax.sharding.Mesh) -> Batch:
    """Every Batch leaf split over its leading (batch) axis by the `batch` sharding rule."""
    two, one = sharding.batch_sharding(mesh, 2), sharding.batch_sharding(mesh, 1)
    return Batch(two, two, two, two, two, two, one)


def jit_train_step(cfg: Config, optimizer: optax.GradientTransformation, mesh, state_sharding, ref_sharding):
    """`train_step` under one `jax.jit` with declared shardings; the state is donated.

    `ref_sharding` is None when beta = 0 (no reference params exist). Metrics come back replicated.
    """
    return jax.jit(
        functools.partial(sharding.activation_rules(mesh)(train_step), cfg, optimizer),
        in_shardings=(state_sharding, ref_sharding, batch_shardings(mesh)),
        out_shardings=(state_sharding, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),
        donate_argnums=0,
    )


@functools.lru_cache(maxsize=None)
def compiled_train_step(cfg: Config, total_updates: int, mesh: jax.sharding.Mesh):
    """(optimizer, state sharding, reference-params sharding or None, jitted step) for a run.

    Cached on (config, schedule length, mesh), so runs that share them (a resume in the same
    process, a sweep over seeds) share one compilation.
    """
    optimizer = make_optimizer(cfg.optim, total_updates)
    params = jax.eval_shape(lambda key: models.init(cfg.model, key), jax.random.key(0))
    state = jax.eval_shape(lambda p: init_state(p, optimizer), params)
    state_sharding = sharding.param_shardings(state, cfg.model, mesh)
    ref_sharding = sharding.param_shardings(params, cfg.model, mesh) if cfg.algorithm.beta > 0 else None
    return optimizer, state_sharding, ref_sharding, jit_train_step(cfg, optimizer, mesh, state_sharding, ref_sharding)
