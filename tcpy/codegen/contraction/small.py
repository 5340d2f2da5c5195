"""The small path: operands read in place (B rows as unaligned vectors, A elements broadcast),
no packing except a zero-padded copy of the last, partial B sliver; rows past M are clamped to
the last valid row and never stored. Its kernel also serves the stream path."""
from __future__ import annotations

from ..cwriter import CWriter, ScratchSlot
from .context import Context, cell_head, fence
from .kernel import accumulate_loop
from .stores import store_c


def small_kernel(ctx: Context, w: CWriter):
    """``<p>_small``: an MR x NR tile with A read in place (its rows clamped to the last valid
    one, never stored) and B's rows at stride ``ldb``, stored into the output."""
    p, T = ctx.prefix, ctx.T
    mr, K, KC = ctx.plan.mr, ctx.K, ctx.plan.kc
    # A is read in place: its M and K offsets are linear (one group each, or groups that compose)
    m_a, k_a = ctx.con.linear_stride("m", "a"), ctx.con.linear_stride("k", "a")
    L = ctx.plan.lanes
    w(f"static __attribute__((noinline)) void {p}_small(int64_t kc, const {T} *TCPY_RESTRICT ab, int64_t i, "
      f"int64_t mr, const {T} *TCPY_RESTRICT b, int64_t ldb, {T} *TCPY_RESTRICT cb, int64_t j, int64_t nr, "
      f"int overwrite, {T} alpha{ctx.epi_params}) {{")
    for r in range(mr):
        w(f"const {T} *TCPY_RESTRICT a{r} = ab + INT64_C({m_a}) * (i + ({r} < mr ? {r} : mr - 1));", 1)
    accumulate_loop(ctx, w, "kc" if K > KC else str(K), lambda v: f"*(const {p}_vu *)(b + k * ldb + {v * L})",
                         lambda r: f"a{r}[k * INT64_C({k_a})]", 1)
    store_c(ctx, w, "overwrite", 1)
    w("}")


def small(ctx: Context, w: CWriter):
    """The small path's kernel and cell: both operands read in place, a partial B sliver (or
    every one, ``copy_b``) copied zero-padded."""
    p, T = ctx.prefix, ctx.T
    mr, nr, K, KC = ctx.plan.mr, ctx.plan.nr, ctx.K, ctx.plan.kc
    k = ctx.single("k")
    small_kernel(ctx, w)
    con = ctx.con
    cell_head(ctx, w, "cell")
    w(f"{T} *edge = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * {max(1, min(K, KC)) * nr});", 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {T} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    w(f"const {T} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
    w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
    w(f"for (int64_t pc = 0; pc < {K}; pc += {KC}) {{", 2)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 3)
    w(f"const int64_t kc = {K} - pc < {KC} ? {K} - pc : {KC};", 3)
    w(f"const {T} *ak = ab + pc * INT64_C({k.a}), *bk = bb + pc * INT64_C({k.b});", 3)
    w(f"for (int64_t j = n0; j < n1; j += {nr}) {{", 3)
    w(f"const int64_t nr = n1 - j < {nr} ? n1 - j : {nr};", 4)
    w(f"const {T} *bs = bk + j;", 4)
    w(f"int64_t ldb = INT64_C({k.b});", 4)
    # B's sliver is copied (contiguous, zero-padded) when partial, or when its rows are far
    # apart: kc rows of NR at a large stride map to few L1 sets and would not stay in L1.
    w(f"if (nr < {nr} || {int(ctx.plan.copy_b)}) {{", 4)
    w(f"if (nr == {nr}) {{", 5)
    w("for (int64_t k = 0; k < kc; k++)", 6)
    w(f"#pragma GCC unroll {nr}", 6)
    w(f"for (int64_t c = 0; c < {nr}; c++) edge[k * {nr} + c] = bk[k * INT64_C({k.b}) + j + c];", 7)
    w("} else {", 5)
    w("for (int64_t k = 0; k < kc; k++)", 6)
    w(f"for (int64_t c = 0; c < {nr}; c++) edge[k * {nr} + c] = c < nr ? bk[k * INT64_C({k.b}) + j + c] : ({T})0;",
      7)
    w("}", 5)
    w(f"bs = edge; ldb = {nr};", 5)
    w("}", 4)
    overwrite = "pc == 0" if con.init else "0"
    w(f"for (int64_t i = m0; i < m1; i += {mr})", 4)
    w(f"{p}_small(kc, ak, i, m1 - i < {mr} ? m1 - i : {mr}, bs, ldb, cb, j, nr, {overwrite}, alpha"
      f"{ctx.last(K)});", 5)
    w("}", 3)
    w("}", 2)
    w("}", 1)
    fence(ctx, w)
    w("}")


