"""LoRA adapters on the attention and MLP weights, as pure functions over the params pytree.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) trains a low-rank update of a frozen weight:
h = x W + (alpha / r) (x A) B, with A [in, r] drawn at random and B [r, out] zero, so training starts
from the base model exactly. Here the adapters are a pytree of their own, {"layers": {"q": {"a", "b"},
...}, "mlp": {"gate": ...}}, described by `specs` (shapes and logical axes derived from the base's
`param_specs`, so the sharding RULES place them like the weight they adapt: A's input axes and B's
output axes are the weight's own). `attach` wraps each targeted base leaf and its adapter in a
`LoraWeight`; the decoder multiplies by one without forming x (W + s A B): it computes x W + s (x A) B,
so a forward, the sampler and the train step cost r (in + out) extra per token and weight, never a
second copy of W. The train state holds only the adapters (so the optimizer state and the checkpoints
are adapter-sized); the base is frozen, shared with the sampler, and is the reference when beta > 0
(adapters at zero are the base model), so a KL term costs no second copy of the model. `merge`
folds the adapters into the weights, for export to Hugging Face.

Why not qwix (Tunix's LoRA): it rewrites the matmuls of Flax modules, and this decoder is plain
functions over a params dict (see the README); the adapted product here is a dozen lines.
"""

import dataclasses
import math
import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from grpo_jax.models import ModelConfig, ParamSpec, param_specs

# The weights an adapter may target, by group of the params tree, with how many of their axes after
# the layer axis are inputs (contracted with the activations); the rest are outputs.
INPUT_AXES = {"layers": {"q": 1, "k": 1, "v": 1, "o": 2}, "mlp": {"gate": 1, "up": 1, "down": 1}}
TARGETS = tuple(name for group in INPUT_AXES.values() for name in group)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`rank` 0 trains every weight (no adapters); > 0 trains only rank-`rank` adapters on `targets`
    (attention q, k, v, o; the dense MLP's gate, up, down; MoE experts are not adapted), scaled by
    alpha / rank."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        if self.rank < 0 or not 0 < self.alpha < math.inf:
            raise ValueError(f"LoraConfig: rank={self.rank} must be >= 0 (0: no adapters) and alpha={self.alpha} "
                             "finite and > 0")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"LoraConfig.targets={self.targets}: choose a non-empty subset of {TARGETS}")

    @property
    def scale(self) -> float:
        return self.alpha / max(self.rank, 1)


@typing.no_type_check  # built by pytree unflattening with any leaves: fields are not checked
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraWeight:
    """A frozen weight and its adapter, for one layer or stacked over layers like the weight."""

    base: Array
    a: Float[Array, "..."]  # [*input axes, rank]
    b: Float[Array, "..."]  # [rank, *output axes]
    scale: float = dataclasses.field(metadata=dict(static=True))

    def dense(self, x: Array, n_in: int) -> Array:
        """x [b, t, *in] @ W for W = base + scale * a b, without forming W: flat 2-D matmuls, like the
        decoder's own (`models.decoder._dense`)."""
        b, t = x.shape[:2]
        rows = x.reshape(b * t, math.prod(self.base.shape[:n_in]))
        low = rows @ self.a.reshape(rows.shape[1], -1)
        y = rows @ self.base.reshape(rows.shape[1], -1) + self.scale * (low @ self.b.reshape(low.shape[1], -1))
        return y.reshape(b, t, *self.base.shape[n_in:])


def specs(model_cfg: ModelConfig, cfg: LoraConfig) -> dict:
    """The adapters as ParamSpecs: A [layers, *inputs, rank] and B [layers, rank, *outputs], axes named
    like the weight's (the rank axis is replicated)."""
    base = param_specs(model_cfg)
    out = {}
    for group, names in INPUT_AXES.items():
        for name in (n for n in cfg.targets if n in names):
            if name not in base.get(group, {}):
                raise ValueError(f"LoraConfig.targets has {name!r}, but this model has no {group} {name} weight "
                                 "(a MoE model's MLP weights are experts, which LoRA does not adapt)")
            spec, k = base[group][name], names[name] + 1  # + the layer axis
            out.setdefault(group, {})[name] = {
                "a": ParamSpec((*spec.shape[:k], cfg.rank), (*spec.axes[:k], None)),
                "b": ParamSpec((spec.shape[0], cfg.rank, *spec.shape[k:]), (spec.axes[0], None, *spec.axes[k:])),
            }
    return out


def init(model_cfg: ModelConfig, cfg: LoraConfig, rng: jax.Array) -> dict:
    """Fresh adapters in float32: A ~ N(0, 1 / fan_in), B = 0, so the adapted model starts as the base."""
    leaves, treedef = jax.tree.flatten_with_path(specs(model_cfg, cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
    keys = jax.random.split(rng, len(leaves))
    out = []
    for (path, spec), key in zip(leaves, keys):
        if path[-1].key == "b":
            out.append(jnp.zeros(spec.shape, jnp.float32))
        else:
            fan_in = math.prod(spec.shape[1:-1])
            out.append(jax.random.normal(key, spec.shape, jnp.float32) / math.sqrt(fan_in))
    return jax.tree.unflatten(treedef, out)


def attach(base: dict, adapters: dict, cfg: LoraConfig) -> dict:
    """The base params with each adapted weight replaced by its `LoraWeight` (what the decoder runs)."""
    out = dict(base)
    for group, weights in adapters.items():
        out[group] = {**base[group], **{
            name: LoraWeight(base[group][name], ab["a"], ab["b"], cfg.scale) for name, ab in weights.items()}}
    return out


def merge(base: dict, adapters: dict, cfg: LoraConfig) -> dict:
    """The base params with the adapters folded in, W + scale * A B (in float32, then W's dtype)."""
    out = dict(base)
    for group, weights in adapters.items():
        out[group] = dict(base[group])
        for name, ab in weights.items():
            w, a, b = base[group][name], ab["a"], ab["b"]
            delta = jnp.einsum("lir,lro->lio", a.reshape(a.shape[0], -1, cfg.rank), b.reshape(b.shape[0], cfg.rank, -1))
            out[group][name] = (w.astype(jnp.float32) + cfg.scale * delta.reshape(w.shape)).astype(w.dtype)
    return out


def policy_params(cfg: LoraConfig, trainable: dict, frozen: dict | None) -> dict:
    """The params the policy runs with: `trainable` itself (rank 0: full fine-tuning), or the frozen
    base with the trainable adapters attached."""
    return attach(frozen, trainable, cfg) if cfg.rank else trainable
