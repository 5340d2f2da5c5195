"""Packing of a guarded operand (a padded convolution's input): zeros where a guard fails.

A sliver's lanes split into runs of the innermost M or N group, along which the offset and
every guard are linear, so each run's valid part per k is one clamped interval (:func:`clamp_run`).
The K block's offsets and guard parts are tabled once per block (:func:`tables_for`); slivers
away from the padding copy plain rows; the others classify their rows once per period of the
guards along K, and a B sliver contiguous in B copies a row crossing the padding as whole
vectors with a lane mask.
"""
from __future__ import annotations

from typing import Optional

from ...contraction_ir import Group
from ..cwriter import CWriter
from .context import Context
from .copies import copy_run, copy_sliver_row, transpose_block

GUARD_PERIOD_MAX = 64  # longest period of the guards along K for which a sliver classifies its rows once


def clamp_run(w: CWriter, value: str, slope: int, depth: int):
    """Narrow a run's ``[lo, hi)`` to the positions c where a guard ``value + slope * c >= 0``
    holds (``value``: the guard at the run's start)."""
    if slope == 0:
        w(f"if (({value}) < 0) hi = 0;", depth)
    elif slope > 0:
        w(f"if (({value}) < 0) lo = tcpy_max_int64(lo, (-({value}) + {slope - 1}) / {slope});", depth)
    else:
        w(f"hi = tcpy_min_int64(hi, ({value}) < 0 ? 0 : ({value}) / {-slope} + 1);", depth)


def guard_base(ctx: Context, w: CWriter, depth: int):
    """``gb``: each guard's constant plus its batch part, for the guarded operand's packing."""
    if ctx.con.guards:
        values = ", ".join(f"INT64_C({g.const}) + {ctx.prefix}_off_g{i}_batch(bi)" for i, g in enumerate(ctx.con.guards))
        w(f"const int64_t gb[{len(ctx.con.guards)}] = {{{values}}};", depth)


def tables_kc(ctx: Context) -> int:
    """Entries of the guarded operand's K tables (one K block)."""
    return max(1, min(ctx.K, ctx.plan.kc))


def declare_tables(ctx: Context, w: CWriter, depth: int):
    """The guarded operand's K tables in the cell, and the K block they hold (none yet)."""
    if ctx.con.guards:
        count = len(ctx.con.guards)
        w(f"int64_t kt[{tables_kc(ctx)}], gt[{count}][{tables_kc(ctx)}], gkmin[{count}], tables_p0 = -1;", depth)


def tables_for(ctx: Context, w: CWriter, pc: str, kc: str, depth: int) -> str:
    """Fill the K tables for the block at ``pc`` unless they hold it; the pack's arguments
    (gb and the tables) for a guarded operand."""
    if not ctx.con.guards:
        return ""
    w(f"if (tables_p0 != {pc}) {{ {ctx.prefix}_tables({pc}, {kc}, kt, gt, gkmin); tables_p0 = {pc}; }}", depth)
    args = ", gb, kt, (const int64_t (*)[" + str(tables_kc(ctx)) + "])gt, gkmin"
    if ctx.con.guarded == "b":
        args += f", B, B + INT64_C({ctx.con.b.elements})"
    return args


def packed_guarded(ctx: Context, w: CWriter, which: str):
    """``<p>_pack_a`` or ``<p>_pack_b`` of the guarded operand: zeros where a guard fails.
    A sliver's rows (A) or columns (B) split into runs of the innermost M or N group, along
    which the operand's offset and every guard are linear, so per k each run's valid part is
    one interval (clamped from the guards). A sliver whose guards hold on every lane of
    every row of the K block (away from the padding) is copied row by row without tests.
    Otherwise, when the guards repeat along K (:func:`guard_period`), the rows of one period
    are classified once (:func:`row_classes`). B's slivers whose lanes are contiguous in B
    (a stride-1 convolution's output pixels, across the ends of image rows) copy a row that
    crosses the padding as whole vectors with the failing lanes zeroed (:func:`masked_row`);
    other rows copy each run's valid interval."""
    p, T, con = ctx.prefix, ctx.T, ctx.con
    role, width, src_t = ("m", ctx.plan.mr, ctx.TA) if which == "a" else ("n", ctx.plan.nr, ctx.TB)
    count = len(con.guards)
    groups = getattr(con, role)
    inner = groups[-1] if groups else Group((), 1, 0, 0, 0, (0,) * count)
    step = inner.stride(which)
    # the K block's offsets and guard parts (div/mod chains over the K groups: per sliver and
    # k they would cost as much as the copy), computed by the caller once per K block
    kc_max = tables_kc(ctx)
    w(f"static void {p}_tables(int64_t p0, int64_t kc, int64_t *TCPY_RESTRICT kt, "
      f"int64_t (*TCPY_RESTRICT gt)[{kc_max}], int64_t *TCPY_RESTRICT gkmin) {{")
    w(f"for (int i = 0; i < {count}; i++) gkmin[i] = INT64_MAX;", 1)
    w("for (int64_t k = 0; k < kc; k++) {", 1)
    w(f"kt[k] = {p}_off_{which}_k(p0 + k);", 2)
    for i in range(count):
        w(f"gt[{i}][k] = {p}_off_g{i}_k(p0 + k);", 2)
        w(f"gkmin[{i}] = tcpy_min_int64(gkmin[{i}], gt[{i}][k]);", 2)
    w("}", 1)
    w("}")
    tables = (f"const int64_t *TCPY_RESTRICT kt, const int64_t (*TCPY_RESTRICT gt)[{kc_max}], "
              "const int64_t *TCPY_RESTRICT gkmin")
    if which == "a":
        w(f"static void {p}_pack_a(const {src_t} *TCPY_RESTRICT ab, int64_t x0, int64_t xc, int64_t p0, "
          f"int64_t kc, {T} *TCPY_RESTRICT dst, const int64_t *TCPY_RESTRICT gb, {tables}) {{")
    else:  # (lo_b, hi_b: B's extent, which a whole row read must stay inside)
        w(f"static void {p}_pack_b(const {src_t} *TCPY_RESTRICT ab, int64_t p0, int64_t kc, int64_t x0, "
          f"int64_t xc, {T} *TCPY_RESTRICT dst, const int64_t *TCPY_RESTRICT gb, {tables}, "
          f"const {src_t} *lo_b, const {src_t} *hi_b) {{")
        w("(void)lo_b; (void)hi_b;", 1)
    w("(void)p0;", 1)
    w(f"for (int64_t s = 0; s < xc; s += {width}) {{", 1)
    w(f"{T} *TCPY_RESTRICT d = dst + s * kc;", 2)
    w(f"const int64_t len = xc - s < {width} ? xc - s : {width};", 2)
    w("/* runs: first lane, length, offset in the operand and guard values at the first lane */", 2)
    w(f"int64_t r0[{width}], rn[{width}], ro[{width}], rg[{width}][{count}];", 2)
    w("int runs = 0;", 2)
    w("for (int64_t c = 0; c < len; runs++) {", 2)
    w(f"const int64_t x = x0 + s + c, left = {inner.extent} - x % {inner.extent};", 3)
    w(f"r0[runs] = c; rn[runs] = len - c < left ? len - c : left; ro[runs] = {p}_off_{which}_{role}(x);", 3)
    for i in range(count):
        w(f"rg[runs][{i}] = gb[{i}] + {p}_off_g{i}_{role}(x);", 3)
    w("c += rn[runs];", 3)
    w("}", 2)
    w(f"int64_t lane[{width}];  /* each lane's offset in the operand */", 2)
    w(f"for (int r = 0; r < runs; r++) for (int64_t c = 0; c < rn[r]; c++) lane[r0[r] + c] = ro[r] + "
      f"INT64_C({step}) * c;", 2)
    # guard i along a run: gk + rg + d_i * c >= 0, d_i its coefficient of the inner group
    slopes = [inner.stride(f"g{i}") for i in range(count)]
    # each guard's least value over the sliver's lanes: a guard is its K part plus its N (or
    # M) part, so it holds on every lane of row k when gt[k] is at least minus that
    w(f"int64_t gmin[{count}];", 2)
    for i, d in enumerate(slopes):
        w(f"gmin[{i}] = INT64_MAX;", 2)
        w(f"for (int r = 0; r < runs; r++) gmin[{i}] = tcpy_min_int64(gmin[{i}], rg[r][{i}] + {min(0, d)} * "
          "(rn[r] - 1));", 2)
    masked = which == "b" and masked_rows_ok(ctx, step, src_t)
    if masked:
        contiguous_sliver(ctx, w, slopes)
    # a sliver read at one stride (its lanes contiguous in B, or one run) whose guards hold
    # on every lane of every row of the K block (away from the padding): copies without tests
    contiguous = "lin" if masked else f"runs == 1 && len == {width}"
    everywhere = " && ".join(f"gkmin[{i}] + gmin[{i}] >= 0" for i in range(count))
    w(f"if ({contiguous} && {everywhere}) {{", 2)
    w("for (int64_t k = 0; k < kc; k++) {", 3)
    w(f"const {src_t} *TCPY_RESTRICT src = ab + kt[k] + ro[0];", 4)
    w(f"{T} *TCPY_RESTRICT dk = d + k * {width};", 4)
    copy_sliver_row(ctx, w, "dk", "src", width, step, src_t, 4)
    w("}", 3)
    w("continue;", 3)
    w("}", 2)
    period = guard_period(ctx)
    L = ctx.plan.lanes
    # B's lanes apart in B but K running along it (a weight gradient: lanes are (channel, tap)
    # pairs, K the pixels): runs of L rows read as one vector per lane (every other element of
    # two at a stride of 2) and transposed
    inner_k = con.k[-1] if con.k else None
    k_step = inner_k.b if inner_k is not None and inner_k.extent >= L and inner_k.b in (1, 2) else 0
    blocks = which == "b" and src_t == T and L >= 2 and width % L == 0 and k_step > 0
    if blocks:
        good_rows(ctx, w, kc_max, k_step)
    if period:
        row_classes(ctx, w, period, masked, contiguous)
        w(f"for (int64_t k = 0, kp = 0; k < kc; k++, kp = kp + 1 == {period} ? 0 : kp + 1) {{", 2)
    else:
        w("for (int64_t k = 0; k < kc; k++) {", 2)
    w(f"const {src_t} *TCPY_RESTRICT src = ab + kt[k];", 3)
    w(f"{T} *TCPY_RESTRICT dk = d + k * {width};", 3)
    w("const int64_t " + ", ".join(f"gk{i} = gt[{i}][k]" for i in range(count)) + ";", 3)
    if blocks:
        if k_step == 1:
            w(f"if (len == {width} && good[k] >= {L}) {{", 3)
            load = lambda c: f"*(const {p}_vu *)(src + lane[{c}])"  # noqa: E731
        else:  # (the second vector's last element, one past the block's, must be inside B)
            w(f"if (len == {width} && good[k] >= {L} && src + lane_max + {2 * L} <= hi_b) {{", 3)
            evens = ", ".join(str(2 * j) for j in range(L))
            load = lambda c: (f"__builtin_shuffle(*(const {p}_vu *)(src + lane[{c}]), "  # noqa: E731
                              f"*(const {p}_vu *)(src + lane[{c}] + {L}), ({p}_m){{{evens}}})")
        for h in range(width // L):
            transpose_block(ctx, w, 4, lambda c, h=h: load(h * L + c), lambda l, h=h: f"dk + {l * width + h * L}")
        w(f"k += {L - 1};", 4)
        if period:
            w(f"kp = (kp + {L - 1}) % {period};", 4)
        w("continue;", 4)
        w("}", 3)
    if period:
        w("if (cls[kp] == 0) {", 3)
        copy_sliver_row(ctx, w, "dk", "src + ro[0]", width, step, src_t, 4)
        w("continue;", 4)
        w("}", 3)
        if masked:
            masked_row(ctx, w, lambda v: f"mk[kp][{v}]", 3)
    elif masked:
        contiguous_row(ctx, w, 3)
    else:  # a sliver that is one valid run is copied without tests
        whole = " && ".join(f"gk{i} + rg[0][{i}] >= {max(0, -d * (width - 1))}" for i, d in enumerate(slopes))
        w(f"if (runs == 1 && len == {width} && {whole}) {{", 3)
        copy_sliver_row(ctx, w, "dk", "src + ro[0]", width, step, src_t, 4)
        w("continue;", 4)
        w("}", 3)
    # a whole sliver's row where every guard holds on every lane, though its runs lie apart in
    # the operand (a weight gradient's short kernel-window runs): one gather over the lanes
    everywhere = " && ".join(f"gk{i} + gmin[{i}] >= 0" for i in range(count))
    w(f"if (len == {width} && {everywhere}) {{", 3)
    w(f"for (int c = 0; c < {width}; c++) dk[c] = ({T})src[lane[c]];", 4)
    w("continue;", 4)
    w("}", 3)
    w(f"for (int64_t c = 0; c < {width}; c++) dk[c] = ({T})0;", 3)
    w("for (int r = 0; r < runs; r++) {", 3)
    w("int64_t lo = 0, hi = rn[r];", 4)
    for i, d in enumerate(slopes):
        clamp_run(w, f"gk{i} + rg[r][{i}]", d, 4)
    if not copy_run(ctx, w, "dk + r0[r]", "src + ro[r]", width, step, src_t, 4):
        w(f"for (int64_t c = lo; c < hi; c++) dk[r0[r] + c] = ({T})src[ro[r] + INT64_C({step}) * c];", 4)
    w("}", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def good_rows(ctx: Context, w: CWriter, kc_max: int, k_step: int):
    """``good[k]``, for a whole sliver: how many rows from k on follow each other in B (each
    row's offset ``k_step`` past the one before) with every guard holding on every lane; a run
    of ``lanes`` such rows is ``lanes`` elements of each lane at that stride, all inside B.
    ``lane_max``: the sliver's last lane offset (a block's reads end there)."""
    count = len(ctx.con.guards)
    w(f"int32_t good[{kc_max}];", 2)
    w("int64_t lane_max = 0;", 2)
    w(f"if (len == {ctx.plan.nr}) {{", 2)
    w("lane_max = lane[0];", 3)
    w(f"for (int c = 1; c < {ctx.plan.nr}; c++) lane_max = tcpy_max_int64(lane_max, lane[c]);", 3)
    w("for (int64_t k = kc - 1; k >= 0; k--) {", 3)
    holds = " && ".join(f"gt[{i}][k] + gmin[{i}] >= 0" for i in range(count))
    w(f"const int holds = {holds};", 4)
    w(f"good[k] = !holds ? 0 : k + 1 < kc && kt[k + 1] == kt[k] + {k_step} ? good[k + 1] + 1 : 1;", 4)
    w("}", 3)
    w("}", 2)
    w("(void)lane_max;", 2)


def masked_rows_ok(ctx: Context, step: int, src_t: str) -> bool:
    """Whether B's packing may copy a contiguous sliver's row as whole vectors with the lanes
    where a guard fails zeroed (:func:`masked_row`): unit step, same type, whole vectors,
    B's extent known, and every guard's value fits the lanes' integer type."""
    con, L = ctx.con, ctx.plan.lanes
    if step != 1 or src_t != ctx.T or ctx.plan.nr % L or L < 2 or not con.b.elements:
        return False
    groups = (*con.batch, *con.m, *con.n, *con.k)
    bound = max(abs(g.const) + sum(abs(grp.stride(f"g{i}")) * grp.extent for grp in groups)
                for i, g in enumerate(con.guards))
    return bound < 2 ** (ctx.element_bytes * 8 - 2)


def contiguous_sliver(ctx: Context, w: CWriter, slopes):
    """Per sliver of B: whether its lanes follow each other in B (``lin``: whole, each run
    starting where the one before ended) and the guards' N parts lane by lane as vectors."""
    p, T, width = ctx.prefix, ctx.T, ctx.plan.nr
    count, nv = len(ctx.con.guards), ctx.plan.nr_vectors
    lane_t = f"int{ctx.element_bytes * 8}_t"
    w(f"int lin = len == {width};", 2)
    w("for (int r = 1; r < runs; r++) lin &= ro[r] == ro[0] + r0[r];", 2)
    w(f"{p}_m gv[{count}][{nv}];", 2)
    w(f"{lane_t} *lanes = ({lane_t} *)gv;", 2)
    for i, d in enumerate(slopes):
        w("for (int r = 0; r < runs; r++)", 2)
        w(f"for (int64_t c = 0; c < rn[r]; c++) lanes[{i * width} + r0[r] + c] = ({lane_t})(rg[r][{i}] + "
          f"{d} * c);", 3)
    w(f"const {T} *TCPY_RESTRICT row0 = ab + ro[0];", 2)


def guard_period(ctx: Context) -> Optional[int]:
    """The period of the guarded operand's guards along K: K groups that no guard reads
    (a convolution's input channels, outermost) repeat the inner groups' guard values, so
    the rows of a sliver fall into as many classes as the inner groups have positions
    (a 3x3 window: 9). None when that is more than GUARD_PERIOD_MAX."""
    groups = list(ctx.con.k)
    while groups and not any(groups[0].g):
        groups.pop(0)
    period = 1
    for g in groups:
        period *= g.extent
    return period if period <= GUARD_PERIOD_MAX else None


def lane_mask(ctx: Context, v: int, gk) -> str:
    """Vector v of a contiguous sliver's row: lanes where every guard holds, given the
    guards' K parts ``gk(i)`` (C expressions)."""
    lane_t = f"int{ctx.element_bytes * 8}_t"
    return " & ".join(f"(gv[{i}][{v}] + ({lane_t}){gk(i)} >= 0)" for i in range(len(ctx.con.guards)))


def row_classes(ctx: Context, w: CWriter, period: int, masked: bool, contiguous: str):
    """A sliver's row classes over one period of K: 0 every guard holds on every lane (a
    plain copy), 1 some lanes of a contiguous sliver fail (copied whole with the lane mask
    ``mk``), 2 the runs' copy."""
    p, count, nv = ctx.prefix, len(ctx.con.guards), ctx.plan.nr_vectors
    w(f"unsigned char cls[{period}];", 2)
    if masked:
        w(f"{p}_m mk[{period}][{nv}];", 2)
    w(f"for (int64_t k = 0; k < kc && k < {period}; k++) {{", 2)
    everywhere = " && ".join(f"gt[{i}][k] + gmin[{i}] >= 0" for i in range(count))
    w(f"cls[k] = {contiguous} && {everywhere} ? 0 : 2;", 3)
    if masked:
        w("if (cls[k] == 2 && lin) {", 3)
        w("cls[k] = 1;", 4)
        for v in range(nv):
            w(f"mk[k][{v}] = {lane_mask(ctx, v, lambda i: f'gt[{i}][k]')};", 4)
        w("}", 3)
    w("}", 2)


def masked_row(ctx: Context, w: CWriter, mask, depth: int):
    """Row k of a contiguous sliver (:func:`contiguous_sliver`) loaded whole, with the lanes
    where a guard fails zeroed (``mask(v)``: the mask of vector v), when it lies inside B;
    other rows fall through to the runs' copy."""
    p, T, L, nv, width = ctx.prefix, ctx.T, ctx.plan.lanes, ctx.plan.nr_vectors, ctx.plan.nr
    w("if (lin) {", depth)
    w(f"const {T} *TCPY_RESTRICT row = row0 + kt[k];", depth + 1)
    w(f"if ((uintptr_t)row >= (uintptr_t)lo_b && (uintptr_t)(row + {width}) <= (uintptr_t)hi_b) {{", depth + 1)
    for v in range(nv):
        w(f"*({p}_vu *)(dk + {v * L}) = ({p}_v)((({p}_m)*(const {p}_vu *)(row + {v * L})) & ({mask(v)}));",
          depth + 2)
    w("continue;", depth + 2)
    w("}", depth + 1)
    w("}", depth)


def contiguous_row(ctx: Context, w: CWriter, depth: int):
    """Row k of a contiguous sliver when the guards have no short period along K: copied as
    whole vectors when every guard holds on every lane, else :func:`masked_row` with the
    mask computed here."""
    count, width = len(ctx.con.guards), ctx.plan.nr
    everywhere = " && ".join(f"gk{i} + gmin[{i}] >= 0" for i in range(count))
    w(f"if (lin && {everywhere}) {{", depth)
    copy_sliver_row(ctx, w, "dk", "src + ro[0]", width, 1, ctx.T, depth + 1)
    w("continue;", depth + 1)
    w("}", depth)
    masked_row(ctx, w, lambda v: lane_mask(ctx, v, lambda i: f"gk{i}"), depth)


