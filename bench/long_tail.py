"""Rollouts with long-tailed completion lengths: continuous batching (`grpo_jax.sampling`, decode slots)
against the lock-step sampler it replaced (commit 1872f66) and `transformers` generate.

    python -m bench.long_tail [--quick] [--caps 1024 2048 4096] [--groups 8 16] [--reps 3]
                                                   # ~41 min on 2 idle cores; bench/results/long_tail.json

Model: a random Qwen3-style model from `grpo_jax.models.init`, float32, 1.3M parameters (vocab 4096,
d 128, 4 layers, 4 query heads sharing 1 kv head, head_dim 32, FFN 384, tied embeddings), written once with
`models.save_hf`; every sampler loads those weights. Prompts: 2 distinct prompts of 32..64 random tokens
(left-padded to 64), G = 8 or 16 samples each (16 or 32 rows), temperature 1, no top-k / top-p.

Lengths: row r's completion length L_r is drawn from a lognormal of median cap / 8 and sigma 1.15
(P(L > cap) = 3.5%), capped at `cap` new tokens (1k, 2k, 4k); stratified (one uniform in each of the
rows' equal strata, then shuffled), so every (cap, G) has its tail: 1 row of 16 or 32 at the cap.
Each sampler is forced to those lengths by a logits processor (`force_lengths`, `ForceLengths`): at
token index i < L_r - 1 the stop token gets -inf, at i = L_r - 1 everything else does; the script
checks that every sampler produced exactly L_r for every row, on every call.

Samplers, each in its own process (its compile time alone, its own peak RSS), timed interleaved:
  grpo_jax   `sampling.rollout(..., processor=force_lengths(...))` at `decode_slots` = rows (all
             rows at once), rows / 2, rows / 4, rows / 8, rows / 16; compiled ahead of time (`compile s`).
  lock-step  `grpo_jax.sampling` of commit 1872f66 (`git archive` into a temporary directory, first on
             sys.path), its default `cache_segments=4`: every row decodes until the longest has stopped;
             the lengths are forced by wrapping that module's `prefill` (token 0) and `decode_step`
             (called with index = prompt width + t to feed token t, i.e. to draw token t + 1).
  transformers  `generate` (PyTorch CPU, 2 threads, `num_return_sequences=G`: row p*G + g is sample g
             of prompt p, as in grpo_jax) with the same lengths forced by a `LogitsProcessor`, eos =
             the stop token, pad_token_id 0; nothing to compile (its warm-up call: first_call_s).
Wall time: the median of --reps interleaved calls after a warm-up call each. Useful tokens = sum L_r.
KV MiB: the cache's size from its shapes (layers x kv heads x head_dim x 2 (k, v) x 4 bytes per token):
grpo_jax = `models.cache_specs` as `rollout` builds it: the prompts once (2 x 64 tokens) + slots x
cap - 1 own tokens (in `models.slot_blocks`); lock-step = rows x (64 + cap); transformers = rows x
(64 + max L_r) (its cache grows to the longest row). XLA temp MiB: the compiled program's temporaries
(`memory_analysis`). RSS MiB: the sampler process's peak resident set (VmHWM).
Every process uses grpo_jax's malloc settings (`workload.KEEP_FREED_MEMORY`).
"""

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.common import RESULTS, ROOT

OUT = RESULTS / "long_tail.json"
OLD_COMMIT = "1872f66"
MODEL = dict(model_type="qwen3", vocab_size=4096, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
             num_kv_heads=1, head_dim=32, tie_word_embeddings=True, max_position_embeddings=8192, eos_token_id=1)
STOP, PAD = 1, 0  # prompts and sampled tokens avoid neither; prompts use ids >= 3
PROMPTS, PROMPT_LEN = 2, 64  # distinct prompts of PROMPT_LEN // 2 .. PROMPT_LEN tokens
SIGMA, MEDIAN_FRACTION = 1.15, 1 / 8
SLOT_DIVISORS = (1, 2, 4, 8, 16)  # decode_slots = rows / each
QUICK = dict(caps=[64, 320], groups=[2, 4], reps=1)


# --- the lengths and the processors that force them (bench/sweep.py's long-tail row uses them too) ---

def tail_lengths(rows: int, cap: int, seed: int = 0, sigma: float = SIGMA) -> np.ndarray:
    """[rows] completion lengths in [1, cap] from a lognormal of median cap * MEDIAN_FRACTION, stratified:
    one uniform in each of `rows` equal strata of (0, 1), through the lognormal's quantile, shuffled."""
    from statistics import NormalDist

    rng = np.random.default_rng(seed)
    u = (np.arange(rows) + rng.uniform(size=rows)) / rows
    z = np.array([NormalDist().inv_cdf(x) for x in u])
    lengths = np.clip(np.round(cap * MEDIAN_FRACTION * np.exp(sigma * z)), 1, cap).astype(np.int32)
    return rng.permutation(lengths)


def force_lengths(lengths, stop: int):
    """A `sampling.rollout` processor (logits [slots, V], rows [slots], index [slots]) -> logits that
    makes row r stop at exactly lengths[r] tokens: the stop token is -inf before index lengths[r] - 1,
    every other token -inf from it on. jax.numpy only (it also runs against the old sampler)."""
    import jax.numpy as jnp

    target = jnp.asarray(lengths, jnp.int32)

    def processor(logits, rows, index):
        is_stop = jnp.arange(logits.shape[-1]) == stop
        last = (index >= target[rows] - 1)[:, None]
        return jnp.where(last == is_stop[None, :], logits, -jnp.inf)

    return processor


def hf_processor(lengths, stop: int, width: int):
    """The same as a `transformers` LogitsProcessor, for inputs of `width` (left-padded) prompt tokens and
    rows in generate's order (num_return_sequences: row p*G + g is sample g of prompt p)."""
    import torch
    import transformers

    class ForceLengths(transformers.LogitsProcessor):
        def __init__(self):
            self.target = torch.as_tensor(np.asarray(lengths), dtype=torch.long)

        def __call__(self, input_ids, scores):
            index = input_ids.shape[1] - width  # the completion token being drawn
            is_stop = torch.arange(scores.shape[-1]) == stop
            last = (index >= self.target - 1)[:, None]
            return scores.masked_fill(last != is_stop[None, :], -math.inf)

    return ForceLengths()


def hf_lengths(sequences, width: int, stop: int) -> np.ndarray:
    """Completion lengths of generate's output: up to and including the first stop token (the rest is pad)."""
    completions = np.asarray(sequences)[:, width:]
    hit = completions == stop
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, completions.shape[1]).astype(np.int32)


def prompt_lists(n: int, vocab: int, width: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, rng.integers(width // 2, width + 1)).tolist() for _ in range(n)]


def kv_bytes_per_token(m: dict = MODEL) -> int:
    return m["num_layers"] * m["num_kv_heads"] * m["head_dim"] * 2 * 4  # float32 k and v


# --- the measured processes ---

def _vm_hwm_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _worker(spec: dict) -> None:
    """One sampler in this process: build it, compile, a warm-up call, then one timed call per "run"
    line on stdin ("TIME s" on stdout), and at "quit" its peak RSS. Every call's lengths are checked."""
    data = np.load(spec["data"])
    lengths, width, kind = data["lengths"], PROMPT_LEN, spec["kind"]
    prompts = [row[row != PAD].tolist() for row in data["prompts"]]
    cap, group = spec["cap"], spec["group"]
    info = {}
    if kind == "transformers":
        import torch
        import transformers

        torch.set_num_threads(2)
        model = transformers.AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32).eval()
        ids = torch.as_tensor(data["prompts"])
        processors = transformers.LogitsProcessorList([hf_processor(lengths, STOP, width)])

        def call(seed):
            torch.manual_seed(seed)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=(ids != PAD).long(), max_new_tokens=cap,
                                     do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=group,
                                     eos_token_id=STOP, pad_token_id=PAD, logits_processor=processors)
            return hf_lengths(out.numpy(), width, STOP)
    else:
        if kind == "lock-step":  # the old tree first on sys.path, before anything imports grpo_jax
            sys.path.insert(0, spec["old_tree"])
        import jax

        import grpo_jax
        from grpo_jax import models, sampling
        from grpo_jax.config import SamplingConfig

        tree = spec["old_tree"] if kind == "lock-step" else ROOT
        assert pathlib.Path(grpo_jax.__file__).is_relative_to(tree), grpo_jax.__file__
        cfg, params = models.load_hf(spec["model_dir"])
        force = force_lengths(lengths, STOP)
        if kind == "lock-step":
            scfg = SamplingConfig(max_prompt_len=width, max_new_tokens=cap, group_size=group)
            info["cache_segments"] = scfg.cache_segments
            prefill, decode_step = sampling.prefill, sampling.decode_step
            rows = len(lengths)

            def forced_prefill(cfg, params, prompts, group_size, cache_len):  # draws token 0
                logits, cache = prefill(cfg, params, prompts, group_size, cache_len)
                return force(logits, jax.numpy.arange(rows), jax.numpy.zeros(rows, "int32")), cache

            def forced_decode_step(cfg, params, cache, tokens, positions, index):  # feeds token index - width
                logits, cache = decode_step(cfg, params, cache, tokens, positions, index)
                return force(logits, jax.numpy.arange(rows), jax.numpy.full(rows, index - width + 1)), cache

            sampling.prefill, sampling.decode_step = forced_prefill, forced_decode_step
            kwargs = {}
        else:
            scfg = SamplingConfig(max_prompt_len=width, max_new_tokens=cap, group_size=group,
                                  decode_slots=spec["slots"])
            kwargs = dict(processor=force)
            specs = models.cache_specs(cfg, min(spec["slots"], len(lengths)), max(cap - 1, 1), len(prompts), width)
            shapes = jax.tree.leaves([specs[k] for k in ("k", "v", "prefix_k", "prefix_v")],
                                     is_leaf=lambda x: isinstance(x, models.ParamSpec))
            info["kv_mib"] = sum(math.prod(s.shape) for s in shapes) * np.dtype(cfg.compute_dtype).itemsize / 2**20
        padded = sampling.pad_prompts(prompts, scfg)
        stop_ids = sampling.check_prompts(cfg, padded, scfg)
        assert stop_ids == (STOP,), stop_ids
        t0 = time.perf_counter()
        lowered = sampling.rollout.lower(cfg, scfg, stop_ids, None, params, padded, jax.random.key(0), **kwargs)
        compiled = lowered.compile()
        info["compile_s"] = time.perf_counter() - t0
        info["xla_temp_mib"] = compiled.memory_analysis().temp_size_in_bytes / 2**20

        def call(seed):
            out = jax.block_until_ready(compiled(params, padded, jax.random.key(seed)))
            return np.asarray(out.lengths)

    def check(got):
        if not np.array_equal(got, lengths):
            bad = np.flatnonzero(got != lengths)
            raise AssertionError(f"{kind} (slots {spec.get('slots')}): lengths differ from the targets at rows "
                                 f"{bad[:10].tolist()}: got {got[bad[:10]].tolist()}, "
                                 f"want {lengths[bad[:10]].tolist()}")

    t0 = time.perf_counter()
    got = call(0)
    info["first_call_s"] = time.perf_counter() - t0
    check(got)
    if kind == "transformers":
        info["compile_s"] = None
    print("READY " + json.dumps(info), flush=True)
    seed = 1
    for line in sys.stdin:
        if line.strip() == "run":
            t0 = time.perf_counter()
            got = call(seed)
            elapsed = time.perf_counter() - t0
            check(got)
            print(f"TIME {elapsed}", flush=True)
            seed += 1
        elif line.strip() == "quit":
            print("DONE " + json.dumps(dict(peak_rss_mib=_vm_hwm_mib())), flush=True)
            return


class Worker:
    """A `--worker` process of this script, driven over its stdin / stdout. One that dies while idle or in a
    call (a signal from outside: seen once on the shared machine) is started again, up to 3 times; its
    compile time and first call stay those of its first start."""

    def __init__(self, spec: dict, log_dir: str):
        self.spec, self.name, self.restarts, self.exits = spec, spec["name"], 0, []
        self.log_path = os.path.join(log_dir, spec["name"].replace(" ", "_").replace("/", "_") + ".log")
        self.info = self._start()

    def _start(self) -> dict:
        from bench.workload import KEEP_FREED_MEMORY

        self.log = open(self.log_path, "a+")
        env = os.environ | KEEP_FREED_MEMORY | {"PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.long_tail", "--worker", json.dumps(self.spec)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True)
        return json.loads(self._read("READY "))

    def _read(self, prefix: str) -> str | None:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):]
        self.proc.wait()
        self.log.seek(0)
        log = self.log.read()[-4000:]
        if "Traceback" in log or self.restarts >= 3 or prefix == "READY ":
            sys.exit(f"{self.name}: the worker failed (exit {self.proc.returncode})\n{log}")
        self.exits.append(self.proc.returncode)
        return None

    def _send(self, command: str, prefix: str) -> str:
        while True:
            if self.proc.poll() is None:
                try:
                    self.proc.stdin.write(command + "\n")
                    self.proc.stdin.flush()
                    got = self._read(prefix)
                except BrokenPipeError:
                    got = None
                    self.proc.wait()
                    self.exits.append(self.proc.returncode)
                if got is not None:
                    return got
            else:
                self.exits.append(self.proc.returncode)
            print(f"  {self.name}: the worker died (exit {self.exits[-1]}); starting it again", flush=True)
            self.restarts += 1
            self._start()

    def run(self) -> float:
        return float(self._send("run", "TIME "))

    def close(self) -> dict:
        done = json.loads(self._send("quit", "DONE "))
        self.proc.wait()
        self.log.close()
        return dict(done, restarts=self.restarts, worker_exits=self.exits)


# --- the parent ---

def write_model(path: str) -> int:
    """The random model as a Hugging Face directory; returns its parameter count."""
    import jax

    from grpo_jax import models

    cfg = models.ModelConfig(**MODEL)
    params = models.init(cfg, jax.random.key(0))
    models.save_hf(cfg, params, path)
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def old_tree(tmp: str) -> str:
    """grpo_jax of OLD_COMMIT, extracted into `tmp`/old."""
    path = os.path.join(tmp, "old")
    os.makedirs(path)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT, "grpo_jax"], check=True,
                             capture_output=True)
    subprocess.run(["tar", "-x", "-C", path], input=archive.stdout, check=True)
    return path


def measure(cap: int, group: int, reps: int, tmp: str, model_dir: str, old: str) -> dict:
    rows = PROMPTS * group
    lengths = tail_lengths(rows, cap, seed=cap * 100 + group)
    ids = prompt_lists(PROMPTS, MODEL["vocab_size"], PROMPT_LEN, seed=group)
    padded = np.array([[PAD] * (PROMPT_LEN - len(p)) + p for p in ids], np.int64)
    data = os.path.join(tmp, f"data_{cap}_{group}.npz")
    np.savez(data, lengths=lengths, prompts=padded)
    base = dict(data=data, model_dir=model_dir, cap=cap, group=group)
    slot_counts = sorted({max(1, rows // k) for k in SLOT_DIVISORS}, reverse=True)
    specs = [dict(base, kind="grpo_jax", slots=n, name=f"grpo_jax slots={n}") for n in slot_counts]
    specs += [dict(base, kind="lock-step", old_tree=old, name=f"lock-step {OLD_COMMIT}"),
              dict(base, kind="transformers", name="transformers")]
    workers = []
    for spec in specs:  # started one at a time: each compiles alone
        workers.append(Worker(spec, tmp))
        print(f"  {spec['name']}: ready {workers[-1].info}", flush=True)
    times = {w.name: [] for w in workers}
    for _ in range(reps):
        for w in workers:
            times[w.name].append(w.run())
    per_token = kv_bytes_per_token()
    kv = {"lock-step": per_token * rows * (PROMPT_LEN + cap) / 2**20,  # grpo_jax's: its worker's, from cache_specs
          "transformers": per_token * rows * (PROMPT_LEN + int(lengths.max())) / 2**20}
    useful = int(lengths.sum())
    samplers = []
    for spec, w in zip(specs, workers):
        done = w.close()
        seconds = statistics.median(times[w.name])
        samplers.append(dict(sampler=w.name, kind=spec["kind"], slots=spec.get("slots"), seconds=seconds,
                             all_seconds=times[w.name], tokens_per_s=useful / seconds,
                             **{"kv_mib": kv.get(spec["kind"]), **w.info, **done}))
    by = {s["sampler"]: s for s in samplers}
    for s in samplers:
        s["vs_lock_step"] = by[f"lock-step {OLD_COMMIT}"]["seconds"] / s["seconds"]
        s["vs_transformers"] = by["transformers"]["seconds"] / s["seconds"]
    best = min((s for s in samplers if s["kind"] == "grpo_jax"), key=lambda s: s["seconds"])
    return dict(cap=cap, group=group, rows=rows, useful_tokens=useful, max_length=int(lengths.max()),
                median_length=float(np.median(lengths)), rows_at_cap=int((lengths == cap).sum()),
                lock_step_token_steps=rows * int(lengths.max()), best_slots=best["slots"],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                load=os.getloadavg(), lengths=lengths.tolist(), samplers=samplers)


HEADER = (f"{'cap':>5}{'G':>4}{'rows':>5}{'useful':>8}  {'sampler':<19}{'compile s':>10}{'wall s':>8}{'tok/s':>8}"
          f"{'x lock-step':>12}{'x hf':>7}{'KV MiB':>8}{'XLA temp':>9}{'RSS MiB':>8}")


def print_row(r: dict) -> None:
    for s in r["samplers"]:
        compile_s = f"{s['compile_s']:>10.1f}" if s["compile_s"] is not None else f"{'-':>10}"
        temp = f"{s['xla_temp_mib']:>9.1f}" if "xla_temp_mib" in s else f"{'-':>9}"
        print(f"{r['cap']:>5}{r['group']:>4}{r['rows']:>5}{r['useful_tokens']:>8}  {s['sampler']:<19}{compile_s}"
              f"{s['seconds']:>8.2f}{s['tokens_per_s']:>8.0f}{s['vs_lock_step']:>12.2f}{s['vs_transformers']:>7.2f}"
              f"{s['kv_mib']:>8.1f}{temp}{s['peak_rss_mib']:>8.0f}", flush=True)
    print(f"{'':>24}max length {r['max_length']}, median {r['median_length']:.0f}, {r['rows_at_cap']} at the cap; "
          f"best slots {r['best_slots']}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"tiny settings to check the script: {QUICK}")
    parser.add_argument("--caps", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--groups", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--note", default="", help="stored in the JSON (e.g. 'measured under load')")
    parser.add_argument("--out", default=None,
                        help=f"default {OUT} ({tempfile.gettempdir()}/long_tail_quick.json with --quick)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        return _worker(json.loads(a.worker))
    if a.quick:
        a.caps, a.groups, a.reps = QUICK["caps"], QUICK["groups"], QUICK["reps"]
    out = pathlib.Path(a.out or (os.path.join(tempfile.gettempdir(), "long_tail_quick.json") if a.quick else OUT))
    import jax
    import torch
    import transformers

    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="python -m bench.long_tail " + " ".join(sys.argv[1:]), note=a.note,
                   machine=dict(cpus=os.cpu_count(), processor=cpu_model(),
                                jax=jax.__version__, torch=torch.__version__, transformers=transformers.__version__),
                   commit=git("rev-parse", "--short", "HEAD"),
                   uncommitted=git("status", "--short", "grpo_jax").splitlines(),
                   old_commit=OLD_COMMIT, model=MODEL, prompts=PROMPTS, prompt_len=f"{PROMPT_LEN // 2}..{PROMPT_LEN}",
                   lengths=dict(distribution="lognormal", median=f"cap * {MEDIAN_FRACTION}", sigma=SIGMA),
                   load_start=os.getloadavg(), rows=[])
    tmp = tempfile.mkdtemp(prefix="long_tail_")
    try:
        model_dir = os.path.join(tmp, "model")
        results["parameters"] = write_model(model_dir)
        old = old_tree(tmp)
        print(f"{results['parameters'] / 1e6:.2f}M parameters; load {os.getloadavg()}", flush=True)
        for cap in a.caps:
            for group in a.groups:
                print(f"cap {cap}, G {group}", flush=True)
                results["rows"].append(measure(cap, group, a.reps, tmp, model_dir, old))
                results["load_end"] = os.getloadavg()
                out.write_text(json.dumps(results, indent=2) + "\n")
                print(HEADER)
                print_row(results["rows"][-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{HEADER}")
    for r in results["rows"]:
        print_row(r)
    print(f"load {results['load_start']} -> {results['load_end']}; wrote {out}")


if __name__ == "__main__":
    main()
