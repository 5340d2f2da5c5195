"""Packing (BLIS's packm): B's panel into NR-wide slivers and A's block into MR-tall slivers,
k-major and zero-padded, read through the affine accesses (offset functions of the linear
indices), so transposed, strided, offset, batched and multi-variable operands reach the
micro-kernel as the same contiguous slivers. A guarded operand is packed by :mod:`.guarded`."""
from __future__ import annotations

from ..cwriter import CWriter, ScratchSlot
from .context import Context
from .copies import copy_run, copy_sliver_row, transpose_block
from .guarded import packed_guarded

PACK_B_AHEAD = 2  # pack_b asks for the rows of the sliver this many slivers ahead


def packed_b(ctx: Context, w: CWriter):
    """``<p>_pack_b``: B(p0:p0+kc, j0:j0+nc) into NR-wide slivers, k-major, zero-padded."""
    if ctx.con.guarded == "b":
        packed_guarded(ctx, w, "b")
        return
    p, T, TB = ctx.prefix, ctx.T, ctx.TB
    nr = ctx.plan.nr
    n = ctx.single("n")
    w(f"static void {p}_pack_b(const {TB} *TCPY_RESTRICT bb, int64_t p0, int64_t kc, int64_t j0, int64_t nc,"
      f" {T} *TCPY_RESTRICT bp) {{")
    # sliver by sliver: the writes run along the packed buffer, and each sliver's kc rows are
    # asked for PACK_B_AHEAD slivers ahead (B streams from memory for a batch of images; a
    # row by row order wrote kc-strided lines that share one L1 set)
    if n is not None:
        col = lambda c: f"INT64_C({n.b}) * (j0 + s + {c})"  # noqa: E731
        step, run = n.b, None
    else:
        # (a slot of its own: a chain's products pack B while its block buffers are live)
        w(f"int64_t *co = (int64_t *)tcpy_scratch({ScratchSlot.B_COLUMNS}, sizeof(int64_t) * nc);", 1)
        w(f"for (int64_t c = 0; c < nc; c++) co[c] = {p}_off_b_n(j0 + c);", 1)
        col = lambda c: f"co[s + {c}]"  # noqa: E731
        step, run = ctx.con.n[-1].b, ctx.con.n[-1].extent
    size, line = ctx.con.b.dtype.bits // 8, ctx.plan.cache_line
    if abs(step) * size >= line:  # each element of a sliver's row on a line of its own
        lines = [c * abs(step) * size for c in range(nr)]
    else:  # first to last element of a sliver's row, in bytes
        span = abs(step) * (nr - 1) * size
        lines = [*range(0, span, line), span]
    # rows of successive k that share their lines (B transposed: k runs along memory) are
    # asked for once per line, not once per k
    k = ctx.single("k")
    every = max(1, line // (abs(k.b) * size)) if k is not None and k.b else 1
    w(f"for (int64_t s = 0; s < nc; s += {nr}) {{", 1)
    w(f"{T} *TCPY_RESTRICT d = bp + s * kc;", 2)
    # a whole sliver inside one run of the inner N group is read at that group's stride in B
    inside = f"s + {nr} <= nc" + (f" && (j0 + s) % {run} + {nr} <= {run}" if run else "")
    w(f"if ({inside}) {{", 2)
    w(f"const {TB} *TCPY_RESTRICT src = bb + {col('0')};", 3)
    w(f"const int ahead = s + {PACK_B_AHEAD * nr + nr} <= nc;", 3)
    w(f"const {TB} *TCPY_RESTRICT pf = bb + (ahead ? {col(str(PACK_B_AHEAD * nr))} : {col('0')});", 3)
    L = ctx.plan.lanes
    # B transposed (k runs along memory), same type: blocks of L k steps of each L rows of
    # the sliver transposed in registers, one vector load per row instead of L scalar ones
    blocks = k is not None and k.b == 1 and TB == T and L >= 2 and nr % L == 0
    w("int64_t k = 0;", 3)
    for first, last in (((f"k + {L} <= kc", f"k += {L}"),) if blocks else ()) + (("k < kc", "k++"),):
        w(f"for (; {first}; {last}) {{", 3)
        w(f"const {TB} *TCPY_RESTRICT r = src + {p}_off_b_k(p0 + k);", 4)
        w("if (ahead) {" if every == 1 else f"if (ahead && k % {every} == 0) {{", 4)  # (every: a multiple of L)
        w(f"const {TB} *q = pf + {p}_off_b_k(p0 + k);", 5)
        for line in lines:
            w(f"__builtin_prefetch((const char *)q + {line if step > 0 else -line}, 0, 3);", 5)
        w("}", 4)
        if last == "k++":
            copy_sliver_row(ctx, w, f"d + k * {nr}", "r", nr, step, TB, 4)
        else:
            for h in range(nr // L):
                transpose_block(ctx, w, 4, lambda c, h=h: f"*(const {p}_vu *)(r + INT64_C({step}) * {h * L + c})",
                                     lambda l, h=h: f"d + (k + {l}) * {nr} + {h * L}")
        w("}", 3)
    w("continue;", 3)
    w("}", 2)
    if run:
        whole_sliver_across_runs(ctx, w, nr, step, run)
    w("for (int64_t k = 0; k < kc; k++) {", 2)
    w(f"const {TB} *TCPY_RESTRICT src = bb + {p}_off_b_k(p0 + k);", 3)
    w(f"for (int64_t c = 0; c < {nr}; c++) d[k * {nr} + c] = s + c < nc ? ({T})src[{col('c')}] : ({T})0;", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def whole_sliver_across_runs(ctx: Context, w: CWriter, nr: int, step: int, run: int):
    """A whole sliver of ``pack_b`` that spans runs of the inner N group (a stride-2 1x1
    convolution's sliver of 48 pixels over rows of 28): copied segment by segment, each one
    run's part at the run's stride by whole vectors (:func:`copy_run`), instead of element by
    element through the column offsets. Writes nothing when copy_run does not apply."""
    p, TB = ctx.prefix, ctx.TB
    segment = CWriter()
    if not copy_run(ctx, segment, f"d + k * {nr} + a", f"r + co[s + a]", nr, step, TB, 5):
        return
    w(f"if (s + {nr} <= nc) {{", 2)
    w(f"for (int64_t a = 0, b; a < {nr}; a = b) {{", 3)
    w(f"b = a + {run} - (j0 + s + a) % {run};", 4)
    w(f"if (b > {nr}) b = {nr};", 4)
    w("for (int64_t k = 0; k < kc; k++) {", 4)
    w(f"const {TB} *TCPY_RESTRICT r = bb + {p}_off_b_k(p0 + k);", 5)
    w("const int64_t lo = 0, hi = b - a;", 5)
    w.lines.extend(segment.lines)
    w("}", 4)
    w("}", 3)
    w("continue;", 3)
    w("}", 2)


def packed_a(ctx: Context, w: CWriter):
    """``<p>_pack_a``: A(i0:i0+mc, p0:p0+kc) into MR-tall slivers, k-major, zero-padded rows."""
    if ctx.con.guarded == "a":
        packed_guarded(ctx, w, "a")
        return
    p, T, TA, mr = ctx.prefix, ctx.T, ctx.TA, ctx.plan.mr
    m = ctx.single("m")
    w(f"static void {p}_pack_a(const {TA} *TCPY_RESTRICT ab, int64_t i0, int64_t mc, int64_t p0, int64_t kc,"
      f" {T} *TCPY_RESTRICT ap) {{")
    w(f"for (int64_t s = 0; s < mc; s += {mr}) {{", 1)
    w(f"{T} *TCPY_RESTRICT d = ap + s * kc;", 2)
    w(f"const int64_t rows = mc - s < {mr} ? mc - s : {mr};", 2)
    if m is not None:
        row = f"INT64_C({m.a}) * (i0 + s + r)"
    else:
        w(f"int64_t ro[{mr}];", 2)
        w(f"for (int64_t r = 0; r < {mr}; r++) ro[r] = {p}_off_a_m(i0 + s + (r < rows ? r : rows - 1));", 2)
        row = "ro[r]"
    w(f"if (rows == {mr}) {{", 2)
    k = ctx.single("k")
    L = ctx.plan.lanes
    if m is not None and k is not None and k.a == 1 and TA == T and mr <= L <= 2 * mr:
        transposed_rows(ctx, w, 3, m.a)
    else:
        w("for (int64_t k = 0; k < kc; k++) {", 3)
        w(f"const {TA} *TCPY_RESTRICT src = ab + {p}_off_a_k(p0 + k);", 4)
        w(f"#pragma GCC unroll {mr}", 4)
        w(f"for (int64_t r = 0; r < {mr}; r++) d[k * {mr} + r] = ({T})src[{row}];", 4)
        w("}", 3)
    w("} else {", 2)
    w("for (int64_t k = 0; k < kc; k++) {", 3)
    w(f"const {TA} *TCPY_RESTRICT src = ab + {p}_off_a_k(p0 + k);", 4)
    w(f"for (int64_t r = 0; r < {mr}; r++) d[k * {mr} + r] = r < rows ? ({T})src[{row}] : ({T})0;", 4)
    w("}", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def transposed_rows(ctx: Context, w: CWriter, depth: int, row_stride: int):
    """The whole-sliver case of packing A when its rows are contiguous along K: blocks of
    ``lanes`` K steps are loaded as one vector per row, transposed in registers
    (:func:`transpose_block`) and written one vector per K step. A store writes ``lanes -
    MR`` lanes past its K step; the next step's store (or the remainder loop, the next
    sliver, the buffer's slack) overwrites them. Leaves the remaining K steps to a scalar
    loop."""
    p, T, mr, L = ctx.prefix, ctx.T, ctx.plan.mr, ctx.plan.lanes
    w(f"const {T} *TCPY_RESTRICT s0 = ab + {p}_off_a_k(p0) + INT64_C({row_stride}) * (i0 + s);", depth)
    w("int64_t k = 0;", depth)
    w(f"for (; k + {L} <= kc; k += {L}) {{", depth)
    transpose_block(ctx, w, depth + 1, lambda r: f"*(const {p}_vu *)(s0 + {r * row_stride} + k)" if r < mr else "x0",
                         lambda l: f"d + (k + {l}) * {mr}")
    w("}", depth)
    w("for (; k < kc; k++)", depth)
    w(f"for (int64_t r = 0; r < {mr}; r++) d[k * {mr} + r] = s0[{row_stride} * r + k];", depth + 1)


def prepack(ctx: Context, w: CWriter):
    """``<p>_prepack``: all of B (one batch), K block after K block, as the cell packs it."""
    p, T, TB, K, KC = ctx.prefix, ctx.T, ctx.TB, ctx.K, ctx.plan.kc
    w(f"static void {p}_prepack(const {TB} *TCPY_RESTRICT bb, {T} *TCPY_RESTRICT bp) {{")
    w(f"for (int64_t pc = 0; pc < {K}; pc += {KC})", 1)
    w(f"{p}_pack_b(bb, pc, {K} - pc < {KC} ? {K} - pc : {KC}, 0, {ctx.N}, bp + pc * INT64_C({ctx.npad}));", 2)
    w("}")


