"""Every knob of a run, as frozen (hashable, jit-static) dataclasses.

A run is one `Config`. Experiment files under `experiments/configs/` are Python that builds one;
a fork of an experiment is a new config file, never a new flag. `ModelConfig` lives with the model
(it mirrors a Hugging Face config.json) and `AlgorithmConfig` with the algorithms (its presets are
the table in docs/presets.md); both are re-exported here.
"""

import dataclasses
import difflib
import types
import typing

from grpo_jax.algorithms.config import AlgorithmConfig  # noqa: F401  (re-export)
from grpo_jax.data.tasks import ArithmeticConfig, CountdownConfig
from grpo_jax.data.templates import PLAIN, PromptTemplate
from grpo_jax.models.config import RUN_FIELDS, ModelConfig, check_run_fields
from grpo_jax.rewards.functions import RewardConfig


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape. -1 on one axis means "all remaining devices"; any axis may be 1."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How rollouts are generated. `group_size` completions are drawn per distinct prompt."""

    max_prompt_len: int = 64
    max_new_tokens: int = 32
    group_size: int = 8
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    top_p: float = 1.0  # 1.0: no nucleus truncation
    greedy: bool = False  # argmax; log-probs are still reported under logits / temperature
    stop_tokens: tuple[int, ...] = ()  # besides ModelConfig.eos_token_id

    def __post_init__(self):
        checks = {
            "max_prompt_len": (self.max_prompt_len >= 1, "must be >= 1"),
            "max_new_tokens": (self.max_new_tokens >= 1, "must be >= 1"),
            "group_size": (self.group_size >= 1, "must be >= 1 (completions per prompt)"),
            "temperature": (self.temperature > 0, "must be > 0; for argmax decoding set greedy=True"),
            "top_k": (self.top_k >= 0, "must be >= 0 (0 disables top-k)"),
            "top_p": (0 < self.top_p <= 1, "must be in (0, 1] (1 disables top-p)"),
        }
        for name, (ok, why) in checks.items():
            if not ok:
                raise ValueError(f"SamplingConfig.{name}={getattr(self, name)!r} {why}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW after global-norm clipping; linear warmup, then constant or cosine decay to 0."""

    learning_rate: float = 1e-6
    schedule: str = "constant"  # "constant" | "cosine"
    warmup_steps: int = 0  # optimizer steps
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # 0: no clipping

    def __post_init__(self):
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"optim.schedule={self.schedule!r}: use 'constant' or 'cosine'")


@dataclasses.dataclass(frozen=True)
class FileTaskConfig:
    """A dataset in local files: GSM8K-format or MATH-format JSONL / parquet (grpo_jax.data.FORMATS)."""

    format: str = "gsm8k"
    path: str = ""  # training examples
    eval_path: str = ""  # held-out examples

    def __post_init__(self):
        if not self.path or not self.eval_path:
            raise ValueError("FileTaskConfig needs path (training file) and eval_path (held-out file)")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The RL loop: rollout batches, inner iterations and minibatches, evaluation and checkpoints.

    One step draws `prompts_per_step` prompts times `sampling.group_size` samples (the rollout batch),
    then runs `algorithm.num_iterations` passes over it, each split into `minibatches` optimizer
    updates, each accumulated over `micro_batches` under `lax.scan`.
    """

    steps: int = 100
    prompts_per_step: int = 8
    minibatches: int = 1
    micro_batches: int = 1
    seed: int = 0
    eval_every: int = 0  # 0: evaluate only before the first and after the last step
    eval_prompts: int = 64
    out_dir: str = "runs/default"
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    export_hf: bool = False  # write the final policy to out_dir/hf as safetensors


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How a `Config.model_path` checkpoint runs (the run fields of ModelConfig; config.json has the
    rest). fp32 params with bf16 compute is the usual choice: bf16 params would round away updates."""

    dtype: str = "float32"  # parameters (and optimizer state)
    compute_dtype: str = "float32"  # activations and matmul inputs
    remat: str = "none"  # per layer: none | full | dots (save only weight-matmul outputs)
    attention: str = "xla"
    moe_impl: str = "dense"  # dense (every expert on every token) | ragged (grouped by expert)
    logprobs_impl: str = "auto"  # auto (pallas on TPU, else chunked) | naive (full logits) | chunked | pallas

    def __post_init__(self):
        check_run_fields(self, "Config.model_options")

    def as_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in RUN_FIELDS}


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run. The policy is `model_path` (a local HF directory) or, if empty, `model` from scratch."""

    model: ModelConfig | None = None
    model_path: str = ""
    model_options: ModelOptions = ModelOptions()  # with model_path; from scratch, set them on `model`
    tokenizer: str = ""  # "char" (grpo_jax.data.CharTokenizer), or an HF dir / sentencepiece file; "": model_path
    mesh: MeshConfig = MeshConfig()
    sampling: SamplingConfig = SamplingConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    task: ArithmeticConfig | CountdownConfig | FileTaskConfig = ArithmeticConfig()  # its type picks the task
    template: PromptTemplate = PLAIN
    reward: RewardConfig = RewardConfig(names=("exact",))
    train: TrainConfig = TrainConfig()

    def __post_init__(self):
        if (self.model is None) == (not self.model_path):
            raise ValueError("set exactly one of Config.model (from scratch) and Config.model_path (HF dir)")
        if self.model is not None and self.model_options != ModelOptions():
            raise ValueError(
                "Config.model_options applies to model_path checkpoints; for a model from scratch set "
                f"{', '.join(RUN_FIELDS)} on Config.model"
            )


def override(cfg, assignments: list[str]):
    """Applies `key.path=value` strings (the CLI's --set) to a config; values parse by the field's type.

    `X.preset=NAME` rebuilds X from its class's `from_preset(NAME)` (e.g. algorithm.preset=gspo);
    presets apply before the other assignments, so explicit fields always win. A key that is not a
    field is an error suggesting the nearest field names.
    """
    parsed = []
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ValueError(f"--set {assignment!r}: expected key=value, e.g. train.steps=100")
        parsed.append((key.strip(), text.strip()))
    for key, text in sorted(parsed, key=lambda kv: not kv[0].endswith(".preset")):
        cfg = _set(cfg, key.split("."), text, key)
    return cfg


def _set(obj, path: list[str], text: str, full_key: str):
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"--set {full_key}: {type(obj).__name__} has no fields to set")
    if path == ["preset"] and hasattr(obj, "from_preset"):
        return type(obj).from_preset(text)
    names = [f.name for f in dataclasses.fields(obj)]
    name = path[0]
    if name not in names:
        near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(n) for n in near)}?" if near else f"fields: {', '.join(names)}"
        raise ValueError(f"--set {full_key}: {type(obj).__name__} has no field {name!r}; {hint}")
    if len(path) > 1:
        return dataclasses.replace(obj, **{name: _set(getattr(obj, name), path[1:], text, full_key)})
    hint = typing.get_type_hints(type(obj))[name]
    try:
        value = _parse(text, hint)
    except ValueError as e:
        raise ValueError(f"--set {full_key}={text}: {e}") from None
    return dataclasses.replace(obj, **{name: value})


def _parse(text: str, hint):
    """Parses `text` as a value of type `hint` (bool, int, float, str, tuple[X, ...], X | None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _parse(text, hint)
    if origin is tuple:
        return tuple(_parse(t.strip(), args[0]) for t in text.split(",") if t.strip())
    if hint is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError("expected true or false")
        return text.lower() in ("true", "1")
    if hint in (int, float, str):
        try:
            return hint(text)
        except ValueError:
            raise ValueError(f"expected a value of type {hint.__name__}") from None
    raise ValueError(f"a field of type {hint} cannot be set from the command line; set one of its fields")
