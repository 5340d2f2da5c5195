"""The packed path (BLIS's five loops around a micro-kernel): per cell of the thread grid,
B panels (kc x nc, L3) and A blocks (mc x kc, L2) packed, then MR x NR micro-kernels over
their slivers (see :mod:`tcpy.codegen.contraction`)."""
from __future__ import annotations

from ..cwriter import CWriter, ScratchSlot
from .context import Context, fence
from .guarded import declare_tables, guard_base, tables_for
from .kernel import micro_kernels, packing_kernel
from .packing import packed_a, packed_b


def packed(ctx: Context, w: CWriter):
    """The packed path's helpers: packing, micro-kernels and the cell."""
    packed_b(ctx, w)
    packed_a(ctx, w)
    micro_kernels(ctx, w)
    if ctx.plan.pack_b_in_kernel:
        packing_kernel(ctx, w)
    packed_cell(ctx, w)


def packed_cell(ctx: Context, w: CWriter):
    """One cell of the thread grid: the five loops around the micro-kernel."""
    p, T, TA, TB = ctx.prefix, ctx.T, ctx.TA, ctx.TB
    mr, nr = ctx.plan.mr, ctx.plan.nr
    KC, MC, NC = ctx.plan.kc, ctx.plan.mc, ctx.plan.nc
    con = ctx.con
    w(f"static void {p}_cell(const {TA} *TCPY_RESTRICT A, const {TB} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C,"
      f" {T} *TCPY_RESTRICT P, int64_t ldp, int64_t prows, int64_t b0, int64_t b1, int64_t m0, int64_t m1,"
      f" int64_t n0, int64_t n1, int64_t k0, int64_t k1, {T} alpha, const volatile int *stop,"
      f" const {T} *TCPY_RESTRICT bpre{ctx.cell_params}) {{")
    once = ctx.plan.a_once
    regions = -(-ctx.K // KC) if once else 1  # a_once: every K block of A, packed up front
    # (+ lanes: the transposing pack's last store may write past the last sliver)
    w(f"{T} *ap = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, sizeof({T}) * {regions * MC * KC + ctx.plan.lanes});", 1)
    w(f"{T} *bp = bpre ? 0 : ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * {KC * NC});", 1)
    declare_tables(ctx, w, 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {TA} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    w(f"const {TB} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
    w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
    w(f"{T} *pb = P ? P + (bi - b0) * prows * ldp : 0;", 2)
    guard_base(ctx, w, 2)
    if once:  # one M block (mc >= the cell's rows): the K blocks of A, each at its region
        w(f"for (int64_t pc = k0; pc < k1; pc += {KC}) {{", 2)
        w(f"const int64_t kc = k1 - pc < {KC} ? k1 - pc : {KC};", 3)
        guard = tables_for(ctx, w, "pc", "kc", 3) if con.guarded == "a" else ""
        w(f"{p}_pack_a(ab, m0, m1 - m0, pc, kc, ap + (pc - k0) / {KC} * {MC * KC}{guard});", 3)
        w("}", 2)
    w(f"for (int64_t jc = n0; jc < n1; jc += {NC}) {{", 2)
    w(f"const int64_t nc = n1 - jc < {NC} ? n1 - jc : {NC};", 3)
    w(f"for (int64_t pc = k0; pc < k1; pc += {KC}) {{", 3)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 4)
    w(f"const int64_t kc = k1 - pc < {KC} ? k1 - pc : {KC};", 4)
    guard_b = tables_for(ctx, w, "pc", "kc", 4) if con.guarded == "b" else ""
    w(f"const {T} *bq = bpre ? bpre + pc * INT64_C({ctx.npad}) + jc * kc : bp;", 4)
    in_kernel = ctx.plan.pack_b_in_kernel
    if not in_kernel:
        w(f"if (!bpre) {p}_pack_b(bb, pc, kc, jc, nc, bp{guard_b});", 4)
    w(f"for (int64_t ic = m0; ic < m1; ic += {MC}) {{", 4)
    w(f"const int64_t mc = m1 - ic < {MC} ? m1 - ic : {MC};", 5)
    if once:
        w(f"const {T} *TCPY_RESTRICT ak = ap + (pc - k0) / {KC} * {MC * KC};", 5)
    else:
        guard_a = tables_for(ctx, w, "pc", "kc", 5) if con.guarded == "a" else ""
        w(f"{p}_pack_a(ab, ic, mc, pc, kc, ap{guard_a});", 5)
        w(f"const {T} *TCPY_RESTRICT ak = ap;", 5)
    w(f"for (int64_t jr = 0; jr < nc; jr += {nr}) {{", 5)
    w(f"const int64_t nr = nc - jr < {nr} ? nc - jr : {nr};", 6)
    overwrite = "pc == k0" if con.init else "0"
    last = ", pc + kc >= k1, bi, tcpy_buffers" if ctx.epilogue else ""
    if in_kernel:
        w("int64_t ir0 = 0;", 6)
        pack_in_kernel(ctx, w, overwrite, last, 6)
    w(f"for (int64_t ir = {'ir0' if in_kernel else 0}; ir < mc; ir += {mr}) {{", 6)
    w(f"const int64_t mr = mc - ir < {mr} ? mc - ir : {mr};", 7)
    if ctx.plan.grid[3] > 1:
        w(f"if (pb) {{ {p}_ukr_p(kc, ak + ir * kc, bq + jr * kc, pb + (ic - m0 + ir) * ldp + (jc - n0 + jr),"
          f" ldp, mr, nr, pc == k0); continue; }}", 7)
    args = f"(kc, ak + ir * kc, bq + jr * kc, cb, ic + ir, jc + jr, mr, nr, {overwrite}, alpha{last});"
    # direct calls: gcc specialises each for the constant arguments
    call = f"{p}_ukr{args}"
    if ctx.plan.nr_vectors > 1:
        call = f"if (nr <= {ctx.plan.lanes}) {p}_ukr1{args} else {call}"
    if ctx.M % mr:
        call = f"if (mr == {ctx.M % mr}) {p}_ukr_r{args} else {call}"
    w(call, 7)
    for depth in range(6, 1, -1):
        w("}", depth)
    w("}", 1)
    fence(ctx, w)
    w("}")


def pack_in_kernel(ctx: Context, w: CWriter, overwrite: str, last: str, depth: int):
    """In the first A block of a K block, each B sliver packed before its micro-tiles: a whole
    sliver inside one run of the inner N group by the first micro-tile reading it in place
    (``<p>_ukr_pk``, which then leaves ``ir0`` at the second), any other by ``<p>_pack_b``."""
    p, T, NR, MR = ctx.prefix, ctx.T, ctx.plan.nr, ctx.plan.mr
    run = ctx.con.n[-1].extent
    w("if (!bpre && ic == m0) {", depth)
    w("const int64_t j = jc + jr;", depth + 1)
    w(f"if (nr == {NR} && j % {run} + {NR} <= {run}) {{", depth + 1)
    w(f"const {T} *src = bb + {p}_off_b_n(j) + {p}_off_b_k(pc);", depth + 2)
    # the next sliver's rows are asked for while this one computes, when they lie in the same run
    w(f"const {T} *pf = jr + {2 * NR} <= nc && (j + {NR}) % {run} + {NR} <= {run} ? src + {NR} : src;", depth + 2)
    w(f"{p}_ukr_pk(kc, ak, src, pf, bp + jr * kc, cb, ic, j, mc < {MR} ? mc : {MR}, nr, {overwrite}, "
      f"alpha{last});", depth + 2)
    w(f"ir0 = {MR};", depth + 2)
    w("} else {", depth + 1)
    w(f"{p}_pack_b(bb, pc, kc, j, nr, bp + jr * kc);", depth + 2)
    w("}", depth + 1)
    w("}", depth)
