"""The stream path (narrow N): A read in place, M tiles outer, against a packed K block of B
holding all of the cell's N."""
from __future__ import annotations

from ..cwriter import CWriter, ScratchSlot
from .context import Context, fence
from .guarded import declare_tables, guard_base, tables_for
from .packing import packed_b
from .small import small_kernel


def stream(ctx: Context, w: CWriter):
    """A read in place, M tiles outer, against a packed K block of B (all of the cell's N)."""
    p, T, TB = ctx.prefix, ctx.T, ctx.TB
    mr, nr, K, KC = ctx.plan.mr, ctx.plan.nr, ctx.K, ctx.plan.kc
    packed_b(ctx, w)
    small_kernel(ctx, w)
    con = ctx.con
    tn = ctx.plan.grid[2]
    npart = -(-(-(-ctx.N // nr)) // tn) * nr
    w(f"static void {p}_cell(const {T} *TCPY_RESTRICT A, const {TB} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C,"
      f" int64_t b0, int64_t b1, int64_t m0, int64_t m1, int64_t n0, int64_t n1, {T} alpha,"
      f" const volatile int *stop, const {T} *TCPY_RESTRICT bpre{ctx.cell_params}) {{")
    w(f"{T} *bp = bpre ? 0 : ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * {min(K, KC) * npart});", 1)
    declare_tables(ctx, w, 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {T} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    w(f"const {TB} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
    w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
    guard_base(ctx, w, 2)
    w(f"for (int64_t pc = 0; pc < {K}; pc += {KC}) {{", 2)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 3)
    w(f"const int64_t kc = {K} - pc < {KC} ? {K} - pc : {KC};", 3)
    w(f"const {T} *bq = bpre ? bpre + pc * INT64_C({ctx.npad}) + n0 * kc : bp;", 3)
    w("if (!bpre) {", 3)
    guard = tables_for(ctx, w, "pc", "kc", 4)
    w(f"{p}_pack_b(bb, pc, kc, n0, n1 - n0, bp{guard});", 4)
    w("}", 3)
    overwrite = "pc == 0" if con.init else "0"
    w(f"for (int64_t i = m0; i < m1; i += {mr})", 3)
    w(f"for (int64_t jr = 0; jr < n1 - n0; jr += {nr})", 4)
    w(f"{p}_small(kc, ab + pc * INT64_C({con.linear_stride('k', 'a')}), i, m1 - i < {mr} ? m1 - i : {mr}, bq + jr * kc, {nr}, cb, "
      f"n0 + jr, n1 - n0 - jr < {nr} ? n1 - n0 - jr : {nr}, {overwrite}, alpha{ctx.last(K)});", 5)
    w("}", 2)
    w("}", 1)
    fence(ctx, w)
    w("}")


