"""Indexing operations: take, gather, scatter (reduce/add), dynamic_slice, dynamic_update_slice.

Indices read from tensors are checked by the kernel: an index out of range raises
:class:`~tcpy.TCRuntimeError` (PTIR: indices MUST be in range). Dynamic slice starts are clamped
into ``[0, extent - size]`` as the contract says.
"""
from __future__ import annotations

from ..errors import TCOpError
from ..lang.types import ScalarType
from ..lang.writer import highest, lowest
from .core import (Loop, Value, axis_of, check_kind, check_same, dim_text, index_vars, ints_of, literal, loops,
                   operation, same_dim, shape_text)

_INDEX_TYPES = (ScalarType.INT32, ScalarType.INT64)
_SCATTER = {"add": "+", "max": "max", "min": "min", "replace": None}


def _indices(op: str, indices: Value, what: str = "indices") -> None:
    if indices.dtype not in _INDEX_TYPES:
        raise TCOpError(f"{op}: {what} must be si32 or si64, got {indices.dtype.numpy_name}")


@operation("x", "indices")
def take(x, indices) -> Value:
    """Rows of ``x`` picked by ``indices`` along axis 0 (an embedding lookup): output shape
    ``indices.shape + x.shape[1:]``."""
    _indices("take", indices)
    if x.rank == 0:
        raise TCOpError("take: x must have rank >= 1, got rank 0")
    outer = index_vars(indices.rank, "p")
    inner = index_vars(x.rank - 1)
    shape = list(indices.shape) + list(x.shape[1:])
    return x.graph.define(shape, outer + inner, "=", x.at([indices.at(outer)] + inner),
                          loops(outer + inner, shape), dtype=x.dtype)


@operation("x", "indices")
def gather(x, indices, axis: int = 0) -> Value:
    """``torch.gather``: ``out[i] = x[i with i[axis] replaced by indices[i]]``; ``indices`` has
    ``x``'s rank and extents except along ``axis``."""
    _indices("gather", indices)
    axis = _same_but_axis("gather", x, indices, axis, "indices")
    out = index_vars(x.rank)
    read = list(out)
    read[axis] = indices.at(out)
    return x.graph.define(indices.shape, out, "=", x.at(read), loops(out, indices.shape), dtype=x.dtype)


def _same_but_axis(op: str, x: Value, other: Value, axis, what: str) -> int:
    if other.rank != x.rank:
        raise TCOpError(f"{op}: {what} must have x's rank {x.rank}, got shape {shape_text(other.shape)}")
    axis = axis_of(axis, x.rank, op)
    for d, (a, b) in enumerate(zip(x.shape, other.shape)):
        if d != axis and not same_dim(a, b):
            raise TCOpError(f"{op}: {what} {shape_text(other.shape)} must match x {shape_text(x.shape)} on every "
                            f"axis but {axis} (axis {d}: {b} vs {a})")
    return axis


@operation("x", "indices", "updates")
def scatter_reduce(x, indices, updates, axis: int = 0, reduce: str = "add") -> Value:
    """``torch.scatter_reduce`` (same-rank form, ``include_self``): ``x`` with each update combined
    into the element at its position with ``axis`` replaced by its index. ``reduce`` is ``add``,
    ``max``, ``min`` or ``replace`` (the update with the largest position along ``axis`` wins).

    A comprehension cannot write at a computed position, so each output element reduces over
    the updates that target it: O(x.shape[axis] x updates.size) work instead of O(updates.size).
    """
    if not isinstance(reduce, str) or reduce not in _SCATTER:
        raise TCOpError(f"scatter_reduce: reduce must be one of {', '.join(_SCATTER)}, got {reduce!r}")
    _indices("scatter_reduce", indices)
    check_same("scatter_reduce", [indices, updates], ["indices", "updates"], dtype=False)
    check_same("scatter_reduce", [x, updates], ["x", "updates"], shape=False)
    if reduce == "add":
        check_kind("scatter_reduce add", x, "x", ("float", "int", "uint"))
    axis = _same_but_axis("scatter_reduce", x, updates, axis, "updates")
    graph = x.graph
    out = index_vars(x.rank)
    source = list(out)
    source[axis] = "k"
    every = loops(out, x.shape) + [Loop("k", updates.shape[axis])]
    position = indices.at(source)
    # every index must be in range even where no output element matches it
    graph.define(updates.shape, source, "=", x.at([position if d == axis else v for d, v in enumerate(source)]),
                 loops(source, updates.shape), dtype=x.dtype)
    if reduce == "replace":
        last = graph.define(x.shape, out, "max=!", f"{position} == {out[axis]} ? int64(k) : int64(-1)", every,
                            dtype=ScalarType.INT64)
        chosen = list(out)
        chosen[axis] = last.at(out)
        return graph.define(x.shape, out, "=", f"{last.at(out)} >= 0 ? {updates.at(chosen)} : {x.at(out)}",
                            loops(out, x.shape), dtype=x.dtype)
    result = graph.define(x.shape, out, "=", x.at(out), loops(out, x.shape), dtype=x.dtype)
    identity = {"add": literal(0, x.dtype), "max": lowest(x.dtype), "min": highest(x.dtype)}[reduce]
    return graph.define(x.shape, out, f"{_SCATTER[reduce]}=", f"{position} == {out[axis]} ? {updates.at(source)} : "
                        f"{identity}", every, target=result)


def scatter_add(x, indices, updates, axis: int = 0, **kwargs):
    """``scatter_reduce(x, indices, updates, axis, "add")`` (PTIR's ScatterAdd in the same-rank
    form; XLA-style dimension numbers are not supported)."""
    return scatter_reduce(x, indices, updates, axis, "add", **kwargs)


def _starts(op: str, x: Value, start: Value, sizes) -> list[str]:
    """``where`` lets naming each clamped start: ``min(max(start[d], 0), extent - size)``."""
    _indices(op, start, "start")
    if start.rank != 1 or not same_dim(start.shape[0], x.rank):
        raise TCOpError(f"{op}: start must have shape ({x.rank},) (one start per axis of x), got "
                        f"{shape_text(start.shape)}")
    lets, corner = [], []
    for d, (size, extent) in enumerate(zip(sizes, x.shape)):
        if isinstance(extent, int) and size > extent:
            raise TCOpError(f"{op}: sizes[{d}] must be <= x's extent {extent}, got {size}")
        lets.append(f"c{d} = min(max(int64({start.name}({d})), 0), {dim_text(extent)} - {size})")
        corner.append(str(size - 1))
    if any(not isinstance(e, int) for e in x.shape) and all(size > 0 for size in sizes):
        # reading x at the window's far corner is a size precondition: a call whose extents
        # are smaller than the window raises TCPreconditionError before anything runs
        x.graph.define((), [], "=", x.at(corner), (), dtype=x.dtype)
    return lets


@operation("x", "start")
def dynamic_slice(x, start, sizes) -> Value:
    """The window of ``sizes`` at run-time ``start`` (a si32/si64 vector, one per axis); each
    start is clamped into ``[0, extent - size]``."""
    sizes = ints_of(sizes, x.rank, "dynamic_slice", "sizes")
    lets = _starts("dynamic_slice", x, start, sizes)
    out = index_vars(x.rank)
    read = [f"{v} + c{d}" for d, v in enumerate(out)]
    return x.graph.define(sizes, out, "=", x.at(read), loops(out, sizes), lets, dtype=x.dtype)


@operation("x", "update", "start")
def dynamic_update_slice(x, update, start) -> Value:
    """``x`` with the window at run-time ``start`` (clamped as in :func:`dynamic_slice`)
    overwritten by ``update``."""
    check_same("dynamic_update_slice", [x, update], ["x", "update"], shape=False)
    if update.rank != x.rank:
        raise TCOpError(f"dynamic_update_slice: update must have x's rank {x.rank}, got {shape_text(update.shape)}")
    sizes = [d if isinstance(d, int) else None for d in update.shape]
    if None in sizes:
        raise TCOpError(f"dynamic_update_slice: update must have a concrete shape, got {shape_text(update.shape)}")
    lets = _starts("dynamic_update_slice", x, start, sizes)
    out = index_vars(x.rank)
    inside = " && ".join(f"{v} >= c{d} && {v} < c{d} + {n}" for d, (v, n) in enumerate(zip(out, sizes)))
    read = [f"{v} - c{d}" for d, v in enumerate(out)]
    text = f"({inside}) ? {update.at(read)} : {x.at(out)}" if out else update.at([])
    return x.graph.define(x.shape, out, "=", text, loops(out, x.shape), lets, dtype=x.dtype)


@operation("x", "segment_ids")
def segment_reduce(x, segment_ids, num_segments: int, kind: str = "sum") -> Value:
    """Rows of ``x`` (axis 0) reduced into ``num_segments`` buckets by ``segment_ids`` (si32/si64,
    one per row), like TensorFlow's ``unsorted_segment_sum/max/min``: output shape
    ``(num_segments,) + x.shape[1:]``; an empty segment holds the identity and rows whose id is
    outside ``[0, num_segments)`` are dropped. Each bucket scans every row: O(num_segments x rows)."""
    from .reduction import _kind
    _kind(kind, x, "segment_reduce")
    _indices("segment_reduce", segment_ids, "segment_ids")
    if x.rank == 0 or segment_ids.rank != 1 or not same_dim(segment_ids.shape[0], x.shape[0]):
        raise TCOpError(f"segment_reduce: segment_ids must have shape ({x.shape[0] if x.rank else '?'},) (one id per "
                        f"row of x {shape_text(x.shape)}), got {shape_text(segment_ids.shape)}")
    if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
        raise TCOpError(f"segment_reduce: num_segments must be an int >= 1, got {num_segments!r}")
    rest = index_vars(x.rank - 1)
    identity = {"sum": literal(0, x.dtype), "max": lowest(x.dtype), "min": highest(x.dtype)}[kind]
    text = f"{segment_ids.at(['n'])} == s ? {x.at(['n'] + rest)} : {identity}"
    shape = [num_segments] + list(x.shape[1:])
    op = {"sum": "+", "max": "max", "min": "min"}[kind]
    return x.graph.define(shape, ["s"] + rest, f"{op}=!", text,
                          [Loop("s", num_segments)] + loops(rest, x.shape[1:]) + [Loop("n", x.shape[0])],
                          dtype=x.dtype)
