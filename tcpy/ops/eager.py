"""``tcpy.ops.eager``: run an operation on NumPy arrays, building its kernel once per signature.

``eager.reduce(x, "sum", axes=-1)`` describes each array argument by its shape and dtype, builds
the operation for that description and the attributes (cached, so a repeated call neither
re-parses nor re-infers), and calls the kernel on the arrays.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import TCOpError
from .core import ConcreteSizeNeeded, ConstantEmptyAxis, Graph, run_in, shape_text, spec_of, tensor

# A zero extent is a size name, not the constant 0: TC rejects `where i in 0:0` as an empty range,
# while a size bound to 0 at call time runs nothing (reductions then give their identity).
_EMPTY = "Z"


def _key(value, arrays: list):
    """A hashable description of one argument; arrays are collected in call order."""
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return ("tensor", tuple(_EMPTY if d == 0 else int(d) for d in value.shape), value.dtype.str)
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_key(v, arrays) for v in value))
    if isinstance(value, dict):
        raise TCOpError(f"eager: attributes must be numbers, strings or lists, got a dict {value!r}")
    try:
        hash(value)
    except TypeError:
        raise TCOpError(f"eager: attributes must be numbers, strings or lists, got {type(value).__name__}") from None
    # the type and repr tell apart what == does not: 1, 1.0 and True; 0.0 and -0.0
    return ("value", value, type(value), repr(value))


def _rebuild(key):
    kind, *rest = key
    if kind == "tensor":
        return tensor(rest[0], np.dtype(rest[1]))
    if kind == "seq":
        return [_rebuild(k) for k in rest[0]]
    return rest[0]


def _count_arrays(value) -> int:
    if isinstance(value, np.ndarray):
        return 1
    return sum(map(_count_arrays, value)) if isinstance(value, (list, tuple)) else 0


def _check_empty(builder, args: tuple, kwargs: dict) -> None:
    """Run ``builder``'s checks on arrays with an empty axis, their sizes as they are (the kernel is
    built with a size name in place of 0): an operation that rejects an empty axis says so in its
    own words. Nothing is compiled."""
    graph = Graph("eager_check")

    def as_value(value):
        if isinstance(value, np.ndarray):
            return graph.input(spec_of(value, "array"))
        return [as_value(v) for v in value] if isinstance(value, (list, tuple)) else value

    run_in(graph, lambda: builder(*map(as_value, args), **{k: as_value(v) for k, v in kwargs.items()}))


@functools.lru_cache(maxsize=512)
def _kernel(builder, args: tuple, kwargs: tuple):
    return builder(*[_rebuild(a) for a in args], **{k: _rebuild(v) for k, v in kwargs})


class Eager:
    """Every operation of :mod:`tcpy.ops`, called on arrays: ``eager.<op>(*arrays, **attrs)``."""

    def __init__(self, operations: Mapping[str, Callable]):
        self._operations = dict(operations)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._operations:
            raise AttributeError(f"tcpy.ops has no operation {name!r}")
        builder = self._operations[name]

        def call(*args, **kwargs):
            arrays: list = []
            arg_keys = tuple(_key(a, arrays) for a in args)
            kwarg_keys = tuple(sorted((k, _key(v, arrays)) for k, v in kwargs.items()))
            if len(arrays) > sum(_count_arrays(a) for a in args):
                raise TCOpError(f"eager.{name}: pass arrays positionally, in the operation's operand order")
            if any(0 in a.shape for a in arrays):
                _check_empty(builder, args, kwargs)
            try:
                kernel = _kernel(builder, arg_keys, kwarg_keys)
            except ConcreteSizeNeeded as err:  # only an empty axis is symbolic here (see _EMPTY)
                empty = next((a.shape for a in arrays if 0 in a.shape), None)
                if empty is None:
                    raise
                raise TCOpError(f"eager.{name}: {err.op} needs the size of {err.what} as a number, and it is 0 "
                                f"(an array of shape {shape_text(empty)}); {err.op} cannot run on an empty axis, "
                                f"since TC ranges are never empty") from None
            except ConstantEmptyAxis as err:  # the arrays' empty axes are size names: the attributes gave it
                raise TCOpError(f"eager.{name}: the attributes give an axis of size 0 ({err.loop}), which "
                                f"tcpy kernels cannot build: TC ranges are never empty") from None
            return kernel(*arrays)

        call.__name__ = name
        call.__doc__ = builder.__doc__
        return call

    def __repr__(self) -> str:
        return f"<tcpy.ops.eager: {len(self._operations)} operations, {_kernel.cache_info().currsize} kernels built>"

    def __dir__(self) -> Sequence[str]:
        return sorted(self._operations)
