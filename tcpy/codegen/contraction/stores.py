"""Stores of a micro-kernel's accumulators: whole tiles as vectors (non-temporal when nothing
reads them back), partial tiles element by element through a spill, split-K partial sums into
a dense tile; the epilogue is called on each output row once its values are final."""
from __future__ import annotations

from typing import Optional

from ..cwriter import CWriter
from .context import Context


def contiguous_tile(ctx: Context, all_rows: bool = True) -> Optional[str]:
    """The C condition under which a whole tile's rows (with ``all_rows=False``: its rows'
    whole width) are contiguous in the output (N's innermost groups are contiguous in it and
    the tile does not cross to the next run), or None."""
    mr, nr = ctx.plan.mr, ctx.plan.nr
    run = output_run(ctx)
    if run is None:
        return None
    whole = f"mr == {mr} && nr == {nr}" if all_rows else f"nr == {nr}"
    return whole if run == ctx.N else f"{whole} && j % {run} + {nr} <= {run}"


def output_run(ctx: Context) -> Optional[int]:
    """The output's run along N: how many consecutive N indices (from a multiple of it) are
    contiguous in the output (N's inner groups that follow each other in it: an image's rows,
    which a guard keeps apart as groups, are one run), or None when N's innermost group is not
    contiguous."""
    groups = ctx.con.n
    if not groups or groups[-1].c != 1:
        return None
    run, outer = groups[-1].extent, len(groups) - 1
    while outer > 0 and groups[outer - 1].c == run:
        outer -= 1
        run *= groups[outer].extent
    return run


def prefetch_c(ctx: Context, w: CWriter, depth: int):
    """Start loading the output tile's rows while the rank-1 updates run."""
    if contiguous_tile(ctx) is None or ctx.nontemporal:
        return
    w(f"for (int64_t r = 0; r < mr; r++) {{ {ctx.T} *q = cb + {ctx.prefix}_off_c_m(i + r) + {ctx.prefix}_off_c_n(j); "
      f"__builtin_prefetch(q, 1, 3); __builtin_prefetch(q + nr - 1, 1, 3); }}", depth)


def whole_tile(ctx: Context, w: CWriter, depth: int, row, first: str, scale: str, nontemporal: bool = False):
    """Vector stores of a whole tile: row r at ``row(r)`` is set (when ``first``) or added to;
    ``nontemporal``: set with non-temporal stores when every row is vector-aligned."""
    p, nv, L = ctx.prefix, ctx.plan.nr_vectors, ctx.plan.lanes
    w(f"if ({first}) {{", depth)
    if nontemporal:
        rows = " | ".join(f"(uintptr_t){row(r)}" for r in range(ctx.plan.mr))
        vb = L * ctx.con.dtype.bits // 8
        w(f"if ((({rows}) & {vb - 1}) == 0) {{", depth + 1)
        for r in range(ctx.plan.mr):
            w(" ".join(f"tcpy_store_nt{vb}({row(r)} + {v * L}, (tcpy_nt{vb})({scale}c{r}_{v}));"
                       for v in range(nv)), depth + 2)
        w("} else {", depth + 1)
    inner = depth + 1 + nontemporal
    for r in range(ctx.plan.mr):
        w(" ".join(f"*({p}_vu *)({row(r)} + {v * L}) = {scale}c{r}_{v};" for v in range(nv)), inner)
    if nontemporal:
        w("}", depth + 1)
    w("} else {", depth)
    for r in range(ctx.plan.mr):
        w(" ".join(f"*({p}_vu *)({row(r)} + {v * L}) += {scale}c{r}_{v};" for v in range(nv)), depth + 1)
    w("}", depth)


def tile_row(ctx: Context, w: CWriter, depth: int, r: int, row: str, first: str, scale: str):
    """Vector stores of the accumulators of row ``r`` at ``row``: set (when ``first``) or added to."""
    p, nv, L = ctx.prefix, ctx.plan.nr_vectors, ctx.plan.lanes
    w(f"if ({first}) {{ " + " ".join(f"*({p}_vu *)({row} + {v * L}) = {scale}c{r}_{v};" for v in range(nv))
      + " } else { " + " ".join(f"*({p}_vu *)({row} + {v * L}) += {scale}c{r}_{v};" for v in range(nv)) + " }",
      depth)


def spill(ctx: Context, w: CWriter, depth: int):
    """The accumulators into ``t[mr][nr]``, for the element-wise store of a partial tile."""
    mr, nr, nv, L = ctx.plan.mr, ctx.plan.nr, ctx.plan.nr_vectors, ctx.plan.lanes
    # on lines of its own, and aligned for the vector stores below
    align = max(ctx.plan.cache_line, ctx.plan.lanes * ctx.element_bytes)
    w(f"{ctx.T} t[{mr}][{nr}] __attribute__((aligned({align})));", depth)
    for r in range(mr):
        w(" ".join(f"*({ctx.prefix}_v *)&t[{r}][{v * L}] = c{r}_{v};" for v in range(nv)), depth)


def store_c(ctx: Context, w: CWriter, overwrite: str, depth: int):
    """Store the accumulators at rows i.., columns j.. of the output (``cb`` is its batch
    base): whole tiles with vector stores when the output's N is contiguous."""
    mr, nr = ctx.plan.mr, ctx.plan.nr
    p, T, epi = ctx.prefix, ctx.T, ctx.epilogue
    contiguous = contiguous_tile(ctx)
    if contiguous is not None:
        w(f"if ({contiguous}) {{", depth)
        for r in range(mr):
            w(f"{T} *q{r} = cb + {p}_off_c_m(i + {r}) + {p}_off_c_n(j);", depth + 1)
        whole_tile(ctx, w, depth + 1, lambda r: f"q{r}", overwrite, "alpha * ", ctx.nontemporal)
        if epi:  # the rows are contiguous and final: the epilogue reads them in place
            w("if (last) {", depth + 1)
            for r in range(mr):
                w(f"{epi}(tcpy_buffers, bi, i + {r}, j, {nr}, q{r});", depth + 2)
            w("}", depth + 1)
        w("return;", depth + 1)
        w("}", depth)
        # a tile of fewer rows (M's last), whole width: each row's vectors, no spill
        w(f"if ({contiguous_tile(ctx, all_rows=False)}) {{", depth)
        for r in range(mr - 1):
            w(f"if (mr > {r}) {{", depth + 1)
            w(f"{T} *q = cb + {p}_off_c_m(i + {r}) + {p}_off_c_n(j);", depth + 2)
            tile_row(ctx, w, depth + 2, r, "q", overwrite, "alpha * ")
            if epi:
                w(f"if (last) {epi}(tcpy_buffers, bi, i + {r}, j, {nr}, q);", depth + 2)
            w("}", depth + 1)
        w("return;", depth + 1)
        w("}", depth)
    spill(ctx, w, depth)
    run = output_run(ctx)
    if run is not None:
        _store_runs(ctx, w, overwrite, depth, run)
        return
    w(f"int64_t co[{nr}];  /* the columns' offsets, once for all rows */", depth)
    w(f"for (int64_t c = 0; c < nr; c++) co[c] = {p}_off_c_n(j + c);", depth)
    w("for (int64_t r = 0; r < mr; r++) {", depth)
    w(f"{T} *q = cb + {p}_off_c_m(i + r);", depth + 1)
    if epi:
        w(f"{T} row[{nr}];", depth + 1)
    w("for (int64_t c = 0; c < nr; c++) {", depth + 1)
    w(f"{T} *e = q + co[c];", depth + 2)
    w(f"*e = {overwrite} ? alpha * t[r][c] : *e + alpha * t[r][c];", depth + 2)
    if epi:
        w("row[c] = *e;", depth + 2)
    w("}", depth + 1)
    if epi:
        w(f"if (last) {epi}(tcpy_buffers, bi, i + r, j, nr, row);", depth + 1)
    w("}", depth)


def _store_runs(ctx: Context, w: CWriter, overwrite: str, depth: int, run: int):
    """The spilled tile ``t`` into the output, each row as the stretches of its columns that
    are contiguous there (``run`` consecutive N indices): one offset per stretch and copies that
    gcc vectorises, where a partial tile (N's last, or a tile crossing from one image row or
    batch index to the next) took an offset and a branch per element (ResNet's last 3x3 layer,
    whose 49 or 25 pixels per image fill no tile, spent up to a quarter of its time there)."""
    p, T, nr, epi = ctx.prefix, ctx.T, ctx.plan.nr, ctx.epilogue
    w(f"int64_t at[{nr}], len[{nr}], off[{nr}], stretches = 0;  /* the contiguous stretches of columns */", depth)
    w("for (int64_t c = 0; c < nr; c += len[stretches++]) {", depth)
    w(f"at[stretches] = c; off[stretches] = {p}_off_c_n(j + c);", depth + 1)
    w(f"len[stretches] = tcpy_min_int64(nr - c, {run} - (j + c) % {run});", depth + 1)
    w("}", depth)
    w("for (int64_t r = 0; r < mr; r++) {", depth)
    w(f"{T} *q = cb + {p}_off_c_m(i + r);", depth + 1)
    w("for (int64_t s = 0; s < stretches; s++) {", depth + 1)
    w(f"{T} *TCPY_RESTRICT e = q + off[s]; const {T} *v = &t[r][at[s]];", depth + 2)
    w(f"if ({overwrite}) for (int64_t c = 0; c < len[s]; c++) e[c] = alpha * v[c];", depth + 2)
    w("else for (int64_t c = 0; c < len[s]; c++) e[c] += alpha * v[c];", depth + 2)
    w("}", depth + 1)
    if epi:  # the row's final values, side by side
        w(f"{T} row[{nr}];", depth + 1)
        w("for (int64_t s = 0; s < stretches; s++) for (int64_t c = 0; c < len[s]; c++) "
          "row[at[s] + c] = q[off[s] + c];", depth + 1)
        w(f"if (last) {epi}(tcpy_buffers, bi, i + r, j, nr, row);", depth + 1)
    w("}", depth)


def store_partial(ctx: Context, w: CWriter, depth: int):
    """Store the accumulators into a dense partial-sum tile ``pp`` (row stride ``ldp``)."""
    mr, nr = ctx.plan.mr, ctx.plan.nr
    w(f"if (mr == {mr} && nr == {nr}) {{", depth)
    whole_tile(ctx, w, depth + 1, lambda r: f"pp + {r} * ldp", "first", "")
    w("return;", depth + 1)
    w("}", depth)
    spill(ctx, w, depth)
    w("for (int64_t r = 0; r < mr; r++)", depth)
    w("for (int64_t c = 0; c < nr; c++)", depth + 1)
    w("pp[r * ldp + c] = first ? t[r][c] : pp[r * ldp + c] + t[r][c];", depth + 2)
