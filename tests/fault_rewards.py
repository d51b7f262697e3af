"""Faulty reward functions for the scoring workers of the reliability tests. A module of their own, and
a light one: a spawned worker imports it to unpickle them, and a heavy import would look like a timeout."""

import os
import pathlib
import time


def odd_values(prompt, completion, example, **_):
    return {"nan": float("nan"), "inf": float("inf"), "huge": 1e300}.get(completion, 1.0)


def dies_or_sleeps(prompt, completion, example, **_):
    if completion == "die":
        os._exit(1)  # like a segfault in a native library
    time.sleep(0.2)
    return 1.0


def hangs(prompt, completion, example, **_):
    """Writes its worker's pid to the file named by `completion`, then hangs."""
    pathlib.Path(completion).write_text(str(os.getpid()))
    time.sleep(600)


def nan_for_odd_answers(prompt, completion, example, **_):
    """nan for every completion of a prompt whose answer is odd: whole groups fail."""
    return float("nan") if int(example["answer"]) % 2 else 0.5
