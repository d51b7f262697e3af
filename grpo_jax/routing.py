"""Mixture-of-experts routing in RL: routing replay, and the routing metrics of every update.

Routing replay (`AlgorithmConfig.routing_replay`) fixes the top-k expert SET of every (token, MoE
layer) in the training forwards of a rollout batch; the gate weights still come from the current
router's probabilities over that set, so the router keeps learning. "old" (R2, the GSPO paper's
Routing Replay, arXiv 2507.18071 sec. 5.3) replays the experts picked when l^old is computed; "sampler"
(R3, Rollout Routing Replay, arXiv 2510.11370) those the sampler picked while generating. The pieces:
`models.decoder._moe` runs replayed routes, the sampler's KV cache records them (`Rollout.routes`),
`train_step.old_logprobs` fills `Batch.routes` (pi_old's routes, also without replay: the metrics
below compare with them) and the train step replays them.

Metrics (each update; over counted completion tokens only, i.e. at the positions whose hidden states
give the counted log-probs, weighted by the loss mask; exact under micro-batching):

- `routing/changed_sets_frac`: fraction of (token, MoE layer) whose top-k set under the update's
  params differs from pi_old's (`Batch.routes`); `routing/changed_experts_frac`: the fraction of the
  k experts that differ, the GSPO paper's unit (about 10% after each gradient update for the 48-layer
  Qwen3-30B-A3B). An update's forward runs at the params before its own gradient, so the j-th update
  of a rollout batch sees the drift of j - 1 updates: 0 on the first (per-update values, as the trainer
  returns them, separate them).
- `routing/entropy_mean`: router entropy, mean over counted tokens and MoE layers.
- `routing/expert_load`: max / mean over experts of the routed token counts (the experts the forward
  ran: replayed or the router's own), per MoE layer, averaged over layers; the counts are summed over
  micro-batches before the ratio, and updates merge weighted by their counted tokens.
- With `train.compare_routes`: the token log-ratio to pi_old under the router's own picks and under
  pi_old's replayed routes, on the same params and batch (`ratio_by_routes`).
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from grpo_jax.metrics import Metric


def metrics(
    aux: dict[str, Array],
    recorded: Int[Array, "batch moe_layers seq_minus_1 k"] | None,
    replayed: bool,
    mask: Float[Array, "batch new"],
    num_experts: int,
) -> tuple[dict[str, Metric], Float[Array, "moe_layers experts"]]:
    """One micro-batch's routing metrics and routed token counts per (MoE layer, expert), from the aux of
    `models.forward_with_aux` over tokens[:, :-1] and the recorded routes (None: no pi_old routes)."""
    new = mask.shape[1]
    own = aux["routes"][:, :, -new:]  # [layers, batch, new, k]
    k = own.shape[-1]
    weight = jnp.broadcast_to(mask.astype(jnp.float32), own.shape[:3])
    out = {"routing/entropy_mean": Metric.mean(aux["router_entropy"][:, :, -new:], weight)}
    used = own
    if recorded is not None:
        old = jnp.moveaxis(recorded, 1, 0)[:, :, -new:]
        shared = jnp.sum(own[..., :, None] == old[..., None, :], axis=(-2, -1))  # |own & old|: sets, no repeats
        out["routing/changed_sets_frac"] = Metric.mean(shared < k, weight)
        out["routing/changed_experts_frac"] = Metric.mean(1.0 - shared / k, weight)
        used = old if replayed else own

    def count(experts, w):  # one layer: counted tokens routed to each expert
        return jnp.zeros(num_experts, jnp.float32).at[experts.reshape(-1)].add(
            jnp.broadcast_to(w[..., None], experts.shape).reshape(-1))

    return out, jax.vmap(count)(used, weight)


def expert_load(counts: Float[Array, "moe_layers experts"], num_tokens: Float[Array, ""]) -> Metric:
    """Max / mean over experts of a minibatch's routed token counts, averaged over MoE layers; weighted
    by the minibatch's counted tokens (0 without any)."""
    mean = counts.mean(-1)
    load = jnp.where(mean > 0, counts.max(-1) / jnp.maximum(mean, 1e-30), 0.0).mean()
    return Metric.mean(load, num_tokens)


def ratio_by_routes(own_logp, replayed_logp, old_logp, mask) -> dict[str, Metric]:
    """The token log-ratio to pi_old on the same params and batch under the router's own picks and under
    pi_old's replayed routes (`train.compare_routes`): `routing/log_ratio_abs_mean_own` and
    `routing/log_ratio_abs_mean_replayed` (mean |log ratio| over counted tokens), and
    `routing/log_ratio_abs_max_own` and `..._replayed`. Their gap is what the routes that moved add to
    the ratio's drift (GSPO, arXiv 2507.18071, sec. 5.3)."""
    out = {}
    for name, logp in (("own", own_logp), ("replayed", replayed_logp)):
        d = jnp.abs(jax.lax.stop_gradient(logp - old_logp).astype(jnp.float32))
        out[f"routing/log_ratio_abs_mean_{name}"] = Metric.mean(d, mask)
        out[f"routing/log_ratio_abs_max_{name}"] = Metric.max(d, mask)
    return out
