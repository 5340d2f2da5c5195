"""The run-time engine: one contraction of a size-generic kernel (:mod:`tcpy.generic`), rendered
once for every size, as BLIS runs: the micro-kernel is fixed by the dtype and the Target, while
the extents, cache blocks and thread grid are read at run time from the statement's *plan
buffer* (:data:`tcpy.contraction_ir.RUNTIME_FIELDS`, made per shape by
:mod:`tcpy.transform.runtime_plan`).

The loops are the packed path's (:mod:`.packed`): cells of the thread grid claimed by the
threads, B panels (kc x nc) and A blocks (mc x kc) packed into slivers, MR x NR micro-kernels
(:func:`.kernel.accumulate_loop`). Every access goes through offset tables (one int64 element
offset per linear index of each role, per tensor), so any affine access (transposes, strides,
batches, a convolution's windows) packs into the same slivers; B rows that are one unit-stride
run copy whole vectors, and output rows that are one unit-stride run take vector stores. A
guarded operand (a padded convolution's image) is packed with zeros where a guard fails, its
guards' values read from tables too; as on the specialised paths, an operand holding inf or NaN
beside it (or an inf or NaN scale by rank-0 tensors) sums point by point (:mod:`.exact`'s rule).

A 3x3 convolution's routine also holds the winograd path (:mod:`.runtime_winograd`), which the
calls whose plan buffer has a winograd section take instead of the packed loops.

When the operands have the contraction's type the routine also holds the small and stream
paths (:mod:`.small`, :mod:`.stream`), which the plan buffer picks per shape: A read in place
along its run-time strides by a second family of micro-kernels, B read in place too (small:
slivers copied only when partial or when the plan says its rows crowd L1) or each K block of it
packed (stream: a micro-tile of A's rows against all of it).
"""
from __future__ import annotations

import dataclasses

from ...contraction_ir import RUNTIME_FIELDS, RUNTIME_PATHS, runtime_paths
from ..cwriter import CWriter, ScratchSlot
from . import runtime_winograd
from .context import Context
from .copies import copy_sliver_row, transpose_block
from .exact import nonfinite
from .kernel import accumulate_loop
from .packing import PACK_B_AHEAD
from .stores import spill, tile_row, whole_tile
from ..units import HAND_VECTORISED

F = {name: index for index, name in enumerate(RUNTIME_FIELDS)}


def _field(name: str) -> str:
    return f"pl[{F[name]}]"


def _table(name: str) -> str:
    return f"(pl + pl[{F[name + '_table']}])"


def render(ctx: Context, plan_slot: int) -> tuple[str, str]:
    """``(helpers, body)`` of the contraction ``ctx.con`` (its roles, dtypes, scale and guards:
    the same at every size) run with the plan buffer ``tcpy_buffers[plan_slot]``."""
    w = CWriter()
    _routines(ctx, w)
    if len(runtime_paths(ctx.con)) > 1:
        _in_place(ctx, w)
    _cells(ctx, w)
    if ctx.plan.winograd is not None:
        w(runtime_winograd.render(ctx))
    body = CWriter()
    _driver(ctx, body, plan_slot)
    return w.text(), body.text()


def render_block(ctx: Context, online: bool) -> str:
    """The routines of a size-generic kernel's chain product on one block of rows (see
    :mod:`tcpy.transform.runtime_chains`): ``<p>_cell(pl, A, B, C, 0, 1, 0, rows, 0, N, alpha,
    stop, bpre, fresh)`` with the block's plan buffer ``pl`` and operands, ``bpre`` B as
    ``<p>_prepack(pl, B, bpre)`` packed it (or 0: the cell packs B itself), ``fresh`` 1 when
    a product summing into C (an online chain's last, over blocks of keys) overwrites it (the
    first block: no pass clearing C first); A's rows are read in
    place where they run along K (a block buffer or a row of queries, in cache: packing them
    would copy them again for every block of columns). With ``online``, the row helpers of an
    online chain's last product over the output rows ``pl`` lays out
    (:func:`tcpy.codegen.contraction.rows.online_rows`' with a plan buffer first)."""
    w = CWriter()
    _routines(ctx, w, True)
    if online:
        _online_rows(ctx, w)
    return w.text()


def _routines(ctx: Context, w: CWriter, chained: bool = False):
    """The vector types, packing routines, micro-kernels and cell every size shares (a
    ``chained`` one: see :func:`render_block`)."""
    p, T, s = ctx.prefix, ctx.T, ctx.element_bytes
    vb = ctx.plan.lanes * s
    w(f"/* contraction {ctx.con.stmt.replace('*/', '* /')}")
    w(f" * run-time engine: micro-tile {ctx.plan.mr}x{ctx.plan.nr}; extents, blocks and thread grid from the "
      "plan buffer */")
    w(f"typedef {T} {p}_v __attribute__((vector_size({vb}), aligned({vb}), __may_alias__));")
    w(f"typedef {T} {p}_vu __attribute__((vector_size({vb}), aligned({s}), __may_alias__));")
    w(f"typedef int{s * 8}_t {p}_m __attribute__((vector_size({vb})));  /* shuffle masks */")
    _guard_test(ctx, w)
    _pack_b(ctx, w)
    _pack_a(ctx, w)
    _micro_kernel(ctx, w)
    if chained and ctx.TA == ctx.T:
        _micro_kernel(ctx, w, True)
    if chained:
        _prepack(ctx, w)
        _packed_in_place(ctx, w)
    _cell(ctx, w, chained)


def _online_rows(ctx: Context, w: CWriter):
    """``<p>_clear_rows(pl, C, rows)``, ``<p>_scale_rows(pl, C, rows, f)`` and ``int
    <p>_finish_rows(pl, C, rows, m, z, redo)`` over a block's output rows (their offsets and
    N from the plan buffer ``pl``), as :func:`tcpy.codegen.contraction.rows.online_rows`."""
    p, T = ctx.prefix, ctx.T
    helpers = (("clear_rows", "", (), (f"*e = ({T})0;",), ()),
               ("scale_rows", f", const {T} *TCPY_RESTRICT f", (f"const {T} s = f[r];", "if (s == 1) continue;"),
                ("*e = *e * s;",), ()),
               ("finish_rows", f", const {T} *TCPY_RESTRICT m, const {T} *TCPY_RESTRICT z, "
                "int32_t *TCPY_RESTRICT redo",
                (f"const {T} d = z[r];", f"int bad = !(isfinite(m[r]) && isfinite(d) && fabs(d) >= ({T})1);"),
                ("*e = *e / d;", "bad |= !isfinite(*e);"), ("redo[r] = bad;", "any |= bad;")))
    for name, params, row, element, after in helpers:
        w(f"static {'int' if after else 'void'} {p}_{name}(const int64_t *TCPY_RESTRICT pl, {T} *TCPY_RESTRICT C, "
          f"int64_t rows{params}) {{")
        w(f"const int64_t *cm = {_table('c_m')}, *cn = {_table('c_n')}, N = {_field('n')};", 1)
        w("int unit = 1;  /* the rows are contiguous: loops the compiler vectorises */", 1)
        w("for (int64_t j = 1; j < N; j++) unit &= cn[j] == cn[0] + j;", 1)
        if after:
            w("int any = 0;", 1)
        w("for (int64_t r = 0; r < rows; r++) {", 1)
        w(f"{T} *TCPY_RESTRICT o = C + {_field('c_base')} + cm[r];", 2)
        for line in row:
            w(line, 2)
        for test, offset in (("if (unit) {", "cn[0] + j"), ("} else {", "cn[j]")):
            w(test, 2)
            w("for (int64_t j = 0; j < N; j++) {", 3)
            w(f"{T} *e = o + {offset};", 4)
            for line in element:
                w(line, 4)
            w("}", 3)
        w("}", 2)
        for line in after:
            w(line, 2)
        w("}", 1)
        if after:
            w("return any;", 1)
        w("}")


def _guards(ctx: Context) -> int:
    return len(ctx.con.guards)


def _guard_test(ctx: Context, w: CWriter):
    """``<p>_holds``: whether every guard holds at (batch bi, own index i, k)."""
    G = _guards(ctx)
    if not G:
        return
    w(f"static inline int {ctx.prefix}_holds(const int64_t *TCPY_RESTRICT pl, int64_t bi, int64_t i, int64_t k) {{")
    w(f"const int64_t *gb = {_table('g_batch')}, *go = {_table('g_own')}, *gk = {_table('g_k')};", 1)
    w(f"const int64_t B = {_field('batch')}, K = {_field('k')}, own = {_field('guarded')} == 1 ? "
      f"{_field('m')} : {_field('n')};", 1)
    w("int ok = 1;", 1)
    w(f"for (int g = 0; g < {G}; g++) ok &= gb[g * B + bi] + go[g * own + i] + gk[g * K + k] >= 0;", 1)
    w("return ok;", 1)
    w("}")


def _guard_parts(ctx: Context, w: CWriter, depth: int, operand: int, own: str, count: str, index: str):
    """Declare ``og[g][c]`` (guard g's value without its K part at the sliver's line ``c <
    count``, the line's own index ``index``) and its least and greatest value ``glo``, ``ghi``
    over the sliver, when ``operand`` (1: a, 2: b) is the guarded one."""
    G, width = _guards(ctx), max(ctx.plan.mr, ctx.plan.nr)
    w(f"const int guarded = {_field('guarded')} == {operand};", depth)
    w(f"int64_t og[{G}][{width}], glo[{G}], ghi[{G}];", depth)
    w("if (guarded) {", depth)
    w(f"for (int g = 0; g < {G}; g++) {{", depth + 1)
    w("glo[g] = INT64_MAX; ghi[g] = INT64_MIN;", depth + 2)
    w(f"for (int64_t c = 0; c < {count}; c++) {{", depth + 2)
    w(f"const int64_t v = gb[g * nb + bi] + go[g * {own} + {index}];", depth + 3)
    w("og[g][c] = v; glo[g] = v < glo[g] ? v : glo[g]; ghi[g] = v > ghi[g] ? v : ghi[g];", depth + 3)
    w("}", depth + 2)
    w("}", depth + 1)
    w("}", depth)


def _guard_row(ctx: Context, w: CWriter, depth: int):
    """``mode`` of the sliver's line at ``p0 + k``: 0 every guard holds along it, 2 one fails
    all along it, 1 mixed (``gt[g]``: each guard's K part)."""
    G = _guards(ctx)
    w(f"int mode = 0; int64_t gt[{G}];", depth)
    w("if (guarded)", depth)
    w(f"for (int g = 0; g < {G}; g++) {{", depth + 1)
    w("gt[g] = gk[g * K + p0 + k];", depth + 2)
    w("if (ghi[g] + gt[g] < 0) mode = 2; else if (glo[g] + gt[g] < 0 && mode == 0) mode = 1;", depth + 2)
    w("}", depth + 1)


def _guard_tables(ctx: Context, w: CWriter, depth: int):
    w(f"const int64_t *gb = {_table('g_batch')}, *go = {_table('g_own')}, *gk = {_table('g_k')};", depth)
    w(f"const int64_t nb = {_field('batch')}, K = {_field('k')};", depth)


def _mixed(ctx: Context, index: str) -> str:
    """C: whether every guard holds at line ``index`` of a mixed row."""
    return " && ".join(f"og[{g}][{index}] + gt[{g}] >= 0" for g in range(_guards(ctx)))


def _pack_b(ctx: Context, w: CWriter, name: str = "pack_b"):
    """``<p>_<name>``: B(p0:p0+kc, j0:j0+nc) of batch index bi into NR-wide slivers, k-major,
    zero-padded (and zeros where a guard fails when B is the guarded operand); a whole sliver
    that is one unit-stride run in B copies vectors, and one whose columns are unit-stride runs
    along K (B transposed) loads them as vectors, transposed in registers."""
    p, T, TB, nr, L = ctx.prefix, ctx.T, ctx.TB, ctx.plan.nr, ctx.plan.lanes
    G = _guards(ctx)
    # (not hand-vectorised: -O3 vectorises the copies of a window's runs at stride 2, 6% of a
    # stride-2 3x3 convolution)
    w(f"static void {p}_{name}(const int64_t *TCPY_RESTRICT pl, const {TB} *TCPY_RESTRICT bb, int64_t bi, "
      f"int64_t p0, int64_t kc, int64_t j0, int64_t nc, {T} *TCPY_RESTRICT bp) {{")
    w(f"const int64_t *TCPY_RESTRICT bk = {_table('b_k')}, *TCPY_RESTRICT bn = {_table('b_n')}, "
      f"*TCPY_RESTRICT runs = {_table('b_runs')}, *TCPY_RESTRICT segments = {_table('b_segments')};", 1)
    w(f"const int k_unit = (int){_field('b_k_unit')}; (void)k_unit; (void)bi;", 1)
    if G:
        _guard_tables(ctx, w, 1)
    w(f"for (int64_t s = 0; s < nc; s += {nr}) {{", 1)
    w(f"{T} *TCPY_RESTRICT d = bp + s * kc;", 2)
    w(f"const int64_t cols = nc - s < {nr} ? nc - s : {nr};", 2)
    w(f"const int run = cols == {nr} && runs[(j0 + s) / {nr}];", 2)
    # a sliver of a few runs of step 1 or 2 (a window's rows at stride 1 or 2): its runs, copied
    # run by run (vectors) in each row, instead of element by element through the table
    most = max(1, nr // 4)
    w(f"int64_t seg_at[{most + 1}], seg_len[{most + 1}]; int seg_step[{most + 1}], segs = 0;", 2)
    w(f"for (int64_t c = 0; !run && c < cols && segs <= {most}; segs++) {{", 2)
    w("const int64_t g = segments[j0 + s + c];", 3)
    w("seg_at[segs] = c; seg_len[segs] = g >> 2 < cols - c ? g >> 2 : cols - c; seg_step[segs] = (int)(g & 3);", 3)
    w("c += seg_len[segs];", 3)
    w("}", 2)
    w(f"const int segmented = !run && segs <= {most};", 2)
    if G:
        _guard_parts(ctx, w, 2, 2, f"{_field('n')}", "cols", "j0 + s + c")
    if TB == T and L >= 2 and nr % L == 0:
        w(f"if (k_unit && !run && cols == {nr}{' && !guarded' if G else ''}) {{", 2)
        w(f"const {T} *TCPY_RESTRICT s0 = bb + bk[p0];", 3)
        w(f"const int64_t *TCPY_RESTRICT co = bn + j0 + s;", 3)
        # (B streams from memory: the columns of the sliver PACK_B_AHEAD ahead are asked for)
        w(f"const int ahead = j0 + s + {PACK_B_AHEAD * nr + nr} <= {_field('n')};", 3)
        w("int64_t k = 0;", 3)
        w(f"for (; k + {L} <= kc; k += {L}) {{", 3)
        w(f"if (ahead) for (int c = 0; c < {nr}; c++) __builtin_prefetch(s0 + co[{PACK_B_AHEAD * nr} + c] + k, 0, 3);",
          4)
        for h in range(nr // L):
            transpose_block(ctx, w, 4, lambda c, h=h: f"*(const {p}_vu *)(s0 + co[{h * L + c}] + k)",
                            lambda l, h=h: f"d + (k + {l}) * {nr} + {h * L}")
        w("}", 3)
        w("for (; k < kc; k++)", 3)
        w(f"for (int64_t c = 0; c < {nr}; c++) d[k * {nr} + c] = s0[co[c] + k];", 4)
        w("continue;", 3)
        w("}", 2)
    w("for (int64_t k = 0; k < kc; k++) {", 2)
    w(f"const {TB} *TCPY_RESTRICT r = bb + bk[p0 + k];", 3)
    w(f"{T} *TCPY_RESTRICT o = d + k * {nr};", 3)
    if G:
        _guard_row(ctx, w, 3)
        w(f"if (mode == 2) {{ for (int64_t c = 0; c < {nr}; c++) o[c] = ({T})0; continue; }}", 3)
    w(f"if (run{' && mode == 0' if G else ''}) {{", 3)
    copy_sliver_row(ctx, w, "o", "r + bn[j0 + s]", nr, 1, TB, 4)
    w("continue;", 4)
    w("}", 3)
    w(f"if (segmented{' && mode == 0' if G else ''}) {{", 3)
    w("for (int g = 0; g < segs; g++) {", 4)
    w(f"const {TB} *TCPY_RESTRICT x = r + bn[j0 + s + seg_at[g]]; {T} *TCPY_RESTRICT y = o + seg_at[g];", 5)
    w("const int64_t len = seg_len[g];", 5)
    w(f"if (seg_step[g] == 2) for (int64_t i = 0; i < len; i++) y[i] = ({T})x[2 * i];", 5)
    w(f"else for (int64_t i = 0; i < len; i++) y[i] = ({T})x[i];", 5)
    w("}", 4)
    w(f"for (int64_t c = cols; c < {nr}; c++) o[c] = ({T})0;", 4)
    w("continue;", 4)
    w("}", 3)
    holds = f" && (mode == 0 || ({_mixed(ctx, 'c')}))" if G else ""
    w(f"for (int64_t c = 0; c < {nr}; c++) o[c] = c < cols{holds} ? ({T})r[bn[j0 + s + c]] : ({T})0;", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def _pack_a(ctx: Context, w: CWriter):
    """``<p>_pack_a``: A(i0:i0+mc, p0:p0+kc) of batch index bi into MR-tall slivers, k-major,
    zero-padded rows (and zeros where a guard fails when A is the guarded operand); a whole
    sliver whose rows are unit-stride runs along K loads them as vectors, transposed in
    registers."""
    p, T, TA, mr, L = ctx.prefix, ctx.T, ctx.TA, ctx.plan.mr, ctx.plan.lanes
    G = _guards(ctx)
    w(HAND_VECTORISED)
    w(f"static void {p}_pack_a(const int64_t *TCPY_RESTRICT pl, const {TA} *TCPY_RESTRICT ab, int64_t bi, "
      f"int64_t i0, int64_t mc, int64_t p0, int64_t kc, {T} *TCPY_RESTRICT ap) {{")
    w(f"const int64_t *TCPY_RESTRICT ak = {_table('a_k')}, *TCPY_RESTRICT am = {_table('a_m')};", 1)
    w(f"const int k_unit = (int){_field('a_k_unit')}; (void)k_unit; (void)bi;", 1)
    if G:
        _guard_tables(ctx, w, 1)
    w(f"for (int64_t s = 0; s < mc; s += {mr}) {{", 1)
    w(f"{T} *TCPY_RESTRICT d = ap + s * kc;", 2)
    w(f"const int64_t rows = mc - s < {mr} ? mc - s : {mr};", 2)
    w(f"int64_t ro[{mr}];", 2)
    w(f"for (int64_t r = 0; r < {mr}; r++) ro[r] = am[i0 + s + (r < rows ? r : rows - 1)];", 2)
    if G:
        _guard_parts(ctx, w, 2, 1, f"{_field('m')}", "rows", "i0 + s + c")
    if TA == T and mr <= L <= 2 * mr:
        w(f"if (k_unit && rows == {mr}{' && !guarded' if G else ''}) {{", 2)
        w(f"const {T} *TCPY_RESTRICT s0 = ab + ak[p0];", 3)
        w("int64_t k = 0;", 3)
        w(f"for (; k + {L} <= kc; k += {L}) {{", 3)
        transpose_block(ctx, w, 4, lambda r: f"*(const {p}_vu *)(s0 + ro[{r}] + k)" if r < mr else "x0",
                        lambda l: f"d + (k + {l}) * {mr}")
        w("}", 3)
        w("for (; k < kc; k++)", 3)
        w(f"for (int64_t r = 0; r < {mr}; r++) d[k * {mr} + r] = s0[ro[r] + k];", 4)
        w("continue;", 3)
        w("}", 2)
    w("for (int64_t k = 0; k < kc; k++) {", 2)
    w(f"const {TA} *TCPY_RESTRICT src = ab + ak[p0 + k];", 3)
    w(f"{T} *TCPY_RESTRICT o = d + k * {mr};", 3)
    if G:
        _guard_row(ctx, w, 3)
    holds = f" && mode != 2 && (mode == 0 || ({_mixed(ctx, 'r')}))" if G else ""
    w(f"#pragma GCC unroll {mr}", 3)
    w(f"for (int64_t r = 0; r < {mr}; r++) o[r] = r < rows{holds} ? ({T})src[ro[r]] : ({T})0;", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def _micro_kernel(ctx: Context, w: CWriter, a_in_place: bool = False):
    """``<p>_ukr<v>``: the tile at rows i.., columns j.. of the output (``cb``: its batch base;
    ``cm``, ``cn``: its offset tables) from ``v`` vectors of each B sliver row (the narrower
    kernels serve N's last tile: fewer FMAs on padding); vector stores of whole rows when the
    tile's columns are one unit-stride run of C (``c_run``), else element by element through
    the tables. With ``a_in_place``, ``<p>_uka<v>``: A's MR rows read in place (``a`` holds a
    pointer per row, each at the K block's first element)."""
    p, T, mr, nr, L = ctx.prefix, ctx.T, ctx.plan.mr, ctx.plan.nr, ctx.plan.lanes
    name, a_type = ("uka", f"const {T} *const *TCPY_RESTRICT") if a_in_place else ("ukr", f"const {T} *TCPY_RESTRICT")
    a_load = (lambda r: f"a{r}[k]") if a_in_place else (lambda r: f"a[k * {mr} + {r}]")
    setup = [" ".join(f"const {T} *TCPY_RESTRICT a{r} = a[{r}];" for r in range(mr))] if a_in_place else []
    for vectors in range(1, ctx.plan.nr_vectors + 1):
        tile = ctx.with_plan(dataclasses.replace(ctx.plan, nr=vectors * L))
        # (B slivers keep the full width's layout)
        _tile_kernel(tile, w, f"{p}_{name}{vectors}", f"{a_type} a, const {T} *TCPY_RESTRICT b",
                     lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * L})", a_load, setup)


def _tile_kernel(tile: Context, w: CWriter, name: str, operands: str, b_load, a_load, setup=()):
    """A micro-kernel ``name`` of ``tile``'s width whose operands (C parameters ``operands``)
    are read by ``b_load`` and ``a_load`` (see :func:`.kernel.accumulate_loop`) after the C
    lines ``setup``."""
    T, mr, width = tile.T, tile.plan.mr, tile.plan.nr
    w(HAND_VECTORISED)
    w(f"static __attribute__((noinline)) void {name}(int64_t kc, {operands}, {T} *TCPY_RESTRICT cb, "
      f"const int64_t *TCPY_RESTRICT cm, const int64_t *TCPY_RESTRICT cn, int c_run, int64_t i, int64_t j, "
      f"int64_t mr, int64_t nr, int overwrite, {T} alpha) {{")
    for line in setup:
        w(line, 1)
    w(f"if (c_run) for (int64_t r = 0; r < mr; r++) {{ {T} *q = cb + cm[i + r] + cn[j]; "
      "__builtin_prefetch(q, 1, 3); __builtin_prefetch(q + nr - 1, 1, 3); }", 1)
    accumulate_loop(tile, w, "kc", b_load, a_load, 1)
    w(f"if (c_run && nr == {width}) {{", 1)
    w(f"if (mr == {mr}) {{", 2)
    for r in range(mr):
        w(f"{T} *q{r} = cb + cm[i + {r}] + cn[j];", 3)
    whole_tile(tile, w, 3, lambda r: f"q{r}", "overwrite", "alpha * ")
    w("return;", 3)
    w("}", 2)
    for r in range(mr - 1):
        w(f"if (mr > {r}) {{", 2)
        w(f"{T} *q = cb + cm[i + {r}] + cn[j];", 3)
        tile_row(tile, w, 3, r, "q", "overwrite", "alpha * ")
        w("}", 2)
    w("return;", 2)
    w("}", 1)
    spill(tile, w, 1)
    w("for (int64_t r = 0; r < mr; r++) {", 1)
    w(f"{T} *q = cb + cm[i + r];", 2)
    w("for (int64_t c = 0; c < nr; c++) {", 2)
    w(f"{T} *e = q + cn[j + c];", 3)
    w("*e = overwrite ? alpha * t[r][c] : *e + alpha * t[r][c];", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def _narrowest(ctx: Context, name: str, args: str) -> str:
    """C: the call of kernel ``<p>_<name><v>`` with ``args`` of the fewest vectors ``v`` that
    cover the tile's ``nr`` columns (N's last tile)."""
    p, nv = ctx.prefix, ctx.plan.nr_vectors
    call = f"{p}_{name}{nv}{args}"
    for vectors in range(nv - 1, 0, -1):
        call = f"if (nr <= {vectors * ctx.plan.lanes}) {p}_{name}{vectors}{args} else {call}"
    return call


def _in_place(ctx: Context, w: CWriter):
    """The small and stream paths' micro-kernels ``<p>_ipk<v>``, as ``<p>_ukr<v>`` with A read in
    place (its rows ``sam``, its columns ``sak`` apart; rows past ``mr`` clamped to the last,
    never stored) and B's rows ``ldb`` apart, and their cell ``<p>_ipk_cell``; with the plan's
    ``small_tile``, the same of that tile (``<p>_ipw<v>``, ``<p>_ipw_cell``, and the stream
    path's ``<p>_pack_bw``, B's slivers of its width)."""
    p, T, L = ctx.prefix, ctx.T, ctx.plan.lanes
    tiles = [("ipk", ctx)]
    if ctx.plan.small_tile is not None:
        mr, nr = ctx.plan.small_tile
        tiles.append(("ipw", ctx.with_plan(dataclasses.replace(ctx.plan, mr=mr, nr=nr))))
    for name, tiled in tiles:
        mr = tiled.plan.mr
        for vectors in range(1, tiled.plan.nr_vectors + 1):
            tile = tiled.with_plan(dataclasses.replace(tiled.plan, nr=vectors * L))
            _tile_kernel(tile, w, f"{p}_{name}{vectors}", f"const {T} *TCPY_RESTRICT a, int64_t sam, int64_t sak, "
                         f"const {T} *TCPY_RESTRICT b, int64_t ldb",
                         lambda v: f"*(const {p}_vu *)(b + k * ldb + {v * L})", lambda r: f"a{r}[k * sak]",
                         [f"const {T} *TCPY_RESTRICT a{r} = a + sam * (i + ({r} < mr ? {r} : mr - 1));"
                          for r in range(mr)])
        pack = "pack_b" if name == "ipk" else "pack_bw"
        if name != "ipk":
            _pack_b(tiled, w, pack)
        _in_place_cell(tiled, w, name, pack)


def _in_place_cell(ctx: Context, w: CWriter, name: str, pack: str):
    """``<p>_<name>_cell``: one cell of the thread grid on the small path (B's slivers read in
    place, a sliver copied zero-padded when it is partial, ``copy_b`` when every one is) or the
    stream path (each K block of B packed by ``<p>_<pack>``, A's rows of one micro-tile against
    all of it), with the kernels ``<p>_<name><v>``."""
    p, T, mr, nr, L = ctx.prefix, ctx.T, ctx.plan.mr, ctx.plan.nr, ctx.plan.lanes
    # (not hand-vectorised: -O3 vectorises the copy of a partial sliver, 12% of a 100x100 GEMM)
    w(f"static void {p}_{name}_cell(const int64_t *TCPY_RESTRICT pl, const {T} *TCPY_RESTRICT A, "
      f"const {T} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C, int64_t b0, int64_t b1, int64_t m0, int64_t m1, "
      f"int64_t n0, int64_t n1, {T} alpha, const volatile int *stop) {{")
    w(f"const int64_t K = {_field('k')}, KC = {_field('kc')}, NC = {_field('nc')};", 1)
    w(f"const int64_t sam = {_field('a_m_stride')}, sak = {_field('a_k_stride')}, sbk = {_field('b_k_stride')};", 1)
    w(f"const int copy_b = (int){_field('copy_b')};", 1)
    w(f"const int64_t *ab_t = {_table('a_batch')}, *bb_t = {_table('b_batch')}, *cb_t = {_table('c_batch')};", 1)
    w(f"const int64_t *cm = {_table('c_m')}, *cn = {_table('c_n')}, *bn = {_table('b_n')};", 1)
    w(f"const int64_t *c_runs = {_table('c_runs')};", 1)
    w(f"const int stream = {_field('path')} == {RUNTIME_PATHS.index('stream')};", 1)
    w("const int64_t block = stream ? NC : n1 - n0;  /* (the small path: the cell's N in one block) */", 1)
    w(f"{T} *bp = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * ((stream ? KC * NC : KC * {nr}) + {L}));",
      1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {T} *ab = A + {_field('a_base')} + ab_t[bi];", 2)
    w(f"const {T} *bb = B + {_field('b_base')} + bb_t[bi];", 2)
    w(f"{T} *cb = C + {_field('c_base')} + cb_t[bi];", 2)
    w("for (int64_t jc = n0; jc < n1; jc += block) {", 2)
    w("const int64_t nc = n1 - jc < block ? n1 - jc : block;", 3)
    w("for (int64_t pc = 0; pc < K; pc += KC) {", 3)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 4)
    w("const int64_t kc = K - pc < KC ? K - pc : KC;", 4)
    w(f"const {T} *ak = ab + pc * sak;", 4)
    overwrite = "pc == 0" if ctx.con.init else "0"
    args = f"(kc, ak, sam, sak, bs, ldb, cb, cm, cn, c_run, i, jc + jr, mr, nr, {overwrite}, alpha);"
    w("if (stream) {", 4)
    w(f"{p}_{pack}(pl, bb, bi, pc, kc, jc, nc, bp);", 5)
    w(f"for (int64_t i = m0; i < m1; i += {mr}) {{", 5)
    w(f"const int64_t mr = m1 - i < {mr} ? m1 - i : {mr};", 6)
    w(f"for (int64_t jr = 0; jr < nc; jr += {nr}) {{", 6)
    w(f"const int64_t nr = nc - jr < {nr} ? nc - jr : {nr}, ldb = {nr};", 7)
    w(f"const {T} *bs = bp + jr * kc;", 7)
    w(f"const int c_run = (int)c_runs[(jc + jr) / {nr}];", 7)
    w(_narrowest(ctx, name, args), 7)
    w("}", 6)
    w("}", 5)
    w("continue;", 5)
    w("}", 4)
    w(f"for (int64_t jr = 0; jr < nc; jr += {nr}) {{", 4)
    w(f"const int64_t nr = nc - jr < {nr} ? nc - jr : {nr};", 5)
    w(f"const {T} *bs = bb + pc * sbk + bn[jc + jr];", 5)
    w("int64_t ldb = sbk;", 5)
    # a sliver whose width is no whole number of vectors is copied, zero-padded (in place,
    # the last vector would read past B); all of them when B's rows crowd L1 (the plan's copy_b)
    w(f"if (copy_b || nr % {L}) {{", 5)
    w("for (int64_t k = 0; k < kc; k++)", 6)
    w(f"for (int64_t c = 0; c < {nr}; c++) bp[k * {nr} + c] = c < nr ? bs[k * sbk + c] : ({T})0;", 7)
    w(f"bs = bp; ldb = {nr};", 6)
    w("}", 5)
    w(f"const int c_run = (int)c_runs[(jc + jr) / {nr}];", 5)
    w(f"for (int64_t i = m0; i < m1; i += {mr}) {{", 5)
    w(f"const int64_t mr = m1 - i < {mr} ? m1 - i : {mr};", 6)
    w(_narrowest(ctx, name, args), 6)
    w("}", 5)
    w("}", 4)
    w("}", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def _prepack(ctx: Context, w: CWriter):
    """``<p>_prepack(pl, B, bp)``: every (kc x nc) panel of B (batch index 0) packed as the cell
    packs it, panel (pc, jc) at ``bp + pc * npad + jc * kc`` (``npad``: N in whole slivers)."""
    p, T, TB, nr = ctx.prefix, ctx.T, ctx.TB, ctx.plan.nr
    w(HAND_VECTORISED)
    w(f"static void {p}_prepack(const int64_t *TCPY_RESTRICT pl, const {TB} *TCPY_RESTRICT B, "
      f"{T} *TCPY_RESTRICT bp) {{")
    w(f"const int64_t K = {_field('k')}, N = {_field('n')}, KC = {_field('kc')}, NC = {_field('nc')};", 1)
    w(f"const int64_t npad = (N + {nr - 1}) / {nr} * {nr};", 1)
    w(f"const {TB} *bb = B + {_field('b_base')} + {_table('b_batch')}[0];", 1)
    w("for (int64_t pc = 0; pc < K; pc += KC)", 1)
    w("for (int64_t jc = 0; jc < N; jc += NC)", 2)
    w(f"{p}_pack_b(pl, bb, 0, pc, K - pc < KC ? K - pc : KC, jc, N - jc < NC ? N - jc : NC, "
      "bp + pc * npad + jc * (K - pc < KC ? K - pc : KC));", 3)
    w("}")


def _packed_in_place(ctx: Context, w: CWriter):
    """``<p>_packed_b(pl, B)``: B itself (batch index 0) where it is laid out as
    ``<p>_prepack`` would pack it, else 0 (it is packed): one whole sliver of N (N = NR, its
    columns one unit-stride run), its rows along K NR elements apart, vector-aligned (the
    micro-kernels' aligned loads: unaligned ones across cache lines cost more than the copy
    saves), of the contraction's type, no guard on it (attention's V at a head size of NR)."""
    p, T, TB, nr = ctx.prefix, ctx.T, ctx.TB, ctx.plan.nr
    w(f"static const {T} *{p}_packed_b(const int64_t *TCPY_RESTRICT pl, const {TB} *TCPY_RESTRICT B) {{")
    if TB != T:
        w("(void)pl; (void)B;", 1)
        w("return 0;  /* (B of another type is converted as it is packed) */", 1)
        w("}")
        return
    w(f"if ({_field('k')} == 0 || {_field('n')} != {nr} || {_field('b_k_stride')} != {nr} || {_field('guarded')} == 2 "
      f"|| !{_table('b_runs')}[0]) return 0;", 1)
    w(f"const {T} *first = B + {_field('b_base')} + {_table('b_batch')}[0] + {_table('b_k')}[0] + {_table('b_n')}[0];", 1)
    w(f"return (uintptr_t)first % {ctx.plan.lanes * ctx.element_bytes} ? 0 : first;", 1)
    w("}")


def _cell(ctx: Context, w: CWriter, chained: bool = False):
    """``<p>_cell``: one cell of the thread grid (batch, M and N ranges), BLIS's five loops
    around the micro-kernel with the plan's blocks; a ``chained`` one (see
    :func:`render_block`) takes B prepacked (``bpre``, or 0) and reads A's rows in place where
    they run along K."""
    p, T, TA, TB, mr, nr = ctx.prefix, ctx.T, ctx.TA, ctx.TB, ctx.plan.mr, ctx.plan.nr
    in_place = chained and TA == T
    w(HAND_VECTORISED)
    w(f"static void {p}_cell(const int64_t *TCPY_RESTRICT pl, const {TA} *TCPY_RESTRICT A, "
      f"const {TB} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C, int64_t b0, int64_t b1, int64_t m0, int64_t m1, "
      f"int64_t n0, int64_t n1, {T} alpha, const volatile int *stop"
      + (f", const {T} *TCPY_RESTRICT bpre, int fresh) {{" if chained else ") {"))
    w(f"const int64_t K = {_field('k')}, KC = {_field('kc')}, MC = {_field('mc')}, NC = {_field('nc')};", 1)
    w(f"const int64_t *ab_t = {_table('a_batch')}, *bb_t = {_table('b_batch')}, *cb_t = {_table('c_batch')};", 1)
    w(f"const int64_t *cm = {_table('c_m')}, *cn = {_table('c_n')};", 1)
    w(f"const int64_t *c_runs = {_table('c_runs')};", 1)
    if chained:
        w(f"const int64_t N = {_field('n')}; (void)N;", 1)
    if in_place:  # A's rows run along K: read in place
        w(f"const int64_t *am = {_table('a_m')}, *ak = {_table('a_k')};", 1)
        w(f"const int direct = (int){_field('a_k_unit')};", 1)
    # (+ lanes: slack as the specialised path's buffers have)
    w(f"{T} *ap = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, sizeof({T}) * (MC * KC + {ctx.plan.lanes}));", 1)
    w(f"{T} *bp = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * (KC * NC + {ctx.plan.lanes}));", 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {TA} *ab = A + {_field('a_base')} + ab_t[bi];", 2)
    w(f"const {TB} *bb = B + {_field('b_base')} + bb_t[bi];", 2)
    w(f"{T} *cb = C + {_field('c_base')} + cb_t[bi];", 2)
    if chained and ctx.con.init:  # an empty sum (no keys, or no head dimension): zeros
        w("if (K == 0) for (int64_t i = m0; i < m1; i++) for (int64_t j = n0; j < n1; j++) "
          f"cb[cm[i] + cn[j]] = ({T})0;", 2)
    w("for (int64_t jc = n0; jc < n1; jc += NC) {", 2)
    w("const int64_t nc = n1 - jc < NC ? n1 - jc : NC;", 3)
    w("for (int64_t pc = 0; pc < K; pc += KC) {", 3)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 4)
    w("const int64_t kc = K - pc < KC ? K - pc : KC;", 4)
    if chained:
        w(f"const {T} *bq = bpre ? bpre + pc * ((N + {nr - 1}) / {nr} * {nr}) + jc * kc : bp;", 4)
        w(f"if (!bpre) {p}_pack_b(pl, bb, bi, pc, kc, jc, nc, bp);", 4)
    else:
        w(f"{p}_pack_b(pl, bb, bi, pc, kc, jc, nc, bp);", 4)
    w("for (int64_t ic = m0; ic < m1; ic += MC) {", 4)
    w("const int64_t mc = m1 - ic < MC ? m1 - ic : MC;", 5)
    w(f"{'if (!direct) ' if in_place else ''}{p}_pack_a(pl, ab, bi, ic, mc, pc, kc, ap);", 5)
    w(f"for (int64_t jr = 0; jr < nc; jr += {nr}) {{", 5)
    w(f"const int64_t nr = nc - jr < {nr} ? nc - jr : {nr};", 6)
    w(f"const int c_run = (int)c_runs[(jc + jr) / {nr}];", 6)
    w(f"for (int64_t ir = 0; ir < mc; ir += {mr}) {{", 6)
    w(f"const int64_t mr = mc - ir < {mr} ? mc - ir : {mr};", 7)
    overwrite = "pc == 0" if ctx.con.init else "pc == 0 && fresh" if chained else "0"
    rest = f"{'bq' if chained else 'bp'} + jr * kc, cb, cm, cn, c_run, ic + ir, jc + jr, mr, nr, {overwrite}, alpha);"
    calls = [_narrowest(ctx, name, f"(kc, {a}, {rest}")
             for name, a in ((("ukr", "ap + ir * kc"), ("uka", "ar")) if in_place else (("ukr", "ap + ir * kc"),))]
    if in_place:  # (rows past M repeat its last row, whose results are not stored)
        w("if (direct) {", 7)
        w(f"const {TA} *ar[{mr}], *abk = ab + ak[pc];", 8)
        w("const int64_t *TCPY_RESTRICT amr = am + ic + ir;", 8)
        # (a whole tile's rows unrolled: a loop with the clamp cost the cell a third of its time)
        w(f"if (mr == {mr}) {{", 8)
        w(f"#pragma GCC unroll {mr}", 9)
        w(f"for (int r = 0; r < {mr}; r++) ar[r] = abk + amr[r];", 9)
        w(f"}} else for (int r = 0; r < {mr}; r++) ar[r] = abk + amr[r < mr ? r : mr - 1];", 8)
        w(calls[1], 8)
        w(f"}} else {calls[0]}", 7)
    else:
        w(calls[0], 7)
    for depth in range(6, 1, -1):
        w("}", depth)
    w("}", 1)
    w("}")


def _cells(ctx: Context, w: CWriter):
    """``<p>_cells``: the cells of the plan's thread grid this thread claims, one by one."""
    p, T, TA, TB, mr, nr = ctx.prefix, ctx.T, ctx.TA, ctx.TB, ctx.plan.mr, ctx.plan.nr
    w(HAND_VECTORISED)
    w(f"static void {p}_cells(const int64_t *TCPY_RESTRICT pl, const {TA} *A, const {TB} *B, {T} *C, {T} alpha, "
      "const volatile int *stop, int64_t *next_cell) {")
    w(f"const int64_t nb = {_field('batch')}, M = {_field('m')}, N = {_field('n')};", 1)
    w(f"const int64_t tb = {_field('grid_batch')}, tm = {_field('grid_m')}, tn = {_field('grid_n')};", 1)
    in_place = len(runtime_paths(ctx.con)) > 1
    if in_place:  # (the small and stream paths' micro-tile may be the plan's small_tile)
        w(f"const int ip = {_field('path')} != {RUNTIME_PATHS.index('packed')};", 1)
        w(f"const int64_t MR = ip ? {_field('mr')} : {mr}, NR = ip ? {_field('nr')} : {nr};", 1)
    else:
        w(f"const int64_t MR = {mr}, NR = {nr};", 1)
    w("const int64_t cells = tb * tm * tn, mt = (M + MR - 1) / MR, nt = (N + NR - 1) / NR;", 1)
    w("for (int64_t cell; (cell = tcpy_claim(next_cell, cells)) < cells; ) {", 1)
    w("const int64_t cbi = cell / (tm * tn), cm = cell / tn % tm, cn = cell % tn;", 2)
    w("const int64_t b0 = cbi * nb / tb, b1 = (cbi + 1) * nb / tb;", 2)
    w("const int64_t m0 = cm * mt / tm * MR, m1 = tcpy_min_int64((cm + 1) * mt / tm * MR, M);", 2)
    w("const int64_t n0 = cn * nt / tn * NR, n1 = tcpy_min_int64((cn + 1) * nt / tn * NR, N);", 2)
    w("if (b0 >= b1 || m0 >= m1 || n0 >= n1) continue;", 2)
    call = "_cell(pl, A, B, C, b0, b1, m0, m1, n0, n1, alpha, stop);"
    if in_place:
        wide = ctx.plan.small_tile
        cell = (f"{{ if (MR == {wide[0]} && NR == {wide[1]}) {p}_ipw{call} else {p}_ipk{call} }}" if wide else
                f"{p}_ipk{call}")
        w(f"if (ip) {{ {cell} continue; }}", 2)
    w(f"{p}{call}", 2)
    w("}", 1)
    w("}")


def _driver(ctx: Context, w: CWriter, plan_slot: int):
    """The statement's C in the kernel: empty roles, the exact sums when they are needed, else
    the cells of the plan's thread grid claimed one by one by the threads."""
    p, T, TA, TB, con = ctx.prefix, ctx.T, ctx.TA, ctx.TB, ctx.con
    X, Y = ctx.names[con.a.tensor], ctx.names[con.b.tensor]
    C = ctx.names[con.c.tensor]
    w("{")
    w(f"const int64_t *TCPY_RESTRICT pl = (const int64_t *)tcpy_buffers[{plan_slot}];", 1)
    w(f"const int64_t nb = {_field('batch')}, M = {_field('m')}, N = {_field('n')}, K = {_field('k')};", 1)
    w(f"const {T} alpha = {ctx.alpha()};", 1)
    # (swapped only when both operands have one type: see tcpy.transform.runtime_plan)
    w(f"const {TA} *A = (const {TA} *)({_field('swapped')} ? (const void *){Y} : (const void *){X});", 1)
    w(f"const {TB} *B = (const {TB} *)({_field('swapped')} ? (const void *){X} : (const void *){Y});", 1)
    w(f"{T} *TCPY_RESTRICT Cc = {C};", 1)
    w("if (nb > 0 && M > 0 && N > 0) {", 1)
    init = con.init
    if init:  # K = 0: every sum is empty
        w("if (K == 0) {", 2)
        _over_outputs(w, 3, f"Cc[ct] = ({T})0;")
        w("} else {", 2)
    else:
        w("if (K > 0) {", 2)
    w(f"int nonfinite = {nonfinite(T, 'alpha') if con.alpha_tensors else '0'};", 3)
    depth = 3
    if ctx.plan.winograd is not None:  # the winograd path scans its operands itself
        image, weights = (ctx.names[getattr(con, role).tensor] for role in (ctx.plan.winograd.image,
                                                                          ctx.plan.winograd.weights))
        w(f"if ({_field('winograd')}) {{", 3)
        w(f"if (!nonfinite) nonfinite = {p}_winograd(pl, {image}, {weights}, Cc, alpha, tcpy_num_threads, "
          "tcpy_stop);", 4)
        w("} else {", 3)
        depth = 4
    if con.guards and not con.padding_multiplies:
        # the operand beside the guarded one, whose inf or NaN a packed zero would turn into NaN
        for guarded, other in ((2, "A"), (1, "B")):
            w(f"if ({_field('guarded')} == {guarded})", depth)
            w(f"for (int64_t e = 0; e < {_field('other_elements')}; e++) nonfinite |= {nonfinite(T, f'{other}[e]')};",
              depth + 1)
    w("if (!nonfinite) {", depth)
    w("int64_t next_cell = 0;  /* the cells are claimed one by one (tcpy_claim) */", depth + 1)
    w(f"const int64_t cells = {_field('grid_batch')} * {_field('grid_m')} * {_field('grid_n')};", depth + 1)
    w("const int team = tcpy_num_threads < cells ? tcpy_num_threads : (int)cells;", depth + 1)
    call = f"{p}_cells(pl, A, B, Cc, alpha, tcpy_stop, &next_cell);"
    w("if (team > 1) {  /* (one cell: no parallel region to open) */", depth + 1)
    w("#pragma omp parallel num_threads(team)", depth + 2)
    w(f"{{ TCPY_TEAM_START(); {call} }}", depth + 2)
    w(f"}} else {call}", depth + 1)
    w("}", depth)
    if depth > 3:
        w("}", 3)
    w("if (TCPY_UNLIKELY(nonfinite)) {  /* inf or NaN: the sums as TC states them */", 3)
    _exact(ctx, w, 4)
    w("}", 3)
    w("}", 2)
    w("}", 1)
    w("}")


def _over_outputs(w: CWriter, depth: int, statement: str, pragma: str = ""):
    """``statement`` (lines) at every output element (``bi``, ``i``, ``j``; ``ct``: the
    element's offset in C), under ``pragma`` when given."""
    w(f"const int64_t *cbt = {_table('c_batch')}, *cmt = {_table('c_m')}, *cnt = {_table('c_n')};", depth)
    if pragma:
        w(pragma, depth)
    w("for (int64_t bi = 0; bi < nb; bi++)", depth)
    w("for (int64_t i = 0; i < M; i++)", depth + 1)
    w("for (int64_t j = 0; j < N; j++) {", depth + 2)
    w(f"const int64_t ct = {_field('c_base')} + cbt[bi] + cmt[i] + cnt[j];", depth + 3)
    w(statement, depth + 3)
    w("}", depth + 2)


def _exact(ctx: Context, w: CWriter, depth: int):
    """The sums point by point, as the statement is written (see :mod:`.exact`): a term whose
    guard fails is left out (a guarded factor: 0 times the other operand); a scale by rank-0
    tensors multiplies every term."""
    p, T, con = ctx.prefix, ctx.T, ctx.con
    w(f"const int64_t *abt = {_table('a_batch')}, *amt = {_table('a_m')}, *akt = {_table('a_k')};", depth)
    w(f"const int64_t *bbt = {_table('b_batch')}, *bnt = {_table('b_n')}, *bkt = {_table('b_k')};", depth)
    w(f"const int64_t guarded = {_field('guarded')}; (void)guarded;", depth)
    lines = [f"{T} s = 0;", "for (int64_t k = 0; k < K; k++) {"]
    a_k = f"({T})A[{_field('a_base')} + abt[bi] + amt[i] + akt[k]]"
    b_k = f"({T})B[{_field('b_base')} + bbt[bi] + bnt[j] + bkt[k]]"
    if con.alpha_tensors:
        a_k = f"alpha * {a_k}"
    holds = f"(!guarded || {p}_holds(pl, bi, guarded == 1 ? i : j, k))" if con.guards else "1"
    if con.guards and con.padding_multiplies:
        lines += [f"    const {T} x = {a_k}, y = {b_k};", f"    const int ok = {holds};",
                  f"    s += (guarded != 1 || ok ? x : ({T})0) * (guarded != 2 || ok ? y : ({T})0);"]
    else:
        lines.append(f"    if ({holds}) s += {a_k} * {b_k};")
    scaled = "s" if con.alpha_tensors else "alpha * s"
    lines += ["}", f"Cc[ct] = {scaled if con.init else 'Cc[ct] + ' + scaled};"]
    _over_outputs(w, depth, "\n".join(lines),
                  "#pragma omp parallel for collapse(3) num_threads(tcpy_num_threads) if(tcpy_num_threads > 1)")
