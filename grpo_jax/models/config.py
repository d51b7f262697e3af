"""`ModelConfig`: one frozen dataclass for the whole decoder family, mirroring HF config.json.

`from_hf` accepts only what the decoder computes exactly; any field that would change the math and
is not implemented (sliding windows, unknown RoPE scaling, another activation, ...) raises an error
naming that field, so a loaded model never yields silently wrong logits.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
DTYPES = ("float32", "bfloat16")
REMAT = ("none", "full", "dots")
DECODE_ATTENTION = ("auto", "xla", "pallas")  # auto: the Pallas kernel on TPU, xla elsewhere
LAYER_LOOPS = ("auto", "scan", "unrolled")  # auto: unrolled on CPU (training under remat: scan), scan elsewhere
RUN_FIELDS = ("dtype", "compute_dtype", "remat", "attention", "decode_attention", "moe_impl", "logprobs_impl",
              "layer_loop")  # how, not what


def check_run_fields(options, owner: str) -> None:
    """Validates the RUN_FIELDS of `options` (a ModelConfig or grpo_jax.config.ModelOptions)."""
    import kernels
    from grpo_jax.models.decoder import ATTENTION, MOE  # the registries live with the kernels

    known = {"dtype": DTYPES, "compute_dtype": DTYPES, "remat": REMAT, "attention": tuple(ATTENTION),
             "decode_attention": DECODE_ATTENTION, "moe_impl": tuple(MOE), "logprobs_impl": ("auto", *kernels.LOGPROBS_IMPLS),
             "layer_loop": LAYER_LOOPS}
    for field, choices in known.items():
        value = getattr(options, field)
        if value not in choices:
            raise ValueError(f"{owner}.{field}={value!r} is not understood; use one of {choices}")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3 frequency-dependent RoPE rescaling (HF `rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture (from config.json) plus how we run it (dtypes, remat, attention kernel)."""

    model_type: str  # one of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    # Qwen3-MoE. Layer i is sparse iff num_experts > 0, (i + 1) % decoder_sparse_step == 0 and
    # i not in mlp_only_layers.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # How to run it.
    dtype: str = "float32"  # parameter dtype
    compute_dtype: str = "float32"  # activations and matmul inputs
    remat: str = "none"  # per layer: none | full | dots (save only weight-matmul outputs)
    attention: str = "xla"  # a key of grpo_jax.models.decoder.ATTENTION
    decode_attention: str = "auto"  # the sampler's decode step: auto (pallas on TPU, else xla) | xla | pallas
    moe_impl: str = "dense"  # a key of grpo_jax.models.decoder.MOE: dense | ragged
    logprobs_impl: str = "auto"  # training log-probs, kernels.fused_logprobs: auto | naive | chunked | pallas
    layer_loop: str = "auto"  # auto | scan (one jax.lax.scan) | unrolled; training and sampling. auto: by backend,
    # scan on TPU/GPU, unrolled on CPU; the rule (and GRPO_JAX_LAYOUT=accelerator) in models.decoder.layers_unrolled

    def __post_init__(self):
        check_run_fields(self, "ModelConfig")
        if self.model_type not in ARCHITECTURES:
            raise ValueError(
                f"ModelConfig.model_type={self.model_type!r} is not supported; "
                f"supported: {sorted(ARCHITECTURES)}"
            )
        sizes = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "max_position_embeddings", "decoder_sparse_step"] + (["moe_intermediate_size"] if self.num_experts else [])
        for name in sizes:  # before any division by them
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)} must be >= 1 (a size of the model); set model.{name}")
        if self.num_experts < 0:
            raise ValueError(f"ModelConfig.num_experts={self.num_experts} must be >= 0 (0: a dense model)")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta={self.rope_theta} must be > 0 (RoPE's base wavelength)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"ModelConfig.num_experts_per_tok={self.num_experts_per_tok} must be in [1, num_experts="
                f"{self.num_experts}]"
            )

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Per layer: True where the MLP is a mixture of experts."""
        return tuple(
            self.num_experts > 0
            and (i + 1) % self.decoder_sparse_step == 0
            and i not in self.mlp_only_layers
            for i in range(self.num_layers)
        )

    @property
    def qkv_bias(self) -> bool:
        """Qwen2/2.5 add biases to the q, k and v projections."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Qwen3 applies RMSNorm over head_dim to q and k before RoPE."""
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def jnp_dtype(self) -> np.dtype:
        return jnp.dtype(self.dtype)

    @property
    def jnp_compute_dtype(self) -> np.dtype:
        return jnp.dtype(self.compute_dtype)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides) -> "ModelConfig":
        """Builds from a config.json dict (transformers 4 or 5 spelling); `overrides` set the run fields."""
        model_type = hf.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(
                f"config.json: model_type={model_type!r} (architectures={hf.get('architectures')}) is "
                f"not supported; supported model_type values: {sorted(ARCHITECTURES)}"
            )
        _check_unsupported(hf)
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        if rope_type == "default":
            rope_scaling = None
        elif rope_type == "llama3":
            rope_scaling = Llama3RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        else:
            raise ValueError(
                f"config.json: rope_scaling/rope_parameters rope_type={rope_type!r} is not "
                "implemented; supported: 'default', 'llama3'"
            )
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        is_moe = model_type == "qwen3_moe"
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            num_experts=(hf.get("num_experts") or hf.get("num_local_experts") or 0) if is_moe else 0,
            num_experts_per_tok=hf.get("num_experts_per_tok", 0) if is_moe else 0,
            moe_intermediate_size=hf.get("moe_intermediate_size", 0) if is_moe else 0,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)) if is_moe else False,
            decoder_sparse_step=hf.get("decoder_sparse_step", 1) if is_moe else 1,
            mlp_only_layers=tuple(hf.get("mlp_only_layers", ())) if is_moe else (),
            **overrides,
        )

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict that `transformers` reads back into the same architecture."""
        hf = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id)
            if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "dtype": self.dtype,
        }
        if self.rope_scaling is not None:
            hf["rope_parameters"].update(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
        if self.model_type != "qwen2":
            hf["attention_bias"] = False
        if self.model_type != "llama":
            hf["use_sliding_window"] = False
        if self.model_type == "qwen3_moe":
            hf.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        return hf


def _check_unsupported(hf: dict[str, Any]) -> None:
    """Rejects config.json fields whose values change the math in ways the decoder does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: hidden_act={hf['hidden_act']!r} is not implemented; only 'silu'")
    if hf.get("use_sliding_window"):
        raise ValueError("config.json: use_sliding_window=true is not implemented; set it to false")
    layer_types = hf.get("layer_types") or ()
    if any(t != "full_attention" for t in layer_types):
        raise ValueError(f"config.json: layer_types={layer_types} is not implemented; only full_attention")
    if hf.get("mlp_bias"):
        raise ValueError("config.json: mlp_bias=true is not implemented")
    if hf.get("attention_bias") and hf.get("model_type") != "qwen2":
        raise ValueError("config.json: attention_bias=true is only implemented for qwen2")
    if hf.get("pretraining_tp", 1) != 1:
        raise ValueError("config.json: pretraining_tp != 1 is not implemented")
