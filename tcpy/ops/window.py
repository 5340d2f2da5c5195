"""Windowed operations: ``reduce_window`` (pooling) and ``extract_patches`` (im2col).

Windowed axes need concrete extents (the output extent divides by the stride). Padding is
guarded: a padded position contributes the reduction's identity (or ``pad_value``), and no read
leaves the input.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import TCOpError
from ..lang.writer import cast, highest, lowest
from .core import Loop, Value, concrete, index_vars, ints_of, literal, loops, operation, shape_text
from .reduction import _kind, accum_and_out, accumulate


def _window_attrs(op: str, rank: int, window, strides, padding, dilation):
    window = ints_of(window, rank, op, "window", minimum=1)
    strides = (1,) * rank if strides is None else ints_of(strides, rank, op, "strides", minimum=1)
    dilation = (1,) * rank if dilation is None else ints_of(dilation, rank, op, "dilation", minimum=1)
    if padding is None:
        padding = ((0, 0),) * rank
    if not isinstance(padding, Sequence) or len(padding) != rank or \
            not all(isinstance(p, Sequence) and len(p) == 2 for p in padding):
        raise TCOpError(f"{op}: padding must be {rank} (low, high) pairs, got {padding!r}")
    padding = tuple(ints_of(p, 2, op, f"padding[{k}]") for k, p in enumerate(padding))
    return window, strides, padding, dilation


def _window_axis(op: str, k: int, extent, w: int, s: int, pad, d: int, out: str, tap: str):
    """(output extent, read index, guard or None) of one windowed axis."""
    if (w, s, d, pad) == (1, 1, 1, (0, 0)):
        return extent, out, None
    extent = concrete(extent, op, f"axis {k} (windowed)")
    span = (w - 1) * d + 1
    padded = extent + pad[0] + pad[1]
    if padded < span:
        raise TCOpError(f"{op}: axis {k}: the window spans {span} elements but the padded extent is {padded}")
    count = (padded - span) // s + 1
    index = " + ".join(t for t in (f"{out} * {s}" if s != 1 else out, f"{tap} * {d}" if d != 1 else tap) if t)
    if pad[0]:
        index = f"{index} - {pad[0]}"
    guard = f"{index} >= 0 && {index} < {extent}" if pad != (0, 0) else None
    return count, index, guard


@operation("x")
def reduce_window(x, kind: str, window, strides=None, padding=None, dilation=None, accum_dtype=None,
                  out_dtype=None) -> Value:
    """Sliding-window ``sum``, ``max`` or ``min`` (pooling): ``window``, ``strides`` and
    ``dilation`` give one int per axis of ``x`` (1 leaves an axis alone), ``padding`` one
    ``(low, high)`` pair per axis; padded positions hold the identity. Accumulates like
    :func:`~tcpy.ops.reduce`."""
    _kind(kind, x, "reduce_window")
    window, strides, padding, dilation = _window_attrs("reduce_window", x.rank, window, strides, padding, dilation)
    accum, out_dtype = accum_and_out(x, accum_dtype, out_dtype)
    out = index_vars(x.rank)
    shape, read, guards, taps = [], [], [], []
    for k, (extent, w, s, pad, d) in enumerate(zip(x.shape, window, strides, padding, dilation)):
        tap = f"w{k}" if w > 1 else "0"
        count, index, guard = _window_axis("reduce_window", k, extent, w, s, pad, d, out[k], tap if w > 1 else "")
        shape.append(count)
        read.append(index)
        if guard:
            guards.append(guard)
        if w > 1:
            taps.append(Loop(tap, w))
    identity = {"sum": literal(0, accum), "max": lowest(accum), "min": highest(accum)}[kind]
    term = cast(x.at(read), accum, x.dtype)
    term_dtype = accum
    if guards:
        term = f"({' && '.join(guards)}) ? {term} : {identity}"
    if not taps:  # a window of one element: the value itself
        taps = [Loop("w", 1)]
    return accumulate(x.graph, shape, out, loops(out, shape), kind, term, term_dtype, taps, accum, out_dtype)


@operation("x")
def extract_patches(x, window, strides=None, padding=None, dilation=None, pad_value=0) -> Value:
    """Sliding windows of a channels-last ``x[N, spatial..., C]`` laid out as
    ``[N, out_spatial..., prod(window) * C]`` (im2col; the last axis runs over window positions,
    then channels, row-major). ``window``/``strides``/``dilation`` give one int and ``padding``
    one ``(low, high)`` pair per spatial axis; padded positions hold ``pad_value``. Spatial and
    channel extents must be concrete."""
    if x.rank < 3:
        raise TCOpError(f"extract_patches: x must be [N, spatial..., C] (rank >= 3), got {shape_text(x.shape)}")
    spatial = x.rank - 2
    window, strides, padding, dilation = _window_attrs("extract_patches", spatial, window, strides, padding, dilation)
    channels = concrete(x.shape[-1], "extract_patches", "the channel axis")
    out = index_vars(spatial + 2)
    patch = out[-1]
    shape, read, guards = [x.shape[0]], [out[0]], []
    block = channels
    taps = []
    for k in reversed(range(spatial)):  # tap of axis k: (p / (C * window[k+1:])) % window[k]
        taps.insert(0, f"({patch} / {block}) % {window[k]}" if window[k] > 1 else "")
        block *= window[k]
    for k in range(spatial):
        extent = concrete(x.shape[k + 1], "extract_patches", f"spatial axis {k + 1}")
        count, index, guard = _window_axis("extract_patches", k + 1, extent, window[k], strides[k], padding[k],
                                           dilation[k], out[k + 1], taps[k])
        shape.append(count)
        if guard:
            guards.append(guard)
            # clamped, so the read stays in bounds whatever the guard (a modulo is not affine)
            index = f"min(max({index}, 0), {extent - 1})"
        read.append(index)
    shape.append(block)
    read.append(f"{patch} % {channels}")
    text = x.at(read)
    if guards:
        text = f"({' && '.join(guards)}) ? {text} : {literal(pad_value, x.dtype)}"
    return x.graph.define(shape, out, "=", text, loops(out, shape), dtype=x.dtype)
