"""Reductions: ``reduce`` (sum, max, min), ``argmax``/``argmin`` and ``dot_general``.

PTIR's accumulator policy: a reduction accumulates in ``accum_dtype`` (default float32 for f16,
the input dtype otherwise) and is then cast to ``out_dtype`` (default the input dtype). Max and
min propagate NaN; a reduction over an empty axis gives the identity (0, -inf / the dtype's
minimum, +inf / the dtype's maximum).
"""
from __future__ import annotations

from typing import Sequence

from ..errors import TCOpError
from ..lang.types import ScalarType, accumulator_type
from ..lang.writer import cast
from .core import (Graph, Loop, Value, axes_of, axis_of, check_kind, check_same, dim_text, dtype_of, operation,
                   same_dim, shape_text)

_KINDS = {"sum": "+", "max": "max", "min": "min"}


def accumulate(graph: Graph, shape, out_vars: Sequence[str], out_loops: Sequence[Loop], kind: str, term: str,
               term_dtype: ScalarType, reduction_loops: Sequence[Loop], accum: ScalarType, out_dtype: ScalarType,
               lets: Sequence[str] = ()) -> Value:
    """``v(out_vars) <kind>=! term`` accumulated in ``accum`` and cast to ``out_dtype``.

    When tcpy's own accumulator for an ``out_dtype`` target is ``accum`` (a half target sums in
    float32) the reduction writes the output directly; else it goes through an ``accum`` temporary.
    """
    op = f"{_KINDS[kind]}=!"
    every = list(out_loops) + list(reduction_loops)
    if term_dtype is out_dtype and accumulator_type(out_dtype) is accum:
        return graph.define(shape, out_vars, op, term, every, lets, dtype=out_dtype)
    acc = graph.define(shape, out_vars, op, cast(term, accum, term_dtype), every, lets, dtype=accum)
    if out_dtype is accum:
        return acc
    return graph.define(shape, out_vars, "=", cast(acc.at(out_vars), out_dtype), out_loops, dtype=out_dtype)


def _kind(kind: str, x: Value, op: str) -> None:
    if not isinstance(kind, str) or kind not in _KINDS:
        raise TCOpError(f"{op}: kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    check_kind(f"{op} {kind}", x, "x", ("float", "int", "uint") if kind == "sum" else ("float", "int", "uint", "bool"))


def accum_and_out(x: Value, accum_dtype, out_dtype) -> tuple[ScalarType, ScalarType]:
    """The (accum, out) dtypes of a reduction of ``x``: given, or PTIR's defaults."""
    accum = accumulator_type(x.dtype) if accum_dtype is None else dtype_of(accum_dtype, "accum_dtype")
    out = x.dtype if out_dtype is None else dtype_of(out_dtype, "out_dtype")
    return accum, out


@operation("x")
def reduce(x, kind: str, axes, keepdims: bool = False, accum_dtype=None, out_dtype=None) -> Value:
    """Reduce ``x`` over ``axes`` (ints, negative from the end; ``[]`` reduces nothing) with
    ``kind`` ``"sum"``, ``"max"`` or ``"min"``. ``keepdims`` keeps reduced axes with size 1.
    Accumulates in ``accum_dtype`` (default f32 for f16, else x's dtype), then casts to
    ``out_dtype`` (default x's dtype). Max and min propagate NaN; an empty axis gives the identity."""
    _kind(kind, x, "reduce")
    axes = axes_of(axes, x.rank, "reduce")
    accum, out_dtype = accum_and_out(x, accum_dtype, out_dtype)
    read, out_vars, out_loops, red_loops, shape = [], [], [], [], []
    for d, extent in enumerate(x.shape):
        if d in axes:
            read.append(f"k{d}")
            red_loops.append(Loop(f"k{d}", extent))
            if keepdims:
                out_vars.append(f"z{d}")
                out_loops.append(Loop(f"z{d}", 1))
                shape.append(1)
        else:
            read.append(f"i{d}")
            out_vars.append(f"i{d}")
            out_loops.append(Loop(f"i{d}", extent))
            shape.append(extent)
    if not axes:  # nothing to reduce: the value, cast
        return x.graph.define(shape, out_vars, "=", cast(cast(x.at(read), accum, x.dtype), out_dtype, accum),
                              out_loops, dtype=out_dtype)
    return accumulate(x.graph, shape, out_vars, out_loops, kind, x.at(read), x.dtype, red_loops, accum, out_dtype)


def reduce_sum(x, axes, keepdims: bool = False, accum_dtype=None, out_dtype=None, **kwargs):
    """``reduce(x, "sum", ...)``."""
    return reduce(x, "sum", axes, keepdims, accum_dtype, out_dtype, **kwargs)


def reduce_max(x, axes, keepdims: bool = False, accum_dtype=None, out_dtype=None, **kwargs):
    """``reduce(x, "max", ...)`` (NaN propagates; an empty axis gives -inf or the dtype's minimum)."""
    return reduce(x, "max", axes, keepdims, accum_dtype, out_dtype, **kwargs)


def reduce_min(x, axes, keepdims: bool = False, accum_dtype=None, out_dtype=None, **kwargs):
    """``reduce(x, "min", ...)`` (NaN propagates; an empty axis gives +inf or the dtype's maximum)."""
    return reduce(x, "min", axes, keepdims, accum_dtype, out_dtype, **kwargs)


def _arg(x: Value, kind: str, axis, keepdims: bool, output_dtype, op: str) -> Value:
    _kind(kind, x, op)
    axis = axis_of(axis, x.rank, op)
    extent = x.shape[axis]
    if extent == 0:
        raise TCOpError(f"{op}: axis {axis} must not be empty (PTIR rejects an arg-reduction over an extent of 0), "
                        f"got shape {shape_text(x.shape)}")
    index_type = dtype_of(output_dtype, "output_dtype")
    if index_type not in (ScalarType.INT32, ScalarType.INT64):
        raise TCOpError(f"{op}: output_dtype must be si32 or si64, got {index_type.numpy_name}")
    graph = x.graph
    best = reduce(x, kind, axis, keepdims=True)
    read = [f"i{d}" if d != axis else "k" for d in range(x.rank)]
    best_read = [f"i{d}" if d != axis else "0" for d in range(x.rank)]
    others = [Loop(f"i{d}", e) for d, e in enumerate(x.shape) if d != axis]
    if not isinstance(extent, int):  # an extent of 0 at call time fails this read's precondition
        graph.define([e for d, e in enumerate(x.shape) if d != axis], [lp.var for lp in others], "=",
                     x.at(best_read), others, dtype=x.dtype)
    value = x.at(read)
    # ties go to the smallest index (a min over the indices that reach the extreme); NaN counts as
    # the extreme (it propagates into `best`), so the first NaN is chosen, as NumPy does
    hit = f"{value} == {best.at(best_read)}"
    if x.dtype.is_float:
        hit = f"({hit} || {value} != {value})"
    out_vars, out_loops, shape = [], [], []
    for d, e in enumerate(x.shape):
        if d != axis:
            out_vars.append(f"i{d}"); out_loops.append(Loop(f"i{d}", e)); shape.append(e)
        elif keepdims:
            out_vars.append("z"); out_loops.append(Loop("z", 1)); shape.append(1)
    text = f"{hit} ? {cast('k', index_type)} : {cast(dim_text(extent), index_type)}"
    return graph.define(shape, out_vars, "min=!", text, out_loops + [Loop("k", extent)], dtype=index_type)


@operation("x")
def argmax(x, axis: int = -1, keepdims: bool = False, output_dtype="si64") -> Value:
    """Index of the maximum along ``axis`` (negative from the end); ties give the smallest index,
    NaN counts as the maximum (the first NaN wins). ``output_dtype`` is si32 or si64. An empty
    axis is rejected."""
    return _arg(x, "max", axis, keepdims, output_dtype, "argmax")


@operation("x")
def argmin(x, axis: int = -1, keepdims: bool = False, output_dtype="si64") -> Value:
    """Index of the minimum along ``axis``: :func:`argmax`'s rules with min."""
    return _arg(x, "min", axis, keepdims, output_dtype, "argmin")


def _pair(value, op: str, what: str):
    if not (isinstance(value, Sequence) and len(value) == 2):
        raise TCOpError(f"{op}: {what} must be a pair (lhs axes, rhs axes), got {value!r}")
    return value


@operation("lhs", "rhs")
def dot_general(lhs, rhs, contracting, batch=((), ()), accum_dtype=None, out_dtype=None) -> Value:
    """A generalized contraction (XLA's dot_general). ``contracting=(lhs_axes, rhs_axes)`` and
    ``batch=(lhs_axes, rhs_axes)`` pair axes of equal extent. Output axes: batch (lhs order), then
    lhs's remaining axes, then rhs's. Multiplies in the input dtype, accumulates in
    ``accum_dtype`` (default f32 for f16, else the input dtype), casts to ``out_dtype``."""
    check_same("dot_general", [lhs, rhs], ["lhs", "rhs"], shape=False)
    check_kind("dot_general", lhs, "lhs", ("float", "int", "uint"))
    lc, rc = (axes_of(a, v.rank, "dot_general", f"contracting {s} axes")
              for a, v, s in zip(_pair(contracting, "dot_general", "contracting"), (lhs, rhs), ("lhs", "rhs")))
    lb, rb = (axes_of(a, v.rank, "dot_general", f"batch {s} axes")
              for a, v, s in zip(_pair(batch, "dot_general", "batch"), (lhs, rhs), ("lhs", "rhs")))
    for what, la, ra in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(la) != len(ra):
            raise TCOpError(f"dot_general: {what} axes must pair up, got {len(la)} lhs axes {list(la)} and "
                            f"{len(ra)} rhs axes {list(ra)}")
        for a, b in zip(la, ra):
            if not same_dim(lhs.shape[a], rhs.shape[b]):
                raise TCOpError(f"dot_general: {what} axis {a} of lhs (extent {lhs.shape[a]}) must match axis {b} "
                                f"of rhs (extent {rhs.shape[b]})")
    for side, c, b in (("lhs", lc, lb), ("rhs", rc, rb)):
        if set(c) & set(b):
            raise TCOpError(f"dot_general: {side} axes {sorted(set(c) & set(b))} are both batch and contracting")
    accum, out_dtype = accum_and_out(lhs, accum_dtype, out_dtype)
    names = {}
    for j, (a, b) in enumerate(zip(lb, rb)):
        names[("l", a)] = names[("r", b)] = f"b{j}"
    for j, (a, b) in enumerate(zip(lc, rc)):
        names[("l", a)] = names[("r", b)] = f"k{j}"
    out_loops = [Loop(f"b{j}", lhs.shape[a]) for j, a in enumerate(lb)]
    for side, value in (("l", lhs), ("r", rhs)):
        for a, extent in enumerate(value.shape):
            if (side, a) not in names:
                names[(side, a)] = f"{'m' if side == 'l' else 'n'}{a}"
                out_loops.append(Loop(names[(side, a)], extent))
    reads = [v.at([names[(s, a)] for a in range(v.rank)]) for s, v in (("l", lhs), ("r", rhs))]
    red_loops = [Loop(f"k{j}", lhs.shape[a]) for j, a in enumerate(lc)]
    return accumulate(lhs.graph, [lp.extent for lp in out_loops], [lp.var for lp in out_loops], out_loops, "sum",
                      f"{reads[0]} * {reads[1]}", lhs.dtype, red_loops, accum, out_dtype)


@operation("x")
def top_k(x, k: int, axis: int = -1, largest: bool = True, indices_dtype="si64") -> tuple[Value, Value]:
    """The ``k`` largest (or smallest) values along ``axis`` and their indices, as a tuple
    ``(values, indices)`` in order (ties: the smaller index first; NaN counts as the largest).

    Each element's rank is the number of elements ahead of it, a comprehension over all pairs:
    O(extent²) work per row, for small ``k`` and rows (sampling, routing), not for sorting."""
    check_kind("top_k", x, "x", ("float", "int", "uint"))
    axis = axis_of(axis, x.rank, "top_k")
    extent = x.shape[axis]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or (isinstance(extent, int) and k > extent):
        raise TCOpError(f"top_k: k must be an int in [0, {extent}] (the extent of axis {axis}), got {k!r}")
    index_type = dtype_of(indices_dtype, "indices_dtype")
    if index_type not in (ScalarType.INT32, ScalarType.INT64):
        raise TCOpError(f"top_k: indices_dtype must be si32 or si64, got {index_type.numpy_name}")
    graph = x.graph

    def pair(var):  # the indices of x with `var` on the axis
        return [f"i{d}" if d != axis else var for d in range(x.rank)]

    a, b = x.at(pair("m")), x.at(pair("j"))  # is a ahead of b?
    first, second = (a, b) if largest else (b, a)
    ahead = f"{first} > {second}"
    if x.dtype.is_float:  # NaN is the largest, and equal to itself
        ahead = f"({ahead} || {a} != {a} && {b} == {b})" if largest else f"({ahead} || {b} != {b} && {a} == {a})"
        tie = f"({a} == {b} || {a} != {a} && {b} != {b})"
    else:
        tie = f"{a} == {b}"
    pair_loops = [Loop(f"i{d}" if d != axis else "j", e) for d, e in enumerate(x.shape)] + [Loop("m", extent)]
    rank = graph.define(x.shape, pair("j"), "+=!", f"{ahead} || {tie} && m < j ? int64(1) : int64(0)", pair_loops,
                        dtype=ScalarType.INT64)
    out_shape = [e if d != axis else k for d, e in enumerate(x.shape)]
    out_loops = [Loop(f"i{d}" if d != axis else "r", e) for d, e in enumerate(out_shape)]
    # the one element of each rank r < k (ranks are a permutation of 0..extent-1)
    index_of_rank = f"{rank.at(pair('j'))} == r ? {cast('j', index_type)} : {cast(dim_text(extent), index_type)}"
    indices = graph.define(out_shape, pair("r"), "min=!", index_of_rank,
                           out_loops + [Loop("j", extent)], dtype=index_type)
    chosen = pair(indices.at(pair("r")))
    values = graph.define(out_shape, pair("r"), "=", x.at(chosen), out_loops, dtype=x.dtype)
    return values, indices
