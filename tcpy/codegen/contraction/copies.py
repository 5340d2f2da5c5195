"""Copies that packing is made of: a sliver's row (whole vectors, every other element by
shuffles, or element by element), a run's valid interval, and a block transposed in registers."""
from __future__ import annotations

from ..cwriter import CWriter
from .context import Context


def copy_sliver_row(ctx: Context, w: CWriter, dst: str, src: str, width: int, step: int, src_t: str, depth: int):
    """``dst[c] = src[step * c]`` for a whole sliver row (``width`` elements)."""
    p, T, L = ctx.prefix, ctx.T, ctx.plan.lanes
    if step == 1 and src_t == T and width % L == 0 and L >= 2:
        for v in range(width // L):
            w(f"*({p}_vu *)({dst} + {v * L}) = *(const {p}_vu *)({src} + {v * L});", depth)
    elif not copy_every_other(ctx, w, dst, src, width, step, src_t, depth):
        w(f"#pragma GCC unroll {width}", depth)
        w(f"for (int64_t c = 0; c < {width}; c++) ({dst})[c] = ({T})({src})[INT64_C({step}) * c];", depth)


def copy_run(ctx: Context, w: CWriter, dst: str, src: str, width: int, step: int, src_t: str, depth: int) -> bool:
    """``dst[c] = src[step * c]`` for ``lo <= c < hi`` (a run's valid part, at most ``width``)
    by whole vectors (of every other element for step 2: :func:`copy_every_other`), the last
    one overlapping the one before; a run shorter than a vector by one masked copy (step 1)
    or element by element: nothing outside the part is read or written. False (nothing
    written) unless the step is 1 or 2 and the types agree."""
    p, T, L, s = ctx.prefix, ctx.T, ctx.plan.lanes, ctx.element_bytes
    if step not in (1, 2) or src_t != T or s not in (4, 8) or L < 2:
        return False
    w("{", depth)
    w(f"const int64_t n = hi - lo; {T} *TCPY_RESTRICT o = {dst} + lo; "
      f"const {T} *TCPY_RESTRICT i = {src} + {step} * lo;", depth + 1)
    w(f"if (n >= {L}) {{", depth + 1)

    def chunk(at: str, guard: str):  # (no loop: gcc would turn a loop of vector copies into memcpy)
        w(f"if ({guard}) {{", depth + 2)
        if step == 1:
            w(f"*({p}_vu *)(o + {at}) = *(const {p}_vu *)(i + {at});", depth + 3)
        else:
            copy_every_other(ctx, w, f"o + {at}", f"i + 2 * ({at})", L, 2, src_t, depth + 3)
        w("}", depth + 2)

    for v in range(width // L):
        chunk(str(v * L), f"n >= {(v + 1) * L}")
    chunk(f"n - {L}", f"n % {L}")
    w("} else if (n > 0) {", depth + 1)
    if step == 1:
        w(f"tcpy_copy_short{s}(o, i, n);", depth + 2)
    else:
        w("for (int64_t c = 0; c < n; c++) o[c] = i[2 * c];", depth + 2)
    w("}", depth + 1)
    w("}", depth)
    return True


def copy_every_other(ctx: Context, w: CWriter, dst: str, src: str, width: int, step: int, src_t: str,
                     depth: int) -> bool:
    """``dst[c] = src[2 c]`` for ``c < width`` (a stride-2 convolution's row) by whole-vector
    loads and even-lane shuffles instead of one insert per element; the last load ends at the
    last element read (it overlaps the one before), so nothing past the row is touched.
    False (nothing written) unless the step is 2, the types agree and width is whole vectors."""
    p, T, L = ctx.prefix, ctx.T, ctx.plan.lanes
    if step != 2 or src_t != T or width % L or L < 2:
        return False
    loads = 2 * width // L
    w("{", depth)
    for v in range(loads):
        at = v * L - (1 if v == loads - 1 else 0)
        w(f"const {p}_v x{v} = *(const {p}_vu *)({src} + {at});", depth + 1)
    for u in range(width // L):
        last = u == width // L - 1
        mask = ", ".join(str(2 * c + (1 if last and c >= L // 2 else 0)) for c in range(L))
        w(f"*({p}_vu *)({dst} + {u * L}) = __builtin_shuffle(x{2 * u}, x{2 * u + 1}, ({p}_m){{{mask}}});",
          depth + 1)
    w("}", depth)
    return True


def transpose_block(ctx: Context, w: CWriter, depth: int, load, store):
    """A ``lanes`` x ``lanes`` block transposed in registers: vector ``r`` is ``load(r)``
    (a row: one element per column), then log2(lanes) stages each swap the off-diagonal
    blocks of half the size, and column ``l`` is stored at ``store(l)``."""
    p, L = ctx.prefix, ctx.plan.lanes
    w("{", depth)
    depth += 1
    names = []
    for r in range(L):
        names.append(f"x{r}")
        w(f"const {p}_v x{r} = {load(r)};", depth)
    b, stage = L // 2, 0
    while b >= 1:
        stage += 1
        lo = ", ".join(str(j if not j & b else L + j - b) for j in range(L))
        hi = ", ".join(str(j + b if not j & b else L + j) for j in range(L))
        out = list(names)
        for i in range(L):
            if i & b:
                continue
            x, y = names[i], names[i + b]
            out[i], out[i + b] = f"t{stage}_{i}", f"t{stage}_{i + b}"
            w(f"const {p}_v {out[i]} = __builtin_shuffle({x}, {y}, ({p}_m){{{lo}}});", depth)
            w(f"const {p}_v {out[i + b]} = __builtin_shuffle({x}, {y}, ({p}_m){{{hi}}});", depth)
        names, b = out, b // 2
    for l in range(L):
        w(f"*({p}_vu *)({store(l)}) = {names[l]};", depth)
    w("}", depth - 1)


