"""The direct path (M = 1, a short K: depthwise convolution): each output row is the sum over
the K taps of one A value times B's shifted row, vectorised along the row where every guard
holds; with a padded copy, the runs read a zero-padded copy of B with no guards."""
from __future__ import annotations

import dataclasses

from ..cwriter import CWriter, ScratchSlot
from .context import Context, cell_head, fence, header
from .exact import exact_sums
from .guarded import clamp_run, guard_base

DIRECT_ENDS = 8  # padded positions of a run whose taps the direct path lists (beyond: tested per tap)


def direct(ctx: Context, w: CWriter):
    """M = 1: the output along each run of its inner N group (a row, at most nc long) is
    the sum over K of one A value times B's row shifted by the tap. A table of the taps
    that read the run (and the interval where each does) is kept from run to run; the
    interior, where every listed tap reads, is vectorised (:func:`_direct_vectors`), and
    the row's padded ends sum the taps listed for each position (with a padded copy,
    :func:`padded_direct`, the runs read the copy with no guards)."""
    if ctx.plan.padded_copy:
        padded_direct(ctx, w)
        return
    direct_cell(ctx, w, "cell")


def padded_direct(ctx: Context, w: CWriter):
    """``<p>_cell`` of the direct path with a padded copy (:class:`PaddedCopy`): per batch
    index, B's slice is copied into a zeroed buffer (its pads stay zero) and the unguarded
    contraction reads the copy; a batch index whose taps are not all finite sums point by
    point instead (:func:`exact_sums`: 0 x inf is NaN where TC adds nothing)."""
    p, T, TA, TB, con = ctx.prefix, ctx.T, ctx.TA, ctx.TB, ctx.con
    copy = con.padded
    inner = Context(copy.contraction, dataclasses.replace(ctx.plan, padded_copy=False), ctx.names, f"{p}_pd",
                    ctx.epilogue)
    header(inner, w)
    direct_cell(inner, w, "cell")
    pitch = copy.pitch
    cell_head(ctx, w, "cell")
    # (+ a vector: a row block's rows shorter than a vector read its lanes past the copy's end)
    size = copy.elements + ctx.plan.lanes
    w(f"{T} *pad = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * {size});", 1)
    w(f"memset(pad, 0, sizeof({T}) * {size});", 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w(f"const {TA} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    if not con.padding_multiplies:  # (a guarded factor's zeros multiply the taps, as written)
        w("int finite = 1;", 2)
        w(f"for (int64_t k = 0; k < {ctx.K}; k++) finite &= __builtin_isfinite(({T})ab[{p}_off_a_k(k)]);", 2)
        w("if (!finite) {", 2)
        exact_sums(ctx, w, 3, ("A", "B", "C"), ("m0", "m1"), ("n0", "n1"))
        w("continue;", 3)
        w("}", 2)
    w(f"const {TB} *src = B + INT64_C({copy.source_offset}) + {p}_off_b_batch(bi);", 2)
    depth = 2
    for i, (extent, _, _, _) in enumerate(copy.dims[:-1]):
        w(f"for (int64_t i{i} = 0; i{i} < {extent}; i{i}++)", depth)
        depth += 1
    outer = copy.dims[:-1]
    s_at = " + ".join([f"INT64_C({stride}) * i{i}" for i, (_, stride, _, _) in enumerate(outer)] or ["0"])
    d_at = " + ".join([f"INT64_C({pitch[i]}) * (i{i} + {lo})" for i, (_, _, lo, _) in enumerate(outer)] or ["0"])
    extent, stride, lo, _ = copy.dims[-1]
    w("{", depth)
    w(f"const {TB} *TCPY_RESTRICT s = src + {s_at};", depth + 1)
    w(f"{T} *TCPY_RESTRICT d = pad + {d_at} + {lo};", depth + 1)
    w(f"for (int64_t j = 0; j < {extent}; j++) d[j] = ({T})s[INT64_C({stride}) * j];", depth + 1)
    w("}", depth)
    w(f"{p}_pd_cell(A, pad, C, bi, bi + 1, m0, m1, n0, n1, alpha, stop{ctx.cell_args});", 2)
    w("}", 1)
    w("}")


def direct_cell(ctx: Context, w: CWriter, name: str):
    """``<p>_<name>``: the direct path's runs over batch indices ``b0..b1`` (see :func:`direct`)."""
    p, T, TA, TB, con = ctx.prefix, ctx.T, ctx.TA, ctx.TB, ctx.con
    NC, K = ctx.plan.nc, ctx.K
    count = len(con.guards)
    inner = con.n[-1]
    step, extent = inner.stride("b"), inner.extent
    cell_head(ctx, w, name)
    w("(void)m0; (void)m1;", 1)
    # The taps' offsets and guard parts, and per batch index the A values, in small tables.
    # Per run, the table of taps that read the input somewhere on it (offset, A value, valid
    # [lo, hi)). Guards constant along the run (a row's kh) only switch taps on or off; the
    # others (kw) clamp [lo, hi) and are the same on most runs, so the table is rebuilt only
    # when the switched-on taps, those guards' values at the run's start or its length change.
    flat = [i for i in range(count) if inner.stride(f"g{i}") == 0]
    sloped = [i for i in range(count) if inner.stride(f"g{i}") != 0]
    w(f"int64_t ko[{K}], gk[{max(1, count)}][{K}], to[{K}], tlo[{K}], thi[{K}];", 1)
    w(f"{T} av[{K}], ta[{K}];", 1)
    w(f"int64_t gmin[{max(1, len(flat))}];  /* the constant guards' least tap part */", 1)
    w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
    w(f"ko[k] = {p}_off_b_k(k);", 2)
    for i in range(count):
        w(f"gk[{i}][k] = {p}_off_g{i}_k(k);", 2)
    for j, i in enumerate(flat):
        w(f"gmin[{j}] = k == 0 ? gk[{i}][0] : tcpy_min_int64(gmin[{j}], gk[{i}][k]);", 2)
    w("}", 1)
    w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
    w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 2)
    w(f"const {TA} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
    w(f"const {TB} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
    w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
    w(f"for (int64_t k = 0; k < {K}; k++) av[k] = ({T})ab[{p}_off_a_k(k)];", 2)
    guard_base(ctx, w, 2)
    w(f"int64_t nt = 0, lo_all = 0, hi_all = 0, key_len = -1, key_g[{max(1, len(sloped))}] = {{0}};", 2)
    w(f"int64_t nb = 0, ne = 0, bc[{DIRECT_ENDS}], bs[{DIRECT_ENDS + 1}] = {{0}}, eo[{DIRECT_ENDS * K}];", 2)
    w(f"{T} ea[{DIRECT_ENDS * K}];", 2)
    w("uint64_t key_on = 0;", 2)
    w("for (int64_t x = n0; x < n1; ) {", 2)
    if ctx.plan.rows > 1:
        row_block(ctx, w, 3)
    w(f"int64_t len = tcpy_min_int64(n1 - x, {extent} - x % {extent});", 3)
    w(f"if (len > {NC}) len = {NC};", 3)
    w(f"const {TB} *TCPY_RESTRICT row = bb + {p}_off_b_n(x);", 3)
    w(f"{T} *TCPY_RESTRICT q = cb + {p}_off_c_n(x);", 3)
    for i in range(count):
        w(f"const int64_t rg{i} = gb[{i}] + {p}_off_g{i}_n(x);", 3)
    w(f"uint64_t on = {(1 << K) - 1:#x}u;  /* every tap (away from the kh padding) */", 3)
    if flat:
        everywhere = " && ".join(f"gmin[{j}] + rg{i} >= 0" for j, i in enumerate(flat))
        w(f"if (!({everywhere})) {{", 3)
        w("on = 0;", 4)
        w(f"for (int64_t k = 0; k < {K}; k++)", 4)
        valid = " && ".join(f"gk[{i}][k] + rg{i} >= 0" for i in flat)
        w(f"on |= (uint64_t)({valid}) << k;", 5)
        w("}", 3)
    same = " && ".join(["on == key_on", "len == key_len", *(f"rg{i} == key_g[{j}]" for j, i in enumerate(sloped))])
    w(f"if (!({same})) {{", 3)
    w("key_on = on; key_len = len;", 4)
    for j, i in enumerate(sloped):
        w(f"key_g[{j}] = rg{i};", 4)
    w("nt = 0; lo_all = 0; hi_all = len;", 4)
    w(f"for (int64_t k = 0; k < {K}; k++) {{", 4)
    w("if (!((on >> k) & 1)) continue;", 5)
    w("int64_t lo = 0, hi = len;", 5)
    for i in sloped:  # as in packed_guarded: guard i is linear along the run
        clamp_run(w, f"gk[{i}][k] + rg{i}", inner.stride(f"g{i}"), 5)
    w("if (lo >= hi) continue;  /* the tap reads only padding on this run */", 5)
    w("to[nt] = ko[k]; ta[nt] = av[k]; tlo[nt] = lo; thi[nt] = hi; nt++;", 5)
    w("lo_all = tcpy_max_int64(lo_all, lo); hi_all = tcpy_min_int64(hi_all, hi);", 5)
    w("}", 4)
    w("if (hi_all < lo_all) hi_all = lo_all;", 4)
    # the first positions outside the interior (the row's padded ends), each with the
    # list of taps it reads, so that a run pays no per-tap test there
    w("nb = 0, ne = 0;", 4)
    w(f"for (int64_t c = 0; c < len && nb < {DIRECT_ENDS}; c++) {{", 4)
    w("if (c == lo_all) { c = hi_all; if (c >= len) break; }", 5)
    w("bc[nb] = c; bs[nb] = ne;", 5)
    w("for (int64_t t = 0; t < nt; t++)", 5)
    w(f"if (c >= tlo[t] && c < thi[t]) {{ eo[ne] = to[t] + INT64_C({step}) * c; ea[ne] = ta[t]; ne++; }}", 6)
    w("nb++;", 5)
    w("}", 4)
    w("bs[nb] = ne;", 4)
    w("}", 3)
    store = "alpha * s" if con.init else "q[c] + alpha * s"
    w("for (int64_t b = 0; b < nb; b++) {", 3)
    w(f"const int64_t c = bc[b]; {T} s = 0;", 4)
    w(f"for (int64_t e = bs[b]; e < bs[b + 1]; e++) s += ea[e] * ({T})row[eo[e]];", 4)
    w(f"q[c] = {store};", 4)
    w("}", 3)
    w("if (nb == " + str(DIRECT_ENDS) + ") {  /* more padded positions than listed: test each tap */", 3)
    w("for (int64_t c = bc[nb - 1] + 1; c < len; c++) {", 4)
    w("if (c == lo_all) { c = hi_all; if (c >= len) break; }", 5)
    w(f"{T} s = 0;", 5)
    w("for (int64_t t = 0; t < nt; t++)", 5)
    w(f"if (c >= tlo[t] && c < thi[t]) s += ta[t] * ({T})row[to[t] + INT64_C({step}) * c];", 6)
    w(f"q[c] = {store};", 5)
    w("}", 4)
    w("}", 3)
    w("int64_t c = lo_all;", 3)
    if step == 1 and TB == T:
        direct_vectors(ctx, w, 3)
    w("for (; c < hi_all; c++) {", 3)
    w(f"{T} s = 0;", 4)
    w("for (int64_t t = 0; t < nt; t++)", 4)
    w(f"s += ta[t] * ({T})row[to[t] + INT64_C({step}) * c];", 5)
    w(f"q[c] = {store};", 4)
    w("}", 3)
    if ctx.epilogue:  # the run is final and contiguous (M = 1: row 0)
        w(f"{ctx.epilogue}(tcpy_buffers, bi, 0, x, len, q);", 3)
    w("x += len;", 3)
    w("}", 2)
    w("}", 1)
    fence(ctx, w)
    w("}")


def row_block(ctx: Context, w: CWriter, depth: int):
    """The direct path's row block (``Plan.rows``, no guards, overwriting): where the run at
    ``x`` starts a whole row and ``rows`` whole rows of the same outer index follow, they are
    computed together in steps of ``row_vectors`` vectors along the row (the last step
    overlapping the previous one). Each distinct B vector of a step is loaded once and feeds
    every row's sum whose tap reads it (a 3-row window: a B row serves up to three output
    rows), so a row costs about one load per tap row instead of one per tap."""
    p, T, L, con = ctx.prefix, ctx.T, ctx.plan.lanes, ctx.con
    rows, width = ctx.plan.rows, ctx.plan.row_vectors
    inner, outer = con.n[-1], con.n[-2]
    extent, step = inner.extent, min(width * L, inner.extent)
    users = {}  # B offset (from the step's start) -> the (tap, row, vector) sums it feeds
    for t, o in enumerate(ctx.k_offsets("b")):
        for r in range(rows):
            for u in range(width):
                users.setdefault(o + r * outer.b + u * L, []).append((t, r, u))
    if ctx.nontemporal or extent < L:
        w(f"{T} blk[{rows * max(extent, L)}] __attribute__((aligned({ctx.plan.cache_line})));", depth)
    w(f"if (x % {extent} == 0 && n1 - x >= {rows * extent} && x / {extent} % {outer.extent} <= "
      f"{outer.extent - rows}) {{", depth)
    w(f"const {T} *TCPY_RESTRICT row = bb + {p}_off_b_n(x);", depth + 1)
    w(f"{T} *TCPY_RESTRICT q = cb + {p}_off_c_n(x);", depth + 1)
    w("for (int64_t c = 0;;) {", depth + 1)
    sums = [f"s{r}_{u}" for r in range(rows) for u in range(width)]
    w(f"{p}_v " + ", ".join(f"{s} = {{0}}" for s in sums) + ";", depth + 2)
    for offset, fed in sorted(users.items()):
        w(f"{{ {p}_v b = *(const {p}_vu *)(row + c + INT64_C({offset}));", depth + 2)
        if len(fed) > 1:  # (not folded into each FMA: a load per sum again)
            w("TCPY_IN_REGISTER(b);", depth + 3)
        w(" ".join(f"s{r}_{u} += av[{t}] * b;" for t, r, u in fed) + " }", depth + 3)
    # non-temporal: the block is set in an L1 buffer (overlapping steps and a block's ends need
    # not be vector-aligned in C), then its aligned vectors are stored around the caches; a
    # row shorter than a vector: set in a buffer of a vector per row, then its elements copied
    narrow = extent < L
    out, pitch = ("blk", L) if narrow else ("blk", extent) if ctx.nontemporal else ("q", outer.c)
    for r in range(rows):
        w(" ".join(f"*({p}_vu *)({out} + c + INT64_C({r * pitch + u * L})) = alpha * s{r}_{u};"
                   for u in range(width)), depth + 2)
    w(f"c += {step};", depth + 2)
    w(f"if (c >= {extent}) break;", depth + 2)
    w(f"if (c + {step} > {extent}) c = {extent - step};  /* the last step overlaps the previous one */", depth + 2)
    w("}", depth + 1)
    if ctx.nontemporal:
        stream_block(ctx, w, depth + 1, rows * extent)
    if narrow:
        w(f"for (int64_t r = 0; r < {rows}; r++) tcpy_copy_short{ctx.element_bytes}(q + r * INT64_C({outer.c}), "
          f"blk + r * {L}, {extent});", depth + 1)
    if ctx.epilogue:  # each row is final and contiguous (M = 1: row 0)
        w(f"for (int64_t r = 0; r < {rows}; r++) {ctx.epilogue}(tcpy_buffers, bi, 0, x + r * {extent}, "
          f"{extent}, q + r * INT64_C({outer.c}));", depth + 1)
    w(f"x += {rows * extent};", depth + 1)
    w("continue;", depth + 1)
    w("}", depth)


def stream_block(ctx: Context, w: CWriter, depth: int, count: int):
    """Copy the row block's ``count`` values from ``blk`` to its contiguous place at ``q``: the
    elements up to q's first vector-aligned address and after its last whole aligned vector
    with plain stores, the aligned vectors between with non-temporal ones."""
    p, T, L = ctx.prefix, ctx.T, ctx.plan.lanes
    vb = L * ctx.element_bytes
    w(f"int64_t e = (int64_t)((({vb} - ((uintptr_t)q & {vb - 1})) & {vb - 1}) / sizeof({T}));", depth)
    w(f"if (e > {count}) e = {count};", depth)
    w("for (int64_t i = 0; i < e; i++) q[i] = blk[i];", depth)
    w(f"for (; e + {L} <= {count}; e += {L}) tcpy_store_nt{vb}(q + e, (tcpy_nt{vb})*(const {p}_vu *)(blk + e));", depth)
    w(f"for (; e < {count}; e++) q[e] = blk[e];", depth)


def direct_vectors(ctx: Context, w: CWriter, depth: int):
    """The direct path's interior ``[c, hi_all)`` of a contiguous run in steps of four
    vectors when overwriting (two or one when shorter), two when accumulating, one sum per
    vector: four independent chains of K FMAs hide the FMA latency within a step (a second
    partial sum per vector instead ran 6% slower, its registers spilling the taps'
    weights); all K taps unrolled, at constant offsets, when all read the run (a table's
    offsets cost a load per tap and step). An overwriting store ends with a
    step that overlaps the previous one (the same values again) instead of leftovers; an
    accumulating one leaves them to the scalar loop."""
    p, T, L, K = ctx.prefix, ctx.T, ctx.plan.lanes, ctx.K

    offsets = ctx.k_offsets("b")

    def body(width: int, taps: str, d: int):
        w("{", d - 1)
        w(f"{p}_v " + ", ".join(f"s{u} = {{0}}" for u in range(width)) + ";", d)
        if taps == str(K):  # every tap: its offset a constant (no table loads beside B's)
            for t, o in enumerate(offsets):
                w(" ".join(f"s{u} += ta[{t}] * *(const {p}_vu *)(row + c + INT64_C({o + u * L}));"
                           for u in range(width)), d)
        else:
            w(f"for (int64_t t = 0; t < {taps}; t++) {{", d)
            w(f"const {T} *r = row + to[t] + c;", d + 1)
            w(" ".join(f"s{u} += ta[t] * *(const {p}_vu *)(r + {u * L});" for u in range(width)), d + 1)
            w("}", d)
        for u in range(width):
            target = f"*({p}_vu *)(q + c + {u * L})"
            w(f"{target} = alpha * s{u};" if ctx.con.init else f"{target} += alpha * s{u};", d)
        w("}", d - 1)

    for taps, test in ((str(K), f"nt == {K}"), ("nt", None)):
        w(f"if ({test}) {{" if test else "else {", depth)
        if ctx.con.init:
            w(f"if (hi_all - c >= {4 * L}) {{", depth + 1)
            w("for (;;) {", depth + 2)
            body(4, taps, depth + 3)
            w(f"c += {4 * L};", depth + 3)
            w("if (c >= hi_all) break;", depth + 3)
            w(f"if (c + {4 * L} > hi_all) c = hi_all - {4 * L};", depth + 3)
            w("}", depth + 2)
            for width in (2, 1):  # shorter interiors: two steps, the second overlapping
                w(f"}} else if (hi_all - c >= {width * L}) {{", depth + 1)
                body(width, taps, depth + 2)
                w(f"c = hi_all - {width * L};", depth + 2)
                body(width, taps, depth + 2)
                w("c = hi_all;", depth + 2)
            w("}", depth + 1)
        else:
            for width in (2, 1):
                w(f"for (; c + {width * L} <= hi_all; c += {width * L}) {{", depth + 1)
                body(width, taps, depth + 2)
                w("}", depth + 1)
        w("}", depth)


