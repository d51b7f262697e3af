"""A search tool over a local key-value table: "[capital of France]" -> "Paris"."""

import dataclasses
import functools
import json

from grpo_jax.envs import ToolEnv, register


@register("retrieval")
@dataclasses.dataclass(frozen=True)
class RetrievalConfig(ToolEnv):
    """`table`: (key, value) pairs, and/or `path`: a JSON file of {key: value}. A query matches a key
    case-insensitively, surrounding spaces ignored; no match answers "not found"."""

    table: tuple[tuple[str, str], ...] = ()
    path: str = ""

    def call(self, query: str) -> str:
        return _table(self.table, self.path).get(query.strip().lower(), "not found")


@functools.lru_cache(maxsize=8)
def _table(pairs: tuple[tuple[str, str], ...], path: str) -> dict[str, str]:
    entries = list(pairs)
    if path:
        with open(path) as f:
            entries += list(json.load(f).items())
    return {str(k).strip().lower(): str(v) for k, v in entries}
