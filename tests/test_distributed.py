"""Runs over several processes: 2 processes x 4 CPU devices on localhost against 1 process x 8 devices.

The quickstart config, shrunk by --set, through the command line. The two-process run is killed
(SIGKILL) once its first checkpoint is complete, then rerun: it resumes in two processes, and a copy of
the killed run resumes in this process (8 devices). Every run must log the per-step metrics of one
uninterrupted run in this process; with a stateful prompt sampler (GDRO), every process of every run
must also draw from the same sampler state, and choose the same prompts, as that run.
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from grpo_jax import models, run
from grpo_jax.data import curricula
from grpo_jax.train import parse_args
from xla_flags import xla_flags  # tests/xla_flags.py

ROOT = pathlib.Path(__file__).parents[1]
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.py"
# The quickstart shrunk: a 1-layer model, 8 prompts x 4 samples a step in 2 minibatches (the second
# update's ratio leaves 1), up to 8 new tokens with a length reward beside exact match (so rewards vary
# within groups of an untrained model), completions packed (prompts of <= 8 tokens padded to 24, so two
# rows fit in one; each process plans its rows' layout from every process's lengths), 8 held-out prompts with 4 samples each (the same sampler
# program as training), completions logged and a checkpoint saved every step, the policy exported to
# safetensors at the end. Compiled programs go to the suite's cache (tests/conftest.py), which the launched
# processes share: a relaunch loads them.
SETS = ["model.num_layers=1", "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
        "model.num_kv_heads=1", "train.prompts_per_step=8", "sampling.group_size=4", "sampling.max_new_tokens=8",
        "train.minibatches=2", "train.eval_prompts=8", "train.eval_samples=4", "train.steps=4",
        "train.checkpoint_every=1", "reward.names=exact,length", "reward.weights=1,1", "reward.num_workers=0",
        "optim.schedule=constant", "train.log_completions_every=1", "train.export_hf=true",
        "train.packing=true", "sampling.max_prompt_len=24"]
TIMING = ("time/", "throughput/", "reward/time_s")


def argv(out: pathlib.Path, sets: list[str] = SETS) -> list[str]:
    return ["--config", str(QUICKSTART), *(a for s in (*sets, f"train.out_dir={out}") for a in ("--set", s))]


def cluster(command: list[str], processes: int, logs: pathlib.Path) -> list[subprocess.Popen]:
    """`processes` processes of `python COMMAND --coordinator localhost:PORT --num-processes N --process-id I`
    on a free port, 8 CPU devices in all; this test's matmul precision, the worktree's code; output in
    `logs`.I.log."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "XLA_FLAGS": xla_flags(8 // processes), "JAX_PLATFORMS": "cpu",
           "JAX_DEFAULT_MATMUL_PRECISION": str(jax.config.jax_default_matmul_precision)}
    logs.parent.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([sys.executable, *command, "--coordinator", f"localhost:{port}",
                              "--num-processes", str(processes), "--process-id", str(i)],
                             env=env, stdout=open(f"{logs}.{i}.log", "w"), stderr=subprocess.STDOUT)
            for i in range(processes)]


def launch(out: pathlib.Path, processes: int, sets: list[str] = SETS) -> list[subprocess.Popen]:
    """The run in `processes` processes."""
    return cluster(["-m", "grpo_jax.train", *argv(out, sets)], processes, out)


def finish(procs: list[subprocess.Popen], out: pathlib.Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            p.kill()
    logs = "\n".join(pathlib.Path(f"{out}.{i}.log").read_text()[-3000:] for i in range(len(procs)))
    assert codes == [0] * len(procs), logs


def kill_after_first_checkpoint(procs: list[subprocess.Popen], out: pathlib.Path) -> None:
    complete = out / "checkpoints" / "1" / "checksums.json"
    deadline = time.monotonic() + 300
    while not complete.exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no checkpoint 1"
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def rows(out: pathlib.Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    """Per step, the mean reward and the gradient norm to 1e-5 relative; every other metric to 1e-5
    relative or 1e-6 absolute: the GSPO loss is a sum over zero-mean advantages (terms of size ~1) that
    cancels to ~1e-5, and some metrics are means of rounding noise (the sampler drift, ~1e-7). Reductions
    across processes add in another order than within one, so the runs differ in the last bits."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g["step"], g.keys() ^ w.keys())
        for key in ("reward/mean", "grad_norm"):
            if key in w:
                np.testing.assert_allclose(g[key], w[key], rtol=1e-5, err_msg=f"step {w['step']} {key}")
        for key in w:
            np.testing.assert_allclose(g[key], w[key], rtol=1e-5, atol=1e-6, err_msg=f"step {w['step']} {key}")


@pytest.mark.slow  # minutes of CPU: four runs' compilations, two of them in two processes at once
def test_two_processes_log_what_one_does_and_resume_after_a_kill(tmp_path):
    reference = run.train(parse_args(argv(tmp_path / "run")))  # 1 process x 8 devices, uninterrupted
    (tmp_path / "run").rename(tmp_path / "reference")
    want = rows(tmp_path / "reference")
    assert any(r.get("grad_norm", 0) > 0 for r in want) and want[-1]["step"] == 4  # a run that learns
    packed = [r["packing/rows_frac"] for r in want if "packing/rows_frac" in r]  # training steps' rows
    assert len(packed) == 4 and min(packed) < 1  # the forwards ran on fewer rows than the padded batch

    two = tmp_path / "two"
    procs = launch(two, 2)
    kill_after_first_checkpoint(procs, two)
    shutil.copytree(two, tmp_path / "run")  # the killed run, for a resume in one process
    start = time.perf_counter()
    procs = launch(two, 2)  # resumes from the newest intact checkpoint, in 2 processes
    finish(procs, two)
    print(f"2-process resume: {time.perf_counter() - start:.1f} s")
    assert_same_metrics(rows(two), want)

    resumed = run.train(parse_args(argv(tmp_path / "run")))  # the 2-process checkpoint, in 1 process
    assert_same_metrics(rows(tmp_path / "run"), want)
    for a, b in zip(jax.tree.leaves(reference["params"]), jax.tree.leaves(resumed["params"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The export gathers the policy from both processes' devices.
    exported = [models.load_hf(out / "hf")[1] for out in (two, tmp_path / "reference")]
    for a, b in zip(jax.tree.leaves(exported[0]), jax.tree.leaves(exported[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The final evaluation's greedy completions, gathered from both processes, are those of one process;
    # the completion log holds process 0's rows (the first half of each step's batch).
    held_out = [read_jsonl(out / "held_out.jsonl") for out in (two, tmp_path / "reference")]
    assert [(r["greedy"], r["sampled"]["correct"]) for r in held_out[0]] == \
        [(r["greedy"], r["sampled"]["correct"]) for r in held_out[1]]
    steps = {}
    for r in read_jsonl(tmp_path / "reference" / "completions.jsonl"):
        steps.setdefault(r["step"], []).append(r)  # 8 groups x 4 rows a step, all kept, in row order
    assert read_jsonl(two / "completions.jsonl") == [r for step in sorted(steps) for r in steps[step][:16]]


# The sampler on a mesh of its own (the first 2 devices of each process; 4 in one process), rollouts
# sampled up to 2 steps ahead; unpacked (the packed layout is planned for the trainer's devices). The
# prompts from GDRO's stateful sampler (data.curricula.Gdro): bins by each prompt's success rate, a
# bandit over them, square-root slot allocation; with a fifth of the exact-match labels flipped
# (reward.label_noise, drawn from the round's key) so that an untrained model's prompts do succeed.
ASYNC = [s for s in SETS if s != "train.packing=true"] + ["mesh.sampler=4", "train.max_staleness=2",
                                                           "algorithm.sampler=gdro", "reward.label_noise=0.2"]


def recording(choose, prefix: str):
    """`choose` (a sampler's method), which also appends what it was given and chose to
    PREFIX.PROCESS.jsonl: the OS process (one per launch), the data position, a digest of each state
    array (dtype, shape, bytes), the state's trials and successes, the prompts and their samples."""
    def recorded(self, state, draw):
        choice = choose(self, state, draw)
        digest = {k: hashlib.sha256(f"{v.dtype.str}{v.shape}".encode() + np.ascontiguousarray(v).tobytes()).hexdigest()
                  for k, v in sorted(state.items())}
        line = {"pid": os.getpid(), "position": draw.position, "state": digest,
                "trials": int(state["trials"].sum()), "successes": int(state["successes"].sum()),
                "indices": np.asarray(choice.indices).tolist(), "samples": np.asarray(choice.samples).tolist()}
        with open(f"{prefix}.{jax.process_index()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return choice
    return recorded


# `python -c RECORDED PREFIX ARGS...`: python -m grpo_jax.train ARGS, GDRO's choices recorded (`recording`).
RECORDED = f"""
import sys
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
from test_distributed import recording
from grpo_jax import train
from grpo_jax.data import curricula
curricula.Gdro.choose = recording(curricula.Gdro.choose, sys.argv[1])
train.main(sys.argv[2:])
"""


def launches(prefix: pathlib.Path, process: int) -> list[list[dict]]:
    """One process's recorded choices, a list per launch (without the OS process)."""
    runs = {}
    for r in read_jsonl(pathlib.Path(f"{prefix}.{process}.jsonl")):
        runs.setdefault(r.pop("pid"), []).append(r)
    return list(runs.values())


@pytest.mark.slow  # minutes of CPU: three runs' compilations, two of them in two processes at once
def test_two_processes_with_a_sampler_mesh_and_staleness_2_resume_after_a_kill(tmp_path, monkeypatch):
    """The params move trainer -> sampler across processes after every step; the kill leaves two
    rollouts in flight in checkpoint 1, which the 2-process resume rebuilds: one process's metrics. The
    stateful prompt sampler takes the same decisions in both processes, from the same state, as in one
    process, and the resume (from the state saved before the rollouts in flight) continues them exactly."""
    monkeypatch.setattr(curricula.Gdro, "choose", recording(curricula.Gdro.choose, str(tmp_path / "chosen")))
    reference = run.train(parse_args(argv(tmp_path / "reference", ASYNC)))  # 1 process x (4 + 4) devices
    want = rows(tmp_path / "reference")
    assert [r["staleness/max"] for r in want if "staleness/max" in r] == [0, 1, 2, 2]
    (chosen,) = launches(tmp_path / "chosen", 0)
    assert [c["position"] for c in chosen] == [0, 1, 2, 3]  # one round a step
    # decisions from a state that learns each round's results (successes among them)
    assert chosen[-1]["trials"] > chosen[1]["trials"] > 0 and chosen[-1]["successes"] > 0
    assert len({json.dumps(c["state"]) for c in chosen}) == 4
    two = tmp_path / "two"
    command = ["-c", RECORDED, str(tmp_path / "two_chosen"), *argv(two, ASYNC)]
    procs = cluster(command, 2, two)
    kill_after_first_checkpoint(procs, two)
    procs = cluster(command, 2, two)
    finish(procs, two)
    assert_same_metrics(rows(two), want)
    assert (two / "hf").is_dir() and reference["resumed_from"] is None
    (killed0, resumed0), (killed1, resumed1) = (launches(tmp_path / "two_chosen", i) for i in range(2))
    n = min(len(killed0), len(killed1))  # the kill may stop one process a round before the other
    assert n >= 3 and killed0[:n] == killed1[:n] and resumed0 == resumed1  # the two processes agree
    assert [c["position"] for c in resumed0] == [1, 2, 3]  # the rounds in flight at step 1, redrawn, then 3
    for c in killed0 + killed1 + resumed0:  # bit for bit the state and the choices of one process
        assert c == chosen[c["position"]], c["position"]


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("flags, message", [
    (["--coordinator", "localhost:1234"], "--coordinator without --num-processes, --process-id"),
    (["--distributed", "--num-processes", "2"], "--distributed detects the cluster; --num-processes name one by hand"),
    (["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"], "expected HOST:PORT"),
    (["--coordinator", "localhost:1234", "--num-processes", "2", "--process-id", "2"], "need 0 <= process id"),
])
def test_launch_flags_that_disagree_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(argv(pathlib.Path("unused")) + flags)
    assert stop.value.code == 2 and message in capsys.readouterr().err


SIGNAL_ONE = """
import os, signal, sys
from grpo_jax import distributed, run
import argparse, jax
parser = argparse.ArgumentParser()
distributed.add_arguments(parser)
distributed.initialize(parser, parser.parse_args())
with run.Interrupts() as interrupts:
    if jax.process_index() == 1:
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the run would finish its step
    print(f"stop {interrupts.requested()} {interrupts.signum}", flush=True)  # one write: gloo logs to the same file
"""


def test_a_signal_to_one_process_stops_every_process(tmp_path):
    """Preemption may signal one host: at the next step boundary every process agrees to stop (and
    save together), with that signal."""
    procs = cluster(["-c", SIGNAL_ONE], 2, tmp_path / "signal")
    finish(procs, tmp_path / "signal", timeout=120)
    for i in range(2):
        assert f"stop True {int(signal.SIGTERM)}" in (tmp_path / f"signal.{i}.log").read_text()
