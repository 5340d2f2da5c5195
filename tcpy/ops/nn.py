"""PTIR's fused and canonical library forms: ``layer_norm``, stable ``softmax`` and ``attention``.

They are built from the other operations inside the caller's graph, so a composition that uses
them (a transformer block) is still one def for the fusion pass.
"""
from __future__ import annotations

from typing import Optional

from ..errors import TCOpError
from ..lang.types import ScalarType, accumulator_type
from ..lang.writer import cast
from .core import (Loop, Value, axis_of, check_kind, check_same, dim_text, dtype_of, index_vars, literal, operation,
                   same_dim, shape_text)
from .reduction import dot_general, reduce


@operation("x", "gamma", "beta")
def layer_norm(x, gamma, beta, epsilon: float = 1e-5, feature_axis: int = -1) -> Value:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` with the mean and (biased) variance over
    ``feature_axis``; ``gamma`` and ``beta`` have shape ``[feature]``. Statistics in float32 for
    f16 input, the result in x's dtype."""
    check_kind("layer_norm", x, "x", ("float",))
    check_same("layer_norm", [x, gamma, beta], ["x", "gamma", "beta"], shape=False)
    axis = axis_of(feature_axis, x.rank, "layer_norm", "feature_axis")
    feature = x.shape[axis]
    for name, value in (("gamma", gamma), ("beta", beta)):
        if value.rank != 1 or not same_dim(value.shape[0], feature):
            raise TCOpError(f"layer_norm: {name} must have shape ({feature},) (the feature axis {axis} of x "
                            f"{shape_text(x.shape)}), got {shape_text(value.shape)}")
    if not isinstance(epsilon, (int, float)) or isinstance(epsilon, bool) or epsilon < 0:
        raise TCOpError(f"layer_norm: epsilon must be a number >= 0, got {epsilon!r}")
    graph, acc = x.graph, accumulator_type(x.dtype)
    rows = [f"i{d}" for d in range(x.rank) if d != axis]
    row_loops = [Loop(f"i{d}", e) for d, e in enumerate(x.shape) if d != axis]
    row_shape = [lp.extent for lp in row_loops]
    every = [Loop(f"i{d}" if d != axis else "f", e) for d, e in enumerate(x.shape)]
    value = cast(x.at([f"i{d}" if d != axis else "f" for d in range(x.rank)]), acc, x.dtype)
    count = cast(dim_text(feature), acc)
    total = graph.define(row_shape, rows, "+=!", value, every, dtype=acc)
    mean = graph.define(row_shape, rows, "=", f"{total.at(rows)} / {count}", row_loops, dtype=acc)
    centred = f"({value} - {mean.at(rows)})"
    square = graph.define(row_shape, rows, "+=!", f"{centred} * {centred}", every, dtype=acc)
    scale = graph.define(row_shape, rows, "=", f"rsqrt({square.at(rows)} / {count} + {literal(epsilon, acc)})",
                         row_loops, dtype=acc)
    affine = (f"{centred} * {scale.at(rows)} * {cast(gamma.at(['f']), acc, gamma.dtype)} + "
              f"{cast(beta.at(['f']), acc, beta.dtype)}")
    out = [f"i{d}" if d != axis else "f" for d in range(x.rank)]
    return graph.define(x.shape, out, "=", cast(affine, x.dtype, acc), every, dtype=x.dtype)


@operation("x")
def softmax(x, axis: int = -1, out_dtype=None) -> Value:
    """PTIR's stable softmax along ``axis``: ``e = exp(x - max)``, ``e / sum(e)``, computed in
    float32 for f16 input; the result in ``out_dtype`` (default x's dtype)."""
    check_kind("softmax", x, "x", ("float",))
    axis = axis_of(axis, x.rank, "softmax")
    acc = accumulator_type(x.dtype)
    out_dtype = x.dtype if out_dtype is None else dtype_of(out_dtype, "out_dtype")
    graph = x.graph
    peak = reduce(x, "max", axis, keepdims=True, accum_dtype=acc, out_dtype=acc)
    full = index_vars(x.rank)
    row = [v if d != axis else "0" for d, v in enumerate(full)]
    every = [Loop(v, e) for v, e in zip(full, x.shape)]
    exps = graph.define(x.shape, full, "=", f"exp({cast(x.at(full), acc, x.dtype)} - {peak.at(row)})", every,
                        dtype=acc)
    total = reduce(exps, "sum", axis, keepdims=True)
    return graph.define(x.shape, full, "=", cast(f"{exps.at(full)} / {total.at(row)}", out_dtype, acc), every,
                        dtype=out_dtype)


@operation("q", "k", "v")
def attention(q, k, v, scale: Optional[float] = None) -> Value:
    """PTIR's canonical attention for ``q, k, v`` of shape ``[..., S, D]`` (leading axes are batch
    axes): ``softmax(q k^T * scale) v`` with scores in float32 (``scale`` defaults to
    ``1 / sqrt(D)``); the result in q's dtype."""
    check_same("attention", [q, k, v], ["q", "k", "v"], shape=False)
    check_kind("attention", q, "q", ("float",))
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise TCOpError(f"attention: q, k, v must have one rank >= 2, got {shape_text(q.shape)}, "
                        f"{shape_text(k.shape)}, {shape_text(v.shape)}")
    batch = list(range(q.rank - 2))
    last = q.rank - 1
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TCOpError(f"attention: scale must be a number, got {scale!r}")
    if scale is None:
        depth = q.shape[-1]
        if not isinstance(depth, int):
            raise TCOpError(f"attention: scale must be given when the depth is symbolic ({depth})")
        scale = depth ** -0.5
    acc = ScalarType.FLOAT32 if q.dtype is not ScalarType.FLOAT64 else q.dtype
    scores = dot_general(q, k, contracting=([last], [last]), batch=(batch, batch), accum_dtype=acc, out_dtype=acc)
    full = index_vars(scores.rank)
    scaled = q.graph.define(scores.shape, full, "=", f"{scores.at(full)} * {literal(scale, acc)}",
                            [Loop(i, e) for i, e in zip(full, scores.shape)], dtype=acc)
    weights = softmax(scaled, axis=-1)
    if v.dtype is not acc:
        weights = q.graph.define(weights.shape, full, "=", cast(weights.at(full), v.dtype, acc),
                                 [Loop(i, e) for i, e in zip(full, weights.shape)], dtype=v.dtype)
    return dot_general(weights, v, contracting=([last], [last - 1]), batch=(batch, batch), out_dtype=q.dtype)
