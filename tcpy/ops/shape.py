"""Shape and layout operations: reshape, transpose, broadcast_to, slice, concat, pad, tile, iota.

Each is one comprehension whose index expressions say where an output element comes from, so
inside :func:`~tcpy.ops.compose` the compiler sees through them (no copy needs to survive).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..errors import TCOpError
from ..lang.writer import cast
from .core import (Value, _dim, active_graph, axis_of, check_same, concrete, dim_text, dtype_of, index_vars, ints_of,
                   literal, loops, operation, same_dim, shape_text)


@operation("x")
def reshape(x, new_shape) -> Value:
    """``x`` with another shape and the same row-major element order. One entry of ``new_shape``
    may be -1 (inferred). Needs concrete sizes (the index maps divide by them)."""
    in_shape = [concrete(d, "reshape", f"x.shape[{k}]") for k, d in enumerate(x.shape)]
    if isinstance(new_shape, int):
        new_shape = (new_shape,)
    shape = ints_of(new_shape, None, "reshape", "new_shape", minimum=-1)
    count = math.prod(in_shape)
    if shape.count(-1) > 1:
        raise TCOpError(f"reshape: new_shape may infer one dimension (-1), got {list(shape)}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or count % known:
            raise TCOpError(f"reshape: cannot infer the -1 of {list(shape)} for {count} elements")
        shape = tuple(count // known if d == -1 else d for d in shape)
    if math.prod(shape) != count:
        raise TCOpError(f"reshape: new_shape {list(shape)} has {math.prod(shape)} elements, x {shape_text(x.shape)} "
                        f"has {count}")
    out = index_vars(len(shape))
    read = []
    for ins, outs in _groups(in_shape, shape):
        # the flat position within a group of axes: splitting an axis reads `i1 * 16 + i2`,
        # merging two reads `i1 / 16` and `i1 % 16` (no division where no axis is cut)
        flat = " + ".join(f"{out[k]} * {math.prod(shape[k + 1:outs[-1] + 1])}" if k != outs[-1] else out[k]
                          for k in outs) or "0"
        grouped = f"({flat})" if " " in flat else flat
        for n, k in enumerate(ins):
            stride = math.prod(in_shape[k + 1:ins[-1] + 1])
            index = (flat if len(ins) == 1 else grouped) if stride == 1 else f"{grouped} / {stride}"
            read.append(index if n == 0 else f"{index} % {in_shape[k]}")
    return x.graph.define(shape, out, "=", x.at(read), loops(out, shape), dtype=x.dtype)


def _groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """(input axes, output axes) of the shortest runs of axes with equal element counts."""
    if 0 in in_shape:  # nothing is read: one group
        return [(list(range(len(in_shape))), list(range(len(out_shape))))]
    groups, ins, outs = [], [], []
    a = b = 0
    counts = [1, 1]
    while a < len(in_shape) or b < len(out_shape):
        if b == len(out_shape) or (a < len(in_shape) and counts[0] <= counts[1]):
            counts[0] *= in_shape[a]
            ins.append(a)
            a += 1
        else:
            counts[1] *= out_shape[b]
            outs.append(b)
            b += 1
        if counts[0] == counts[1]:
            groups.append((ins, outs))
            ins, outs, counts = [], [], [1, 1]
    return groups


@operation("x")
def transpose(x, perm) -> Value:
    """Permute axes: output axis ``j`` is ``x``'s axis ``perm[j]`` (a permutation of ``0..rank-1``,
    negative entries counting from the end)."""
    if not isinstance(perm, Sequence) or len(perm) != x.rank:
        raise TCOpError(f"transpose: perm must be a permutation of {list(range(x.rank))}, got {perm!r}")
    perm = [axis_of(p, x.rank, "transpose", "perm entry") for p in perm]
    if sorted(perm) != list(range(x.rank)):
        raise TCOpError(f"transpose: perm must be a permutation of {list(range(x.rank))}, got {perm}")
    out = index_vars(x.rank)
    read = [""] * x.rank
    for j, p in enumerate(perm):
        read[p] = out[j]
    shape = [x.shape[p] for p in perm]
    return x.graph.define(shape, out, "=", x.at(read), loops(out, shape), dtype=x.dtype)


@operation("x")
def broadcast_to(x, shape) -> Value:
    """``x`` repeated along axes where it has size 1 (and new leading axes), to ``shape``:
    right-aligned, each dim equal or 1 (PTIR's only broadcasting operation)."""
    if isinstance(shape, (int, str)):
        shape = (shape,)
    if not isinstance(shape, Sequence):
        raise TCOpError(f"broadcast_to: shape must be a tuple of sizes (ints or size names), got {shape!r}")
    shape = [_dim(d, f"broadcast_to: shape[{k}]") for k, d in enumerate(shape)]
    if len(shape) < x.rank:
        raise TCOpError(f"broadcast_to: the result rank ({len(shape)}) must be at least x's ({x.rank}); "
                        f"x {shape_text(x.shape)} to {shape_text(shape)}")
    out = index_vars(len(shape))
    lead = len(shape) - x.rank
    read = []
    for k, d in enumerate(x.shape):
        target = shape[lead + k]
        if same_dim(d, target):
            read.append(out[lead + k])
        elif d == 1:
            read.append("0")
        else:
            raise TCOpError(f"broadcast_to: x {shape_text(x.shape)} cannot broadcast to {shape_text(shape)}: "
                            f"axis {k} has {d}, expected 1 or {target}")
    return x.graph.define(shape, out, "=", x.at(read), loops(out, shape), dtype=x.dtype)


@operation("x")
def slice(x, starts, sizes) -> Value:  # noqa: A001 (PTIR's name)
    """The window ``x[starts[i] : starts[i] + sizes[i]]`` on every axis (unit stride)."""
    starts = ints_of(starts, x.rank, "slice", "starts")
    sizes = ints_of(sizes, x.rank, "slice", "sizes")
    for k, (s, n, d) in enumerate(zip(starts, sizes, x.shape)):
        if isinstance(d, int) and s + n > d:
            raise TCOpError(f"slice: axis {k}: starts + sizes must be <= the extent {d}, got {s} + {n}")
    out = index_vars(x.rank)
    read = [f"{v} + {s}" if s else v for v, s in zip(out, starts)]
    return x.graph.define(sizes, out, "=", x.at(read), loops(out, sizes), dtype=x.dtype)


@operation("*xs")
def concat(xs, axis: int = 0) -> Value:
    """``xs`` (one or more tensors of one dtype) joined along ``axis``; other axes must agree."""
    first = xs[0]
    if first.rank == 0:
        raise TCOpError("concat: operands must have rank >= 1, got rank 0")
    axis = axis_of(axis, first.rank, "concat")
    for k, x in enumerate(xs[1:], 1):
        check_same("concat", [first, x], ["xs[0]", f"xs[{k}]"], shape=False)
        if x.rank != first.rank or not all(same_dim(a, b) for d, (a, b) in enumerate(zip(x.shape, first.shape))
                                           if d != axis):
            raise TCOpError(f"concat: xs[{k}] {shape_text(x.shape)} must match xs[0] {shape_text(first.shape)} on "
                            f"every axis but {axis}")
    out = index_vars(first.rank)
    offset, offsets, text = 0, [], None
    for x in xs:
        offsets.append(offset)
        offset = offset + x.shape[axis]
    for x, start in zip(reversed(xs), reversed(offsets)):  # nested from the last operand outwards
        read = list(out)
        if start != 0:
            read[axis] = f"{out[axis]} - ({dim_text(start)})"
        branch = x.at(read)
        text = branch if text is None else f"{out[axis]} < {dim_text(start + x.shape[axis])} ? {branch} : {text}"
    shape = list(first.shape)
    shape[axis] = offset
    return first.graph.define(shape, out, "=", text, loops(out, shape), dtype=first.dtype)


@operation("x")
def pad(x, low, high, interior=None, pad_value=0) -> Value:
    """``x`` padded with ``pad_value``: ``low``/``high`` elements before/after each axis and
    ``interior`` between neighbours. Output extent: ``low + in + high + max(in - 1, 0) * interior``.
    An axis with interior padding needs a concrete extent."""
    low = ints_of(low, x.rank, "pad", "low")
    high = ints_of(high, x.rank, "pad", "high")
    interior = (0,) * x.rank if interior is None else ints_of(interior, x.rank, "pad", "interior")
    if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
        raise TCOpError(f"pad: pad_value must be a number, got {pad_value!r}")
    out = index_vars(x.rank)
    inside, on_grid, read, shape = [], [], [], []
    for k, (v, lo, hi, gap, extent) in enumerate(zip(out, low, high, interior, x.shape)):
        if gap:
            extent = concrete(extent, "pad", f"axis {k} (interior padding)")
            step = gap + 1
            last = lo + (extent - 1) * step
            inside.append(f"{v} >= {lo} && {v} <= {last}")
            on_grid.append(f"({v} - {lo}) % {step} == 0")
            read.append(f"({v} - {lo}) / {step}")
            shape.append(lo + hi + extent + max(extent - 1, 0) * gap)
        else:
            if lo or hi:
                inside.append(f"{v} >= {lo} && {v} < {dim_text(extent + lo)}")
            read.append(f"{v} - {lo}" if lo else v)
            shape.append(extent + lo + hi)
    fill = literal(pad_value, x.dtype)
    text = x.at(read)
    # the affine bounds guard the read for range inference; the grid test (a modulo) is inside them
    if on_grid:
        text = f"({' && '.join(on_grid)}) ? {text} : {fill}"
    if inside:
        text = f"({' && '.join(inside)}) ? {text} : {fill}"
    return x.graph.define(shape, out, "=", text, loops(out, shape), dtype=x.dtype)


@operation("x")
def tile(x, repeats) -> Value:
    """``x`` repeated ``repeats[i]`` times along each axis ``i``."""
    repeats = ints_of(repeats, x.rank, "tile", "repeats")
    out = index_vars(x.rank)
    read = [v if r == 1 else f"{v} % {dim_text(d)}" for v, r, d in zip(out, repeats, x.shape)]
    shape = [d * r for d, r in zip(x.shape, repeats)]
    return x.graph.define(shape, out, "=", x.at(read), loops(out, shape), dtype=x.dtype)


@operation()
def iota(shape, dtype="si64", axis: int = 0) -> Value:
    """A tensor of ``shape`` (concrete sizes) whose values count ``0, 1, ...`` along ``axis``."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = ints_of(shape, None, "iota", "shape")
    to = dtype_of(dtype)
    axis = axis_of(axis, len(shape), "iota")
    out = index_vars(len(shape))
    return active_graph("iota").define(shape, out, "=", cast(out[axis], to), loops(out, shape), dtype=to)
