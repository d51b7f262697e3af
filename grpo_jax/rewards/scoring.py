"""Scoring completions on the host: every reward call runs in a worker process, with a timeout.

Why processes: math verification can hang on adversarial completions, inside sympy or in C
(big-integer arithmetic), and a Python thread cannot be stopped. Each call goes to an idle worker
over a pipe; if it has not answered within `timeout_s` the parent kills that worker (SIGKILL) and
starts a fresh one, so nothing leaks. A timeout or an exception scores 0 and is counted in the
metrics; the run goes on. Workers are spawned (not forked: the parent runs JAX threads), started
once per `num_workers` on first use, ignore Ctrl-C (the parent handles it) and die with the parent.
Reward functions must therefore be picklable: module-level functions, or functools.partial of
them. A spawned worker imports the parent's `__main__`, so scripts need `if __name__ == "__main__"`.
"""

import collections
import logging
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable, Sequence

import numpy as np
from jaxtyping import Float


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """Worker loop: receive (fn, args, kwargs), answer (ok, float or error text)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # we own the timeouts, not math-verify
    conn.send("ready")
    while True:
        try:
            fn, args, kwargs = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, float(fn(*args, **kwargs))))
        except Exception as e:  # noqa: BLE001 (any failure of a reward scores 0)
            conn.send((False, f"{type(e).__name__}: {e}"))


class _Worker:
    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def wait_ready(self) -> "_Worker":
        if self.conn.recv() != "ready":
            raise RuntimeError("reward worker failed to start")
        return self

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


class _Pool:
    """`size` workers; `run` maps jobs to ("ok" | "error" | "timeout", value) in order."""

    def __init__(self, size: int):
        self.workers = [w.wait_ready() for w in [_Worker() for _ in range(size)]]

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker().wait_ready()
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def run(self, jobs: Sequence[tuple], timeout_s: float) -> list[tuple[str, float | str]]:
        results: list = [None] * len(jobs)
        pending = collections.deque(enumerate(jobs))
        idle = list(self.workers)
        busy: dict = {}  # connection -> (worker, job index, deadline)
        try:
            while pending or busy:
                while pending and idle:
                    worker, (i, job) = idle.pop(), pending.popleft()
                    try:
                        worker.conn.send(job)
                    except Exception as e:  # noqa: BLE001 (an unpicklable reward function, or a dead worker)
                        if worker.process.is_alive():
                            results[i] = ("error", f"{type(e).__name__}: {e}")
                        else:
                            worker = self._replace(worker)
                            pending.appendleft((i, job))
                        idle.append(worker)
                        continue
                    busy[worker.conn] = (worker, i, time.monotonic() + timeout_s)
                if not busy:
                    continue
                next_deadline = min(deadline for _, _, deadline in busy.values())
                for conn in multiprocessing.connection.wait(list(busy), max(0.0, next_deadline - time.monotonic())):
                    worker, i, _ = busy.pop(conn)
                    try:
                        ok, value = conn.recv()
                        results[i] = ("ok", value) if ok else ("error", value)
                    except EOFError:  # the worker died (e.g. a segfault in a native library)
                        results[i] = ("error", "reward worker died")
                        worker = self._replace(worker)
                    idle.append(worker)
                now = time.monotonic()
                for conn, (worker, i, deadline) in list(busy.items()):
                    if deadline <= now:
                        del busy[conn]
                        results[i] = ("timeout", f"no answer within {timeout_s}s")
                        idle.append(self._replace(worker))
        except BaseException:  # e.g. Ctrl-C: a busy worker would answer the next call with a stale result
            for worker, _, _ in busy.values():
                self._replace(worker)
            raise
        return results


_POOLS: dict[int, _Pool] = {}


def _name(fn: Callable) -> str:
    return getattr(fn, "func", fn).__name__


def score(
    reward_fns: Sequence[Callable[..., float]],
    weights: Sequence[float],
    prompts: Sequence[str],
    completions: Sequence[str],
    examples: Sequence[dict],
    *,
    completion_lens: Sequence[int] | None = None,
    timeout_s: float = 5.0,
    num_workers: int = 2,
) -> tuple[Float[np.ndarray, "completions rewards"], dict[str, float]]:
    """Rewards [N, K] (float32, unweighted: the algorithm applies `weights`) and metrics.

    Row n scores (prompts[n], completions[n], examples[n]) (repeat a group's prompt and example per
    completion). `completion_lens` (tokens) is passed as `completion_len` to every reward function
    when given; length-based rewards need it. `weights` only enter the "reward/total_mean" metric.
    """
    n, k = len(completions), len(reward_fns)
    if not len(prompts) == len(examples) == n or (completion_lens is not None and len(completion_lens) != n):
        raise ValueError(
            f"score: prompts ({len(prompts)}), completions ({n}), examples ({len(examples)})"
            + ("" if completion_lens is None else f" and completion_lens ({len(completion_lens)})")
            + " must have one entry per completion"
        )
    if len(weights) != k:
        raise ValueError(f"score: {len(weights)} weights for {k} reward functions")
    if num_workers not in _POOLS:
        _POOLS[num_workers] = _Pool(num_workers)
    start = time.perf_counter()
    jobs = [
        (fn, (prompts[i], completions[i], examples[i]), {} if completion_lens is None else {"completion_len": int(completion_lens[i])})
        for i in range(n)
        for fn in reward_fns
    ]
    outcomes = _POOLS[num_workers].run(jobs, timeout_s)
    rewards = np.array([v if s == "ok" else 0.0 for s, v in outcomes], np.float32).reshape(n, k)
    status = np.array([s for s, _ in outcomes]).reshape(n, k)
    metrics = {"reward/time_s": time.perf_counter() - start}
    for j, fn in enumerate(reward_fns):
        name = _name(fn)
        metrics[f"reward/{name}/mean"] = float(rewards[:, j].mean()) if n else 0.0
        metrics[f"reward/{name}/std"] = float(rewards[:, j].std()) if n else 0.0
        metrics[f"reward/{name}/errors"] = float((status[:, j] == "error").sum())
        metrics[f"reward/{name}/timeouts"] = float((status[:, j] == "timeout").sum())
    metrics["reward/errors"] = float((status == "error").sum())
    metrics["reward/timeouts"] = float((status == "timeout").sum())
    metrics["reward/total_mean"] = float((rewards @ np.asarray(weights, np.float32)).mean()) if n else 0.0
    first_error = next((v for s, v in outcomes if s == "error"), None)
    if first_error is not None:
        logging.getLogger(__name__).warning("%d reward call(s) failed, first: %s", metrics["reward/errors"], first_error)
    return rewards, metrics
