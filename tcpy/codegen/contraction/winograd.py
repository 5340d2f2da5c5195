"""C for the winograd path of a contraction (:mod:`tcpy.transform.winograd`), F(2x2, 3x3) or
F(4x4, 3x3) (P points per tile: 16 or 36)::

    the threads scan the image (blocks claimed one by one) and transform the weights, checking
      each weight they read, into U (A slivers): [batch][P][M/MR][K'][MR], rows claimed likewise
    inf, NaN or a huge magnitude anywhere: no thread goes on; the sums run point by point after
    each thread claims blocks of up to nc tiles (a fixed set per image) until none is left:
      V = the input transform of the block, [P][slivers][K'][NR] (B slivers; guards read zeros)
      for each of the P points, K' block, tile sliver, row sliver:
        MR x NR micro-kernel: U[xi] x V[xi] into the block's products [P][M][nc]
      the output transform of the products into the output (alpha, +=, the epilogue)

The transforms' C is generated from the tile size's matrices (:mod:`tcpy.winograd_matrices`).
The weights' transform is plain C; the input transform takes groups of a vector's width of tiles
as vectors (F(2x2): side by side in a tile row, by loads and shuffles; F(4x4): any tiles, each
element gathered; other tiles one by one), the output transform is vectorised by gcc along the
tiles; the products run on the engine's micro-kernel.
"""
from __future__ import annotations

from ...contraction_ir import TAPS, TILE, Var
from ...winograd_matrices import transforms
from ..cwriter import CWriter, ScratchSlot, c_literal
from .context import Context, header
from .exact import exact_sums, nonfinite
from .kernel import accumulate_loop
from .stores import whole_tile

# magnitudes beyond which the transforms' differences could overflow where the direct sums do
# not (and past which a product of two such values is near the type's range anyway)
HUGE = {4: "0x1p60", 8: "0x1p500"}
SCAN_BLOCK = 1 << 14  # image elements a thread scans for inf and NaN per claim


def render(ctx: Context) -> tuple[str, str]:
    """``(helpers, body)`` of a contraction on the winograd path, as
    :func:`tcpy.codegen.contraction.render` returns them."""
    return _Winograd(ctx).render()


def unusual(ctx: Context, value: str) -> str:
    """C: 1 when ``value`` (of ``ctx``'s element type) is inf, NaN or beyond HUGE in magnitude
    (NaN fails both tests; no short-circuit, which is control flow that keeps gcc from
    vectorising the loop)."""
    huge = f"({ctx.T}){HUGE[ctx.element_bytes]}"
    return f"!(({value} <= {huge}) & ({value} >= -{huge}))"


def var_offset_fn(w: CWriter, name: str, variables: tuple[Var, ...], stride):
    """``int64_t <name>(int64_t i)``: ``stride(var)`` summed over the digits of the linear index
    ``i`` of ``variables`` (outermost first)."""
    w(f"static inline int64_t {name}(int64_t i) {{")
    w("int64_t o = 0; (void)i;", 1)
    for v in reversed(variables):
        if stride(v):
            w(f"o += INT64_C({stride(v)}) * (i % {v.extent});", 1)
        w(f"i /= {v.extent};", 1)
    w("return o;", 1)
    w("}")


def combination(coefs, terms, literal) -> str:
    """C of the sum of ``coefs[i] * terms[i]`` (exact fractions): zero terms left out, a
    magnitude common to all factored out, coefficients of magnitude 1 as signs; ``literal``
    gives a constant's C."""
    pairs = [(c, t) for c, t in zip(coefs, terms) if c]
    common = abs(pairs[0][0])
    scale = common if all(abs(c) == common for c, _ in pairs) else 1
    text = ""
    for c, t in pairs:
        c /= scale
        term = t if abs(c) == 1 else f"{t} * {literal(abs(c))}"
        text += (" - " if c < 0 else " + ") + term if text else ("-" if c < 0 else "") + term
    return text if scale == 1 else f"({text}) * {literal(scale)}"


def transform_weight_rows(w: CWriter, path, TW: str, align: int, K, weight_k: str, tap_offset, store,
                          unit_columns: str | None = None):
    """The loop over the K input channels of a sliver's weights' transform: per channel, the 3x3
    windows of the MR rows ``wm[r]`` (at C offset ``weight_k`` of ``k``, tap (i, j) at
    ``tap_offset(i, j)``; rows from ``live`` read zeros) loaded side by side into ``g``, then
    transformed (:func:`transform_weights`) in a loop over the rows that gcc vectorises, row
    ``r`` of point ``q`` into ``u`` by the C statement ``store(q, value)``. The specialised and
    size-generic renderers differ only in those offsets. ``unit_columns``: a C condition under
    which a window row's taps are adjacent: a loop of its own then reads them at
    ``tap_offset(i, 0) + j``, every row live, without tests (with a run-time column stride or a
    test per load, gcc stored the loads one by one and read them back as vectors, a stalled
    store forwarding per row of taps: ~1.4x the specialised transform's time)."""
    T, mr = path.ctx.T, path.ctx.plan.mr
    taps = [(i, j) for i in range(TAPS) for j in range(TAPS)]
    w(f"{T} g[{len(taps)}][{mr}] __attribute__((aligned({align})));", 1)
    loads = [lambda i, j: f"({tap_offset(i, 0)}) + {j}", tap_offset] if unit_columns else [tap_offset]
    for variant, offset in enumerate(loads):
        fast = unit_columns and variant == 0
        if unit_columns:
            w(f"if ({unit_columns} && live == {mr})" if fast else "else", 1)
        w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
        w(f"const int64_t wk = {weight_k};", 2)
        w(f"for (int64_t r = 0; r < {mr}; r++) {{", 2)
        w(f"const {TW} *q = wm[r] + wk;", 3)
        for n, (i, j) in enumerate(taps):
            w(f"g[{n}][r] = ({T})q[{offset(i, j)}];" if fast else
              f"g[{n}][r] = r < live ? ({T})q[{offset(i, j)}] : ({T})0;", 3)
        w("}", 2)
        w(f"{T} *TCPY_RESTRICT u = us + k * {mr};", 2)
        w("#pragma GCC ivdep", 0)
        w(f"for (int64_t r = 0; r < {mr}; r++) {{", 2)
        w(f"const {T} " + ", ".join(f"g{i}{j} = g[{TAPS * i + j}][r]" for i, j in taps) + ";", 3)
        transform_weights(w, path, T, taps, store, path.tile)
        w("}", 2)
        w("}", 1)


def transform_weights(w: CWriter, path, T: str, taps, store, tile: int = TILE):
    """The body of a loop over the rows ``r`` of a sliver whose 3x3 windows are ``g<i><j>``:
    ``bad |=`` the unusual-magnitude test of the taps summed (``path.unusual``), then U = G g
    G^T of F(tile x tile, 3x3) into its points, point ``q``'s ``value`` by the C statement
    ``store(q, value)``, called in the points' order."""
    fabs = "fabsf" if path.ctx.element_bytes == 4 else "fabs"
    g, a = transforms(tile).g, tile + TAPS - 1
    literal = lambda c: c_literal(float(c), path.ctx.con.dtype)  # noqa: E731
    w(f"bad |= {path.unusual(' + '.join(f'{fabs}(g{i}{j})' for i, j in taps))};", 3)
    for j in range(TAPS):  # t = G g (the columns j of the a x 3 product)
        w(f"const {T} " + ", ".join(f"t{i}_{j} = {combination(g[i], [f'g{k}{j}' for k in range(TAPS)], literal)}"
                                    for i in range(a)) + ";", 3)
    for i in range(a):  # U = t G^T
        w(" ".join(store(a * i + x, combination(g[x], [f't{i}_{k}' for k in range(TAPS)], literal))
                   for x in range(a)), 3)


def input_transform(w: CWriter, depth: int, elem: str, matrices, literal, store):
    """B^T d B of the patch ``d[a][a]`` (scalars or vectors of tiles, type ``elem``) of
    ``matrices`` (:class:`tcpy.winograd_matrices.Transforms`): ``store(x, value)`` gives the C
    statement that stores point ``x``'s value, called in the points' order; ``literal`` gives a
    constant's C."""
    a, bt = matrices.size, matrices.bt
    for i in range(a):  # e = B^T d
        sums = (combination(bt[i], [f"d[{k}][{c}]" for k in range(a)], literal) for c in range(a))
        w(f"const {elem} " + ", ".join(f"e{i}_{c} = {value}" for c, value in enumerate(sums)) + ";", depth)
    for i in range(a):  # V = e B
        for x in range(a):
            w(store(a * i + x, combination(bt[x], [f"e{i}_{k}" for k in range(a)], literal)), depth)


def output_transform(w: CWriter, depth: int, T: str, matrices, literal, load, store, scale: str = ""):
    """A^T s A of one tile's products of ``matrices``: ``load(x)`` is the C of point ``x``'s
    product, ``store(x)`` the lvalue of output ``x`` (row-major in the tile), times ``scale`` (C
    text) when given; ``literal`` gives a constant's C."""
    a, tile, at = matrices.size, matrices.tile, matrices.at
    for r in range(a):  # (loads written out: a loop over the points kept gcc from vectorising)
        w(f"const {T} " + ", ".join(f"s{r}_{c} = {load(a * r + c)}" for c in range(a)) + ";", depth)
    for i in range(tile):  # r = A^T s
        sums = (combination(at[i], [f"s{k}_{c}" for k in range(a)], literal) for c in range(a))
        w(f"const {T} " + ", ".join(f"r{i}_{c} = {value}" for c, value in enumerate(sums)) + ";", depth)
    for i in range(tile):  # y = r A
        sums = (combination(at[j], [f"r{i}_{k}" for k in range(a)], literal) for j in range(tile))
        w(" ".join(f"{store(tile * i + j)} = {f'{scale} * ({value})' if scale else value};"
                   for j, value in enumerate(sums)), depth)


def load_patches(w: CWriter, p: str, T: str, L: int, row_stride: str, depth: int):
    """``d[4][4]``: the 4x4 patches of ``L`` tiles side by side (tiles 2 elements apart along a
    row) starting at ``s``, each element a vector of the tiles' values, from two pairs of
    unaligned loads a row split into even and odd elements; ``row_stride``: C text."""
    evens = ", ".join(str(2 * c) for c in range(L))
    odds = ", ".join(str(2 * c + 1) for c in range(L))
    w(f"{p}_v d[4][4];", depth)
    w("for (int r = 0; r < 4; r++) {", depth)
    w(f"const {T} *sr = s + r * {row_stride};", depth + 1)
    w(f"const {p}_v a0 = *(const {p}_vu *)sr, a1 = *(const {p}_vu *)(sr + {L}), "
      f"b0 = *(const {p}_vu *)(sr + 2), b1 = *(const {p}_vu *)(sr + {L + 2});", depth + 1)
    w(f"d[r][0] = __builtin_shuffle(a0, a1, ({p}_m){{{evens}}}); "
      f"d[r][1] = __builtin_shuffle(a0, a1, ({p}_m){{{odds}}});", depth + 1)
    w(f"d[r][2] = __builtin_shuffle(b0, b1, ({p}_m){{{evens}}}); "
      f"d[r][3] = __builtin_shuffle(b0, b1, ({p}_m){{{odds}}});", depth + 1)
    w("}", depth)


def gather_patches(w: CWriter, p: str, T: str, a: int, L: int, element_bytes: int, row_stride: str,
                   col_stride: str, depth: int, unit_columns: str | None = None):
    """``d[a][a]``: the patches of the L tiles from ``q`` (each inside; ``src[q]``: a tile's
    corner, ``ik``: the input channel's offset), each element a vector of the tiles' values
    gathered lane by lane (gcc's gathers); the strides: C text. ``unit_columns``: a C condition
    under which the column stride is 1 (the reads then at constant offsets along a row, as
    with a stride known when compiling)."""
    w(f"{T} g[{a}][{a}][{L}] __attribute__((aligned({element_bytes * L})));", depth)
    for variant, stride in enumerate(["1", col_stride] if unit_columns else [col_stride]):
        if unit_columns:
            w(f"{'if (' + unit_columns + ')' if variant == 0 else 'else'}", depth)
        w(f"for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) {{", depth)
        w(f"const int64_t o = ik + r * {row_stride} + c * {stride};", depth + 1)
        w(f"for (int l = 0; l < {L}; l++) g[r][c][l] = src[q + l][o];", depth + 1)
        w("}", depth)
    w(f"{p}_v d[{a}][{a}];", depth)
    w(f"for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) d[r][c] = *(const {p}_v *)g[r][c];", depth)


class _Winograd:
    """The winograd path's C over a render context: its block buffers' layout, the transforms,
    and the engine's micro-kernel, stores and exact sums."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        con, plan = ctx.con, ctx.plan
        self.form = plan.winograd
        self.matrices = transforms(self.form.tile)
        self.points, self.a, self.tile = self.form.points, self.form.patch, self.form.tile
        # tiles along the axes
        self.row_tiles, self.col_tiles = self.form.axis_tiles(self.form.rows), self.form.axis_tiles(self.form.cols)
        self.mt = -(-self.form.M // plan.mr)  # row slivers of U
        self.slivers = -(-self.form.tiles // plan.nr)  # tile slivers per batch index
        self.ns = plan.nc // plan.nr  # tile slivers per block
        # strides between the points in the block buffers, one sliver row more than their
        # size: a tile's P values (and a product's P reads) fall in P different L1 sets, not
        # in one set when the size is a multiple of the L1 way size
        self.v_point = self.ns * self.form.K * plan.nr + plan.nr
        self.p_point = self.mt * plan.mr * plan.nc + plan.nr
        self.u_point = self.mt * self.form.K * plan.mr + plan.nr
        self.img, self.wts = getattr(con, self.form.image), getattr(con, self.form.weights)
        self.TI, self.TW = self.img.dtype.c_type, self.wts.dtype.c_type

    def var_offset_fn(self, w: CWriter, name: str, variables: tuple[Var, ...], stride):
        """``int64_t <p>_w<name>(int64_t i)`` (:func:`var_offset_fn`)."""
        var_offset_fn(w, f"{self.ctx.prefix}_w{name}", variables, stride)

    def offsets(self, w: CWriter):
        """Offsets in the image (``i``), the weights (``w``) and the output (``c``) of the linear
        indices of the input channels (``_k``), the images (``_n``) and the output channels
        (``_m``), for the tensors each indexes; ``l``: their part of the epilogue's linear M or N
        index."""
        form = self.form
        for which, field, roles in (("i", "image", "kn"), ("w", "weights", "km"), ("c", "c", "nm"),
                                    ("l", "line", "nm")):
            for role in roles:
                self.var_offset_fn(w, f"{which}_{role}", getattr(form, role), lambda v, f=field: getattr(v, f))
        for i in range(len(self.ctx.con.guards)):
            self.var_offset_fn(w, f"g{i}_k", form.k, lambda v, i=i: v.g[i])
            self.var_offset_fn(w, f"g{i}_n", form.n, lambda v, i=i: v.g[i])

    def literal(self, value) -> str:
        """C of the transforms' constant ``value`` in the contraction's type."""
        return c_literal(float(value), self.ctx.con.dtype)

    def unusual(self, value: str) -> str:
        """C: 1 when ``value`` is inf, NaN or beyond HUGE in magnitude (:func:`unusual`)."""
        return unusual(self.ctx, value)

    def weights(self, w: CWriter):
        """``<p>_weights``: U = G g G^T for the MR rows from r0 (a sliver) of batch index bi; returns
        whether a weight it read is inf, NaN or huge (the weights' scan, fused: they are read once).
        Per input channel, the sliver's 3x3 windows are loaded side by side (rows past M as
        zeros), then transformed in a loop over the rows that gcc vectorises: each point's MR
        values are one store. (Written out tap by tap and row by row in scalars it took ~20
        cycles a pair on AMD Zen 5, a third of ResNet's 14x14 layer at N=1; a loop over the taps
        with rows past M tested per load ~50.)"""
        p, T, TW, mr, K = self.ctx.prefix, self.ctx.T, self.TW, self.ctx.plan.mr, self.form.K
        rows, cols = self.form.rows.tap, self.form.cols.tap
        point, points = self.u_point, self.points
        align = max(self.ctx.element_bytes * self.ctx.plan.lanes, 16)
        w(f"static int {p}_weights(const {TW} *TCPY_RESTRICT Wt, {T} *TCPY_RESTRICT U, int64_t bi, int64_t r0) {{")
        w("int bad = 0;", 1)
        w(f"{T} *us = U + bi * INT64_C({points * self.u_point}) + r0 / {mr} * INT64_C({K * mr});", 1)
        w(f"const int64_t live = tcpy_min_int64({mr}, {self.form.M} - r0);  /* rows past M hold zeros */", 1)
        w(f"const {TW} *wm[{mr}];", 1)
        w(f"for (int64_t r = 0; r < {mr}; r++)", 1)
        w(f"wm[r] = Wt + INT64_C({self.wts.offset}) + {p}_off_{self.form.weights}_batch(bi) + "
          f"(r < live ? {p}_ww_m(r0 + r) : 0);", 2)
        transform_weight_rows(w, self, TW, align, K, f"{p}_ww_k(k)", lambda i, j: i * rows.weights + j * cols.weights,
                              lambda q, value: f"u[INT64_C({q * point}) + r] = {value};")
        w("return bad;", 1)
        w("}")

    def inputs(self, w: CWriter):
        """``<p>_inputs``: V = B^T d B for tiles t0..t0+nt of batch index bi; lanes past nt (to the end
        of their sliver) hold 0.
        Each input channel in turn for all the block's tiles (a sliver's row of V is written
        whole); a tile whose 4x4 patches are inside the window and the guards for every input
        channel is read without tests."""
        p, T, TI, form = self.ctx.prefix, self.ctx.T, self.TI, self.form
        nr, nc, K = self.ctx.plan.nr, self.ctx.plan.nc, form.K
        rows, cols = form.rows, form.cols
        guards = self.ctx.con.guards
        point, points, tile, a = self.v_point, self.points, self.tile, self.a
        w(f"static void {p}_inputs(const {TI} *TCPY_RESTRICT I, {T} *TCPY_RESTRICT V, int64_t bi, int64_t t0, "
          f"int64_t nt) {{")
        w(f"const {TI} *ib = I + INT64_C({self.img.offset}) + {p}_off_{form.image}_batch(bi);", 1)
        w(f"const {TI} *src[{nc}]; int inside[{nc}]; int64_t ty[{nc}], tx[{nc}];", 1)
        if guards:
            w(f"int64_t gt[{len(guards)}][{nc}];", 1)
        w("for (int64_t q = 0; q < nt; q++) {", 1)
        w(f"const int64_t t = t0 + q, nn = t / {self.row_tiles * self.col_tiles}, "
          f"y = t / {self.col_tiles} % {self.row_tiles} * {tile}, x = t % {self.col_tiles} * {tile};", 2)
        w(f"src[q] = ib + {p}_wi_n(nn) + y * INT64_C({rows.out.image}) + x * INT64_C({cols.out.image});", 2)
        w("ty[q] = y; tx[q] = x;", 2)
        inside = [f"y + {a - 1} < {rows.window}", f"x + {a - 1} < {cols.window}"]
        for i, g in enumerate(guards):
            w(f"gt[{i}][q] = INT64_C({g.const}) + {p}_off_g{i}_batch(bi) + {p}_wg{i}_n(nn) + "
              f"y * INT64_C({rows.out.g[i]}) + x * INT64_C({cols.out.g[i]});", 2)
            kmin = sum(min(0, v.g[i] * (v.extent - 1)) for v in form.k)
            corner = kmin + min(0, (a - 1) * rows.out.g[i]) + min(0, (a - 1) * cols.out.g[i])
            inside.append(f"gt[{i}][q] + INT64_C({corner}) >= 0")
        w(f"inside[q] = {' && '.join(inside)};", 2)
        w("}", 1)
        w(f"const int64_t lanes = (nt + {nr - 1}) / {nr} * {nr};  /* the slivers the products read */", 1)
        L = self.ctx.plan.lanes
        # F(2x2): groups of L tiles side by side in one tile row, all inside, by vector loads and
        # shuffles; F(4x4) (a row holds fewer tiles: 14 at 56 pixels): groups of any L tiles all
        # inside, each patch element's L values gathered
        shuffled = tile == TILE
        vector = (cols.out.image == 1 or not shuffled) and TI == T and L >= 2
        if vector:
            w(f"int whole[{nc // L}];", 1)
            w(f"for (int64_t q = 0; q < {nc}; q += {L}) {{", 1)
            same_row = f" && (t0 + q) / {self.col_tiles} == (t0 + q + {L - 1}) / {self.col_tiles}" if shuffled else ""
            w(f"int all = q + {L} <= nt{same_row};", 2)
            w(f"for (int64_t l = 0; all && l < {L}; l++) all = inside[q + l];", 2)
            w(f"whole[q / {L}] = all;", 2)
            w("}", 1)
        w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
        w(f"const int64_t ik = {p}_wi_k(k);", 2)
        for i in range(len(guards)):
            w(f"const int64_t gk{i} = {p}_wg{i}_k(k);", 2)
        w(f"for (int64_t q = 0; q < lanes; q++) {{", 2)
        w(f"{T} *vk = V + q / {nr} * INT64_C({K * nr}) + k * {nr} + q % {nr};", 3)
        if vector:
            w(f"if (q % {L} == 0 && whole[q / {L}]) {{", 3)
            if shuffled:
                w(f"const {T} *s = src[q] + ik;", 4)
                load_patches(w, p, T, L, f"INT64_C({rows.out.image})", 4)
            else:
                gather_patches(w, p, T, a, L, self.ctx.element_bytes,
                               f"INT64_C({rows.out.image})", f"INT64_C({cols.out.image})", 4)
            self.transform_input(w, 4, f"{p}_v", lambda at: f"*({p}_vu *)(vk + {at})")
            w(f"q += {L - 1};", 4)
            w("continue;", 4)
            w("}", 3)
        w(f"if (q >= nt) {{ for (int x = 0; x < {points}; x++) vk[x * INT64_C({point})] = 0; continue; }}", 3)
        w(f"const {TI} *s = src[q] + ik;", 3)
        w(f"{T} d[{a}][{a}];", 3)
        read = f"({T})s[r * INT64_C({rows.out.image}) + c * INT64_C({cols.out.image})]"
        w(f"if (inside[q]) for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) d[r][c] = {read};", 3)
        holds = [f"ty[q] + r < {rows.window}", f"tx[q] + c < {cols.window}"]
        holds += [f"gt[{i}][q] + gk{i} + r * INT64_C({rows.out.g[i]}) + c * INT64_C({cols.out.g[i]}) >= 0"
                  for i in range(len(guards))]
        w(f"else for (int r = 0; r < {a}; r++) for (int c = 0; c < {a}; c++) "
          f"d[r][c] = {' && '.join(holds)} ? {read} : 0;", 3)
        self.transform_input(w, 3, T, lambda at: f"vk[{at}]")
        w("}", 2)
        w("}", 1)
        w("}")

    def transform_input(self, w: CWriter, depth: int, elem: str, at):
        """B^T d B of the patch ``d[a][a]`` (scalars or vectors of tiles, type ``elem``) stored
        through ``at(offset)`` at each point's offset."""
        point = self.v_point
        input_transform(w, depth, elem, self.matrices, self.literal,
                        lambda x, value: f"{at(f'INT64_C({x * point})')} = {value};")

    def kernel(self, w: CWriter):
        """``<p>_ukr``: one MR x NR tile of one point's product, set (first K block) or added into
        the block's products (row stride nc)."""
        p, T, mr, nr, nc = self.ctx.prefix, self.ctx.T, self.ctx.plan.mr, self.ctx.plan.nr, self.ctx.plan.nc
        w(f"static __attribute__((noinline)) void {p}_ukr(int64_t kc, const {T} *TCPY_RESTRICT a, "
          f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT mw, int first) {{")
        accumulate_loop(self.ctx, w, "kc", lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * self.ctx.plan.lanes})",
                        lambda r: f"a[k * {mr} + {r}]", 1)
        whole_tile(self.ctx, w, 1, lambda r: f"mw + {r * nc}", "first", "")
        w("}")

    def block(self, w: CWriter):
        """``<p>_block``: the P products of a transformed block, then the output transform."""
        p, T = self.ctx.prefix, self.ctx.T
        mr, nr, nc, KC = self.ctx.plan.mr, self.ctx.plan.nr, self.ctx.plan.nc, self.ctx.plan.kc
        K, form = self.form.K, self.form
        rows, cols = form.rows, form.cols
        w(f"static void {p}_block(const {T} *TCPY_RESTRICT U, const {T} *TCPY_RESTRICT V, {T} *TCPY_RESTRICT P, "
          f"{T} *TCPY_RESTRICT C, int64_t bi, int64_t t0, int64_t nt, {T} alpha{self.ctx.cell_params}) {{")
        w(f"const {T} *ub = U + bi * INT64_C({self.points * self.u_point});", 1)
        w(f"const int64_t ns = (nt + {nr - 1}) / {nr};", 1)
        w(f"for (int x = 0; x < {self.points}; x++)", 1)
        w(f"for (int64_t pc = 0; pc < {K}; pc += {KC}) {{", 2)
        w(f"const int64_t kc = {K} - pc < {KC} ? {K} - pc : {KC};", 3)
        mc = self.ctx.plan.mc // mr
        w(f"for (int64_t ic = 0; ic < {self.mt}; ic += {mc})", 3)
        w("for (int64_t jr = 0; jr < ns; jr++)", 4)
        w(f"for (int64_t ir = ic; ir < ic + {mc} && ir < {self.mt}; ir++)", 5)
        w(f"{p}_ukr(kc, ub + x * INT64_C({self.u_point}) + (ir * {K} + pc) * {mr}, "
          f"V + x * INT64_C({self.v_point}) + (jr * {K} + pc) * {nr}, "
          f"P + x * INT64_C({self.p_point}) + ir * {mr * nc} + jr * {nr}, "
          "pc == 0);", 6)
        w("}", 2)
        w(f"{T} *cb = C + INT64_C({self.ctx.con.c.offset}) + {p}_off_c_batch(bi);", 1)
        w(f"for (int64_t m = 0; m < {form.M}; m++) {{", 1)
        w(f"{T} *cm = cb + {p}_wc_m(m);", 2)
        w(f"const {T} *pm = P + m * {nc};", 2)
        tile = self.tile
        w(f"{T} y[{tile * tile}][{nc}];", 2)
        w(f"for (int64_t q = 0; q < {nc}; q++) {{  /* A^T M A, vectorised along the tiles */", 2)
        output_transform(w, 3, T, self.matrices, self.literal, lambda x: f"pm[INT64_C({x * self.p_point}) + q]",
                         lambda x: f"y[{x}][q]")
        w("}", 2)
        w("for (int64_t q = 0; q < nt; q++) {", 2)
        w(f"const int64_t t = t0 + q, nn = t / {self.row_tiles * self.col_tiles}, "
          f"y0 = t / {self.col_tiles} % {self.row_tiles} * {tile}, x0 = t % {self.col_tiles} * {tile};", 3)
        w(f"{T} *o = cm + {p}_wc_n(nn) + y0 * INT64_C({rows.out.c}) + x0 * INT64_C({cols.out.c});", 3)
        if self.ctx.epilogue:
            w(f"const int64_t j0 = {p}_wl_n(nn) + y0 * INT64_C({rows.out.line}) + x0 * INT64_C({cols.out.line});", 3)
        w(f"for (int i = 0; i < {tile}; i++) for (int j = 0; j < {tile}; j++) {{", 3)
        w(f"if (y0 + i >= {rows.out.extent} || x0 + j >= {cols.out.extent}) continue;", 4)
        w(f"{T} *e = o + i * INT64_C({rows.out.c}) + j * INT64_C({cols.out.c});", 4)
        value = f"alpha * y[{tile} * i + j][q]"
        w(f"*e = {value if self.ctx.con.init else '*e + ' + value};", 4)
        if self.ctx.epilogue:  # its (M, N) coordinates: (channel, pixel), or (pixel, channel) with the image as a
            pixel = f"j0 + i * INT64_C({rows.out.line}) + j * INT64_C({cols.out.line})"
            channel = f"{p}_wl_m(m)"
            at = f"{channel}, {pixel}" if form.image == "b" else f"{pixel}, {channel}"
            w(f"{self.ctx.epilogue}(tcpy_buffers, bi, {at}, 1, e);", 4)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        w("}")

    def body(self, w: CWriter):
        """The statement's C in the kernel: the scan and the weights' transform, then the blocks
        claimed by the threads; the exact sums when an operand holds inf, NaN or a huge value."""
        T, con, plan, form = self.ctx.T, self.ctx.con, self.ctx.plan, self.form
        p, mr, nr = self.ctx.prefix, plan.mr, plan.nr
        A, B, C = (self.ctx.names[x.tensor] for x in (con.a, con.b, con.c))
        image, weights = (A, B) if form.image == "a" else (B, A)
        w("{")
        w(f"const {T} alpha = {self.ctx.alpha()};", 1)
        if con.alpha_tensors:  # a rank-0 scale of inf or NaN scales every term (see .exact)
            w(f"int bad = {nonfinite(T, 'alpha')};  /* an operand holds inf, NaN or a huge value */", 1)
        else:
            w("int bad = 0;  /* an operand holds inf, NaN or a huge value */", 1)
        w(f"{T} *U = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, "
          f"sizeof({T}) * INT64_C({self.ctx.batch * self.points * self.u_point}));", 1)
        elements, weight_rows = self.img.elements, self.ctx.batch * self.mt
        scans = -(-elements // SCAN_BLOCK)
        per_image = -(-self.slivers // self.ns)  # blocks of ns slivers, the items claimed
        blocks = self.ctx.batch * per_image
        w("int64_t next_scan = 0, next_weights = 0, next_block = 0;  /* items claimed (tcpy_claim) */", 1)
        w(f"const int team = tcpy_num_threads < {blocks} ? tcpy_num_threads : {blocks};", 1)
        w("#pragma omp parallel num_threads(team) if(team > 1)", 1)
        w("{", 1)
        w("TCPY_TEAM_START();", 2)
        w("int mine = 0;  /* int: gcc vectorises no bool or-reduction */", 2)
        w(f"for (int64_t sb; (sb = tcpy_claim(&next_scan, {scans})) < {scans}; )", 2)
        w(f"for (int64_t e = sb * {SCAN_BLOCK}, e1 = tcpy_min_int64(e + {SCAN_BLOCK}, INT64_C({elements})); "
          f"e < e1; e++) mine |= {self.unusual(f'({T}){image}[e]')};", 3)
        w(f"for (int64_t r; (r = tcpy_claim(&next_weights, {weight_rows})) < {weight_rows}; )", 2)
        w(f"mine |= {p}_weights({weights}, U, r / {self.mt}, r % {self.mt} * {mr});", 3)
        w("if (mine) {", 2)
        w("#pragma omp atomic write", 0)
        w("bad = 1;", 3)
        w("}", 2)
        w("#pragma omp barrier", 0)
        w("int stop_all;", 2)
        w("#pragma omp atomic read", 0)
        w("stop_all = bad;", 2)
        w("if (!stop_all) {", 2)
        w(f"{T} *V = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * INT64_C({self.points * self.v_point}));",
          3)
        w(f"{T} *P = ({T} *)tcpy_scratch({ScratchSlot.PARTIALS}, sizeof({T}) * INT64_C({self.points * self.p_point}));",
          3)
        w(f"for (int64_t block; (block = tcpy_claim(&next_block, {blocks})) < {blocks}; ) {{", 3)
        w("if (TCPY_UNLIKELY(*tcpy_stop)) break;  /* Ctrl-C: the kernel reports it after the nest */", 4)
        w(f"const int64_t bi = block / {per_image}, j = block % {per_image} * {self.ns};", 4)
        w(f"const int64_t count = tcpy_min_int64({self.ns}, {self.slivers} - j);", 4)
        w(f"const int64_t t0 = j * {nr}, nt = tcpy_min_int64(count * {nr}, {form.tiles} - t0);", 4)
        w(f"{p}_inputs({image}, V, bi, t0, nt);", 4)
        w(f"{p}_block(U, V, P, {C}, bi, t0, nt, alpha{self.ctx.cell_args});", 4)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        w("if (TCPY_UNLIKELY(bad)) {  /* inf, NaN or huge: the sums as TC states them */", 1)
        w("#pragma omp parallel for collapse(2) num_threads(tcpy_num_threads) if(tcpy_num_threads > 1)", 2)
        w(f"for (int64_t bi = 0; bi < {self.ctx.batch}; bi++)", 2)
        exact_sums(self.ctx, w, 3, (A, B, C), ("0", str(self.ctx.M)), ("0", str(self.ctx.N)))
        w("}", 1)
        w("}")

    def render(self) -> tuple[str, str]:
        """``(helpers, body)``."""
        helpers = CWriter()
        header(self.ctx, helpers)
        self.offsets(helpers)
        self.weights(helpers)
        self.inputs(helpers)
        self.kernel(helpers)
        self.block(helpers)
        body = CWriter()
        self.body(body)
        return helpers.text(), body.text()
