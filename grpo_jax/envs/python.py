"""The Python tool: "<python>print(6*7)</python>" -> "42". The code runs in a fresh interpreter
(isolated mode) under an address-space limit and a CPU-time limit, started from a worker of the
reward pool (`rewards.scoring.run`), which kills it and answers a timeout if it overruns: a loop,
a crash or a memory bomb in the policy's code becomes an observation."""

import dataclasses
import subprocess
import sys

from grpo_jax.envs import ToolEnv, register
from grpo_jax.rewards import scoring


@register("python")
@dataclasses.dataclass(frozen=True)
class PythonConfig(ToolEnv):
    """`timeout_s`: wall-clock limit of a call; `memory_mb`: its address space; `num_workers`: the
    reward pool it runs in (0: started from the trainer's process)."""

    call_start: str = "<python>"
    call_end: str = "</python>"
    timeout_s: float = 2.0
    memory_mb: int = 512
    num_workers: int = 1

    def __post_init__(self):
        super().__post_init__()
        if not (self.timeout_s > 0 and self.memory_mb > 0 and self.num_workers >= 0):
            raise ValueError(f"PythonConfig: timeout_s={self.timeout_s} and memory_mb={self.memory_mb} must be > 0, "
                             f"num_workers={self.num_workers} >= 0 (env.timeout_s, env.memory_mb, env.num_workers)")

    def call(self, query: str) -> str:
        [(status, value)] = scoring.run([(run, (query, self.timeout_s, self.memory_mb), {})],
                                        self.timeout_s + 1.0, self.num_workers)
        return value if status == "ok" else f"error: {status}"


# The child limits itself before it compiles the code (no preexec_fn: unsafe in a process with threads).
_LIMITED = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]),) * 2)\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[3]),) * 2)\n"
            "del resource, sys\n"
            "exec(compile(__import__('sys').argv[1], '<tool>', 'exec'), {'__name__': '__main__'})")


def run(code: str, timeout_s: float, memory_mb: int) -> str:
    """The last line of what `code` prints, or of its error."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _LIMITED, code, str(memory_mb << 20), str(int(timeout_s) + 1)],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "error: timeout"
    lines = (done.stdout if done.returncode == 0 else done.stderr or f"exit {done.returncode}").strip().splitlines()
    return (lines or [""])[-1][:200]
