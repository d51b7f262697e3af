"""`Registry`: name -> entry, for everything a fork adds by name (algorithm variants, rewards, tasks).

A light module on purpose: reward worker processes import it (through the reward functions) and
must not pay for jax or the algorithms."""

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> entry. Registering a taken name is an error (a fork that shadows a variant by accident
    would silently change every run that names it); an unknown name is an error listing the known."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, name: str, entry: T) -> T:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self[name] = entry
        return entry

    def __missing__(self, name):
        raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(map(repr, self))}")
