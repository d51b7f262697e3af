"""Every knob of a run, as frozen (hashable, jit-static) dataclasses.

A run is one `Config`. Experiment files under `experiments/configs/` are Python that builds one;
a fork of an experiment is a new config file, never a new flag. `ModelConfig` lives with the model
(it mirrors a Hugging Face config.json) and `AlgorithmConfig` with the algorithms (its presets are
the table in docs/presets.md); both are re-exported here, as are the reward, LoRA and task configs.
Code imports every config type from this module, wherever it is defined: `from grpo_jax.config
import Config, ModelConfig, RewardConfig, ...` (only the packages this module imports use their own).
"""

import dataclasses
import difflib
import functools
import importlib.util
import json
import math
import types
import typing

from grpo_jax.algorithms.config import PARTS, AlgorithmConfig
from grpo_jax.data.datasets import FileTaskConfig, TfdsTaskConfig  # noqa: F401  (re-export)
from grpo_jax.data.hf import HFTaskConfig, MixtureTaskConfig, Part  # noqa: F401  (re-export)
from grpo_jax.data.reasoning import ColumnAdditionConfig  # noqa: F401  (re-export)
from grpo_jax.data.tasks import ArithmeticConfig, CountdownConfig, TaskConfig, task_name  # noqa: F401
from grpo_jax.data.templates import PLAIN, PromptTemplate
from grpo_jax.envs import EnvConfig
from grpo_jax.logging import TRACKERS
from grpo_jax.lora import LoraConfig
from grpo_jax.metrics import EDGES_RULE, edges_increase
from grpo_jax.models.config import DTYPES, RUN_FIELDS, ModelConfig, check_run_fields
from grpo_jax.registry import Params
from grpo_jax.rewards.functions import RewardConfig


def _check(owner: str, checks: dict[str, tuple[bool, str]], obj) -> None:
    """Raises for the first field whose check fails: `{owner}.{field}={value} {why}`."""
    for name, (ok, why) in checks.items():
        if not ok:
            raise ValueError(f"{owner}.{name}={getattr(obj, name)!r} {why}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape. -1 on one axis means "all remaining devices"; any axis may be 1."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    # The sharding tolerance (grpo_jax.sharding.check_replicated, MaxText's): on a mesh whose fsdp, tensor
    # or expert axis splits weights, the largest fraction of the train state's bytes (params and optimizer
    # state) that may stay whole on every device although the rules could split it (a dimension the mesh
    # does not divide, an optimizer leaf that matches no parameter). Any such bytes warn; more fail the
    # run before it compiles. 1: never fail. Norm scales and step counts never count.
    max_replicated_fraction: float = 0.1
    # Devices of a sampler mesh of their own (0: the sampler runs on the trainer's mesh). Each process
    # gives its first sampler / process_count local devices to the sampler, the rest to the trainer, so
    # the two meshes are disjoint by construction; the sampler mesh splits rows only (each of its devices
    # holds the whole weights). After each step the trained params move to it (sharding.to_mesh).
    sampler: int = 0

    def __post_init__(self):
        _check("MeshConfig", {
            "sampler": (self.sampler >= 0, "must be >= 0 (devices of the sampler's own mesh; 0: share the trainer's)"),
            "max_replicated_fraction": (0 <= self.max_replicated_fraction <= 1,
                                        "must be in [0, 1] (the share of the train state's bytes; 1: never fail)"),
        }, self)


# The smallest sampling temperature: logits / T must stay finite in float32 for any realistic logits
# (|logit| up to ~1e4 at T = 1e-3 is 1e7). Argmax decoding is `greedy`, not T -> 0.
MIN_TEMPERATURE = 1e-3
FLOAT32_MAX = 3.4028234663852886e38  # every float of a config reaches the device as a float32


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
    # Never stop early: every row runs to max_new_tokens, past eos (benchmarks: fixed work per step;
    # evaluation of a fixed length). The eos a row emits stays in its completion and mask.
    ignore_eos: bool = False
    # Rows decoded at once (continuous batching: a slot whose row finishes takes the next queued row);
    # 0: all rows of a rollout at once. Samples do not depend on it (bench/long_tail.py measures it).
    decode_slots: int = 0
    # A controlled sampler/trainer mismatch (the trainer's l^old stays the model's; the gap is logged as
    # sampler_drift_*), as inference engines have: the sampler's activations and matmul inputs in this dtype
    # (None: the model's compute_dtype), and Gaussian noise of this std added to every logit it samples from
    # and reports l^samp under (drawn from the row's step key). The held-out evaluation runs without both.
    compute_dtype: str | None = None
    logit_noise: float = 0.0

    def __post_init__(self):
        _check("SamplingConfig", {
            "compute_dtype": (self.compute_dtype in (None, *DTYPES), f"must be None (the model's) or one of {DTYPES}"),
            "logit_noise": (0 <= self.logit_noise < math.inf, "must be finite and >= 0 (the std of the logits' noise)"),
            "decode_slots": (self.decode_slots >= 0, "must be >= 0 (0: decode all rows of a rollout at once)"),
            "max_prompt_len": (self.max_prompt_len >= 1, "must be >= 1"),
            "max_new_tokens": (self.max_new_tokens >= 1, "must be >= 1"),
            "group_size": (self.group_size >= 1, "must be >= 1 (completions per prompt)"),
            "temperature": (MIN_TEMPERATURE <= self.temperature < math.inf,
                            f"must be finite and >= {MIN_TEMPERATURE} (logits / temperature must stay in float32 range); "
                            "for argmax decoding set sampling.greedy=true"),
            "top_k": (self.top_k >= 0, "must be >= 0 (0 disables top-k)"),
            "top_p": (0 < self.top_p <= 1, "must be in (0, 1] (1 disables top-p)"),
            "stop_tokens": (not (self.ignore_eos and self.stop_tokens),
                            "are never checked with ignore_eos=True: drop them or set ignore_eos=False"),
        }, self)


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
        _check("OptimConfig", {
            "schedule": (self.schedule in ("constant", "cosine"), "is unknown: use 'constant' or 'cosine'"),
            "learning_rate": (0 <= self.learning_rate < math.inf, "must be finite and >= 0"),
            "warmup_steps": (self.warmup_steps >= 0, "must be >= 0 (optimizer steps of linear warmup)"),
            "weight_decay": (0 <= self.weight_decay < math.inf, "must be finite and >= 0"),
            "b1": (0 <= self.b1 < 1, "must be in [0, 1) (Adam's first-moment decay)"),
            "b2": (0 <= self.b2 < 1, "must be in [0, 1) (Adam's second-moment decay)"),
            "eps": (0 < self.eps < math.inf, "must be finite and > 0"),
            "max_grad_norm": (0 <= self.max_grad_norm < math.inf, "must be finite and >= 0 (0: no clipping)"),
        }, self)


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
    # The seed of the sampling streams (rollouts and sampled evaluations); None: `seed`. Another value
    # resamples the same run (the same init, data order and held-out set, other samples): a study's
    # null control measures the noise of sampling alone with it.
    rollout_seed: int | None = None
    eval_every: int = 0  # 0: evaluate only before the first and after the last step
    eval_prompts: int = 64  # the first held-out examples (a task without a held-out set is not evaluated)
    # Sampled completions per held-out prompt: eval/accuracy_sampled is their mean (avg@n), and
    # eval/pass@k (k = 2, 4, ..., n) the unbiased pass@k. The greedy completion is evaluated besides.
    eval_samples: int = 1
    # A benchmarks file (its get_config() returns a grpo_jax.evaluate.EvalConfig), evaluated besides at every
    # evaluation (also of a run without a held-out set) by the harness of `python -m grpo_jax.evaluate`:
    # eval/NAME/avg@n, eval/NAME/pass@k, eval/NAME/maj@k per benchmark and eval/mean/... ("": none).
    eval_benchmarks: str = ""
    log_completions_every: int = 0  # write the step's completions to completions.jsonl every N steps (0: never)
    out_dir: str = "runs/default"
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    export_hf: bool = False  # write the final policy to out_dir/hf as safetensors
    # Stop (unsaved, the last checkpoint kept) once this many steps' worth of consecutive updates
    # (x algorithm.num_iterations x minibatches) were skipped as non-finite, or this many steps in a row
    # applied no update or had every reward call fail: such a run learns nothing (grpo_jax.run).
    max_skipped_steps: int = 3
    # JAX's persistent compilation cache (grpo_jax.run.use_compilation_cache; "~" expanded): a rerun or
    # resume of the same shapes loads its compiled programs instead of compiling them (bench/README.md:
    # first step). One directory for all of a user's runs, so any run of known shapes starts warm; ""
    # turns it off. A directory already given to JAX (the JAX_COMPILATION_CACHE_DIR environment variable,
    # or jax.config) is used instead, whatever this field says: it is the process-wide choice.
    compilation_cache_dir: str = "~/.cache/grpo_jax/xla"
    # Prefix Grouper (arXiv 2506.05433): the training forwards encode each group's shared prompt once
    # and attend the G completions to its keys and values, instead of encoding it in every row. The
    # same log-probs and gradients (up to float rounding) for fewer FLOPs, most where prompts are long.
    # Dense models; a minibatch's micro-batches must hold whole groups.
    prefix_grouper: bool = False
    # Packing (grpo_jax.packing): the training forwards lay the rows end to end, each prompt and counted
    # completion once, in rows of max_prompt_len + max_new_tokens - 1 inputs, instead of padding every row
    # to that width: completions that stop early cost their tokens, not the width. The same log-probs and
    # gradients (up to float rounding). The host loop (trainer) only, without prefix_grouper.
    packing: bool = False
    # Completion-length bucket edges (tokens, increasing) of the per-length token-ratio metrics
    # (algorithms.ratio_by_length: within-completion log-ratio variance per bucket); () reports none.
    length_buckets: tuple[int, ...] = ()
    # MoE: also run each update's forward on the other routes (pi_old's recorded experts when the router
    # picks, the router's own when they are replayed) and report the token log-ratio under both, on the
    # same params and batch (routing.ratio_by_routes): the part of the ratio's drift that routing
    # changes cause (GSPO sec. 5.3). One more forward per update.
    compare_routes: bool = False
    # Trackers that also get every logged row's scalars, by package name (grpo_jax.logging.TRACKERS:
    # "wandb", "mlflow"); metrics.jsonl and TensorBoard are always written.
    report_to: tuple[str, ...] = ()
    # Bounded staleness (asynchronous RL): the rollout of step t is sampled with the params of step
    # max(0, t - k) while the trainer runs the steps between (on one mesh by JAX's async dispatch, or on
    # mesh.sampler). 0: the synchronous loop.
    max_staleness: int = 0
    # Which params give l^old under max_staleness > 0. "sampler": those that sampled, so the loss's ratio
    # carries the staleness and the rollout correction (algorithm.tis_level, off_policy_threshold) sees
    # the sampler/trainer numerics only. "trainer": the trainer's params at the step, before its updates
    # (AReaL's decoupled objective, arXiv 2505.24298: the proximal policy is the current one, the stale
    # sampler the behaviour policy), so the ratio starts at 1 and the correction weight exp(l^old - l^samp)
    # carries the staleness; with no correction, stale samples are trained on as if on-policy.
    # "rollout": no params and no forward: l^old is the sampler's own reported log-probs (Batch.sampler_logp;
    # GSPO's sec. 5.4, arXiv 2507.18071: the ratio on the inference engine's likelihoods, no recompute), at
    # any staleness including 0, so the rollout correction's d = l^old - l^samp is 0 and the ratio carries
    # the sampler/trainer mismatch (and any staleness).
    proximal: str = "sampler"

    def __post_init__(self):
        _check("TrainConfig", {
            "max_staleness": (self.max_staleness >= 0, "must be >= 0 (0: the synchronous loop; k: rollouts sampled "
                              "with params up to k steps old)"),
            "proximal": (self.proximal in ("sampler", "trainer", "rollout"), "must be 'sampler' (l^old under the "
                         "params that sampled), 'trainer' (under the trainer's current params, max_staleness >= 1) or "
                         "'rollout' (the sampler's own log-probs, no l^old forward)"),
            "steps": (self.steps >= 1, "must be >= 1"),
            "seed": (0 <= self.seed < 2**32, "must be in [0, 2**32) (it seeds a uint32 JAX random key); pick another seed"),
            "rollout_seed": (self.rollout_seed is None or 0 <= self.rollout_seed < 2**32,
                             "must be None or in [0, 2**32) (it seeds a uint32 JAX random key)"),
            "prompts_per_step": (self.prompts_per_step >= 1, "must be >= 1"),
            "minibatches": (self.minibatches >= 1, "must be >= 1 (optimizer updates per pass over a rollout batch)"),
            "micro_batches": (self.micro_batches >= 1, "must be >= 1 (accumulation slices of a minibatch)"),
            "eval_every": (self.eval_every >= 0, "must be >= 0 (0: evaluate before the first and after the last step)"),
            "eval_prompts": (self.eval_prompts >= 1, "must be >= 1"),
            "eval_samples": (self.eval_samples >= 1, "must be >= 1 (sampled completions per held-out prompt)"),
            "log_completions_every": (self.log_completions_every >= 0, "must be >= 0 (0: never)"),
            "out_dir": (bool(self.out_dir), "must name the run's directory"),
            "checkpoint_every": (self.checkpoint_every >= 1, "must be >= 1 (steps between checkpoints)"),
            "keep_checkpoints": (self.keep_checkpoints >= 1, "must be >= 1"),
            "max_skipped_steps": (self.max_skipped_steps >= 1, "must be >= 1"),
            "length_buckets": (edges_increase(self.length_buckets), EDGES_RULE),
            "report_to": (set(self.report_to) <= set(TRACKERS), f"names an unknown tracker; choose from {sorted(TRACKERS)}"),
        }, self)
        _check("TrainConfig", {
            "report_to": (all(importlib.util.find_spec(n) for n in self.report_to),
                          "names a tracker whose package is not installed: pip install it"),
        }, self)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How a `Config.model_path` checkpoint runs (the run fields of ModelConfig; config.json has the
    rest). fp32 params with bf16 compute is the usual choice: bf16 params would round away updates."""

    dtype: str = "float32"  # parameters (and optimizer state)
    compute_dtype: str = "float32"  # activations and matmul inputs
    remat: str = "none"  # per layer: none | full | dots (save only weight-matmul outputs)
    attention: str = "xla"
    decode_attention: str = "auto"  # the sampler's decode step: auto (Pallas kernel on TPU, else xla) | xla | pallas
    moe_impl: str = "dense"  # dense (every expert on every token) | ragged (grouped by expert)
    logprobs_impl: str = "auto"  # auto (pallas on TPU, else chunked) | naive (full logits) | chunked | pallas
    layer_loop: str = "auto"  # auto (by backend: models.decoder.layers_unrolled) | scan | unrolled

    def __post_init__(self):
        check_run_fields(self, "Config.model_options")

    def as_dict(self) -> dict[str, str | bool]:
        return {name: getattr(self, name) for name in RUN_FIELDS}


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole run. The policy is `model_path` (a local HF directory) or, if empty, `model` from scratch."""

    model: ModelConfig | None = None
    model_path: str = ""
    model_options: ModelOptions = ModelOptions()  # with model_path; from scratch, set them on `model`
    lora: LoraConfig = LoraConfig()  # rank 0: train every weight; > 0: only low-rank adapters (grpo_jax/lora.py)
    tokenizer: str = ""  # "char" (grpo_jax.data.CharTokenizer), or an HF dir / sentencepiece file; "": model_path
    mesh: MeshConfig = MeshConfig()
    sampling: SamplingConfig = SamplingConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    task: TaskConfig = ArithmeticConfig()  # a registered task (grpo_jax.data.TASKS); --set task=NAME picks one
    template: PromptTemplate = PLAIN
    reward: RewardConfig = RewardConfig(names=("exact",))
    train: TrainConfig = TrainConfig()
    # Multi-turn rollouts with a registered environment (grpo_jax.envs; --set env=NAME), rewarded by its
    # return (reward "env"); the held-out set is evaluated by greedy trajectories (Trainer.evaluate_examples).
    env: EnvConfig | None = None

    def __post_init__(self):
        if not isinstance(self.task, TaskConfig):
            raise TypeError(f"Config.task={self.task!r} is not a task config: use a registered one (grpo_jax.data.TASKS)")
        if (self.model is None) == (not self.model_path):
            raise ValueError("set exactly one of Config.model (from scratch) and Config.model_path (HF dir)")
        if self.model is not None and self.model_options != ModelOptions():
            raise ValueError(
                "Config.model_options applies to model_path checkpoints; for a model from scratch set "
                f"{', '.join(RUN_FIELDS)} on Config.model"
            )
        for key, value in flatten(self).items():
            floats = [x for x in (value if isinstance(value, list) else [value]) if isinstance(x, float)]
            if not all(math.isfinite(x) for x in floats):
                raise ValueError(f"Config.{key}={value!r} is not finite; every number of a config must be")
            if any(abs(x) > FLOAT32_MAX for x in floats):
                raise ValueError(f"Config.{key}={value!r} overflows float32 (|x| <= {FLOAT32_MAX:.8g}), as which it "
                                 "reaches the device: lower it")
        alg = self.algorithm
        self._check_env()
        if self.train.max_staleness and not alg.loss.spec.ratio and alg.tis_level is None:
            raise ValueError(
                f"train.max_staleness={self.train.max_staleness} trains on samples of older params, but "
                f"algorithm.loss={alg.loss.name!r} has no importance ratio and algorithm.tis_level is None: REINFORCE on "
                "stale samples is off-policy, uncorrected; set algorithm.tis_level='token' (or 'sequence'), use a ratio "
                "loss (e.g. ppo_clip), or train.max_staleness=0"
            )
        if self.train.proximal == "trainer" and not self.train.max_staleness:
            raise ValueError("train.proximal='trainer' takes l^old under the trainer's params rather than the "
                             "sampler's, which differ only under bounded staleness; at train.max_staleness=0 they are "
                             "the same params: set train.proximal='sampler' or train.max_staleness >= 1")
        if self.train.max_staleness and alg.sampler.spec.drift:
            raise ValueError(f"train.max_staleness={self.train.max_staleness} samples rounds before the drift that "
                             f"algorithm.sampler={alg.sampler.name!r} learns from is measured: use train.max_staleness=0 "
                             "or another sampler")
        if self.mesh.sampler and self.train.packing:
            raise ValueError("mesh.sampler gives the sampler its own devices, where the l^old forward of train.packing's "
                             "layout (planned for the trainer's devices) cannot run: set train.packing=False or mesh.sampler=0")
        if self.model is not None:
            check_routing_replay(self.algorithm, self.model)
            if self.train.proximal == "rollout" and any(self.model.moe_layers) and alg.routing_replay != "sampler":
                raise ValueError(f"train.proximal='rollout' takes l^old from the sampler, under the experts the sampler "
                                 f"chose, and skips the l^old forward that records pi_old's routes: with "
                                 f"algorithm.routing_replay={alg.routing_replay!r} the updates would run other experts "
                                 "than l^old's; set algorithm.routing_replay='sampler' (R3) or another train.proximal")
            if self.train.compare_routes and not any(self.model.moe_layers):
                raise ValueError(f"train.compare_routes=True compares mixture-of-experts routes, but the "
                                 f"{self.model.model_type} model has no MoE layer; set it to False")


    def _check_env(self) -> None:
        if self.env is not None and not isinstance(self.env, EnvConfig):
            raise TypeError(f"Config.env={self.env!r} is not an environment: use a registered one (grpo_jax.envs.ENVS)")
        if (self.env is None) == ("env" in self.reward.names):
            raise ValueError("reward.names holds 'env' (the environment's return) exactly when Config.env is set: "
                             f"env={None if self.env is None else self.env.name!r}, reward.names={self.reward.names}")
        if self.algorithm.turn_discount is not None and self.env is not None and self.reward.names != ("env",):
            raise ValueError(f"algorithm.turn_discount={self.algorithm.turn_discount} credits each turn by the environment's "
                             f"turn rewards alone: set reward.names=('env',) (now {self.reward.names}), or turn_discount=None")
        if self.env is not None and (self.train.eval_benchmarks or self.train.eval_samples > 1):
            raise ValueError(f"train.eval_benchmarks={self.train.eval_benchmarks!r} and train.eval_samples="
                             f"{self.train.eval_samples} sample one turn (grpo_jax.evaluate); a run with Config.env "
                             "evaluates its held-out set by greedy trajectories: unset them")
        if self.env is not None and (self.sampling.compute_dtype is not None or self.sampling.logit_noise):
            raise ValueError(f"sampling.compute_dtype={self.sampling.compute_dtype!r} and sampling.logit_noise="
                             f"{self.sampling.logit_noise} mismatch the single-turn sampler and trainer; multi-turn rollouts "
                             "(Config.env) and their held-out trajectories decode as the model: unset them")
        if self.env is not None and self.train.max_staleness:
            raise ValueError(f"train.max_staleness={self.train.max_staleness}: multi-turn rollouts (Config.env) are "
                             "sampled synchronously; set train.max_staleness=0")
        if self.env is not None and self.train.packing:
            raise ValueError("train.packing lays rows out by their counted tokens, which leave out a trajectory's "
                             "observations: set train.packing=False with Config.env")
        if self.env is not None and self.algorithm.routing_replay == "sampler":
            raise ValueError("algorithm.routing_replay='sampler' replays the experts the sampler chose, which multi-turn "
                             "rollouts (Config.env) do not record: use routing_replay='old' or 'none'")
        if self.env is not None and self.algorithm.sampler.spec.replays:
            raise ValueError(f"algorithm.sampler={self.algorithm.sampler.name!r} replays stored groups, which keep no "
                             "observation mask: use a sampler without replays with Config.env")


def check_routing_replay(algorithm: AlgorithmConfig, model: ModelConfig) -> None:
    """Routing replay needs a mixture-of-experts model (`trainer.check` runs this on a model_path's
    config.json before any weight loads)."""
    if algorithm.routing_replay != "none" and not any(model.moe_layers):
        raise ValueError(
            f"algorithm.routing_replay={algorithm.routing_replay!r} replays mixture-of-experts routes, but the "
            f"{model.model_type} model has no MoE layer; use routing_replay='none'"
        )


def flatten(cfg) -> dict:
    """A config as flat {"train.steps": 100, ...} with JSON values (tuples as lists): what a checkpoint
    stores, and what `resume_changes` compares. A task appears by name too ("task": "countdown"); a tuple of
    dataclasses by index ("task.parts.0.name")."""
    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, (TaskConfig, Params, EnvConfig)):
                yield f"{prefix}{f.name}", task_name(value) if isinstance(value, TaskConfig) else value.name
            if dataclasses.is_dataclass(value):
                yield from walk(value, f"{prefix}{f.name}.")
            elif isinstance(value, tuple) and value and all(dataclasses.is_dataclass(v) for v in value):
                for i, v in enumerate(value):  # e.g. a mixture's parts: task.parts.0.weight
                    yield from walk(v, f"{prefix}{f.name}.{i}.")
            else:
                yield f"{prefix}{f.name}", list(value) if isinstance(value, tuple) else value

    return dict(walk(cfg, ""))


# Fields that may differ when a run resumes: how long it runs, how often it evaluates and saves, where
# it writes, how it is laid out and executed. Any other difference (model, data, seed, batch sizes,
# algorithm, optimizer, rewards) would continue a different run on this one's state and is refused.
# Mesh and kernel choices keep the math but not the rounding: the continuation matches to float tolerance.
RESUMABLE = (
    "train.eval_every", "train.eval_prompts", "train.eval_benchmarks", "train.out_dir", "train.checkpoint_every", "train.keep_checkpoints",
    "train.export_hf", "train.max_skipped_steps", "train.eval_samples", "train.log_completions_every",
    "train.compilation_cache_dir", "train.prefix_grouper", "train.packing", "train.length_buckets", "train.compare_routes", "train.report_to", "mesh.", "reward.num_workers", "reward.timeout_s",
    "model.remat", "model.attention", "model.decode_attention", "model.moe_impl", "model.logprobs_impl", "model.layer_loop", "sampling.decode_slots",
    "model_options.",  # for a model_path; stored as defaults (the trainer moves them into model)
    "model.scan_layers",  # layer_loop's name until 2026-11-27, in the checkpoints saved before
    "sampling.cache_segments",  # the segmented KV cache's option until continuous batching (2026-11-27)
)


# Before the variants owned their parameters (2026-11-27), AlgorithmConfig held them all as flat fields,
# some prefixed by their variant's name: (part, variant) -> {parameter: the flat field's name}. A field
# not listed kept its name (adv_eps became each estimator's eps).
_RENAMED = {
    ("loss", "holder"): {"p": "holder_p"}, ("loss", "llds"): {"coef": "llds_coef"},
    ("loss", "clip_cov"): {"ratio": "clip_cov_ratio", "lb": "clip_cov_lb", "ub": "clip_cov_ub"},
    ("loss", "kl_cov"): {"ratio": "kl_cov_ratio", "coef": "kl_cov_coef"}, ("loss", "dhpo"): {"alpha": "dhpo_alpha"},
    ("loss", "gvpo"): {"beta": "gvpo_beta"},
    ("loss", "disco"): {"score": "disco_score", "tau": "disco_tau", "delta": "disco_delta", "beta": "disco_beta"},
    ("loss", "gtpo"): {"conflict_weight": "gtpo_conflict_weight", "entropy_max": "gtpo_entropy_max",
                       "entropy_coef": "gtpo_entropy_coef"},
    ("loss", "egsw"): {"alpha": "egsw_alpha", "temperature": "egsw_temperature"},
    ("advantage", "ngrpo"): {"max_reward": "ngrpo_max_reward", "virtual_samples": "ngrpo_virtual_samples"},
    ("advantage", "gapo"): {"fraction": "gapo_fraction"}, ("advantage", "pass_at_k"): {"k": "pass_k"},
}


def upgrade(saved: dict) -> dict:
    """A checkpoint's flattened config in today's keys: one saved before the variants owned their
    parameters has its flat algorithm fields moved under the parts that read them (the others were
    at their defaults, unread, and are dropped)."""
    if "algorithm.adv_eps" not in saved:
        return saved
    kept = {f"algorithm.{f}" for f in AlgorithmConfig.__dataclass_fields__}
    out = {k: v for k, v in saved.items() if not k.startswith("algorithm.") or k in kept}
    for part in ("advantage", "loss"):
        name = saved[f"algorithm.{part}"]
        renamed = _RENAMED.get((part, name), {})
        for f in dataclasses.fields(PARTS[part].registry[name].params):
            old = renamed.get(f.name, "adv_eps" if (part, f.name) == ("advantage", "eps") else f.name)
            if f"algorithm.{old}" in saved:
                out[f"algorithm.{part}.{f.name}"] = saved[f"algorithm.{old}"]
    return out


@functools.cache
def _defaults() -> dict:
    """Every field's default; a ModelConfig's run fields (`model.*`) default as ModelOptions' do."""
    defaults = json.loads(json.dumps(flatten(Config(model_path="-"))))
    return {**defaults, **{f"model.{f}": defaults[f"model_options.{f}"] for f in RUN_FIELDS}}


def with_defaults(saved: dict, now: dict) -> dict:
    """A stored flattened config (a checkpoint's, a study's) in today's keys (`upgrade`), with each field
    of `now` that it lacks (added since it was stored) at its default: a new field at its default is no
    change."""
    saved, defaults = upgrade(saved), _defaults()
    return {**{k: defaults[k] for k in now if k not in saved and k in defaults}, **saved}


def resume_changes(saved: dict, now: dict, also: tuple[str, ...] = ()) -> list[str]:
    """The fields in which `now` (flatten of the run's config) differs from `saved` (a checkpoint's, in
    its own or an older format: `with_defaults`) and may not (beyond RESUMABLE and `also`), as "field: saved
    -> now" lines. `train.steps` may change (extend or cut a run) only with a constant learning rate: a
    cosine schedule decays over train.steps, so it sets the trajectory."""
    now = json.loads(json.dumps(now))  # tuples and lists alike, as stored
    saved = with_defaults(saved, now)
    may_change = RESUMABLE + also + (("train.steps",) if now.get("optim.schedule") == "constant" else ())
    return [
        f"{key}: {saved.get(key, '(absent)')!r} -> {now.get(key, '(absent)')!r}"
        for key in sorted(set(saved) | set(now))
        if saved.get(key) != now.get(key) and not key.startswith(may_change)
    ]


def override(cfg, assignments: list[str]):
    """Applies `key.path=value` strings (the CLI's --set) to a config; values parse by the field's type.

    All assignments to one dataclass apply together and it is validated once, so fields that must
    agree (reward.names and reward.weights) change together. A whole value comes before the fields
    set inside it, so explicit fields always win: `X.preset=NAME` rebuilds X from its class's
    `from_preset(NAME)` (e.g. algorithm.preset=gspo), and `X=NAME` on a field whose type has
    `from_name` (the task) builds that registered kind (e.g. task=countdown, then task.max_number=50).
    A key that is not a field is an error suggesting the nearest field names.
    """
    tree: dict = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {assignment!r}: expected key=value, e.g. train.steps=100")
        *parents, leaf = key.strip().split(".")
        node = tree
        for name in parents:
            if isinstance(node.get(name), tuple):  # set as a whole, then inside: keep both, whole first
                node[name] = {WHOLE: node[name]}
            node = node.setdefault(name, {})
        if isinstance(node.get(leaf), dict):
            node[leaf][WHOLE] = (key.strip(), text.strip())
        else:
            node[leaf] = (key.strip(), text.strip())
    return _apply(cfg, tree, "")


WHOLE = ""  # the key of a subtree's whole-value assignment (`task=countdown` beside `task.max_number=50`)


def _apply(obj, tree: dict, prefix: str):
    """`obj` with the assignments of `tree` ({field: subtree | (key, text)}) applied, validated once."""
    if WHOLE in tree:  # (key, text, the field's type)
        key, text, hint = tree.pop(WHOLE)
        obj = _parse_field(key, text, hint)
        if not dataclasses.is_dataclass(obj):
            raise ValueError(f"--set {key}={text} leaves no fields to set, but {', '.join(prefix + k for k in tree)} "
                             "are set too; drop them")
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"--set {prefix}...: {type(obj).__name__} has no fields to set")
    if "preset" in tree and hasattr(obj, "from_preset"):
        obj = type(obj).from_preset(tree.pop("preset")[1])
    names = [f.name for f in dataclasses.fields(obj)]
    changes = {}
    for name, sub in tree.items():
        if name not in names:
            near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(repr(n) for n in near)}?" if near else f"fields: {', '.join(names)}"
            owners = [f.name for f in dataclasses.fields(obj) if dataclasses.is_dataclass(getattr(obj, f.name))
                      and name in {g.name for g in dataclasses.fields(getattr(obj, f.name))}]
            if owners:  # a part's parameter set one level too high (e.g. algorithm.eps_low)
                hint = f"--set {prefix}{owners[0]}.{name}= ({name} is a parameter of {prefix}{owners[0]})"
            raise ValueError(f"--set {prefix}{name}: {type(obj).__name__} has no field {name!r}; {hint}")
        hint = typing.get_type_hints(type(obj))[name]
        if isinstance(sub, dict):
            if WHOLE in sub:
                sub = {**sub, WHOLE: (*sub[WHOLE], hint)}
            changes[name] = _apply(getattr(obj, name), sub, f"{prefix}{name}.")
        else:
            changes[name] = _parse_field(*sub, hint)
    return dataclasses.replace(obj, **changes)


def _parse_field(key: str, text: str, hint):
    try:
        return _parse(text, hint)
    except ValueError as e:
        raise ValueError(f"--set {key}={text}: {e}") from None


def _parse(text: str, hint):
    """Parses `text` as a value of type `hint` (bool, int, float, str, tuple[X, ...], a union of them, or
    a class with `from_name`, such as the task); a union takes the first member that parses."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in args:
            return None
        errors = []
        for member in (a for a in args if a is not type(None)):
            try:
                return _parse(text, member)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(" or ".join(dict.fromkeys(errors)))
    if hasattr(hint, "from_name"):
        try:
            return hint.from_name(text)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
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
