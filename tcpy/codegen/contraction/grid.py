"""The grid driver: the statement's cells over the plan's thread grid, claimed dynamically, and
the split-K combine of the K cells' partial sums (added in a fixed order, so results do not
depend on the thread count at run time); the dispatch to the plan's path."""
from __future__ import annotations

from ...contraction_ir import Path
from ..cwriter import CWriter, ScratchSlot, dynamic_schedule
from .batch_lanes import batch_lanes
from .context import Context
from .direct import direct
from .exact import exact_fallback, has_exact_fallback
from .packed import packed
from .small import small
from .stream import stream

_PATHS = {Path.PACKED: packed, Path.SMALL: small, Path.STREAM: stream, Path.DIRECT: direct,
          Path.BATCH_LANES: batch_lanes}


def path_helpers(ctx: Context, w: CWriter):
    """The file-scope helpers of the plan's path: its packing, kernels and cell."""
    _PATHS[ctx.plan.path](ctx, w)


def driver(ctx: Context, w: CWriter):
    """The statement's C in the kernel: the cells of the plan's thread grid (batch x M x N x K
    parts) claimed one by one by the threads, then (split K) the partials combined; an operand
    with inf or NaN beside a guarded one, or a rank-0 scale that is inf or NaN, runs the exact
    sums instead (:mod:`.exact`)."""
    T, con, plan = ctx.T, ctx.con, ctx.plan
    tb, tm, tn, tk = plan.grid
    mt, nt = -(-ctx.M // plan.mr), -(-ctx.N // plan.nr)
    cells = tb * tm * tn * tk
    bpart = -(-ctx.batch // tb)
    mpart, npart = -(-mt // tm) * plan.mr, -(-nt // tn) * plan.nr
    part = bpart * mpart * npart
    A, B, C = (ctx.names[x.tensor] for x in (con.a, con.b, con.c))
    w("{")
    w(f"const {T} alpha = {ctx.alpha()};", 1)
    if exact_fallback(ctx, w, A, B, C):
        w("} else {", 1)
    if tk > 1:
        w(f"{T} *partials = ({T} *)tcpy_scratch({ScratchSlot.PARTIALS}, sizeof({T}) * {cells * part});", 1)
    if cells > 1:
        w("int64_t next_cell = 0;  /* the cells are claimed one by one (tcpy_claim) */", 1)
        w(f"const int nt = tcpy_num_threads < {cells} ? tcpy_num_threads : {cells};", 1)
        w("#pragma omp parallel num_threads(nt) if(nt > 1)", 1)
    w("{", 1)
    if cells > 1:
        w("TCPY_TEAM_START();", 2)
        w(f"for (int64_t cell; (cell = tcpy_claim(&next_cell, {cells})) < {cells}; ) {{", 2)
    else:
        w("for (int64_t cell = 0; cell < 1; cell++) {", 2)
    w(f"const int64_t cb = cell / {tm * tn * tk}, cm = cell / {tn * tk} % {tm}, cn = cell / {tk} % {tn}, "
      f"ck = cell % {tk};", 3)
    w(f"const int64_t b0 = cb * {ctx.batch} / {tb}, b1 = (cb + 1) * {ctx.batch} / {tb};", 3)
    w(f"const int64_t m0 = cm * {mt} / {tm} * {plan.mr}, m1 = tcpy_min_int64((cm + 1) * {mt} / {tm} * {plan.mr},"
      f" {ctx.M});", 3)
    w(f"const int64_t n0 = cn * {nt} / {tn} * {plan.nr}, n1 = tcpy_min_int64((cn + 1) * {nt} / {tn} * {plan.nr},"
      f" {ctx.N});", 3)
    w(f"const int64_t k0 = ck * {ctx.K} / {tk}, k1 = (ck + 1) * {ctx.K} / {tk};", 3)
    w("if (b0 >= b1 || m0 >= m1 || n0 >= n1) continue;", 3)
    w("(void)k0; (void)k1;", 3)
    P = f"partials + (int64_t)cell * {part}" if tk > 1 else "0"
    w(f"{cell_call(ctx, A, B, C, 'b0, b1', 'm0, m1', 'n0, n1', 'k0, k1', P, npart, mpart, '0')};", 3)
    w("}", 2)
    w("}", 1)
    if tk > 1:
        combine(ctx, w, mt, nt, bpart, mpart, npart, part)
    if has_exact_fallback(ctx):  # (the else of exact_fallback)
        w("}", 1)
    w("}")


def cell_call(ctx: Context, A, B, C, b, m, n, k, P="0", ldp=0, prows=0, bpre="0") -> str:
    """The call of ``<p>_cell`` on the given ranges (``"lo, hi"`` each); ``bpre``: B packed
    beforehand by ``<p>_prepack`` (0: the cell packs its own)."""
    if ctx.plan.path in (Path.SMALL, Path.DIRECT, Path.BATCH_LANES):
        return f"{ctx.prefix}_cell({A}, {B}, {C}, {b}, {m}, {n}, alpha, tcpy_stop{ctx.cell_args})"
    if ctx.plan.path == Path.STREAM:
        return f"{ctx.prefix}_cell({A}, {B}, {C}, {b}, {m}, {n}, alpha, tcpy_stop, {bpre}{ctx.cell_args})"
    return (f"{ctx.prefix}_cell({A}, {B}, {C}, {P}, {ldp}, {prows}, {b}, {m}, {n}, {k}, alpha, tcpy_stop, {bpre}"
            f"{ctx.cell_args})")


def combine(ctx: Context, w: CWriter, mt, nt, bpart, mpart, npart, part):
    """C (=|+=) alpha * the sum of the K cells' partials, in the order of the K cells."""
    p, T, con, plan = ctx.prefix, ctx.T, ctx.con, ctx.plan
    tb, tm, tn, tk = plan.grid
    groups = tb * tm * tn
    C = ctx.names[con.c.tensor]
    rows = groups * bpart * mpart
    w(f"#pragma omp parallel for num_threads(tcpy_num_threads) {dynamic_schedule(rows, plan.threads)} "
      "if(tcpy_num_threads > 1)", 1)
    w(f"for (int64_t row = 0; row < {rows}; row++) {{", 1)
    w(f"const int64_t g = row / {bpart * mpart}, local = row % {bpart * mpart};", 2)
    w(f"const int64_t cb = g / {tm * tn}, cm = g / {tn} % {tm}, cn = g % {tn};", 2)
    w(f"const int64_t bi = cb * {ctx.batch} / {tb} + local / {mpart};", 2)
    w(f"const int64_t m0 = cm * {mt} / {tm} * {plan.mr}, m = m0 + local % {mpart};", 2)
    w(f"const int64_t n0 = cn * {nt} / {tn} * {plan.nr}, n1 = tcpy_min_int64((cn + 1) * {nt} / {tn} * {plan.nr},"
      f" {ctx.N});", 2)
    w(f"if (bi >= (cb + 1) * {ctx.batch} / {tb} || m >= tcpy_min_int64((cm + 1) * {mt} / {tm} * {plan.mr}, "
      f"{ctx.M})) continue;", 2)
    w(f"const {T} *src = partials + g * {tk * part} + local * {npart};", 2)
    w(f"{T} *q = {C} + INT64_C({con.c.offset}) + {p}_off_c_batch(bi) + {p}_off_c_m(m);", 2)
    w("for (int64_t n = n0; n < n1; n++) {", 2)
    w(f"{T} s = src[n - n0];", 3)
    for ck in range(1, tk):
        w(f"s += src[{ck * part} + n - n0];", 3)
    w(f"{T} *e = q + {p}_off_c_n(n);", 3)
    w(f"*e = {'alpha * s' if con.init else '*e + alpha * s'};", 3)
    if ctx.epilogue:
        w(f"{{ const {T} v = *e; {ctx.epilogue}(tcpy_buffers, bi, m, n, 1, &v); }}", 3)
    w("}", 2)
    w("}", 1)
