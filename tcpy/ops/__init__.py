"""PTIR's operation set (seed ``001_*``, ptir.v0.4) as comprehension builders.

Each builder takes static descriptions of its operands (:func:`tensor` specs with concrete or
symbolic sizes, or example arrays) and attributes, and returns an ordinary :class:`~tcpy.Kernel`
generated from TC source (``kernel.source``)::

    import tcpy.ops as ops
    k = ops.reduce(ops.tensor(("B", "N"), "f16"), "sum", axes=-1)   # f32 accumulation, f16 out
    print(k.source)
    y = k(x)

:func:`compose` builds several operations into one def (so the compiler fuses them), and
:data:`eager` runs an operation on arrays directly, building each signature once.
"""
from .core import TensorSpec, Value, compose, dtype_of, tensor
from .elementwise import (abs, add, binary, cast, clamp, compare, div, erf, exp, log, maximum, minimum, mul, neg,
                          reciprocal, rsqrt, select, stop_gradient, sub, tanh, unary)
from .indexing import (dynamic_slice, dynamic_update_slice, gather, scatter_add, scatter_reduce, segment_reduce,
                       take)
from .nn import attention, layer_norm, softmax
from .reduction import argmax, argmin, dot_general, reduce, reduce_max, reduce_min, reduce_sum, top_k
from .shape import broadcast_to, concat, iota, pad, reshape, slice, tile, transpose
from .window import extract_patches, reduce_window
from .eager import Eager

#: Every operation by name (what :data:`eager` dispatches on).
OPERATIONS = {name: fn for name, fn in globals().items() if callable(fn) and getattr(fn, "__module__", "").startswith(
    __name__ + ".") and name not in ("TensorSpec", "Value", "Eager", "compose", "dtype_of", "tensor")}

#: ``eager.<op>(*arrays, **attributes)``: build the operation for the arrays (once per signature) and run it.
eager = Eager(OPERATIONS)

__all__ = [
    "TensorSpec", "Value", "compose", "dtype_of", "tensor", "eager",
    "abs", "add", "binary", "cast", "clamp", "compare", "div", "erf", "exp", "log", "maximum", "minimum", "mul",
    "neg", "reciprocal", "rsqrt", "select", "stop_gradient", "sub", "tanh", "unary",
    "dynamic_slice", "dynamic_update_slice", "gather", "scatter_add", "scatter_reduce", "segment_reduce", "take",
    "attention", "layer_norm", "softmax",
    "argmax", "argmin", "dot_general", "reduce", "reduce_max", "reduce_min", "reduce_sum", "top_k",
    "broadcast_to", "concat", "iota", "pad", "reshape", "slice", "tile", "transpose",
    "extract_patches", "reduce_window",
]
