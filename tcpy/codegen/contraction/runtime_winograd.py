"""The run-time engine's winograd path: a 3x3 convolution of a size-generic kernel as F(2x2, 3x3)
or F(4x4, 3x3) (:mod:`tcpy.transform.winograd`), rendered once for every size (once per tile size
and micro-tile the planner may give it, :attr:`tcpy.contraction_ir.Plan.winograd_tiles`: the plan
buffer names the call's).

The loops are the specialised winograd path's (:mod:`.winograd`): the weights' transform U once
per call (scanning them, and the image, for inf, NaN and huge magnitudes), then blocks of tiles
claimed by the threads: the block's input transform into slivers, its P products on the
kernel's micro-kernel, the output transform into the output. Their inner loops take no offset
of a run-time stride that gcc would keep in a register per point (and spill): the block's
products lie a tile sliver after another, so the micro-kernel's rows and the output
transform's points are at offsets known when compiling; the transforms step one pointer from
point to point; unit-stride image, weights and output rows have loops of their own.

What depends on sizes is read from the winograd section of the plan buffer
(:data:`tcpy.contraction_ir.RUNTIME_WINOGRAD_FIELDS`, made per call shape by
:mod:`tcpy.transform.runtime_plan`): the channels, tiles and windows, the blocks, and offset
tables for every variable besides the two axes, so the images, channels and batch may be any
variables (NCHW, NHWC, grouped). Partial tiles at the image's
edges and the guards of a padded image are tested per tile as on the specialised path, with
the guards' coefficients from the section. The point-by-point sums that an operand holding
inf, NaN or a huge value needs are the run-time engine's (:mod:`.runtime`).
"""
from __future__ import annotations

import dataclasses

from ...contraction_ir import MAX_SLIVERS, RUNTIME_FIELDS, RUNTIME_WINOGRAD_FIELDS, TILE
from ...winograd_matrices import transforms
from ..cwriter import CWriter, ScratchSlot, c_literal
from .context import Context
from .kernel import accumulate_loop
from .stores import whole_tile
from .winograd import (SCAN_BLOCK, gather_patches, input_transform, load_patches, output_transform,
                       transform_weight_rows, unusual)

W = {name: index for index, name in enumerate(RUNTIME_WINOGRAD_FIELDS)}


def _f(name: str) -> str:
    """C: a field of the winograd section (``wp``: where it starts)."""
    return f"wp[{W[name]}]"


def _t(name: str) -> str:
    """C: a table the winograd section points at (its index in the whole buffer ``pl``)."""
    return f"(pl + wp[{W[name + '_table']}])"


# the derived extents every routine reads, from the section's fields
# (the block's products: a sliver's [M][P][NR] after another's, so that a point's products are
# at offsets known when compiling and the output transform reads each tile sliver's P x NR values
# of an output channel in one run; ``p_sliver`` apart)
_EXTENTS = ("const int64_t M = {m}, K = {k}, mt = (M + {mr1}) / {mr}, nc = {nc}, ns = nc / {nr};\n"
            "const int64_t u_point = mt * K * {mr} + {nr}, v_point = ns * K * {nr} + {nr}, "
            "p_sliver = mt * {mr} * {points} * {nr};\n"
            "(void)u_point; (void)v_point; (void)p_sliver;")


def render(ctx: Context) -> str:
    """The helpers of the winograd path of ``ctx.con`` (the kernel's contraction at its nominal
    sizes, whose plan holds the form and the micro-tiles to render it with: its image and
    weights operands, types, scale and guards are the same at every size);
    ``<p>_winograd(pl, image, weights, C, alpha, threads, stop)`` runs it with the plan buffer
    ``pl`` (on the routine of the tile size and micro-tile it names) and returns 1 when an operand holds inf,
    NaN or a huge value (nothing is written then: the caller sums point by point)."""
    w = CWriter()
    T, s = ctx.T, ctx.element_bytes
    vb = ctx.plan.lanes * s
    variants = []
    for size, mr, vectors in ctx.plan.winograd_tiles:
        tile = ctx.with_plan(dataclasses.replace(ctx.plan, mr=mr, nr=vectors * ctx.plan.lanes))
        variant = dataclasses.replace(tile, prefix=f"{ctx.prefix}_w{size}_{vectors}")
        p = variant.prefix
        w(f"typedef {T} {p}_v __attribute__((vector_size({vb}), aligned({vb}), __may_alias__));")
        w(f"typedef {T} {p}_vu __attribute__((vector_size({vb}), aligned({s}), __may_alias__));")
        w(f"typedef int{s * 8}_t {p}_m __attribute__((vector_size({vb})));  /* shuffle masks */")
        w(_RuntimeWinograd(variant, size).render())
        variants.append((size, vectors, p))
    form = ctx.plan.winograd
    TI, TW = (getattr(ctx.con, role).dtype.c_type for role in (form.image, form.weights))
    w(f"static int {ctx.prefix}_winograd(const int64_t *TCPY_RESTRICT pl, const {TI} *image, const {TW} *weights, "
      f"{T} *C, {T} alpha, int tcpy_num_threads, const volatile int *tcpy_stop) {{")
    w(f"const int64_t *wp = pl + pl[{RUNTIME_FIELDS.index('winograd')}];", 1)
    w(f"const int64_t size = {_f('tile')}, vectors = {_f('vectors')};", 1)
    args = "(pl, image, weights, C, alpha, tcpy_num_threads, tcpy_stop)"
    for size, vectors, p in variants[:-1]:
        w(f"if (size == {size} && vectors == {vectors}) return {p}_winograd{args};", 1)
    w(f"return {variants[-1][2]}_winograd{args};", 1)
    w("}")
    return w.text()


class _RuntimeWinograd:
    """The routines of the winograd path with one tile size (``tile``) and micro-tile (``ctx.plan``'s)."""

    def __init__(self, ctx: Context, tile: int):
        self.ctx = ctx
        self.tile, self.matrices = tile, transforms(tile)
        self.a = self.matrices.size  # the input patch's side
        self.points = self.a * self.a
        form = ctx.plan.winograd
        self.form = form
        self.TI = getattr(ctx.con, form.image).dtype.c_type
        self.TW = getattr(ctx.con, form.weights).dtype.c_type
        self.G = len(ctx.con.guards)

    def extents(self, w: CWriter, depth: int):
        plan = self.ctx.plan
        text = _EXTENTS.format(m=_f("m"), k=_f("k"), nc=_f("nc"), mr=plan.mr, mr1=plan.mr - 1, nr=plan.nr,
                               points=self.points)
        for line in text.splitlines():
            w(line, depth)

    def unusual(self, value: str) -> str:
        """C: 1 when ``value`` is inf, NaN or beyond HUGE in magnitude (:func:`.winograd.unusual`:
        no short-circuit, so the scans vectorise as the specialised path's)."""
        return unusual(self.ctx, value)

    def weights(self, w: CWriter):
        """``<p>_wweights``: U = G g G^T for the MR rows from r0 (a sliver) of batch index bi;
        returns whether a weight it read is inf, NaN or huge."""
        p, T, TW, mr = self.ctx.prefix, self.ctx.T, self.TW, self.ctx.plan.mr
        align = max(self.ctx.element_bytes * self.ctx.plan.lanes, 16)
        w(f"static int {p}_wweights(const int64_t *TCPY_RESTRICT pl, const int64_t *TCPY_RESTRICT wp, "
          f"const {TW} *TCPY_RESTRICT Wt, {self.ctx.T} *TCPY_RESTRICT U, int64_t bi, int64_t r0) {{")
        self.extents(w, 1)
        w("int bad = 0;", 1)
        w(f"const int64_t *wk_t = {_t('weights_k')}, *wm_t = {_t('weights_m')};", 1)
        w(f"const int64_t rw = {_f('row_weights')}, cw = {_f('col_weights')};", 1)
        w(f"{T} *us = U + bi * {self.points} * u_point + r0 / {mr} * K * {mr};", 1)
        w(f"const int64_t live = tcpy_min_int64({mr}, M - r0);  /* rows past M hold zeros */", 1)
        w(f"const {TW} *wm[{mr}];", 1)
        w(f"for (int64_t r = 0; r < {mr}; r++)", 1)
        w(f"wm[r] = Wt + {_f('weights_base')} + {_t('weights_batch')}[bi] + (r < live ? wm_t[r0 + r] : 0);", 2)
        # (one pointer stepped from point to point: with offsets of a run-time stride gcc kept
        # each point's address in a register of its own and spilled them, ~1.5x the
        # specialised transform's time)
        transform_weight_rows(w, self, TW, align, "K", "wk_t[k]", lambda i, j: f"{i} * rw + {j} * cw",
                              lambda q, value: f"{T} *uo = u + r; *uo = {value};" if q == 0 else
                              f"uo += u_point; *uo = {value};", unit_columns="cw == 1")
        w("return bad;", 1)
        w("}")

    def inputs(self, w: CWriter):
        """``<p>_winputs``: V = B^T d B for tiles t0..t0+nt of batch index bi; lanes past nt (to
        the end of their sliver) hold 0. A tile whose a x a patches are inside the image and the
        guards for every input channel is read without tests; groups of a vector's width of
        such tiles load as vectors (F(2x2): in one tile row, along a unit-stride image row, by
        loads and shuffles; F(4x4): any such tiles, gathered)."""
        p, T, TI, G = self.ctx.prefix, self.ctx.T, self.TI, self.G
        tile, a = self.tile, self.a
        nr, L = self.ctx.plan.nr, self.ctx.plan.lanes
        NC = MAX_SLIVERS * nr  # (fixed-size arrays: at known places in the frame, fewer registers taken)
        w(f"static void {p}_winputs(const int64_t *TCPY_RESTRICT pl, const int64_t *TCPY_RESTRICT wp, "
          f"const {TI} *TCPY_RESTRICT I, {T} *TCPY_RESTRICT V, int64_t bi, int64_t t0, int64_t nt) {{")
        self.extents(w, 1)
        w(f"const int64_t rt = {_f('row_tiles')}, ct = {_f('col_tiles')}, ri = {_f('row_image')}, "
          f"ci = {_f('col_image')}, rwin = {_f('row_window')}, cwin = {_f('col_window')};", 1)
        w(f"const int64_t *ik_t = {_t('image_k')}, *in_t = {_t('image_n')};", 1)
        w(f"const {TI} *ib = I + {_f('image_base')} + {_t('image_batch')}[bi];", 1)
        w(f"const {TI} *src[{NC}]; int inside[{NC}]; int64_t patch[{NC}], ty[{NC}], tx[{NC}];", 1)
        if G:
            w(f"const int64_t *gb_t = {_t('g_batch')}, *gk_t = {_t('g_k')}, *gn_t = {_t('g_n')}, "
              f"*grow = {_t('g_row')}, *gcol = {_t('g_col')}, *gmin = {_t('g_k_min')};", 1)
            w(f"const int64_t nb = {_f('batch')}, images = {_f('tiles')} / (rt * ct), guards_k = {_f('guards_k')};", 1)
            w(f"int64_t gt[{G}][{NC}];", 1)
        w("for (int64_t q = 0; q < nt; q++) {", 1)
        w(f"const int64_t t = t0 + q, nn = t / (rt * ct), y = t / ct % rt * {tile}, x = t % ct * {tile};", 2)
        w("src[q] = ib + in_t[nn] + y * ri + x * ci;", 2)
        w("ty[q] = y; tx[q] = x;", 2)
        w(f"int in = y + {a - 1} < rwin && x + {a - 1} < cwin;", 2)
        for i in range(G):
            w(f"gt[{i}][q] = gb_t[{i} * nb + bi] + gn_t[{i} * images + nn] + y * grow[{i}] + x * gcol[{i}];", 2)
            w(f"in = in && gt[{i}][q] + gmin[{i}] >= 0;", 2)
        w("inside[q] = in;", 2)
        # an edge tile's patch: which of its a x a elements are read, when that is the same for
        # every input channel (its guards' tests once per block, not once per channel)
        checks = ["y + r < rwin", "x + c < cwin"] + [f"gt[{i}][q] + r * grow[{i}] + c * gcol[{i}] >= 0"
                                                     for i in range(G)]
        w("int64_t bits = 0;", 2)
        w(f"if (!in{' && !guards_k' if G else ''}) for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) "
          f"bits |= (int64_t)({' && '.join(checks)}) << ({a} * r + c);", 2)
        w("patch[q] = bits;", 2)
        w("}", 1)
        # the last sliver's lanes past nt (the products read them): zeros, written once per block
        # along the lanes (one by one, a point at a time, they took an eighth of the transform)
        w(f"if (nt % {nr}) {{", 1)
        w(f"{T} *vz = V + nt / {nr} * K * {nr};", 2)
        w(f"for (int x = 0; x < {self.points}; x++) for (int64_t k = 0; k < K; k++)", 2)
        w(f"for (int64_t l = nt % {nr}; l < {nr}; l++) vz[x * v_point + k * {nr} + l] = 0;", 3)
        w("}", 1)
        vector = TI == T and L >= 2
        shuffled = tile == TILE
        if vector and not shuffled:  # groups of L tiles from a multiple of L, all inside
            w(f"int whole[{NC // L}];", 1)
            w(f"for (int64_t q = 0; q + {L} <= nt; q += {L}) {{", 1)
            w("int all = 1;", 2)
            w(f"for (int64_t l = 0; l < {L}; l++) all &= inside[q + l];", 2)
            w(f"whole[q / {L}] = all;", 2)
            w("}", 1)
        if vector and shuffled:
            # groups of L tiles side by side in one tile row of a unit-stride image row, all
            # inside, within one sliver: vector loads. A group starts at any tile (``run``: the
            # tiles inside from each one to the end of its tile row), not only at multiples of
            # L: a row of tiles that is no multiple of L (or a padded image's, whose first and
            # last tiles are outside) then still loads most of its tiles as vectors.
            w(f"int run[{NC}];", 1)
            w("for (int64_t q = nt - 1, next = 0; q >= 0; q--) {", 1)
            w("next = ci == 1 && inside[q] ? 1 + (q + 1 < nt && (t0 + q) / ct == (t0 + q + 1) / ct ? next : 0) : 0;",
              2)
            w("run[q] = (int)next;", 2)
            w("}", 1)
            # the group a tile loads in: from it, or, with fewer than L tiles inside left in its
            # tile row, the L ending at the last of them (the tiles before it, transformed again,
            # get the same values): a row of 28 tiles is then two groups, not one and 12 tiles
            # one by one (-1: none, the tile is read alone)
            w(f"int group[{NC}];", 1)
            w("for (int64_t q = 0; q < nt; q++) {", 1)
            w(f"const int64_t g = run[q] >= {L} ? q : q + run[q] - {L};", 2)
            w(f"group[q] = run[q] > 0 && g >= 0 && run[g] >= {L} && g % {nr} <= {nr - L} ? (int)g : -1;", 2)
            w("}", 1)
        w("for (int64_t k = 0; k < K; k++) {", 1)
        w("const int64_t ik = ik_t[k];", 2)
        for i in range(G):
            w(f"const int64_t gk{i} = gk_t[{i} * K + k];", 2)
        w("for (int64_t q = 0; q < nt; q++) {", 2)
        w(f"{T} *vk = V + q / {nr} * K * {nr} + k * {nr} + q % {nr};", 3)
        if vector and not shuffled:
            w(f"if (q % {L} == 0 && q + {L} <= nt && whole[q / {L}]) {{", 3)
            gather_patches(w, p, T, a, L, self.ctx.element_bytes, "ri", "ci", 4, unit_columns="ci == 1")
            w(f"{T} *vo = vk;", 4)
            self.transform_input(w, 4, f"{p}_v", lambda at: f"*({p}_vu *){at}")
            w(f"q += {L - 1};", 4)
            w("continue;", 4)
            w("}", 3)
        if vector and shuffled:
            w("if (group[q] >= 0) {", 3)
            w("const int64_t g = group[q];", 4)
            w(f"const {T} *s = src[g] + ik;", 4)
            load_patches(w, p, T, L, "ri", 4)
            w(f"{T} *vo = V + g / {nr} * K * {nr} + k * {nr} + g % {nr};", 4)
            self.transform_input(w, 4, f"{p}_v", lambda at: f"*({p}_vu *){at}")
            w(f"q = g + {L - 1};", 4)
            w("continue;", 4)
            w("}", 3)
        w(f"const {TI} *s = src[q] + ik;", 3)
        w(f"{T} d[{a}][{a}];", 3)
        read = f"({T})s[r * ri + c * ci]"
        patch = f"for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) "
        w(f"if (inside[q] && ci == 1) {patch}d[r][c] = ({T})s[r * ri + c];", 3)
        w(f"else if (inside[q]) {patch}d[r][c] = {read};", 3)
        w(f"else{' if (!guards_k)' if G else ''} {patch}d[r][c] = patch[q] >> ({a} * r + c) & 1 ? {read} : 0;", 3)
        if G:
            holds = ["ty[q] + r < rwin", "tx[q] + c < cwin"]
            holds += [f"gt[{i}][q] + gk{i} + r * grow[{i}] + c * gcol[{i}] >= 0" for i in range(G)]
            w(f"else {patch}d[r][c] = {' && '.join(holds)} ? {read} : 0;", 3)
        w(f"{T} *vo = vk;", 3)
        self.transform_input(w, 3, T, lambda at: f"*{at}")
        w("}", 2)
        w("}", 1)
        w("}")

    def transform_input(self, w: CWriter, depth: int, elem: str, at):
        """B^T d B of the patch ``d[a][a]`` (scalars or vectors of tiles, type ``elem``) stored
        through ``at(pointer)`` at each point, ``v_point`` apart: one pointer stepped from point
        to point (offsets of a run-time stride were spilled and reloaded around the stores: the
        input transform of a 64-channel 56x56 image took ~1.7x the specialised one's, then ~1.4x)."""
        literal = lambda c: c_literal(float(c), self.ctx.con.dtype)  # noqa: E731
        input_transform(w, depth, elem, self.matrices, literal,
                        lambda x, value: f"{at('vo')} = {value}; vo += v_point;")

    def kernel(self, w: CWriter):
        """``<p>_wukr``: one MR x NR tile of one point's product, set (first K block) or added
        into the block's products (rows P x NR apart)."""
        p, T, mr, nr = self.ctx.prefix, self.ctx.T, self.ctx.plan.mr, self.ctx.plan.nr
        w(f"static __attribute__((noinline)) void {p}_wukr(int64_t kc, const {T} *TCPY_RESTRICT a, "
          f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT mw, int first) {{")
        accumulate_loop(self.ctx, w, "kc", lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * self.ctx.plan.lanes})",
                        lambda r: f"a[k * {mr} + {r}]", 1)
        whole_tile(self.ctx, w, 1, lambda r: f"mw + {r * self.points * nr}", "first", "")
        w("}")

    def block(self, w: CWriter):
        """``<p>_wblock``: the P products of a transformed block, then the output transform."""
        p, T, mr, nr = self.ctx.prefix, self.ctx.T, self.ctx.plan.mr, self.ctx.plan.nr
        tile, points = self.tile, self.points
        NC = MAX_SLIVERS * nr  # (fixed-size arrays: at known places in the frame, fewer registers taken)
        w(f"static void {p}_wblock(const int64_t *TCPY_RESTRICT pl, const int64_t *TCPY_RESTRICT wp, "
          f"const {T} *TCPY_RESTRICT U, const {T} *TCPY_RESTRICT V, {T} *TCPY_RESTRICT P, {T} *TCPY_RESTRICT C, "
          f"int64_t bi, int64_t t0, int64_t nt, {T} alpha) {{")
        self.extents(w, 1)
        w(f"const int64_t KC = {_f('kc')}, MCS = {_f('mc')} / {mr};", 1)
        w(f"const {T} *ub = U + bi * {points} * u_point;", 1)
        w(f"const int64_t nsb = (nt + {nr - 1}) / {nr};", 1)
        w(f"for (int x = 0; x < {points}; x++)", 1)
        w("for (int64_t pc = 0; pc < K; pc += KC) {", 2)
        w("const int64_t kc = K - pc < KC ? K - pc : KC;", 3)
        w("for (int64_t ic = 0; ic < mt; ic += MCS)", 3)
        w("for (int64_t jr = 0; jr < nsb; jr++)", 4)
        w("for (int64_t ir = ic; ir < ic + MCS && ir < mt; ir++)", 5)
        w(f"{p}_wukr(kc, ub + x * u_point + (ir * K + pc) * {mr}, V + x * v_point + (jr * K + pc) * {nr}, "
          f"P + jr * p_sliver + ir * {mr * points * nr} + x * {nr}, pc == 0);", 6)
        w("}", 2)
        w(f"const int64_t rt = {_f('row_tiles')}, ct = {_f('col_tiles')}, rc = {_f('row_c')}, cc = {_f('col_c')}, "
          f"re = {_f('row_extent')}, ce = {_f('col_extent')};", 1)
        w(f"const int64_t *cm_t = {_t('c_m')}, *cn_t = {_t('c_n')};", 1)
        w(f"{T} *cb = C + {_f('c_base')} + {_t('c_batch')}[bi];", 1)
        # each tile's offset in the output and its rows and columns inside it, once per block
        # (run-time divisions: not once per output channel)
        w(f"int64_t co[{NC}]; int rows[{NC}], cols[{NC}];", 1)
        w("for (int64_t q = 0; q < nt; q++) {", 1)
        w(f"const int64_t t = t0 + q, nn = t / (rt * ct), y0 = t / ct % rt * {tile}, x0 = t % ct * {tile};", 2)
        w("co[q] = cn_t[nn] + y0 * rc + x0 * cc;", 2)
        w(f"rows[q] = re - y0 < {tile} ? (int)(re - y0) : {tile}; "
          f"cols[q] = ce - x0 < {tile} ? (int)(ce - x0) : {tile};", 2)
        w("}", 1)
        w("for (int64_t m = 0; m < M; m++) {", 1)
        w(f"{T} *cm = cb + cm_t[m];", 2)
        w("for (int64_t jr = 0; jr < nsb; jr++) {", 2)
        w(f"const {T} *pm = P + jr * p_sliver + m * {points * nr};", 3)
        # alpha A^T M A on vectors of the sliver's tiles (written as scalars, gcc kept each
        # point's address in a register of its own and spilled them; alpha here, not in the
        # stores: a multiplication per vector of tiles, not per row of each tile)
        L, vb = self.ctx.plan.lanes, self.ctx.plan.lanes * self.ctx.element_bytes
        w(f"{T} y[{tile * tile}][{nr}] __attribute__((aligned({vb})));", 3)
        w(f"for (int l = 0; l < {nr}; l += {L}) {{", 3)
        literal = lambda c: c_literal(float(c), self.ctx.con.dtype)  # noqa: E731
        output_transform(w, 4, f"{p}_v", self.matrices, literal, lambda x: f"*(const {p}_vu *)(pm + {x * nr} + l)",
                         lambda x: f"*({p}_v *)(y[{x}] + l)", scale="alpha")
        w("}", 3)
        w(f"for (int64_t l = 0, q = jr * {nr}; l < {nr} && q < nt; l++, q++) {{", 3)
        w(f"{T} *o = cm + co[q];", 4)
        init = self.ctx.con.init
        store = lambda at, x: f"{at} = {'' if init else at + ' + '}y[{x}][l];"  # noqa: E731
        # a whole tile: with unit-stride output rows, each row's values are one store (gcc
        # combines them; with a run-time column stride, its 16 scalar stores and their address
        # arithmetic took ~1.5x the specialised output stores)
        w(f"if (rows[q] == {tile} && cols[q] == {tile} && cc == 1) {{", 4)
        for i in range(tile):
            w(f"{T} *o{i} = o + {i} * rc; " + " ".join(store(f"o{i}[{j}]", tile * i + j) for j in range(tile)), 5)
        w("continue;", 5)
        w("}", 4)
        w(f"if (rows[q] == {tile} && cols[q] == {tile}) {{", 4)
        w(" ".join(store(f"o[{i} * rc + {j} * cc]", tile * i + j) for i in range(tile) for j in range(tile)), 5)
        w("continue;", 5)
        w("}", 4)
        w("for (int i = 0; i < rows[q]; i++) for (int j = 0; j < cols[q]; j++) {", 4)
        w(store("o[i * rc + j * cc]", f"{tile} * i + j"), 5)
        w("}", 4)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        w("}")

    def run(self, w: CWriter):
        """``<p>_winograd``: the scan and the weights' transform, then the blocks claimed by the
        threads; 1 (with nothing written) when an operand holds inf, NaN or a huge value."""
        p, T, mr, nr = self.ctx.prefix, self.ctx.T, self.ctx.plan.mr, self.ctx.plan.nr
        w(f"static int {p}_winograd(const int64_t *TCPY_RESTRICT pl, const {self.TI} *image, "
          f"const {self.TW} *weights, {T} *C, {T} alpha, int tcpy_num_threads, const volatile int *tcpy_stop) {{")
        w(f"const int64_t *wp = pl + pl[{RUNTIME_FIELDS.index('winograd')}];", 1)
        self.extents(w, 1)
        w(f"const int64_t nb = {_f('batch')}, tiles = {_f('tiles')}, elements = {_f('image_elements')};", 1)
        w(f"const int64_t slivers = (tiles + {nr - 1}) / {nr}, per_image = (slivers + ns - 1) / ns, "
          "blocks = nb * per_image;", 1)
        w(f"const int64_t scans = (elements + {SCAN_BLOCK - 1}) / {SCAN_BLOCK}, weight_rows = nb * mt;", 1)
        w("int bad = 0;", 1)
        w(f"{T} *U = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, sizeof({T}) * nb * {self.points} * u_point);", 1)
        w("int64_t next_scan = 0, next_weights = 0, next_block = 0;  /* items claimed (tcpy_claim) */", 1)
        w("const int team = tcpy_num_threads < blocks ? tcpy_num_threads : (int)blocks;", 1)
        w("#pragma omp parallel num_threads(team) if(team > 1)", 1)
        w("{", 1)
        w("TCPY_TEAM_START();", 2)
        w("int mine = 0;", 2)
        w("for (int64_t sb; (sb = tcpy_claim(&next_scan, scans)) < scans; )", 2)
        w(f"for (int64_t e = sb * {SCAN_BLOCK}, e1 = tcpy_min_int64(e + {SCAN_BLOCK}, elements); e < e1; e++) "
          f"mine |= {self.unusual(f'({T})image[e]')};", 3)
        w("for (int64_t r; (r = tcpy_claim(&next_weights, weight_rows)) < weight_rows; )", 2)
        w(f"mine |= {p}_wweights(pl, wp, weights, U, r / mt, r % mt * {mr});", 3)
        w("if (mine) {", 2)
        w("#pragma omp atomic write", 0)
        w("bad = 1;", 3)
        w("}", 2)
        w("#pragma omp barrier", 0)
        w("int stop_all;", 2)
        w("#pragma omp atomic read", 0)
        w("stop_all = bad;", 2)
        w("if (!stop_all) {", 2)
        w(f"{T} *V = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * {self.points} * v_point);", 3)
        w(f"{T} *P = ({T} *)tcpy_scratch({ScratchSlot.PARTIALS}, sizeof({T}) * ns * p_sliver);", 3)
        w("for (int64_t block; (block = tcpy_claim(&next_block, blocks)) < blocks; ) {", 3)
        w("if (TCPY_UNLIKELY(*tcpy_stop)) break;  /* Ctrl-C: the kernel reports it after the nest */", 4)
        w("const int64_t bi = block / per_image, j = block % per_image * ns;", 4)
        w("const int64_t count = tcpy_min_int64(ns, slivers - j);", 4)
        w(f"const int64_t t0 = j * {nr}, nt = tcpy_min_int64(count * {nr}, tiles - t0);", 4)
        w(f"{p}_winputs(pl, wp, image, V, bi, t0, nt);", 4)
        w(f"{p}_wblock(pl, wp, U, V, P, C, bi, t0, nt, alpha);", 4)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        w("return bad;", 1)
        w("}")

    def render(self) -> str:
        """The routines, ``<p>_winograd`` last."""
        helpers = CWriter()
        self.weights(helpers)
        self.inputs(helpers)
        self.kernel(helpers)
        self.block(helpers)
        self.run(helpers)
        return helpers.text()
