"""The registries of the algorithms: a name maps to an entry that carries everything the code must
know about a variant (its function, its capabilities, its float64 reference), declared once at its
registration and read everywhere else (config validation, the presets table, the tests). The class
is `grpo_jax.registry.Registry`, shared with the rewards and tasks."""

from grpo_jax.registry import Registry  # noqa: F401
