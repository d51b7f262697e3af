"""The host loop: prompts -> sample G each -> reward -> advantages -> mu x minibatch train steps.

Everything that touches files, clocks or Python objects lives here; the math lives in the jitted
pieces it calls (`sampling.generate`, `train_step`, `algorithms`). One RL step:

1. draw a round of prompts from `algorithm.sampler` (`data.samplers`: the uniform shuffle of
   `data.batches`, or a sampler with per-prompt state, updated from each round's results and saved in
   the checkpoint) and sample G completions per slot (a prompt given several slots is one group);
   with DAPO dynamic sampling, drop groups whose rewards are all equal and draw again until
   `train.prompts_per_step` slots are kept or `algorithm.max_gen_batches` rounds are spent (a short
   batch is padded with masked rows, so shapes and compilations never change);
2. score on the host (`rewards.score`), add DAPO overlong shaping, mask truncated completions,
   compute advantages on the kept groups, and assemble the batch on device (under `train.packing` also
   its packed layout, planned on the host: `grpo_jax.packing`);
3. compute l^old ONCE for the whole rollout batch, then run `algorithm.num_iterations` passes of
   `train.minibatches` jitted updates: the ratio leaves 1 from the second update on, which is what
   makes clipping (and mu > 1) mean anything;
4. evaluate on held-out prompts (greedy and sampled accuracy, pass@k: the harness of `grpo_jax.evaluate`).

Under `train.max_staleness` = k, steps 1-2 of step t + k run while step t's updates do (the rollout
sampled with the params of step t, l^old taken under them, or with `train.proximal="trainer"` at step
t + k under the trainer's params then), optionally on the sampler's own devices (`mesh.sampler`):
`Trainer.train_step`.

The examples and rewards come from the config (a registered task, registered reward names) or are
passed in code: `Trainer(cfg, examples=[...], held_out=[...], rewards={"name": fn})` with
`cfg.task = data.Examples()`.

Over several processes (one per host), every batch is global and each process works on the rows its
devices hold (`sharding.process_rows`): it reads only those prompts, decodes and scores only those
completions, and gathers the whole batch's rewards, lengths and finish reasons, which every process
needs alike to choose groups and compute advantages. Rows are numbered globally (prompt p of a batch
is the batch's p-th example; sample g of it draws from a key of (p, g)), so a run does not depend on
the number of processes.

The run around the steps (resume, signals, logs, checkpoint cadence) is `grpo_jax/run.py`.
"""

import collections
import dataclasses
import functools
import json
import math
import pathlib
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax import (
    algorithms, checkpoint, data, distributed, evaluate, lora, models, multi_turn, packing, rewards, sampling, sharding,
)
from grpo_jax import metrics as metrics_lib
from grpo_jax import train_step as ts
from grpo_jax.config import Config, ModelOptions, check_routing_replay, flatten
from grpo_jax.data import samplers
from grpo_jax.rewards import scoring


@dataclasses.dataclass
class Task:
    train: data.Source  # random-access examples (dicts with "prompt", "answer", ...)
    held_out: list[dict] | None  # the first train.eval_prompts held-out examples; None: no evaluation
    tokenizer: object
    rewards: tuple[rewards.Reward, ...]  # in the order of cfg.reward.names


def load_tokenizer(cfg: Config):
    name = cfg.tokenizer or cfg.model_path
    if name == "char":
        return data.CharTokenizer()
    from grpo_jax import tokenizer

    return tokenizer.load(name)


def build_task(
    cfg: Config,
    examples: data.Source | None = None,
    held_out: data.Source | None = None,
    reward_fns: Mapping[str, rewards.RewardFn | rewards.Reward] | None = None,
) -> Task:
    """The run's examples (from `cfg.task`, or passed in code with task=data.Examples()), tokenizer and
    rewards (`cfg.reward.names`: registered, or among `reward_fns`)."""
    if examples is None and held_out is not None:
        raise ValueError("held_out was passed without examples: pass the training examples too (examples=...)")
    if examples is not None and not isinstance(cfg.task, data.Examples):
        raise ValueError(f"examples passed in code need Config.task=data.Examples(label); Config.task names the task "
                         f"{data.task_name(cfg.task)!r}, which brings its own")
    for name, given in (("examples", examples), ("held_out", held_out)):
        if given is not None and (isinstance(given, (str, bytes, Mapping)) or not isinstance(given, data.Source)):
            raise TypeError(f"{name}= is a {type(given).__name__}, not random-access examples: pass a list of dicts "
                            f"(e.g. {name}=list(...)), or anything with len() and [i]")
    train, held = (examples, held_out) if examples is not None else cfg.task.sources(cfg.train.seed)
    tr = cfg.train
    if len(train) < tr.prompts_per_step:
        raise ValueError(f"{cfg.task.describe('train')} holds {len(train)} examples, fewer than train.prompts_per_step="
                         f"{tr.prompts_per_step}: add examples, or lower train.prompts_per_step")
    if held is not None:
        if len(held) < tr.eval_prompts:
            raise ValueError(
                f"{cfg.task.describe('held_out')} holds {len(held)} held-out examples, fewer than train.eval_prompts="
                f"{tr.eval_prompts}: lower train.eval_prompts to at most {len(held)}, or add held-out examples"
            )
        held = [held[i] for i in range(tr.eval_prompts)]
    run_rewards = cfg.reward.rewards(cfg.sampling.max_new_tokens, reward_fns)
    if cfg.reward.num_workers:
        scoring.check_sendable({n: r.fn for n, r in zip(cfg.reward.names, run_rewards)})
    return Task(train, held, load_tokenizer(cfg), run_rewards)


def model_config(cfg: Config) -> models.ModelConfig:
    """The run's architecture before any weight loads: `Config.model`, or a model_path's config.json
    (with `Config.model_options`)."""
    if cfg.model is not None:
        return cfg.model
    path = pathlib.Path(cfg.model_path) / "config.json"
    try:
        config_json = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"model_path: {path} is not JSON ({e}); restore the model's config.json") from None
    return models.ModelConfig.from_hf(config_json, **cfg.model_options.as_dict())


def check(cfg: Config) -> None:
    """User errors of the run's shape and paths, raised before anything loads or compiles."""
    tr, s = cfg.train, cfg.sampling
    if cfg.model_path and not (pathlib.Path(cfg.model_path) / "config.json").is_file():
        where = "has no config.json" if pathlib.Path(cfg.model_path).is_dir() else "does not exist"
        raise FileNotFoundError(f"model_path={cfg.model_path} {where}: point it at a local Hugging Face model directory")
    model = model_config(cfg)
    if cfg.model_path:  # the checks of the architecture that Config and train_step.check make for a `model`
        check_routing_replay(cfg.algorithm, model)
        ts.check(dataclasses.replace(cfg, model=model, model_path="", model_options=ModelOptions()))
    longest = s.max_prompt_len + s.max_new_tokens
    if model.max_position_embeddings < longest:
        where = f" ({cfg.model_path}/config.json)" if cfg.model_path else ""
        raise ValueError(
            f"model.max_position_embeddings={model.max_position_embeddings}{where} is shorter than sampling.max_prompt_len "
            f"+ sampling.max_new_tokens = {s.max_prompt_len} + {s.max_new_tokens} = {longest}, the longest sequence: "
            "lower them (or, for a model of your own, raise max_position_embeddings)"
        )
    out = pathlib.Path(tr.out_dir)
    if any(p.exists() and not p.is_dir() for p in (out, out / "checkpoints")):
        raise ValueError(f"train.out_dir={tr.out_dir}: a file is in the way of the run directory; move it or set another out_dir")
    rows = tr.prompts_per_step * s.group_size
    if rows % (tr.minibatches * tr.micro_batches):
        raise ValueError(
            f"the rollout batch of train.prompts_per_step * sampling.group_size = {rows} completions does "
            f"not split into train.minibatches={tr.minibatches} x train.micro_batches={tr.micro_batches}"
        )
    need = algorithms.advantages.min_group_size(cfg.algorithm.advantage)
    if s.group_size < need:
        raise ValueError(f"sampling.group_size={s.group_size}: group advantages need at least {need} samples per prompt "
                         f"(algorithm.advantage={cfg.algorithm.advantage.name!r}); raise it, or use a group-free advantage "
                         "(algorithm.preset=spo)")


def check_prompts(cfg: Config, task: Task) -> None:
    """Every example of the training and held-out sets is a dict with a str "prompt" holding what its
    rewards read (`rewards.Reward.reads`), and its prompt fits `sampling.max_prompt_len` (checked up
    front: otherwise a bad record fails only when drawn, mid-run). Generated (synthetic)
    training tasks are endless; their prompts are checked as each batch is drawn."""
    tok, width = task.tokenizer, cfg.sampling.max_prompt_len
    chat = getattr(tok, "apply_chat_template", None)
    sets = [] if task.held_out is None else [(task.held_out, cfg.task.describe("held_out"))]
    if not cfg.task.generated:
        sets.append((task.train, cfg.task.describe("train")))
    for examples, source in sets:
        for i in range(len(examples)):
            example = examples[i]
            if not isinstance(example, Mapping) or not isinstance(example.get("prompt"), str):
                got = (f"is a {type(example).__name__}" if not isinstance(example, Mapping) else
                       f"has no 'prompt' (its keys: {sorted(map(str, example))})" if "prompt" not in example else
                       f"has prompt={example['prompt']!r} of type {type(example['prompt']).__name__}")
                raise TypeError(f"{source}: example {i} {got}; every example is a dict with a str 'prompt' "
                                "(and what its rewards read, e.g. a str 'answer')")
            where = f"{source}: example {i} (prompt {example['prompt'][:40]!r})"
            for name, reward in zip(cfg.reward.names, task.rewards):
                problem = rewards.functions.example_problem(name, reward, example)
                if problem:
                    raise ValueError(f"{where} {problem}")
            try:
                n = len(tok.encode(render(cfg, example, chat)))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if not 0 < n <= width:
                raise ValueError(f"{where} renders to {n} tokens; sampling.max_prompt_len={width}: raise it, "
                                 "or remove the example")


def render(cfg: Config, example: Mapping, chat) -> str:
    """An example's prompt text: its "prompt" (with an environment, the environment's `reset` of it) in the
    run's template."""
    if cfg.env is not None:
        example = {**example, "prompt": cfg.env.reset(example)}
    return data.render(cfg.template, example, chat)


def check_params(model: models.ModelConfig, params) -> None:
    """Raises unless `params` (passed in code) have the leaves of `model` (those of `models.init`), each
    of its shape, of a floating dtype and finite: others fail at the first update, train a model that is
    not the config's, or skip every update (and checkpoint non-finite weights)."""
    name = lambda path: jax.tree_util.keystr(path, simple=True, separator="/")  # noqa: E731
    want = {name(p): x for p, x in jax.tree_util.tree_leaves_with_path(jax.eval_shape(
        lambda: models.init(model, jax.random.key(0))))}
    got = {name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        said = [f"{what} {', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''} ({len(keys)})"
                for what, keys in (("missing", missing), ("extra", extra)) if keys]
        raise ValueError(f"params do not have the leaves of the {model.model_type} model of Config.model: "
                         f"{'; '.join(said)}; pass params of this model (models.init(cfg.model, key), models.load_hf) "
                         "or the Config.model they belong to")
    for key, x in got.items():
        shape, dtype = tuple(getattr(x, "shape", ())), getattr(x, "dtype", None)
        if shape != want[key].shape:
            raise ValueError(
                f"params {key} has shape {shape} where Config.model (hidden_size={model.hidden_size}, "
                f"intermediate_size={model.intermediate_size}, num_heads={model.num_heads}, num_kv_heads="
                f"{model.num_kv_heads}, head_dim={model.head_dim}, vocab_size={model.vocab_size}) needs "
                f"{want[key].shape}: the params are of another model; set Config.model to theirs"
            )
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"params {key} are {dtype}, not floating point: the optimizer updates them by "
                            f"gradients; cast the params to model.dtype={model.dtype!r}")
        if not bool(jnp.isfinite(x).all()):
            raise ValueError(f"params {key} hold non-finite values (NaN or inf): every update would be skipped "
                             "as non-finite; pass finite params")


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _pack(mesh, mask_truncated: bool, minibatches: int, packed_rows: int, drawn: tuple, source, advantages,
          layout: tuple | None) -> list[ts.Batch]:
    """The rollout batch, assembled on device from the drawn rounds ((row prompts, rollout) each): row j
    is row `source[j]` of their rows concatenated, or a masked padding row where -1 (prompt length 1,
    zero tokens, experts 0..k-1). Rows move between devices (and hosts) here, not through the host.
    Split into `minibatches` Batches sharded by rows, without l^old; under train.packing each with its
    rows packed by `layout` (`packing.Plan.arrays`) into `packed_rows` rows."""
    def take(get, pad):
        x = jnp.concatenate([get(prompts, r) for prompts, r in drawn])
        keep = (source >= 0).reshape(-1, *(1,) * (x.ndim - 1))
        return jnp.where(keep, x[jnp.maximum(source, 0)], pad)

    prompt_tokens = take(lambda p, r: p.tokens, 0)
    prompt_lengths = take(lambda p, r: p.lengths, 1)
    completions = take(lambda p, r: r.tokens, 0)
    mask = take(lambda p, r: (r.mask & ~r.truncated[:, None] if mask_truncated else r.mask).astype(jnp.float32), 0.0)
    sampler_logp = take(lambda p, r: r.logprobs, 0.0)
    routes = None
    if drawn[0][1].routes is not None:
        routes = take(lambda p, r: r.routes, jnp.arange(drawn[0][1].routes.shape[-1], dtype=jnp.int32))
    tokens, positions, segment_ids = ts.sequences(prompt_tokens, prompt_lengths, completions)
    batch = ts.Batch(tokens, positions, segment_ids, mask, None, sampler_logp, advantages, routes)
    size = len(source) // minibatches
    out = []
    for j in range(minibatches):
        rows = slice(j * size, (j + 1) * size)
        b = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x[rows], sharding.batch_sharding(mesh, x.ndim)),
                         batch)
        if layout is not None:
            packed = packing.pack(b.tokens, b.positions, b.segment_ids, completions.shape[1],
                                  *(a[rows] for a in layout), packed_rows)
            b = dataclasses.replace(b, packing=jax.tree.map(
                lambda x: jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim)), packed))
        out.append(b)
    return out


def _record(r) -> dict:
    """A sampler output (`sampling.Rollout`) or a minibatch's (l^old, routes) as a checkpointable dict of
    its arrays (routes only for MoE); `restore` tells them apart by "tokens"."""
    if isinstance(r, sampling.Rollout):
        return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if getattr(r, f.name) is not None}
    return {"old_logp": r[0], **({"routes": r[1]} if r[1] is not None else {})}


@jax.jit
def _read_updates(updates: list[dict], learning_rates: list) -> tuple[dict, list[dict]]:
    """The plain values of an RL step's train metrics (its updates merged by their weights: counters add,
    means weigh by what they average over) and of each update's, with the learning rate each used; one
    program (op by op on the host, `Metric`'s jnp calls compiled a small program each).

    `learning_rates[j]` is the schedule's rate after j of the step's updates were applied: an empty or
    skipped update leaves the optimizer step (`TrainState.step`) where it was, so an update's rate is
    picked here by the count of applied updates before it, which the host does not wait for."""
    applied = [1 - m["skipped_updates"].value - m["empty_updates"].value for m in updates]
    before = jnp.cumsum(jnp.stack([jnp.float32(0), *applied[:-1]])).astype(jnp.int32)
    rates = jnp.stack(learning_rates)[before]
    updates = [{**m, "learning_rate": metrics_lib.Metric.mean(rates[k])} for k, m in enumerate(updates)]
    return metrics_lib.finalize(metrics_lib.combine_all(updates)), [metrics_lib.finalize(m) for m in updates]


class Trainer:
    """Holds the mesh, the compiled pieces and the train state of one run. `examples`, `held_out` and
    `rewards` pass the data and reward functions in code (see `build_task`)."""

    def __init__(
        self,
        cfg: Config,
        params=None,
        *,
        examples: data.Source | None = None,
        held_out: data.Source | None = None,
        rewards: Mapping[str, rewards.RewardFn | rewards.Reward] | None = None,
    ):
        check(cfg)
        self.sampler_mesh, devices = sharding.split_devices(cfg.mesh.sampler)
        self.mesh = sharding.make_mesh(cfg.mesh, devices)
        self.gen_mesh = self.sampler_mesh or self.mesh  # where rollouts (and evaluations) are sampled
        self.task = build_task(cfg, examples, held_out, rewards)
        check_prompts(cfg, self.task)
        self.source_path = cfg.model_path
        given = params is not None  # checked against the model before anything compiles
        # LoRA adapters are only worth their base, which is not saved: a checkpoint holds its fingerprint
        self.base = models.fingerprint(cfg.model_path) if cfg.model_path and cfg.lora.rank else None
        if cfg.model_path:
            model_cfg, loaded = models.load_hf(cfg.model_path, mesh=self.mesh, **cfg.model_options.as_dict())
            cfg = dataclasses.replace(cfg, model=model_cfg, model_path="", model_options=ModelOptions())
            params = loaded if params is None else params
        elif params is None:
            params = models.init(cfg.model, jax.random.key(cfg.train.seed))
        if given:
            check_params(cfg.model, params)
        self.cfg = cfg
        if cfg.env is not None:  # env.call_end checked against the tokenizer before anything compiles
            multi_turn.stop_ids(cfg.model, cfg.sampling, cfg.env, self.task.tokenizer)
        tr, alg = cfg.train, cfg.algorithm
        self.rows = tr.prompts_per_step * cfg.sampling.group_size
        if self.task.tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(
                f"the tokenizer has {self.task.tokenizer.vocab_size} ids but the model's vocab_size is "
                f"{cfg.model.vocab_size}: Config.tokenizer does not belong to this model"
            )
        self.shards = shards = math.prod(self.mesh.shape[a] for a in sharding.RULES["batch"])
        if self.rows // tr.minibatches % shards:  # (a held-out set of any size is padded: evaluate_examples)
            raise ValueError(
                f"a minibatch of {self.rows // tr.minibatches} rows does not split over the {shards} devices of the "
                f"batch mesh axes {sharding.RULES['batch']}; change the batch sizes or the MeshConfig"
            )
        self.gen_shards = sharding.batch_shards(self.gen_mesh)
        if self.sampler_mesh is not None and self.rows // tr.minibatches % self.gen_shards:
            raise ValueError(
                f"mesh.sampler={cfg.mesh.sampler}: a minibatch of {self.rows // tr.minibatches} rows does not split over "
                f"the sampler mesh's {self.gen_shards} batch devices; change mesh.sampler or the batch sizes")
        if cfg.sampling.decode_slots % self.gen_shards:
            raise ValueError(
                f"sampling.decode_slots={cfg.sampling.decode_slots} does not split over the {self.gen_shards} devices of "
                f"the sampler's batch mesh axes {sharding.RULES['batch']}: each device decodes its rows on its own share "
                "of the slots; make it a multiple of that (0: all rows at once)"
            )
        if tr.packing and self.rows // tr.minibatches % (shards * tr.micro_batches):
            raise ValueError(
                f"train.packing=True packs each device's share of each micro-batch, but a minibatch of "
                f"{self.rows // tr.minibatches} rows does not split over {shards} devices x train.micro_batches="
                f"{tr.micro_batches}; change the batch sizes or micro_batches, or set train.packing=False"
            )
        self.total_updates = tr.steps * alg.num_iterations * tr.minibatches
        self.schedule = ts.learning_rate(cfg.optim, self.total_updates)
        self.optimizer, self.state_sharding, ref_sharding, self.update = ts.compiled_train_step(
            cfg, self.total_updates, self.mesh
        )
        if cfg.lora.rank:  # train adapters only; the base stays frozen (and is the reference if beta > 0)
            trainable = lora.init(cfg.model, cfg.lora, jax.random.fold_in(jax.random.key(tr.seed), 1))
            self.ref_params = jax.device_put(params, ref_sharding)
        else:
            trainable = params
        init_state = jax.jit(ts.init_state, static_argnums=1, out_shardings=self.state_sharding)  # one program
        self.state = init_state(trainable, self.optimizer)
        if not cfg.lora.rank:  # beta = 0: no reference params exist at all. A copy, as the train state is donated.
            self.ref_params = jax.device_put(jax.tree.map(jnp.copy, params), ref_sharding) if alg.beta > 0 else None
        self.rng = jax.random.key(cfg.train.seed if cfg.train.rollout_seed is None else cfg.train.rollout_seed)
        self.sampler = alg.sampler
        if self.sampler.spec.needs_correctness and not any(r.correctness for r in self.task.rewards):
            raise ValueError(f"algorithm.sampler={self.sampler.name!r} learns from each prompt's correctness, but none of "
                             f"reward.names={cfg.reward.names} is a correctness reward: add one (e.g. 'exact'), or use "
                             "algorithm.sampler='uniform'")
        if cfg.reward.label_noise and not any(r.correctness for r in self.task.rewards):
            raise ValueError(f"reward.label_noise={cfg.reward.label_noise} flips correctness labels, but none of "
                             f"reward.names={cfg.reward.names} is a correctness reward: add one (e.g. 'exact') or set 0")
        self.sampler_state = samplers.check_state(self.sampler, self.sampler.init(len(self.task.train)))
        self.replay = None  # samplers with replays: each prompt's last group (samplers.replay_store)
        if self.sampler.spec.replays:
            self.replay = samplers.replay_store(self.sampler, len(self.task.train), cfg.sampling.group_size,
                                                cfg.sampling.max_new_tokens, len(cfg.reward.names))
        self.position = 0  # prompt rounds drawn
        self.step = 0
        # TrainState.step (the applied optimizer updates, which set the learning rate), counted on the host
        # so that the updates of a step are dispatched back to back: advanced from the step's metrics, read
        # from the device once after a restore
        self.optimizer_step = 0
        self._rates: dict[int, float] = {}  # optimizer step -> the schedule's rate, as logged
        # Bounded staleness: the rollouts of the next steps, sampled ahead (`_produce`); the sampler's copy
        # of the trainable params (None: it samples with the policy's own) and the step they are of
        self.queue: collections.deque[dict] = collections.deque()
        self._sampled, self._sampler_base, self.version = None, None, 0
        if self.sampler_mesh is not None and cfg.lora.rank:  # the frozen base moves once
            self._sampler_base = sharding.to_mesh(self.ref_params, self._on_sampler(self.ref_params))
        self._rounds, self._recorded = None, []  # the sampler outputs of the rollout being produced, or replayed
        self._publish()

    def _on_sampler(self, tree):
        """`tree`'s shardings on the sampler's mesh: whole on every device (it splits rows only)."""
        return jax.tree.map(lambda x: NamedSharding(self.sampler_mesh, P()), tree)

    def _publish(self) -> None:
        """Gives the sampler the policy after `self.step` steps (its version): the trainable params (under
        LoRA the adapters only, with the base the sampler holds) moved to the sampler mesh's shardings, or
        on one mesh under max_staleness a copy (updates donate the train state); else nothing: it samples
        with the policy's own params."""
        self.version = self.step
        if self.sampler_mesh is not None:
            self._sampled = sharding.to_mesh(self.state.params, self._on_sampler(self.state.params))
        elif self.cfg.train.max_staleness:
            self._sampled = jax.tree.map(jnp.copy, self.state.params)

    @property
    def sampler_params(self):
        """The params rollouts and evaluations sample with (`_publish`)."""
        if self._sampled is None:
            return self.policy_params
        base = self.ref_params if self._sampler_base is None else self._sampler_base
        return lora.policy_params(self.cfg.lora, self._sampled, base)

    @property
    def policy_params(self):
        """The params the policy samples and is scored with: the trained params, or under LoRA the frozen
        base with the trained adapters attached."""
        return lora.policy_params(self.cfg.lora, self.state.params, self.ref_params)

    def export_params(self):
        """The policy as plain params (under LoRA, the adapters merged into the base), for HF export."""
        return lora.merge(self.ref_params, self.state.params, self.cfg.lora) if self.cfg.lora.rank else self.state.params

    # -- rollouts --------------------------------------------------------------------------------

    def _prompts(self, examples: data.Source) -> tuple[list[str], sampling.Prompts]:
        tok = self.task.tokenizer
        chat = getattr(tok, "apply_chat_template", None)
        texts = [render(self.cfg, examples[i], chat) for i in range(len(examples))]
        return texts, sampling.pad_prompts([tok.encode(t) for t in texts], self.cfg.sampling)

    def sample(self, examples: data.Source, rng, sampling_cfg, temperatures: np.ndarray | None = None) -> dict:
        """Generates `sampling_cfg.group_size` completions per example of a global prompt batch
        (`examples`: random access, every process the same; `temperatures`: one per example, instead of
        `sampling_cfg.temperature`). Rows are global: row p*G + g is sample g of
        prompt p, its key derived from (p, g), so nothing depends on the number of processes. This
        process reads, renders, decodes and scores only its own rows (`sharding.process_rows`: those its
        devices hold); the rewards, lengths and finish reasons of every row come back to every process
        (host numpy), since groups, advantages and metrics need them whole."""
        g = sampling_cfg.group_size
        n = len(examples) * g
        rows = sharding.process_rows(self.gen_mesh, n)
        prompt_ids = np.unique(rows // g)
        mine = [examples[int(p)] for p in prompt_ids]
        texts, prompts = self._prompts(mine)
        if temperatures is not None:
            prompts = dataclasses.replace(prompts, temperatures=jnp.asarray(temperatures[prompt_ids], jnp.float32))
        stop_ids = sampling.check_prompts(self.cfg.model, prompts, sampling_cfg)
        of_row = np.searchsorted(prompt_ids, rows // g)  # row -> its prompt among this process's
        row_prompts = sharding.global_batch(jax.tree.map(lambda x: np.asarray(x)[of_row], prompts), self.gen_mesh, n)
        t0 = time.perf_counter()
        row_examples, credit = [mine[i] for i in of_row], {}
        if self.cfg.env is None:
            rollout = self._generate(sampling_cfg, stop_ids, row_prompts, rng)
        else:  # the trajectory's return is the reward "env"
            rollout, turns = multi_turn.rollout(self.cfg.model, sampling_cfg, self.cfg.env, self.task.tokenizer,
                                                self.gen_mesh, self.sampler_params, row_prompts, row_examples, rng)
            row_examples = [{**e, "env_return": t.total} for e, t in zip(row_examples, turns)]
            credit = multi_turn.turn_table(turns, self.cfg.env.max_turns, sharding.local_rows(rollout.mask, rows))
            credit = sharding.gather(sharding.global_batch(credit, self.gen_mesh, n))  # every process's rows
        tokens, lengths = (sharding.local_rows(x, rows) for x in jax.block_until_ready((rollout.tokens, rollout.lengths)))
        generate_s = time.perf_counter() - t0
        completions = [self.task.tokenizer.decode(t[:k]) for t, k in zip(tokens, lengths)]
        row_texts = [texts[i] for i in of_row]
        fns, weights = [r.fn for r in self.task.rewards], self.cfg.reward.weights
        scores, status, metrics = rewards.score(
            fns, weights, row_texts, completions, row_examples, completion_lens=lengths.tolist(),
            timeout_s=self.cfg.reward.timeout_s, num_workers=self.cfg.reward.num_workers,
        )
        # every process's rows: groups, advantages and the metrics need them all
        scores, status = sharding.gather(sharding.global_batch((scores, status), self.gen_mesh, n))
        flips, correct = {}, [i for i, r in enumerate(self.task.rewards) if r.correctness]
        clean = scores[:, correct[0]] >= 1.0 if correct else None  # the verifier's own labels, before any flip
        if self.cfg.reward.label_noise:  # drawn from the round's key (every process, a resume: the same flips),
            kinds = [r.correctness for r in self.task.rewards]  # folded with no prompt's index (the row keys')
            uniform = np.asarray(jax.random.uniform(jax.random.fold_in(rng, 2**32 - 1), scores.shape))
            scores, flipped = rewards.flip_labels(scores, status, kinds, self.cfg.reward.label_noise, uniform)
            flips = {"reward/label_flip_frac": float(flipped.sum() / max(((status == 0) & kinds).sum(), 1))}
        metrics = {"reward/time_s": metrics["reward/time_s"], **rewards.summarize(fns, weights, scores, status), **flips}
        lengths, truncated, prompt_lengths, counted = sharding.gather(
            (rollout.lengths, rollout.truncated, row_prompts.lengths, rollout.mask.sum(1)))
        names = data.source_names(examples)  # a mixture's part of each row, for its metrics
        return dict(
            prompts=row_prompts, rollout=rollout, rows=rows, texts=row_texts, completions=completions,
            rewards=scores, lengths=lengths, truncated=truncated, prompt_lengths=prompt_lengths, counted=counted,
            metrics=metrics, generate_s=generate_s, **credit, sources=None if names is None else np.repeat(names, g),
            correct=scores[:, correct[0]] >= 1.0 if correct else None, clean_correct=clean,
            usable=rewards.usable_groups(status, g, self.cfg.reward.on_failure),
        )

    def _generate(self, sampling_cfg, stop_ids, row_prompts, rng) -> sampling.Rollout:
        """The sampler's output for one round: generated with `sampler_params`, or while a restore
        replays a checkpointed rollout (`_recorded`), its saved output. Recorded in `_rounds` while a
        rollout is produced ahead, for the checkpoint."""
        if self._recorded:
            rollout = self._recorded.pop(0)
        else:
            rollout = sampling.rollout_rows(self.cfg.model, sampling_cfg, stop_ids, self.gen_mesh, self.sampler_params,
                                            row_prompts, rng)
            if self.cfg.algorithm.routing_replay != "sampler":  # MoE routes stay only for R3
                rollout = dataclasses.replace(rollout, routes=None)
        if self._rounds is not None:
            self._rounds.append(rollout)
        return rollout

    def _store(self, s: dict, indices: np.ndarray, group: np.ndarray) -> None:
        """Keeps the first slot of each prompt of a sampled round whose rewards are usable (under `reuse`, and
        hold a correct answer) as its last group."""
        g, store = self.cfg.sampling.group_size, self.replay
        tokens, logprobs = sharding.gather((s["rollout"].tokens, s["rollout"].logprobs))
        for e in np.unique(group):
            i = int(np.flatnonzero(group == e)[0])
            if s["usable"][i] and (not self.sampler.spec.reuse or s["correct"][i * g:(i + 1) * g].any()):
                rows, p = slice(i * g, (i + 1) * g), indices[e]
                store["tokens"][p], store["logprobs"][p], store["lengths"][p] = tokens[rows], logprobs[rows], s["lengths"][rows]
                store["truncated"][p], store["rewards"][p], store["stored"][p] = s["truncated"][rows], s["rewards"][rows], 1

    def _replayed(self, indices: np.ndarray) -> dict:
        """The stored groups of prompts `indices` as a drawn round (what `sample` returns, with "stored"):
        their tokens, the log-probs their sampler reported then (so the rollout correction weighs them),
        their rewards; every process builds the rows it holds."""
        g, store = self.cfg.sampling.group_size, self.replay
        n = len(indices) * g
        rows = sharding.process_rows(self.mesh, n)
        prompt_ids = np.unique(rows // g)
        texts, prompts = self._prompts(samplers.Picked(self.task.train, indices[prompt_ids]))
        of_row = np.searchsorted(prompt_ids, rows // g)
        row_prompts = sharding.global_batch(jax.tree.map(lambda x: np.asarray(x)[of_row], prompts), self.mesh, n)
        flat = {k: v[indices].reshape(n, *v.shape[2:]) for k, v in store.items() if k != "stored"}
        mask = np.arange(flat["tokens"].shape[1]) < flat["lengths"][:, None]
        rollout = sharding.global_batch(sampling.Rollout(
            flat["tokens"][rows], mask[rows], flat["logprobs"][rows], flat["lengths"][rows],
            flat["truncated"][rows].astype(bool)), self.mesh, n)
        correct = [i for i, r in enumerate(self.task.rewards) if r.correctness]
        return dict(
            prompts=row_prompts, rollout=rollout, rows=rows, texts=[texts[i] for i in of_row],
            completions=[self.task.tokenizer.decode(t[:k]) for t, k in zip(flat["tokens"][rows], flat["lengths"][rows])],
            rewards=flat["rewards"], lengths=flat["lengths"], truncated=flat["truncated"].astype(bool),
            counted=flat["lengths"], prompt_lengths=sharding.gather(row_prompts.lengths), metrics={}, generate_s=0.0,
            correct=flat["rewards"][:, correct[0]] >= 1.0 if correct else None, usable=np.ones(len(indices), bool),
            stored=True,
        )

    def draw(self) -> samplers.Draw:
        """What the sampler knows of the next round: seeded by train.seed (not rollout_seed: the data order
        is the run's) and the rounds drawn before."""
        tr = self.cfg.train
        return samplers.Draw(len(self.task.train), tr.prompts_per_step, self.cfg.sampling.group_size, tr.seed,
                             self.position, self.cfg.sampling.temperature,
                             None if self.replay is None else self.replay["stored"] > 0)

    def rollout_batch(self, rng) -> tuple[list[ts.Batch], dict]:
        """Samples one rollout batch of `prompts_per_step` slots of G samples, in rounds that
        `algorithm.sampler` chooses (DAPO dynamic sampling if enabled); returns its `train.minibatches`
        minibatches (global arrays, without l^old) and the metrics. A sampler with replays adds stored
        groups (`_replayed`): as groups of their own, or (reuse) a correct answer lent to a group with none.

        A group is informative when its completions differ in correctness (0 < correct < G, the DAPO
        paper's condition), or, for a task without a correctness reward, in total reward; dynamic
        sampling keeps only those, and `groups/zero_variance_frac` counts the others. Which groups are
        kept, and their advantages, every process computes alike from the rewards of all rows; the rows
        themselves move to their place in the batch on device (`_pack`)."""
        cfg, alg, g = self.cfg, self.cfg.algorithm, self.cfg.sampling.group_size
        want = cfg.train.prompts_per_step
        shaping = alg.overlong_buffer_frac > 0
        weights = np.asarray(cfg.reward.weights + ((1.0,) if shaping else ()), np.float32)
        # kept: one (rows, scores, group key) per slot of the batch; rows [G, 2]: (drawn round, row) of each
        kept, rounds, drawn, sample_time = [], 0, [], 0.0
        def columns(s):  # the reward columns the advantages read: with DAPO's overlong shaping, one more of weight 1
            if not shaping:
                return s["rewards"]
            pen = np.asarray(algorithms.overlong_penalty(alg, s["lengths"], cfg.sampling.max_new_tokens))
            return np.concatenate([s["rewards"], pen[:, None]], axis=1)

        slot = lambda r, i: np.stack([np.full(g, r), np.arange(i * g, (i + 1) * g)], 1)  # noqa: E731
        while True:
            t0 = time.perf_counter()
            draw = self.draw()
            choice = samplers.checked(self.sampler, self.sampler.choose(self.sampler_state, draw), draw)
            slots = choice.samples // g
            group = np.repeat(np.arange(len(choice.indices)), slots)  # slot -> its prompt's group
            baseline = self.sampler.baseline(self.sampler_state, choice.indices) if self.sampler.spec.baseline else None
            s = self.sample(samplers.Picked(self.task.train, np.repeat(choice.indices, slots)), jax.random.fold_in(rng, rounds),
                            cfg.sampling, None if choice.temperatures is None else np.repeat(choice.temperatures, slots))
            replayed = None if choice.replay is None or not choice.replay.any() else self._replayed(
                choice.indices[choice.replay > 0])  # the stored groups, before this round's replace them
            sample_time += time.perf_counter() - t0
            self.position += 1
            rounds += 1
            scores = columns(s)
            signal = s["correct"].astype(np.float32) if s["correct"] is not None else scores @ weights
            k, rows = len(choice.indices), np.repeat(group, g)
            low, high, usable = np.full(k, np.inf, signal.dtype), np.full(k, -np.inf, signal.dtype), np.ones(k, bool)
            np.minimum.at(low, rows, signal)
            np.maximum.at(high, rows, signal)
            np.logical_and.at(usable, group, s["usable"])  # reward failures: rewards.usable_groups
            s["informative"], s["usable"] = (high > low)[group], usable[group]  # per slot, of its prompt's group
            keep = s["informative"] if alg.dynamic_sampling else np.ones(len(s["informative"]), bool)
            keep &= s["usable"]
            start = len(kept)
            kept += [(slot(len(drawn), i), scores[i * g:(i + 1) * g], (rounds, group[i])) for i in np.flatnonzero(keep)]
            total = scores @ weights
            if baseline is not None:  # each row's reward less its prompt's expected reward, before this round
                s["centred"] = total - np.repeat(baseline[group], g).astype(np.float32)
                if s["correct"] is not None:  # its baseline against the round's success rate, per prompt
                    n = np.bincount(group, minlength=k) * g
                    s["tracked"] = (baseline, np.bincount(rows, s["correct"], k) / n, n)
            drawn.append(s)
            if self.sampler.spec.reuse:  # a group with no correct answer borrows its prompt's stored one
                solved = np.zeros(k, bool)
                np.logical_or.at(solved, rows, s["correct"])
                lacking = [e for e in np.unique(group) if not solved[e] and self.replay["stored"][choice.indices[e]]]
                if lacking:
                    lent = self._replayed(choice.indices[lacking])
                    ls = columns(lent)
                    for n, e in enumerate(lacking):
                        j = next((j for j in range(start, len(kept)) if kept[j][2] == (rounds, e)), None)
                        if j is not None:  # the first slot of its group, if kept: its last sample replaced
                            q = n * g + int(np.flatnonzero(lent["correct"][n * g:(n + 1) * g])[0])
                            rows_j, scores_j = kept[j][0].copy(), kept[j][1].copy()
                            rows_j[-1], scores_j[-1] = (len(drawn), q), ls[q]
                            kept[j] = (rows_j, scores_j, kept[j][2])
                    drawn.append(lent)
            if self.replay is not None:
                self._store(s, choice.indices, group)
            if replayed is not None:  # each stored group a group of its own
                rs = columns(replayed)
                kept += [(slot(len(drawn), i), rs[i * g:(i + 1) * g], (rounds, "replay", i))
                         for i in range(len(replayed["usable"]))]
                drawn.append(replayed)
            if self.sampler.spec.needs_correctness:
                counted = np.repeat(s["usable"], g)
                self.sampler_state = samplers.check_state(self.sampler, self.sampler.update(
                    self.sampler_state, samplers.Results(
                        choice.indices, np.bincount(rows, counted, k).astype(np.int64),
                        np.bincount(rows, counted & s["correct"], k).astype(np.int64),
                        np.bincount(rows, np.where(counted, total, 0.0), k))))
            if not alg.dynamic_sampling or len(kept) >= want or rounds >= alg.max_gen_batches:
                break
        kept = kept[:want]
        source, advantages, mask_lengths, prompt_lengths = self._plan(drawn, kept, weights)
        self.last_rollout = dict(drawn=drawn, kept=kept, advantages=advantages, train_tokens=float(mask_lengths.sum()))
        metrics = self._rollout_metrics(drawn, kept, rounds, sample_time)
        tr, layout, packed_rows = cfg.train, None, 0
        if tr.packing:  # the forwards' layout: each device's share of each micro-batch packed apart
            width = cfg.sampling.max_prompt_len + cfg.sampling.max_new_tokens - 1
            layout = packing.plan(prompt_lengths, mask_lengths, width, self.shards, tr.micro_batches, tr.minibatches)
            packed_rows = layout.packed_rows
            metrics["packing/rows_frac"] = packed_rows * tr.minibatches / self.rows  # of the padded forward's
            metrics["packing/fill"] = float(layout.length.sum()) / (packed_rows * tr.minibatches * width)  # real tokens
        rounds = tuple((s["prompts"], s["rollout"]) for s in drawn)
        if self.sampler_mesh is not None:  # the sampled rows move to the trainer's devices
            rounds = sharding.to_mesh(rounds, jax.tree.map(lambda x: sharding.batch_sharding(self.mesh, x.ndim), rounds))
        batches = _pack(self.mesh, alg.mask_truncated, tr.minibatches, packed_rows, rounds, source, advantages,
                        None if layout is None else layout.arrays())
        return batches, metrics

    def _plan(self, drawn: list[dict], kept: list, weights: np.ndarray) -> tuple[np.ndarray, ...]:
        """Where each row of the rollout batch comes from (its index among the drawn rounds' rows, -1
        for the masked rows that pad a short batch), its advantage, its counted tokens (the completion
        policy's tokens (the completion length less its observations; 0 for a truncated one under
        `algorithm.mask_truncated`) and its prompt length. Host numpy,
        the same on every process. Kept slots of one prompt of one round form one group (a replayed
        group, one of its own)."""
        alg, g = self.cfg.algorithm, self.cfg.sampling.group_size
        source = np.full(self.rows, -1, np.int32)
        turn_level = alg.turn_discount is not None and self.cfg.env is not None  # one advantage per token: its turn's
        advantages = np.zeros((self.rows, self.cfg.sampling.max_new_tokens) if turn_level else self.rows, np.float32)
        mask_lengths = np.zeros(self.rows, np.int32)
        prompt_lengths = np.ones(self.rows, np.int32)
        offsets = np.cumsum([0] + [len(s["lengths"]) for s in drawn])  # rounds differ in rows where one replays
        for j, (rows, _, _) in enumerate(kept):
            for q, (r, row) in enumerate(rows):
                s = drawn[r]
                source[j * g + q] = offsets[r] + row
                mask_lengths[j * g + q] = 0 if alg.mask_truncated and s["truncated"][row] else s["counted"][row]
                prompt_lengths[j * g + q] = s["prompt_lengths"][row]
        n = len(kept) * g
        if n:
            ids = {}
            groups = np.array([ids.setdefault(key, len(ids)) for _, _, key in kept])
            scores, w = np.concatenate([sc for _, sc, _ in kept]), weights
            if self.sampler.spec.baseline:  # the weighted total less the sampler's baseline (sum_then_normalize)
                scores, w = np.array([drawn[r]["centred"][row] for rows, _, _ in kept for r, row in rows])[:, None], (1.0,)
            if turn_level:
                picked = [(drawn[r], row) for rows, _, _ in kept for r, row in rows]
                table = {k: np.stack([s[k][row] for s, row in picked]) for k in ("turn_rewards", "turn_mask", "token_turns")}
                by_turn = algorithms.turn_advantages(alg, table["turn_rewards"], table["turn_mask"], np.repeat(groups, g))
                at = table["token_turns"]
                advantages[:n] = np.where(at >= 0, np.take_along_axis(by_turn, np.maximum(at, 0), axis=1), 0.0)
            else:
                mean_logp = None
                if alg.unlikeliness:  # each kept row's mean token l^samp, whose rank in its group scales its reward
                    means = [sharding.gather(jnp.sum(s["rollout"].logprobs * s["rollout"].mask, 1)
                                             / jnp.maximum(s["rollout"].mask.sum(1), 1)) for s in drawn]
                    mean_logp = np.array([means[r][row] for rows, _, _ in kept for r, row in rows])
                advantages[:n] = np.asarray(algorithms.compute_advantages(
                    alg, scores, group_ids=np.repeat(groups, g), lengths=mask_lengths[:n], reward_weights=w,
                    sampler_logprobs=mean_logp))
        return source, advantages, mask_lengths, prompt_lengths

    def minibatches(self, batches: list[ts.Batch]) -> list[ts.Batch]:
        """Attaches l^old (and, for MoE policies, pi_old's routes) to each minibatch of a rollout batch,
        all under the params that sampled them (`sampler_params`: before any update of this step, or
        under max_staleness those of `self.version`, on the sampler's mesh), or under train.proximal =
        "trainer" the trainer's current params (`policy_params`, called before the step's updates); none
        when the updates are on-policy (`train_step.on_policy`: the update takes sg(l) from its own forward).
        Under train.proximal = "rollout" l^old is the sampler's own log-probs (`Batch.sampler_logp`): no forward."""
        cfg = self.cfg
        if cfg.train.proximal == "rollout":
            return [dataclasses.replace(b, old_logp=b.sampler_logp.astype(jnp.float32) * b.mask) for b in batches]
        if ts.on_policy(cfg):
            return batches
        sampler = cfg.train.proximal == "sampler" and self.sampler_mesh is not None
        params = self.policy_params if cfg.train.proximal == "trainer" else self.sampler_params
        out = []
        for b in batches:
            if self._recorded:  # a checkpointed rollout replayed: its l^old, saved with it
                old_logp, routes = self._recorded.pop(0)
            else:
                on = b if not sampler else sharding.to_mesh(
                    b, jax.tree.map(lambda x: sharding.batch_sharding(self.gen_mesh, x.ndim), b))
                with sharding.activation_rules(self.gen_mesh if sampler else self.mesh):
                    old_logp, routes = ts.old_logprobs(cfg.model, cfg.sampling.temperature, params,
                                                       on.tokens, on.positions, on.segment_ids, on.mask, on.routes,
                                                       group=ts.prefix_group(cfg), packing=on.packing)
                if sampler:
                    old_logp, routes = sharding.to_mesh((old_logp, routes), jax.tree.map(
                        lambda x: sharding.batch_sharding(self.mesh, x.ndim), (old_logp, routes)))
            if self._rounds is not None:
                self._rounds.append((old_logp, routes))
            out.append(dataclasses.replace(b, old_logp=old_logp, routes=routes))
        return out

    def _rollout_metrics(self, drawn: list, kept: list, rounds: int, sample_time: float) -> dict:
        """The metrics of the rounds sampled now (stored rows count only in groups/kept and replay/rows)."""
        replays = sum("stored" in drawn[r] for rows, _, _ in kept for r, _ in rows)
        drawn = [s for s in drawn if "stored" not in s]
        lengths = np.concatenate([s["lengths"] for s in drawn])
        truncated = np.concatenate([s["truncated"] for s in drawn])
        total = np.concatenate([s["rewards"] @ np.asarray(self.cfg.reward.weights, np.float32) for s in drawn])
        m = {
            "reward/mean": float(total.mean()),
            "reward/std": float(total.std()),
            "groups/zero_variance_frac": float(1.0 - np.concatenate([s["informative"] for s in drawn]).mean()),
            "groups/kept": float(len(kept)),
            "groups/gen_rounds": float(rounds),
            **({"replay/rows": float(replays)} if self.replay is not None else {}),
            "completion/length_mean": float(lengths.mean()),
            "completion/length_max": float(lengths.max()),
            **{f"completion/length_p{q}": float(np.percentile(lengths, q)) for q in (10, 50, 90)},
            "completion/truncated_frac": float(truncated.mean()),
            "time/sample_s": sample_time,  # generation, tokenizing, decoding and rewards
            "time/generate_s": sum(s["generate_s"] for s in drawn),  # the jitted sampler alone
            "throughput/sample_tokens_per_s": float(lengths.sum()) / max(sample_time, 1e-9),
        }
        tracked = [s["tracked"] for s in drawn if "tracked" in s]
        if tracked:  # a sampler's baseline v against p, its prompt's success rate, which a round's n >= 2 samples
            v, p, n = (np.concatenate(x) for x in zip(*tracked))  # estimate without bias (p^ (1 - p^) / (n - 1))
            v, p, var = v[n > 1], p[n > 1], p[n > 1] * (1 - p[n > 1]) / (n[n > 1] - 1)
            if v.size:  # (v - p)^2 unbiased, and the variance of the round's own group mean
                m["sampler/baseline_sq_error"] = float(np.mean((v - p) ** 2 - var))
                m["sampler/group_mean_var"] = float(np.mean(var))
        if drawn[0]["correct"] is not None:
            correct = np.concatenate([s["correct"] for s in drawn])
            m["accuracy"] = float(correct.mean())
            if self.cfg.reward.label_noise:  # accuracy counts the flipped labels the update trains on; this, the true ones
                m["accuracy_clean"] = float(np.concatenate([s["clean_correct"] for s in drawn]).mean())
            for name, rows in (("correct", correct), ("incorrect", ~correct)):  # Dr. GRPO's length bias
                if rows.any():
                    m[f"completion/length_{name}"] = float(lengths[rows].mean())
        for s in drawn[:1]:
            m.update({k: v for k, v in s["metrics"].items() if k.startswith("reward/")})
        if "turn_mask" in drawn[0]:  # Config.env: how the trajectories used their turns (a second turn follows a tool's answer)
            turns = np.concatenate([s["turn_mask"] for s in drawn]).sum(1)
            m["env/turns_mean"], m["env/tool_call_rate"] = float(turns.mean()), float((turns > 1).mean())
        if drawn[0].get("sources") is not None:  # a mixture: each part's rows (data.hf)
            names = np.concatenate([s["sources"] for s in drawn])
            for name in np.unique(names):
                rows = names == name
                m[f"reward/mean@{name}"] = float(total[rows].mean())
                m[f"completion/length_mean@{name}"] = float(lengths[rows].mean())
                if "accuracy" in m:
                    m[f"accuracy@{name}"] = float(correct[rows].mean())
        return m

    def rollout_histograms(self) -> dict[str, np.ndarray]:
        """The last rollout batch's weighted total rewards and completion lengths, every drawn row."""
        drawn, w = [s for s in self.last_rollout["drawn"] if "stored" not in s], np.asarray(self.cfg.reward.weights, np.float32)
        return {"reward/total": np.concatenate([s["rewards"] @ w for s in drawn]),
                "completion/length": np.concatenate([s["lengths"] for s in drawn])}

    def completion_records(self) -> list[dict]:
        """The last rollout batch's trained completions (the kept groups) that this process holds, one
        JSON-ready dict each (process 0 writes them: on several processes, its share of the rows)."""
        g, names = self.cfg.sampling.group_size, self.cfg.reward.names
        out = []
        for j, (rows, _, _) in enumerate(self.last_rollout["kept"]):
            for q, (r, row) in enumerate(rows):
                s = self.last_rollout["drawn"][r]
                k = np.searchsorted(s["rows"], row)
                if k == len(s["rows"]) or s["rows"][k] != row:
                    continue  # another process's row
                adv = self.last_rollout["advantages"][j * g + q]  # turn-level credit: each token's
                out.append({
                    "prompt": s["texts"][k], "completion": s["completions"][k],
                    "rewards": dict(zip(names, s["rewards"][row].tolist())),
                    "advantage": float(adv) if adv.ndim == 0 else adv[: s["lengths"][row]].tolist(),
                    "length": int(s["lengths"][row]), "truncated": bool(s["truncated"][row]),
                })
        return out

    # -- one RL step -------------------------------------------------------------------------------

    def _produce(self, step: int) -> dict:
        """The rollout batch of `step`, sampled now with the sampler's params (`self.version`): its
        minibatches (with l^old under max_staleness and proximal "sampler"), metrics and host record, and
        what a checkpoint needs of it while it waits (the host state before it and its sampler outputs,
        `_rounds`)."""
        k = self.cfg.train.max_staleness
        before = self._host_state()
        self._rounds = [] if k else None
        batches, metrics = self.rollout_batch(jax.random.fold_in(jax.random.fold_in(self.rng, 0), step))
        adv = self.last_rollout["advantages"][: int(metrics["groups/kept"]) * self.cfg.sampling.group_size]
        metrics["advantage/mean"] = float(adv.mean()) if adv.size else 0.0
        metrics["advantage/std"] = float(adv.std()) if adv.size else 0.0
        metrics["advantage/zero_frac"] = float((np.abs(adv).reshape(len(adv), -1).max(1) == 0).mean()) if adv.size else 0.0
        if len(self.cfg.reward.weights) > 1 and adv.ndim == 1 and adv.size:  # does the combination merge outcomes?
            scores = np.concatenate([sc for _, sc, _ in self.last_rollout["kept"]])
            combos, values = algorithms.distinct_per_group(scores, adv, self.cfg.sampling.group_size)
            metrics["advantage/distinct_reward_combos"], metrics["advantage/distinct_values"] = combos, values
        if self._old_ahead:  # l^old under the params that sampled, which the trainer will have moved past
            batches = self.minibatches(batches)
        item = dict(batches=batches, metrics=metrics, last_rollout=self.last_rollout, version=self.version,
                    before=before, rounds=self._rounds)
        self._rounds = None
        return item

    @property
    def _old_ahead(self) -> bool:
        """Whether l^old is taken when a rollout is sampled ahead (max_staleness with proximal "sampler"),
        not when it trains."""
        return bool(self.cfg.train.max_staleness) and self.cfg.train.proximal == "sampler"

    def _host_state(self) -> dict:
        """Copies of what rollouts change on the host: the data position, the sampler's state, the replay store."""
        return dict(position=self.position, sampler={k: np.copy(v) for k, v in self.sampler_state.items()},
                    replay=None if self.replay is None else {k: np.copy(v) for k, v in self.replay.items()})

    def train_step(self) -> tuple[dict, list[dict]]:
        """One RL step; returns the step's metrics and the per-update train metrics.

        Under train.max_staleness = k the rollouts of steps t..t+k-1 wait in `queue`; step t trains on
        the first, and once its updates are dispatched (nothing read back), samples step t + k's with the
        sampler's params of step t, so that sampling and the host's scoring run while the device trains.
        The sampler then gets the updated params (`_publish`). k = 0 is the synchronous loop."""
        k, steps = self.cfg.train.max_staleness, self.cfg.train.steps
        t0 = time.perf_counter()
        while not self.queue or (len(self.queue) < k and self.step + len(self.queue) < steps):
            self.queue.append(self._produce(self.step + len(self.queue)))
        item = self.queue.popleft()
        batches, metrics, self.last_rollout = item["batches"], item["metrics"], item["last_rollout"]
        staleness = float(self.step - item["version"])  # one version for all of a batch's rows
        metrics.update({"staleness/mean": staleness, "staleness/max": staleness} if k else {})
        t1 = time.perf_counter()
        batches = batches if self._old_ahead else self.minibatches(batches)  # l^old: once, fixed for all mu passes
        n = self.cfg.algorithm.num_iterations * len(batches)
        # the rate at every optimizer step that this step's updates can reach, read before they run
        learning_rates = [self.learning_rate(self.optimizer_step + j) for j in range(n)]
        updates = []
        for _ in range(self.cfg.algorithm.num_iterations):
            for mb in batches:  # dispatched back to back: nothing is read from the device in between
                self.state, m = self.update(self.state, self.ref_params, mb)
                updates.append(m)
        if self.sampler.spec.drift:  # how far this step's updates moved the policy, on the step's tokens
            metrics["sampler/drift"] = self._drift(batches)
            self.sampler_state = samplers.check_state(self.sampler, self.sampler.observe(self.sampler_state,
                                                                                        metrics["sampler/drift"]))
        ahead = 0.0
        if k and self.step + k < steps:  # sampled while the device runs the updates above
            ahead = time.perf_counter()
            self.queue.append(self._produce(self.step + k))
            ahead = time.perf_counter() - ahead
        step_metrics, updates = jax.device_get(_read_updates(updates, learning_rates))  # replicated: every process
        self.optimizer_step += n - round(float(step_metrics["skipped_updates"]) + float(step_metrics["empty_updates"]))
        t2 = time.perf_counter()
        metrics.update({k: float(v) for k, v in step_metrics.items()})
        updates = [{k: float(v) for k, v in u.items()} for u in updates]
        train_tokens = self.last_rollout["train_tokens"] * self.cfg.algorithm.num_iterations
        metrics.update({
            "time/rollout_s": t1 - t0, "time/train_s": t2 - t1 - ahead,
            "throughput/train_tokens_per_s": train_tokens / max(t2 - t1 - ahead, 1e-9),
            **({"time/sampled_ahead_s": ahead} if k else {}),
        })
        self.step += 1
        self._publish()
        return metrics, updates

    def _drift(self, batches: list[ts.Batch]) -> float:
        """Mean |log pi_new - log pi_old| over the rollout batch's counted tokens, pi_new the policy after
        the step's updates (one more forward per minibatch), pi_old its l^old, or where the step is
        on-policy (no l^old pass) the sampler's log-probs, taken under the same params."""
        cfg, total, count = self.cfg, 0.0, 0.0
        for b in batches:
            with sharding.activation_rules(self.mesh):
                new, _ = ts.old_logprobs(cfg.model, cfg.sampling.temperature, self.policy_params, b.tokens, b.positions,
                                         b.segment_ids, b.mask, b.routes, group=ts.prefix_group(cfg), packing=b.packing)
            old = b.sampler_logp if b.old_logp is None else b.old_logp
            total, count = total + jnp.sum(jnp.abs(new - old) * b.mask), count + jnp.sum(b.mask)
        return float(total / jnp.maximum(count, 1.0))

    def learning_rate(self, optimizer_step: int) -> float:
        """The schedule's rate at an optimizer step, as the update metrics log it (computed on the host once)."""
        if optimizer_step not in self._rates:
            self._rates[optimizer_step] = float(self.schedule(optimizer_step))
        return self._rates[optimizer_step]

    # -- evaluation --------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        """Held-out metrics (`grpo_jax.evaluate`): greedy, and `train.eval_samples` samples per prompt."""
        return self.evaluate_examples()[0]

    def evaluate_examples(self) -> tuple[dict, list[dict]]:
        """(held-out metrics, one JSON-ready dict of results per held-out example): the harness of
        `grpo_jax.evaluate` on the held-out set's two implicit benchmarks (`evaluate.evaluate_held_out`),
        sampled with the sampler's params on its mesh and the step's key. A set of any size runs on any
        mesh: it is padded with copies of its first example to a multiple of the batch devices, and the
        padding's rows enter no metric and no record (no problem is dropped or counted twice)."""
        if self.cfg.env is not None:
            return self._evaluate_trajectories()
        return evaluate.evaluate_held_out(self.cfg, self.task.held_out, self.task.tokenizer, self.task.rewards,
                                          self.cfg.model, self.sampler_params, self.gen_mesh,
                                          jax.random.fold_in(jax.random.fold_in(self.rng, 1), self.step))

    def _evaluate_trajectories(self) -> tuple[dict, list[dict]]:
        """With an environment: one greedy trajectory per held-out example (the set padded with copies of
        its first example to a multiple of the sampler's batch devices, the copies counted nowhere; each
        process runs its rows, and the records are gathered). eval/accuracy_greedy: the share whose final
        reward is >= 1 (solved, for the tool environments); eval/return_mean; eval/tool_call_rate: the
        share with an observation."""
        examples = list(self.task.held_out)
        rows = examples + examples[:1] * (-len(examples) % self.gen_shards)
        mine = sharding.process_rows(self.gen_mesh, len(rows))
        _, prompts = self._prompts([rows[i] for i in mine])
        key = jax.random.fold_in(jax.random.fold_in(self.rng, 1), self.step)
        _, turns = multi_turn.rollout(
            self.cfg.model, dataclasses.replace(self.cfg.sampling, group_size=1, greedy=True), self.cfg.env,
            self.task.tokenizer, self.gen_mesh, self.sampler_params, sharding.global_batch(prompts, self.gen_mesh, len(rows)),
            [rows[i] for i in mine], key)
        records = [{"index": int(i), "prompt": rows[i]["prompt"], "answer": rows[i].get("answer"),
                    "greedy": {"completions": t.completions, "observations": t.observations, "rewards": t.rewards,
                               "correct": t.rewards[-1] >= 1.0}} for i, t in zip(mine, turns) if i < len(examples)]
        records = list({r["index"]: r for part in distributed.all_gather_json(records) for r in part}.values())
        records.sort(key=lambda r: r["index"])
        metrics = {"eval/accuracy_greedy": float(np.mean([r["greedy"]["correct"] for r in records])),
                   "eval/return_mean": float(np.mean([sum(r["greedy"]["rewards"]) for r in records])),
                   "eval/tool_call_rate": float(np.mean([bool(r["greedy"]["observations"]) for r in records]))}
        return metrics, records

    # -- checkpoints -------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict:
        """The state to save. Under max_staleness, the rollouts sampled ahead are saved as their sampler
        outputs and (proximal "sampler") l^old (`inflight`), with the host state from before the first of
        them: a restore rebuilds them from these (`restore`), bit for bit."""
        rng = jax.device_put(jax.random.key_data(self.rng), NamedSharding(self.mesh, P()))
        state = {"train": self.state, "rng": rng}
        host = self.queue[0]["before"] if self.queue else dict(sampler=self.sampler_state, replay=self.replay)
        for name, tree in (("sampler", host["sampler"]), ("replay", host["replay"] or {})):
            if tree:  # replicated: every process holds the same
                state[name] = {k: jax.device_put(v, NamedSharding(self.mesh, P())) for k, v in tree.items()}
        if self.queue:
            state["inflight"] = [[_record(r) for r in item["rounds"]] for item in self.queue]
        if self.ref_params is not None and not self.cfg.lora.rank:  # a LoRA base is not saved: it is model_path
            state["ref"] = self.ref_params
        return state

    def save(self, ckpt: checkpoint.Checkpointer, force: bool = False) -> bool:
        """Checkpoints the state (valid only between steps); the config goes with it, for `run.py`'s
        resume check."""
        meta = {"step": self.step, "data_position": self.queue[0]["before"]["position"] if self.queue else self.position,
                "config": flatten(self.cfg)}
        if self.queue:  # what restore needs to rebuild the in-flight rollouts' arrays and versions
            meta["inflight"] = [{"version": item["version"], "rounds": [
                {name: [list(x.shape), str(x.dtype)] for name, x in _record(r).items()} for r in item["rounds"]]}
                for item in self.queue]
        if self.base is not None:
            meta["base"] = {"model_path": self.source_path, "fingerprint": self.base}
        return ckpt.save(self.step, self.checkpoint_state(), meta, force)

    def restore(self, ckpt: checkpoint.Checkpointer, step: int) -> None:
        base = ckpt.read_meta(step).get("base")
        if base is not None and base["fingerprint"] != self.base:
            raise ValueError(
                f"{ckpt.directory} holds LoRA adapters trained on the base model of {base['model_path']}, but "
                f"model_path={self.source_path} holds other weights (fingerprint {self.base[:12]}, saved "
                f"{base['fingerprint'][:12]}): resume with the base the adapters were trained on"
            )
        self.queue.clear()
        target, inflight = self.checkpoint_state(), ckpt.read_meta(step).get("inflight", [])
        if inflight:
            target["inflight"] = [[{name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(
                self.gen_mesh if "tokens" in record else self.mesh, len(shape))) for name, (shape, dtype) in record.items()}
                for record in item["rounds"]] for item in inflight]
        state, meta = ckpt.restore(target, step)
        # the key uncommitted, as a fresh run's: the sampler's programs run on other devices than the trainer's
        self.state, self.rng = state["train"], jax.random.wrap_key_data(sharding.gather(state["rng"]))
        self.ref_params = state.get("ref", self.ref_params)
        self.sampler_state = {k: sharding.gather(v) for k, v in state.get("sampler", {}).items()}
        if self.replay is not None:
            self.replay = {k: sharding.gather(v) for k, v in state["replay"].items()}
        self.step, self.position = meta["step"], meta["data_position"]
        self.optimizer_step = int(self.state.step)  # the one read of it
        self._publish()
        for item, records in zip(inflight, state.get("inflight", [])):  # the same host steps on the saved outputs
            self._recorded = [sampling.Rollout(**{"routes": None, **r}) if "tokens" in r else (r["old_logp"], r.get("routes"))
                              for r in records]
            self.queue.append({**self._produce(self.step + len(self.queue)), "version": item["version"]})
            assert not self._recorded, "a checkpointed rollout was not replayed whole"
