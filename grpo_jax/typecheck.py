"""Runtime checks of the jaxtyping annotations: `checked` for the public entry points, and `TYPECHECKER`
for the tests' import hook (tests/conftest.py), which checks every annotated function.

beartype, with an int accepted where a float is annotated (PEP 484's numeric tower), so
`temperature=1` is as good as `temperature=1.0`. A misshapen array reads like a sentence: "The problem
arose whilst typechecking parameter 'segment_ids' ... Expected type: Int[Array, 'batch seq'] ... The
current values for each jaxtyping axis annotation are as follows. batch=2 seq=5".
"""

from beartype import BeartypeConf, beartype
from jaxtyping import jaxtyped

TYPECHECKER = beartype(conf=BeartypeConf(is_pep484_tower=True))


def checked(fn):
    """`fn` with its arguments and result checked against its annotations at every call (at tracing,
    under jit)."""
    return jaxtyped(fn, typechecker=TYPECHECKER)
