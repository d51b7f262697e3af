"""THE jitted train step: policy (and reference) log-probs, the registry loss, exact accumulation, AdamW.

One call is one optimizer update on a minibatch of rollouts. The minibatch is split into
`micro_batches` slices run under `lax.scan`; each slice's loss is its exact share of the minibatch
loss (one `algorithms.Normalizer` for the whole minibatch), so gradients and metrics equal those of
the unsplit minibatch. Variants that decide over the whole minibatch (`algorithms.needs_step_stats`:
Clip-Cov, KL-Cov, top-entropy selection, the losses over groups) get one no-grad pass over every
micro-batch first, and their decisions split with the rows. Log-probs come from the final hidden states through
`kernels.fused_logprobs`: no [batch, seq, vocab] logits exist in training. Under `train.prefix_grouper`
each group's prompt is encoded once (`prefix_group`), and micro-batches split by whole groups. Under
`train.packing` the forwards run the rows packed end to end (`Batch.packing`, `grpo_jax.packing`).

An update is not applied (params, optimizer state and step untouched) when its minibatch has no
counted token (`TrainState.empty`, metric `empty_updates`) or when the loss, the gradient or the
updated parameters / optimizer state are not finite (`TrainState.skipped`, metric `skipped_updates`,
and the first failing check as `nonfinite_loss`, `nonfinite_grad` or `nonfinite_params`). Metrics
are `grpo_jax.metrics.Metric`s: counters are sums, so merging a step's updates adds them.
"""

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float, Int, PyTree

import kernels
from grpo_jax import algorithms, lora, models, routing, sharding
from grpo_jax import metrics as metrics_lib
from grpo_jax import packing as packing_lib
from grpo_jax.config import Config, OptimConfig
from grpo_jax.metrics import Metric
from grpo_jax.typecheck import checked

# Per-update flags, summed over a step's updates: why an update was not applied.
SKIP_CAUSES = ("nonfinite_loss", "nonfinite_grad", "nonfinite_params")


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """A minibatch of rollouts. `tokens` is the left-padded prompt followed by the completion."""

    tokens: Int[Array, "batch seq"]
    positions: Int[Array, "batch seq"]
    segment_ids: Int[Array, "batch seq"]  # 0 on left padding
    mask: Float[Array, "batch new"]  # m_{i,t} over the completion (the last `new` tokens)
    # l^old, fixed for the whole rollout batch; None when the update is on-policy (`on_policy`): sg(l)
    old_logp: Float[Array, "batch new"] | None
    sampler_logp: Float[Array, "batch new"]  # l^samp, as reported by the sampler
    advantages: Float[Array, "batch"] | Float[Array, "batch new"]  # per token: turn-level credit (turn_discount)
    # MoE policies: pi_old's experts for every input token (tokens[:, :-1]) and MoE layer, from
    # `old_logprobs`; replayed in every forward when algorithm.routing_replay is set, compared with
    # the router's own picks by the routing metrics (grpo_jax.routing). Batch-major, like every field,
    # so minibatches, micro-batches and the `batch` sharding rule split it with its rows.
    routes: Int[Array, "batch moe_layers seq_minus_1 k"] | None = None
    # train.packing: the rows laid end to end for the training forwards (grpo_jax.packing); None: padded
    packing: packing_lib.Packing | None = None


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: PyTree
    opt_state: PyTree
    step: Int[Array, ""]  # optimizer updates applied
    skipped: Int[Array, ""]  # updates skipped for a non-finite loss, gradient or update
    empty: Int[Array, ""]  # updates skipped for a minibatch without counted tokens


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
    step, skipped, empty = (jnp.zeros((), jnp.int32) for _ in range(3))  # three buffers: the state is donated
    return TrainState(params, optimizer.init(params), step, skipped, empty)


def on_policy(cfg: Config) -> bool:
    """Whether every update of a step is exactly on-policy: one pass (num_iterations 1) in one minibatch,
    so the params that train are those that sampled. Then l^old = sg(l) from the update's own forward
    (the ratio is 1 with the true gradient) and the separate l^old forward is skipped: `Batch.old_logp`
    is None. MoE policies keep that pass: it records pi_old's routes (`Batch.routes`) for routing
    replay and the routing metrics. Under train.max_staleness > 0 only with train.proximal="trainer"
    (l^old under the params that train); with "sampler" l^old is under the older params that sampled.
    Never under train.proximal="rollout": l^old is the sampler's log-probs, not sg(l)."""
    return (cfg.algorithm.num_iterations == 1 and cfg.train.minibatches == 1 and not any(cfg.model.moe_layers)
            and not (cfg.train.max_staleness and cfg.train.proximal == "sampler") and cfg.train.proximal != "rollout")


def prefix_group(cfg: Config) -> int:
    """How many consecutive rows share one encoding of their prompt in the training forwards:
    sampling.group_size under train.prefix_grouper (a rollout batch's groups are consecutive rows),
    else 1 (every row encodes its own)."""
    return cfg.sampling.group_size if cfg.train.prefix_grouper else 1


def check(cfg: Config) -> None:
    """Errors of the update schedule a user can cause, raised before anything compiles."""
    alg, tr = cfg.algorithm, cfg.train
    if tr.packing and tr.prefix_grouper:
        raise ValueError("train.packing=True: train.prefix_grouper=True shares each group's prompt across rows, "
                         "which packing lays apart; set train.packing=False or train.prefix_grouper=False")
    # A model_path's architecture is checked by grpo_jax.trainer.check, which reads its config.json.
    if tr.prefix_grouper and cfg.model is not None and any(cfg.model.moe_layers):
        raise ValueError(
            "train.prefix_grouper=True: this MoE model's routing metrics and routing replay read every "
            "token of a row, which prefix grouping encodes once per group; set train.prefix_grouper=False"
        )
    slices = tr.minibatches * tr.micro_batches
    if tr.prefix_grouper and tr.prompts_per_step % slices:
        raise ValueError(
            f"train.prefix_grouper=True encodes each group's prompt once, so every micro-batch must hold whole "
            f"groups, but train.prompts_per_step={tr.prompts_per_step} groups do not split into train.minibatches="
            f"{tr.minibatches} x train.micro_batches={tr.micro_batches} = {slices} slices; choose divisors"
        )
    if not alg.loss.spec.ratio and tr.minibatches > 1:
        raise ValueError(
            f"algorithm.loss={alg.loss.name!r} has no importance ratio, so minibatches 2..{tr.minibatches} of a "
            "rollout batch would train on samples of an older policy without correction; use "
            "train.minibatches=1 (and grow train.micro_batches for memory) or a ratio loss (e.g. ppo_clip)."
        )
    if alg.loss.spec.needs_groups and tr.prompts_per_step % tr.minibatches:
        raise ValueError(
            f"algorithm.loss={alg.loss.name!r} compares the completions of a group, but train.prompts_per_step="
            f"{tr.prompts_per_step} prompts do not split into train.minibatches={tr.minibatches} minibatches of "
            "whole groups; choose a divisor."
        )


@checked  # a public entry point: misshapen inputs are named, with their axes
def sequences(
    prompt_tokens: Int[ArrayLike, "batch prompt_len"],
    prompt_lengths: Int[ArrayLike, "batch"],
    completions: Int[ArrayLike, "batch new"],
) -> tuple[Int[Array, "batch seq"], Int[Array, "batch seq"], Int[Array, "batch seq"]]:
    """(tokens, positions, segment_ids) of left-padded prompts followed by their completions."""
    tokens = jnp.concatenate([prompt_tokens, completions], axis=1)
    real = jnp.arange(tokens.shape[1]) >= prompt_tokens.shape[1] - prompt_lengths[:, None]
    positions = jnp.maximum(jnp.cumsum(real, axis=1) - 1, 0).astype(jnp.int32)
    return tokens.astype(jnp.int32), positions, real.astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1, 7), static_argnames=("group",))
@checked  # checked when traced
def completion_logprobs(
    model_cfg: models.ModelConfig,
    temperature: float,
    params: PyTree,
    tokens: Int[Array, "batch seq"],
    positions: Int[Array, "batch seq"],
    segment_ids: Int[Array, "batch seq"],
    mask: Float[Array, "batch new"],
    with_entropy: bool = False,
    routes: Int[Array, "batch moe_layers seq_minus_1 k"] | None = None,
    group: int = 1,
    packing: packing_lib.Packing | None = None,
) -> tuple[Float[Array, "batch new"], Float[Array, "batch new"] | None]:
    """log pi(y_t | x, y_<t) of the last `new` tokens under logits / temperature (and entropies),
    replaying `routes` (see `Batch.routes`) if given; rows in runs of `group` sharing their prompt
    encode it once (`prefix_group`); with `packing` (`Batch.packing`) the forward runs the rows packed.
    Jitted on its own; inlined inside the step."""
    return _completion_forward(model_cfg, temperature, params, tokens, positions, segment_ids, mask, with_entropy,
                               routes, group, packing)[:2]


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("group",))
def old_logprobs(
    model_cfg: models.ModelConfig,
    temperature: float,
    params: PyTree,
    tokens: Int[Array, "batch seq"],
    positions: Int[Array, "batch seq"],
    segment_ids: Int[Array, "batch seq"],
    mask: Float[Array, "batch new"],
    routes: Int[Array, "batch moe_layers seq_minus_1 k"] | None = None,
    group: int = 1,
    packing: packing_lib.Packing | None = None,
) -> tuple[Float[Array, "batch new"], Int[Array, "batch moe_layers seq_minus_1 k"] | None]:
    """The one l^old pass of a rollout batch, and pi_old's routes for `Batch.routes` (MoE; else None).

    Given routes (routing_replay="sampler", R3: `Rollout.routes`) are replayed here too and returned;
    otherwise the routes are those this forward's router picks (what "old", R2, replays)."""
    logp, _, aux = _completion_forward(model_cfg, temperature, params, tokens, positions, segment_ids, mask, False,
                                       routes, group, packing)
    if "routes" not in aux:
        return logp, None
    return logp, jnp.moveaxis(aux["routes"], 0, 1) if routes is None else routes


def _completion_forward(model_cfg, temperature, params, tokens, positions, segment_ids, mask, with_entropy, routes,
                        group=1, packing=None):
    """(log-probs, entropies or None, the decoder's aux) of the last `new` tokens."""
    batch, new = mask.shape
    if packing is not None:
        if group > 1:
            raise ValueError("train.packing lays rows apart: it takes no prefix grouping")
        hidden, aux = packing_lib.completion_hidden(model_cfg, params, packing, new, routes)
    elif group > 1:
        hidden, aux = _grouped_hidden(model_cfg, params, tokens, positions, segment_ids, new, group), {}
    else:
        replay = None if routes is None else jnp.moveaxis(routes, 1, 0)  # the decoder's [moe_layers, batch, ...]
        hidden, aux = models.forward_with_aux(
            model_cfg, params, tokens[:, :-1], positions[:, :-1], segment_ids[:, :-1], replay
        )
        hidden = hidden[:, -new:]
    hidden = hidden.reshape(batch * new, -1)
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
        return logp.reshape(batch, new), entropy.reshape(batch, new), aux
    return out.reshape(batch, new), None, aux


def _grouped_hidden(model_cfg, params, tokens, positions, segment_ids, new, group):
    """The hidden states that predict the last `new` tokens, [batch, new, d], with each run of `group`
    rows sharing one encoding of their prompt (`models.forward_shared_prefix`, Prefix Grouper); the
    backward sums the G rows' gradients into it. The first completion token is predicted from the
    prompt's last position."""
    prompt, first = tokens.shape[1] - new, slice(None, None, group)  # `first`: one row per group
    shared = (tokens[first, :prompt], positions[first, :prompt], segment_ids[first, :prompt])
    if new == 1:
        prompt_hidden = models.forward(model_cfg, params, *shared)
        return jnp.repeat(prompt_hidden[:, -1:], group, axis=0)
    prompt_hidden, hidden = models.forward_shared_prefix(model_cfg, params, *shared, tokens[:, prompt:-1],
                                                         positions[:, prompt:-1], segment_ids[:, prompt:-1])
    return jnp.concatenate([jnp.repeat(prompt_hidden[:, -1:], group, axis=0), hidden], axis=1)


def _replayed_routes(cfg: Config, batch: Batch):
    """The routes every training forward runs on (None: the router's own picks)."""
    if cfg.algorithm.routing_replay == "none":
        return None
    if batch.routes is None:
        raise ValueError(f"algorithm.routing_replay={cfg.algorithm.routing_replay!r} needs Batch.routes: build the "
                         "batch with the routes train_step.old_logprobs returns")
    return batch.routes


def _loss(cfg: Config, params, ref_params, batch: Batch, normalizer, stats):
    alg, group = cfg.algorithm, prefix_group(cfg)
    logprobs = functools.partial(completion_logprobs, cfg.model, cfg.sampling.temperature, group=group)
    replayed = _replayed_routes(cfg, batch)
    # Entropy is reported every step, not only when it is a loss term.
    logp, entropy, aux = _completion_forward(cfg.model, cfg.sampling.temperature,
                                             lora.policy_params(cfg.lora, params, ref_params), batch.tokens,
                                             batch.positions, batch.segment_ids, batch.mask, True, replayed, group,
                                             batch.packing)
    old_logp = jax.lax.stop_gradient(logp) if batch.old_logp is None else batch.old_logp
    ref_logp = None
    if alg.beta > 0:  # the frozen reference routes by its own router
        ref_logp, _ = logprobs(ref_params, batch.tokens, batch.positions, batch.segment_ids, batch.mask, False,
                               packing=batch.packing)
        ref_logp = jax.lax.stop_gradient(ref_logp)
    loss, metrics = algorithms.policy_loss(
        alg,
        logp,
        old_logp,
        batch.advantages,
        batch.mask,
        ref_logp=ref_logp,
        sampler_logp=batch.sampler_logp,
        entropy=entropy,
        normalizer=normalizer,
        stats=stats,
    )
    if cfg.train.max_staleness:  # the trainer's policy against the stale sampler's: staleness and numerics
        gap = jnp.abs(logp - batch.sampler_logp.astype(jnp.float32)) * batch.mask
        metrics.update({"staleness/logprob_gap_mean": Metric.mean(gap, batch.mask),
                        "staleness/logprob_gap_max": Metric.max(gap, batch.mask)})
    if cfg.train.length_buckets:
        metrics.update(algorithms.ratio_by_length(logp, old_logp, batch.mask, cfg.train.length_buckets))
    if cfg.train.compare_routes and batch.routes is not None:
        other, _ = logprobs(lora.policy_params(cfg.lora, params, ref_params), batch.tokens, batch.positions,
                            batch.segment_ids, batch.mask, False, None if replayed is not None else batch.routes,
                            packing=batch.packing)
        own, old_routes = (other, logp) if replayed is not None else (logp, other)
        metrics.update(routing.ratio_by_routes(own, old_routes, old_logp, batch.mask))
    counts = None
    if "routes" in aux:  # MoE
        routing_metrics, counts = routing.metrics(aux, batch.routes, replayed is not None, batch.mask,
                                                  cfg.model.num_experts)
        metrics.update(routing_metrics)
    return loss, (metrics, counts)


def _micro_batches(tree, k: int, unit: int = 1):
    """[B, ...] -> [k, B/k, ...] by runs of `unit` rows (`prefix_group`): slice j holds runs j, j+k, ...
    (each device keeps its rows)."""
    def split(x):
        runs = x.reshape(x.shape[0] // (k * unit), k, unit, *x.shape[1:])
        return jnp.moveaxis(runs, 1, 0).reshape(k, x.shape[0] // k, *x.shape[1:])

    return jax.tree.map(split, tree)


def _unsplit(x, unit: int = 1):
    """The inverse of `_micro_batches` for one array."""
    k = x.shape[0]
    runs = x.reshape(k, x.shape[1] // unit, unit, *x.shape[2:])
    return jnp.moveaxis(runs, 0, 1).reshape(-1, *x.shape[2:])


def _step_stats(cfg: Config, params, batch: Batch, micro: Batch, step) -> algorithms.StepStats:
    """The no-grad pass over every micro-batch, then the step's decisions on the whole minibatch.

    Clip-Cov's random choice comes from a permutation keyed by (train.seed, state.step)."""
    unit = prefix_group(cfg)

    def forward(mb):
        return completion_logprobs(cfg.model, cfg.sampling.temperature, params, mb.tokens, mb.positions,
                                   mb.segment_ids, mb.mask, True, _replayed_routes(cfg, mb), group=unit,
                                   packing=mb.packing)

    logp, entropy = (_unsplit(x, unit) for x in jax.lax.map(forward, micro))
    key = jax.random.fold_in(jax.random.key(cfg.train.seed), step)
    priority = jax.random.permutation(key, batch.mask.size).reshape(batch.mask.shape)
    old_logp = logp if batch.old_logp is None else batch.old_logp
    return algorithms.step_stats(cfg.algorithm, logp, old_logp, batch.advantages, batch.mask, entropy, priority,
                                 tokens=batch.tokens[:, -batch.mask.shape[1]:], group_size=cfg.sampling.group_size)


def _all_finite(tree) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def train_step(
    cfg: Config,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    ref_params: PyTree | None,
    batch: Batch,
) -> tuple[TrainState, dict[str, Metric]]:
    """One optimizer update on `batch` (pure; `jit_train_step` compiles it). Returns the new state and
    the update's metrics (`metrics.finalize` reads them; `metrics.combine` merges updates).

    `ref_params` are the frozen params: the reference when beta > 0 (None otherwise); with LoRA, the
    base the trained adapters (`state.params`) attach to, which is the reference too."""
    k, unit = cfg.train.micro_batches, prefix_group(cfg)
    if batch.old_logp is None and not on_policy(cfg):
        raise ValueError(
            f"Batch.old_logp is None, but with algorithm.num_iterations={cfg.algorithm.num_iterations} and "
            f"train.minibatches={cfg.train.minibatches} updates after the first are off-policy: pass l^old "
            "computed under the params that sampled (train_step.completion_logprobs)"
        )
    if batch.advantages.shape[0] % (k * unit):
        raise ValueError(
            f"a minibatch of {batch.advantages.shape[0]} completions does not split into "
            f"train.micro_batches={k}" + (f" of whole groups of {unit}" if unit > 1 else "") + "; choose a divisor"
        )
    normalizer = algorithms.normalizer(cfg.algorithm, batch.mask, cfg.sampling.max_new_tokens)
    micro = _micro_batches(batch, k, unit)
    stats = None
    if algorithms.needs_step_stats(cfg.algorithm):
        stats = _step_stats(cfg, lora.policy_params(cfg.lora, state.params, ref_params), batch, micro, state.step)
    grad_fn = jax.value_and_grad(functools.partial(_loss, cfg), has_aux=True)

    def accumulate(grads, xs):
        mb, mb_stats = xs
        (loss, (metrics, counts)), g = grad_fn(state.params, ref_params, mb, normalizer, mb_stats)
        return jax.tree.map(jnp.add, grads, g), (loss, metrics, counts)

    if k == 1:  # no loop: nothing to accumulate, and XLA fuses the gradient into the update
        (loss, (metrics, counts)), grads = grad_fn(state.params, ref_params, batch, normalizer, stats)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    else:
        zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        grads, (losses, metrics, counts) = jax.lax.scan(accumulate, zero_grads, (micro, _micro_batches(stats, k, unit)))
        loss, metrics = losses.sum(), metrics_lib.reduce_stacked(metrics)
        counts = None if counts is None else counts.sum(0)
    if counts is not None:  # MoE: the balance of the whole minibatch's routed token counts
        metrics["routing/expert_load"] = routing.expert_load(counts, normalizer.num_tokens)

    grad_norm = optax.tree.norm(grads)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    empty = normalizer.num_tokens == 0
    apply, causes = ~empty, {}
    for name, ok in zip(SKIP_CAUSES, (jnp.isfinite(loss), jnp.isfinite(grad_norm), _all_finite((params, opt_state)))):
        causes[name] = apply & ~ok  # only the first check that fails is named
        apply = apply & ok
    skipped = ~empty & ~apply
    keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(apply, new, old))
    new_state = TrainState(
        params=keep(params, state.params),
        opt_state=keep(opt_state, state.opt_state),
        step=state.step + apply.astype(jnp.int32),
        skipped=state.skipped + skipped.astype(jnp.int32),
        empty=state.empty + empty.astype(jnp.int32),
    )
    metrics.update({
        "grad_norm": Metric.mean(grad_norm, ~empty),
        "skipped_updates": Metric.sum(skipped),
        "empty_updates": Metric.sum(empty),
        **{name: Metric.sum(flag) for name, flag in causes.items()},
    })
    return new_state, metrics


def batch_shardings(mesh: jax.sharding.Mesh) -> Batch:
    """Every Batch leaf split over its leading (batch, or packed rows) axis by the `batch` sharding rule."""
    two, one = sharding.batch_sharding(mesh, 2), sharding.batch_sharding(mesh, 1)
    return Batch(two, two, two, two, two, two, one, sharding.batch_sharding(mesh, 4), one)  # packing: all [rows, ...]


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
    """(optimizer, state sharding, frozen-params sharding or None, jitted step) for a run. With LoRA the
    state holds the adapters and the frozen params are the base.

    Cached on (config, schedule length, mesh), so runs that share them (a resume in the same
    process, a sweep over seeds) share one compilation.
    """
    check(cfg)
    optimizer = make_optimizer(cfg.optim, total_updates)
    params = jax.eval_shape(lambda: models.init(cfg.model, jax.random.key(0)))  # no key made: no program run
    if cfg.lora.rank:
        trainable = jax.eval_shape(lambda: lora.init(cfg.model, cfg.lora, jax.random.key(0)))
        specs = lora.specs(cfg.model, cfg.lora)
    else:
        trainable, specs = params, models.param_specs(cfg.model)
    state = jax.eval_shape(lambda p: init_state(p, optimizer), trainable)
    state_sharding = sharding.tree_shardings(state, specs, mesh)
    sharding.check_replicated(state, specs, mesh, cfg.mesh.max_replicated_fraction)  # warns or raises
    frozen = cfg.algorithm.beta > 0 or cfg.lora.rank
    ref_sharding = models.param_shardings(params, cfg.model, mesh) if frozen else None
    return optimizer, state_sharding, ref_sharding, jit_train_step(cfg, optimizer, mesh, state_sharding, ref_sharding)
