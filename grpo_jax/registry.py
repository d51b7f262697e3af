"""`Registry`: name -> entry, for everything a fork adds by name (algorithm variants, rewards, tasks);
`Params`: the parameter dataclass a variant registers with.

A light module on purpose: reward worker processes import it (through the reward functions) and
must not pay for jax or the algorithms."""

import dataclasses
import difflib
import sys
from typing import ClassVar, Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> entry. Registering a taken name is an error (a fork that shadows a variant by accident
    would silently change every run that names it); an unknown name is an error listing the known."""

    def __init__(self, kind: str, entry: type | None = None, how: str = ""):
        """`entry`: the type every entry must have (checked however it is set); `how`: the way to make one."""
        super().__init__()
        self.kind, self.entry, self.how = kind, entry, how

    def __setitem__(self, name, value):
        if self.entry is not None and not isinstance(value, self.entry):
            raise TypeError(f"{self.kind} {name!r}: {value!r} is not a {self.entry.__module__}.{self.entry.__name__}; "
                            f"{self.how}")
        super().__setitem__(name, value)

    def add(self, name: str, entry: T) -> T:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self[name] = entry
        return entry

    def __missing__(self, name):
        near = [n for n in self if n.startswith(str(name))] + difflib.get_close_matches(str(name), list(self), 3, 0.5)
        near = list(dict.fromkeys(near))[:3]
        hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
        raise KeyError(f"unknown {self.kind} {name!r}; {hint}known: {', '.join(map(repr, self))}")

    def name_of(self, params: type) -> str:
        """The name registered with the parameter class `params`."""
        for name, entry in self.items():
            if entry.params is params:
                return name
        raise KeyError(f"{params.__name__} is not the parameter class of any registered {self.kind}")

    def params_class(self, name: str, params: type | None, base: type, module: str) -> type:
        """The parameter class `name` registers with: `params` (a frozen dataclass subclassing `base`,
        owned by this one name, so that a config value names its variant), or, for a variant without
        parameters, an empty one made here and bound in `module` (the registering function's), where
        pickle finds it."""
        if params is None:
            cls_name = "".join(part.capitalize() for part in name.split("_"))
            cls_name += "Params" if hasattr(sys.modules[module], cls_name) else ""
            params = dataclasses.make_dataclass(cls_name, [], bases=(base,), frozen=True)
            params.__module__ = module
            setattr(sys.modules[module], cls_name, params)
            return params
        if not (isinstance(params, type) and issubclass(params, base) and dataclasses.is_dataclass(params)
                and params.__dataclass_params__.frozen):
            raise TypeError(f"{self.kind} {name!r}: params={params!r} must be a frozen dataclass subclassing "
                            f"{base.__module__}.{base.__name__}")
        taken = [n for n, entry in self.items() if entry.params is params]
        if taken:
            raise ValueError(f"{self.kind} {name!r}: {params.__name__} is already the parameter class of "
                             f"{taken[0]!r}; subclass it (class {params.__name__}2({params.__name__}): ...)")
        return params


class Params:
    """Base of a variant's parameter dataclass. A config holds the variant as an instance of its class
    (`AlgorithmConfig(loss=Gspo(eps_high=4e-4))`); `name` and `spec` find its registration, and
    `from_name` (what `--set algorithm.loss=gspo` calls) builds it with its defaults. Each family's
    base class sets `registry` and `path` (where it sits in a config, for error messages)."""

    registry: ClassVar[Registry]
    path: ClassVar[str]

    @classmethod
    def from_name(cls, name: str) -> "Params":
        return cls.registry[name].params()

    @property
    def name(self) -> str:
        return self.registry.name_of(type(self))

    @property
    def spec(self):
        return self.registry[self.name]

    def check(self, rules: dict[str, tuple[bool, str]]) -> None:
        """Raises for the first field whose rule fails, naming the field as a config path sets it."""
        for field, (ok, why) in rules.items():
            if not ok:
                raise ValueError(f"{self.path}.{field}={getattr(self, field)!r} ({self.registry.kind} "
                                 f"{self.name!r}) {why}")
