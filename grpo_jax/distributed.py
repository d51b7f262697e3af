"""Runs over several processes (one per host): the launch flags of every entry point, and what they do.

    python -m grpo_jax.train --config ... --distributed      # TPU VM pods, SLURM, Open MPI: auto-detected
    python -m grpo_jax.train --config ... --coordinator HOST:PORT --num-processes N --process-id I

Every process runs the same command on its own devices. `jax.distributed.initialize` joins them into
one set of global devices before anything touches a device; from then on the mesh spans all hosts,
each process feeds and reads only the rows its devices hold (grpo_jax/sharding.py, grpo_jax/trainer.py)
and only process 0 writes logs. CPU devices of several processes talk through gloo, which is JAX's
default (`jax_cpu_collectives_implementation`, as of JAX 0.10.2), so nothing is set for them here.
`train.out_dir` must be a directory that every process sees: every process writes checkpoints there.
"""

import argparse
import json
import pathlib
import re
import shutil

import jax
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax import host_memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launch flags, for `grpo_jax.train` and the experiment scripts alike."""
    group = parser.add_argument_group("several processes (one per host)")
    group.add_argument("--distributed", action="store_true",
                       help="join the processes of a cluster JAX detects (TPU VM pods, SLURM, Open MPI)")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="a cluster named by hand: process 0's address, with --num-processes and --process-id")
    group.add_argument("--num-processes", type=int, metavar="N", help="processes in the cluster named by hand")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to N-1")


def initialize(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Prepares this process: on CPU, keeps freed host memory for reuse (`grpo_jax.host_memory`), then
    calls `jax.distributed.initialize` as the flags say (nothing without them). Every entry point calls
    it first, before any computation. Inconsistent flags are a usage error naming the fix."""
    host_memory.keep_freed_memory()
    manual = {"--coordinator": args.coordinator, "--num-processes": args.num_processes, "--process-id": args.process_id}
    given = [flag for flag, value in manual.items() if value is not None]
    if args.distributed and given:
        parser.error(f"--distributed detects the cluster; {', '.join(given)} name one by hand: give one or the other")
    if given and len(given) < len(manual):
        missing = [flag for flag in manual if flag not in given]
        parser.error(f"{', '.join(given)} without {', '.join(missing)}: a cluster named by hand needs all three")
    if given:
        if not re.fullmatch(r"\S+:\d+", args.coordinator):
            parser.error(f"--coordinator {args.coordinator}: expected HOST:PORT, e.g. 10.0.0.2:1234")
        if not 0 <= args.process_id < args.num_processes:
            parser.error(f"--process-id {args.process_id} with --num-processes {args.num_processes}: "
                         "need 0 <= process id < number of processes")
    if args.distributed or given:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)


def remove(path: str | pathlib.Path) -> None:
    """Deletes the directory `path` (if there is one) that every process sees, for a fresh run in it:
    process 0 deletes, and every process returns once it is gone."""
    if jax.process_index() == 0:
        shutil.rmtree(path, ignore_errors=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"removed {path}")


def all_gather_json(obj) -> list:
    """Every process's `obj` (JSON-able: records each process built from its own rows), in process order,
    on every process. A collective: every process calls it. Sent as UTF-8 bytes padded to the longest."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.int64(data.size))
    every = multihost_utils.process_allgather(np.pad(data, (0, int(sizes.max()) - data.size)))
    return [json.loads(row[:k].tobytes()) for row, k in zip(every, sizes)]
