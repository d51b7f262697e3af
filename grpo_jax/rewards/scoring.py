"""Scoring completions on the host: each reward call runs in a worker process, with a timeout (or,
with `num_workers=0`, in this process: `_run_here`).

Why processes: math verification can hang on adversarial completions, inside sympy or in C
(big-integer arithmetic), and a Python thread cannot be stopped. Each call goes to an idle worker
over a pipe; if it has not answered within `timeout_s` the parent kills that worker (SIGKILL) and
starts a fresh one, so nothing leaks. A replacement starts in the background: the result loop never
waits for it, so healthy calls cannot time out while it imports. A call that raises, times out or
returns a non-finite number (or one beyond float32) is a failure: it scores 0, is counted and
logged per reward, and its status code (`FAILURES`) tells the caller's policy (`usable_groups`). Workers are
spawned (not forked: the parent runs JAX threads), started once per `num_workers` on first use,
ignore SIGINT and SIGTERM (the trainer handles them and ends the workers at exit) and die with the
trainer, even stuck in a hung call. Reward functions must therefore be picklable: module-level
functions, or functools.partial of them. A spawned worker imports the parent's `__main__`, so
scripts need `if __name__ == "__main__"`.
"""

import atexit
import collections
import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from jaxtyping import Bool, Float, Int8

PR_SET_PDEATHSIG = 1  # linux/prctl.h
SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the trainer's to handle; workers ignore them
log = logging.getLogger(__name__)


@contextlib.contextmanager
def _children_ignore_signals():
    """Processes started inside ignore SIGINT and SIGTERM from their first instruction (an ignored
    signal stays ignored across exec), so a Ctrl-C to the process group cannot kill a worker while it
    imports. Meanwhile the trainer's own signals are held (blocked), not lost."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; such workers ignore the signals once serving
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _die_with_parent(parent: int) -> None:
    """Ends this worker when the trainer dies, however it dies: Linux sends SIGKILL on the parent's
    death (prctl), which reaches a call stuck in C; elsewhere a thread polls for the parent."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except AttributeError:  # no prctl: not Linux
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _serve(conn: multiprocessing.connection.Connection, parent: int) -> None:
    """Worker loop: receive (fn, args, kwargs), answer (ok, the value or error text)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    _die_with_parent(parent)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # we own the timeouts, not math-verify
    conn.send("ready")
    while True:
        try:
            fn, args, kwargs = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, fn(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 (any failure of a reward scores 0)
            conn.send((False, f"{type(e).__name__}: {e}"))


class _Worker:
    """A worker process, started without waiting: `ready` once it has said so."""

    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, os.getpid()), daemon=True)
        with _children_ignore_signals():
            self.process.start()
        child.close()
        self.ready = False

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


class _Pool:
    """`size` workers; `run` maps jobs to ("ok" | "error" | "timeout", value) in order."""

    def __init__(self, size: int):
        self.workers = [_Worker() for _ in range(size)]
        atexit.register(self.close)  # before multiprocessing's exit hook, which would SIGTERM them

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker()
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()

    def run(self, jobs: Sequence[tuple], timeout_s: float) -> list[tuple[str, object]]:
        results: list = [None] * len(jobs)
        pending = collections.deque(enumerate(jobs))
        idle = [w for w in self.workers if w.ready]
        starting = {w.conn: w for w in self.workers if not w.ready}
        busy: dict = {}  # connection -> (worker, job index, deadline)

        def answer(conn) -> None:
            worker, i, _ = busy.pop(conn)
            try:
                ok, value = conn.recv()
                results[i] = ("ok", value) if ok else ("error", value)
                idle.append(worker)
            except EOFError:  # the worker died (e.g. a segfault in a native library)
                results[i] = ("error", "reward worker died")
                fresh = self._replace(worker)
                starting[fresh.conn] = fresh

        try:
            while pending or busy:
                while pending and idle:
                    worker, (i, job) = idle.pop(), pending.popleft()
                    try:
                        worker.conn.send(job)
                    except Exception as e:  # noqa: BLE001 (an unpicklable reward function, or a dead worker)
                        if worker.process.is_alive():
                            results[i] = ("error", f"{type(e).__name__}: {e}")
                            idle.append(worker)
                        else:
                            fresh = self._replace(worker)
                            starting[fresh.conn] = fresh
                            pending.appendleft((i, job))
                        continue
                    busy[worker.conn] = (worker, i, time.monotonic() + timeout_s)
                if not pending and not busy:
                    break
                deadline = min((d for _, _, d in busy.values()), default=None)
                wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
                for conn in multiprocessing.connection.wait([*busy, *starting], wait_s):
                    if conn in starting:
                        worker = starting.pop(conn)
                        try:
                            hello = conn.recv()
                        except EOFError:
                            hello = None
                        if hello != "ready":
                            raise RuntimeError(
                                f"a reward worker failed to start (exit code {worker.process.exitcode}); a "
                                "spawned worker imports __main__: guard scripts with if __name__ == '__main__'"
                            )
                        worker.ready = True
                        idle.append(worker)
                    else:
                        answer(conn)
                now = time.monotonic()
                for conn, (worker, i, deadline) in list(busy.items()):
                    if deadline > now:
                        continue
                    if conn.poll():  # answered just in time: not a timeout
                        answer(conn)
                        continue
                    del busy[conn]
                    results[i] = ("timeout", f"no answer within {timeout_s}s")
                    fresh = self._replace(worker)
                    starting[fresh.conn] = fresh
        except BaseException:  # e.g. Ctrl-C: a busy worker would answer the next call with a stale result
            for worker, _, _ in busy.values():
                self._replace(worker)
            raise
        return results


_POOLS: dict[int, _Pool] = {}


def _importable(module: str) -> bool:
    """Could a fresh worker process import `module` (what unpickling a function by reference needs)?"""
    if module == "__main__":  # a spawned worker runs the main script's file again
        return getattr(sys.modules["__main__"], "__file__", None) is not None
    top = module.partition(".")[0]
    return any(hasattr(f, "find_spec") and f.find_spec(top, None) is not None for f in sys.meta_path)


def check_sendable(reward_fns: Mapping[str, Callable]) -> None:
    """Raises, naming the reward, if a worker process could not load one of `reward_fns` (a lambda, a
    nested function, one defined in a config file or an interactive session): otherwise every call
    would fail in the worker and every group be dropped."""
    for name, fn in reward_fns.items():
        module = getattr(getattr(fn, "func", fn), "__module__", None) or ""
        try:
            pickle.dumps(fn)
            sendable = _importable(module)
        except Exception:  # noqa: BLE001 (pickling fails in many ways)
            sendable = False
        if not sendable:
            raise ValueError(
                f"reward {name!r} ({_name(fn)} in {module or 'an unknown module'}) cannot be loaded by a reward worker "
                "process: set reward.num_workers=0 to score in the trainer's process, or define it at module level "
                "in an importable module"
            )


def _run_here(jobs: Sequence[tuple], timeout_s: float) -> list[tuple[str, object]]:
    """The jobs in this process, in order, as `_Pool.run` reports them. A call cannot be stopped here:
    one that overruns `timeout_s` is reported as a timeout once it returns."""
    results = []
    for fn, args, kwargs in jobs:
        start = time.monotonic()
        try:
            value = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (any failure of a reward scores 0)
            results.append(("error", f"{type(e).__name__}: {e}"))
            continue
        took = time.monotonic() - start
        results.append(("timeout", f"took {took:.1f}s, over {timeout_s}s") if took > timeout_s else ("ok", value))
    return results


def run(jobs: Sequence[tuple], timeout_s: float, num_workers: int) -> list[tuple[str, object]]:
    """(fn, args, kwargs) jobs -> ("ok", value) or ("error" | "timeout", why), in order: each in a
    worker of the pool of `num_workers` (started on first use), killed past `timeout_s`; 0: here."""
    if num_workers and num_workers not in _POOLS:
        _POOLS[num_workers] = _Pool(num_workers)
    return _POOLS[num_workers].run(jobs, timeout_s) if num_workers else _run_here(jobs, timeout_s)


def _number(outcome: tuple[str, object]) -> tuple[str, object]:
    """A reward call's outcome with its value as a float; a value that is not a number is an error."""
    status, value = outcome
    if status != "ok":
        return outcome
    try:
        return "ok", float(value)
    except (TypeError, ValueError) as e:
        return "error", f"{type(e).__name__}: {e}"


def _name(fn: Callable) -> str:
    fn = getattr(fn, "func", fn)
    return getattr(fn, "__name__", type(fn).__name__)


FAILURES = ("error", "timeout", "nonfinite")  # `score`'s status codes 1, 2, 3 (0: the call returned a number)


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
) -> tuple[Float[np.ndarray, "completions rewards"], Int8[np.ndarray, "completions rewards"], dict[str, float]]:
    """(rewards [N, K] float32, unweighted: the algorithm applies `weights`; status [N, K]: 0, or 1 +
    the index in FAILURES of how the call failed; the `summarize` metrics and the time it took). A
    failed call scores 0; the failures of each reward are logged with the first message.

    Row n scores (prompts[n], completions[n], examples[n]) (repeat a group's prompt and example per
    completion). `completion_lens` (tokens) is passed as `completion_len` to every reward function
    when given; length-based rewards need it. `num_workers=0` scores in this process.
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
    start = time.perf_counter()
    jobs = [
        (fn, (prompts[i], completions[i], examples[i]), {} if completion_lens is None else {"completion_len": int(completion_lens[i])})
        for i in range(n)
        for fn in reward_fns
    ]
    outcomes = [_number(o) for o in run(jobs, timeout_s, num_workers)]
    with np.errstate(over="ignore"):  # 1e300 becomes inf in float32: a non-finite reward
        values = np.array([v if s == "ok" else 0.0 for s, v in outcomes], np.float32)
    kinds = [s if s != "ok" or np.isfinite(v) else "nonfinite" for (s, _), v in zip(outcomes, values)]
    status = np.array([0 if s == "ok" else 1 + FAILURES.index(s) for s in kinds], np.int8).reshape(n, k)
    for j, fn in enumerate(reward_fns):
        for code, kind in enumerate(FAILURES, 1):
            count = int((status[:, j] == code).sum())
            if count:
                first = next(v for (_, v), st in zip(outcomes[j::k], status[:, j]) if st == code)
                log.warning("reward %r: %d of %d call(s) failed (%s), first: %s", _name(fn), count, n, kind, first)
    rewards = np.where(status > 0, 0.0, values.reshape(n, k)).astype(np.float32)
    metrics = {"reward/time_s": time.perf_counter() - start, **summarize(reward_fns, weights, rewards, status)}
    return rewards, status, metrics


def summarize(
    reward_fns: Sequence[Callable[..., float]],
    weights: Sequence[float],
    rewards: Float[np.ndarray, "completions rewards"],
    status: Int8[np.ndarray, "completions rewards"],
) -> dict[str, float]:
    """The reward/ metrics of rows scored by `score` (in a run over several processes, every process's
    rows together): mean and std per reward, failures per reward and kind, the weighted total's mean.
    `weights` only enter "reward/total_mean"."""
    n, metrics = len(rewards), {}
    for j, fn in enumerate(reward_fns):
        name = _name(fn)
        metrics[f"reward/{name}/mean"] = float(rewards[:, j].mean()) if n else 0.0
        metrics[f"reward/{name}/std"] = float(rewards[:, j].std()) if n else 0.0
        for code, kind in enumerate(FAILURES, 1):
            metrics[f"reward/{name}/{kind}s"] = float((status[:, j] == code).sum())
    for code, kind in enumerate(FAILURES, 1):
        metrics[f"reward/{kind}s"] = float((status == code).sum())
    metrics["reward/total_mean"] = float((rewards @ np.asarray(weights, np.float32)).mean()) if n else 0.0
    metrics["reward/failed_frac"] = float((status != 0).mean()) if status.size else 0.0  # of all calls
    return metrics


def flip_labels(
    rewards: Float[np.ndarray, "completions rewards"], status: Int8[np.ndarray, "completions rewards"],
    correctness: Sequence[bool], p: float, uniform: Float[np.ndarray, "completions rewards"],
) -> tuple[Float[np.ndarray, "completions rewards"], Bool[np.ndarray, "completions rewards"]]:
    """Symmetric label noise (RewardConfig.label_noise): each correctness reward v in {0, 1} of a call
    that returned (status 0) becomes 1 - v where its `uniform` draw in [0, 1) is below `p` (the trainer
    draws them from the sampling round's key, so a resumed run flips the same labels). (rewards, flipped)."""
    cols = np.asarray(correctness, bool)[None, :] & (status == 0)
    bad = rewards[cols][~np.isin(rewards[cols], (0.0, 1.0))]
    if bad.size:
        raise ValueError(f"RewardConfig.label_noise flips binary correctness rewards, but one scored {bad[0]}; "
                         "set label_noise=0 for this task.")
    flipped = cols & (uniform < p)
    return np.where(flipped, 1.0 - rewards, rewards).astype(np.float32), flipped


def usable_groups(status: Int8[np.ndarray, "completions rewards"], group_size: int, on_failure: str) -> Bool[np.ndarray, "groups"]:
    """Per group of `group_size` rows: may it enter the update? With `on_failure="drop_group"` (see
    RewardConfig) a group with any failed reward call (nonzero `score` status) is dropped; with "zero"
    its failures score 0."""
    if on_failure == "zero":
        return np.ones(len(status) // group_size, bool)
    return ~(status != 0).reshape(-1, group_size * status.shape[1]).any(axis=1)
