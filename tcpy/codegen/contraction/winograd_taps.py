"""C for the winograd_taps path of a contraction (:mod:`tcpy.transform.winograd_taps`)::

    the threads scan both operands (blocks claimed one by one) for inf, NaN and huge values
    anywhere: the sums run point by point after
    for each chunk of nc tiles (all threads, one chunk after the other):
      the threads claim blocks of kc tiles of a row sliver (MR gradient channels) or a column
      sliver (NR image channels) and transform them:
        U = A o A^T of the gradient, [16][M/MR][nc][MR] (A slivers)
        V = B^T d B of the image, [16][N/NR][nc][NR] (B slivers; guards read zeros)
      the threads claim (point, column sliver) items: for each K block of kc tiles, row sliver:
        MR x NR micro-kernel: U[xi] x V[xi] into the products P[xi] [M][N], set by the first
        chunk's first block, added to after: every product sums its tiles in one fixed order
    the threads claim rows of the gradient's channels: G^T P G into the output (alpha, +=, the
    epilogue)

What a thread computes depends on the item it claims only, so results do not depend on the
thread count. The transforms are plain C (gcc vectorises the output transform along the image's
channels); the products run on the engine's micro-kernel.
"""
from __future__ import annotations

from ...contraction_ir import POINTS, TAPS, TILE
from ..cwriter import CWriter, ScratchSlot, c_literal
from .context import Context, header
from .exact import exact_sums, nonfinite
from .kernel import accumulate_loop
from .stores import whole_tile
from .winograd import HUGE, SCAN_BLOCK, var_offset_fn

OUTPUT_STACK_BYTES = 16 * 1024  # the output transform's block of values on the stack, whatever the dtype


def render(ctx: Context) -> tuple[str, str]:
    """``(helpers, body)`` of a contraction on the winograd_taps path, as
    :func:`tcpy.codegen.contraction.render` returns them."""
    return _WinogradTaps(ctx).render()


class _WinogradTaps:
    """The winograd_taps path's C over a render context: its buffers' layout, the transforms,
    the products on the engine's micro-kernel, and the exact sums."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        plan = ctx.plan
        self.form = form = plan.taps
        self.mt = -(-form.M // plan.mr)  # row slivers (gradient channels)
        self.nt = -(-form.N // plan.nr)  # column slivers (image channels)
        self.chunk = plan.nc
        self.ldp = self.nt * plan.nr  # a row of the products
        # strides between the points in the buffers, one sliver row more than their size: a
        # tile's 16 values fall in 16 different L1 sets
        self.u_point = self.mt * self.chunk * plan.mr + plan.nr
        self.v_point = self.nt * self.chunk * plan.nr + plan.nr
        self.p_point = self.mt * plan.mr * self.ldp + plan.nr
        self.img = getattr(ctx.con, form.image)
        self.grad = getattr(ctx.con, form.weights)

    def offsets(self, w: CWriter):
        """Offsets in the image (``i``), the gradient (``o``) and the output (``c``) of the linear
        indices of the images (``_k``), the image's channels (``_n``) and the gradient's (``_m``),
        for the tensors each indexes; ``l``: their part of the epilogue's linear M or N index;
        ``g<i>``: their part of guard i."""
        form, p = self.form, self.ctx.prefix
        for which, field, roles in (("i", "image", "kn"), ("o", "weights", "km"), ("c", "c", "nm"),
                                    ("l", "line", "nm")):
            for role in roles:
                var_offset_fn(w, f"{p}_w{which}_{role}", getattr(form, role), lambda v, f=field: getattr(v, f))
        for i in range(len(self.ctx.con.guards)):
            for role in "kn":
                var_offset_fn(w, f"{p}_wg{i}_{role}", getattr(form, role), lambda v, i=i: v.g[i])

    def unusual(self, value: str) -> str:
        """C: 1 when ``value`` is inf, NaN or beyond HUGE in magnitude (NaN fails both tests)."""
        huge = f"({self.ctx.T}){HUGE[self.ctx.element_bytes]}"
        return f"!({value} <= {huge} && {value} >= -{huge})"

    def tile_coordinates(self, w: CWriter, depth: int, tile: str):
        """``nn``, ``y``, ``x``: the image and the first pixel of chunk tile ``tile``."""
        rows, cols = self.form.rows, self.form.cols
        w(f"const int64_t g = c0 + {tile}, nn = g / {rows.tiles * cols.tiles}, "
          f"y = g / {cols.tiles} % {rows.tiles} * {TILE}, x = g % {cols.tiles} * {TILE};", depth)

    def gradient(self, w: CWriter):
        """``<p>_gradient``: U = A o A^T for chunk tiles t0..t1 of row sliver ir (rows past M: 0)."""
        p, T, form = self.ctx.prefix, self.ctx.T, self.form
        mr, chunk = self.ctx.plan.mr, self.chunk
        rows, cols = form.rows, form.cols
        TG = self.grad.dtype.c_type
        # a tile's MR rows side by side in U: a whole sliver's are transformed as one vector of the
        # next power of two lanes, whose lanes past MR land on the next tile's first rows (written
        # after, by the same call) or, MR a power of two, nowhere
        lanes = 1 << (mr - 1).bit_length()
        vector = mr >= 2 and TG == T
        if vector:
            w(f"typedef {T} {p}_g __attribute__((vector_size({lanes * self.ctx.element_bytes}), "
              f"aligned({self.ctx.element_bytes}), __may_alias__));")
        w(f"static void {p}_gradient(const {TG} *TCPY_RESTRICT G, {T} *TCPY_RESTRICT U, int64_t c0, int64_t ir, "
          f"int64_t t0, int64_t t1) {{")
        w(f"const {TG} *gb = G + INT64_C({self.grad.offset});", 1)
        w(f"{T} *us = U + ir * INT64_C({chunk * mr});", 1)
        if vector:
            w(f"const {TG} *rp[{mr}];", 1)
            w(f"for (int64_t r = 0; r < {mr}; r++) rp[r] = gb + {p}_wo_m(tcpy_min_int64(ir * {mr} + r, "
              f"{form.M - 1}));", 1)
            w(f"const int full = ir * {mr} + {mr} <= {form.M};", 1)
        w("for (int64_t t = t0; t < t1; t++) {", 1)
        self.tile_coordinates(w, 2, "t")
        w(f"const int64_t off = {p}_wo_k(nn) + y * INT64_C({rows.out.weights}) + x * INT64_C({cols.out.weights});", 2)
        w(f"const int whole = y + 1 < {rows.out.extent} && x + 1 < {cols.out.extent};", 2)
        if vector:
            w(f"if (full && whole && {'1' if lanes == mr else 't + 1 < t1'}) {{", 2)
            w(f"{p}_g o[2][2];", 3)
            read = ", ".join([f"rp[{r}][o_ij]" for r in range(mr)] + ["0"] * (lanes - mr))
            w("for (int i = 0; i < 2; i++) for (int j = 0; j < 2; j++) {", 3)
            w(f"const int64_t o_ij = off + i * INT64_C({rows.out.weights}) + j * INT64_C({cols.out.weights});", 4)
            w(f"o[i][j] = ({p}_g){{{read}}};", 4)
            w("}", 3)
            point = self.u_point
            self.transform_gradient(w, 3, f"{p}_g", lambda x: f"*({p}_g *)(us + t * {mr} + INT64_C({point}) * {x})")
            w("continue;", 3)
            w("}", 2)
        w(f"for (int64_t r = 0; r < {mr}; r++) {{", 2)
        w(f"{T} *u = us + t * {mr} + r;", 3)
        w(f"if (ir * {mr} + r >= {form.M}) {{ for (int q = 0; q < {POINTS}; q++) u[q * INT64_C({self.u_point})] = 0; "
          "continue; }", 3)
        w(f"const {TG} *s = gb + off + {p}_wo_m(ir * {mr} + r);", 3)
        read = f"({T})s[i * INT64_C({rows.out.weights}) + j * INT64_C({cols.out.weights})]"
        w(f"{T} o[2][2];", 3)
        w(f"for (int i = 0; i < 2; i++) for (int j = 0; j < 2; j++) o[i][j] = whole || (y + i < {rows.out.extent} && "
          f"x + j < {cols.out.extent}) ? {read} : 0;", 3)
        self.transform_gradient(w, 3, T, lambda x: f"u[INT64_C({self.u_point}) * {x}]")
        w("}", 2)
        w("}", 1)
        w("}")

    def transform_gradient(self, w: CWriter, depth: int, elem: str, at):
        """A o A^T of the patch ``o[2][2]`` (scalars, or vectors of rows, type ``elem``) stored
        through ``at(point)``."""
        # e = A o (rows), then e A^T (columns)
        w(f"{elem} e[4][2];", depth)
        w("for (int j = 0; j < 2; j++) { e[0][j] = o[0][j]; e[1][j] = o[0][j] + o[1][j]; "
          "e[2][j] = o[0][j] - o[1][j]; e[3][j] = -o[1][j]; }", depth)
        w("for (int i = 0; i < 4; i++) {", depth)
        w(f"{at('(4 * i)')} = e[i][0]; {at('(4 * i + 1)')} = e[i][0] + e[i][1]; "
          f"{at('(4 * i + 2)')} = e[i][0] - e[i][1]; {at('(4 * i + 3)')} = -e[i][1];", depth + 1)
        w("}", depth)

    def image(self, w: CWriter):
        """``<p>_image``: V = B^T d B for chunk tiles t0..t1 of column sliver jr (columns past N:
        0); a patch inside the window and the guards is read without tests. With one channel
        variable and guards free of it, a whole patch of a vector's width of channels is
        gathered into vectors, transformed and stored as vectors (a sliver's row holds a tile's
        channels side by side)."""
        p, T, form = self.ctx.prefix, self.ctx.T, self.form
        nr, chunk, L = self.ctx.plan.nr, self.chunk, self.ctx.plan.lanes
        rows, cols = form.rows, form.cols
        guards = self.ctx.con.guards
        TI = self.img.dtype.c_type
        point = self.v_point
        vector = len(form.n) == 1 and TI == T and L >= 2 and not any(any(g) for g in (v.g for v in form.n))
        w(f"static void {p}_image(const {TI} *TCPY_RESTRICT I, {T} *TCPY_RESTRICT V, int64_t c0, int64_t jr, "
          f"int64_t t0, int64_t t1) {{")
        w(f"const {TI} *ib = I + INT64_C({self.img.offset});", 1)
        w(f"{T} *vs = V + jr * INT64_C({chunk * nr});", 1)
        w("for (int64_t t = t0; t < t1; t++) {", 1)
        self.tile_coordinates(w, 2, "t")
        w(f"const {TI} *src = ib + {p}_wi_k(nn) + y * INT64_C({rows.out.image}) + x * INT64_C({cols.out.image});", 2)
        inside = [f"y + 3 < {rows.window}", f"x + 3 < {cols.window}"]
        for i, g in enumerate(guards):
            w(f"const int64_t gt{i} = INT64_C({g.const}) + {p}_wg{i}_k(nn) + y * INT64_C({rows.out.g[i]}) + "
              f"x * INT64_C({cols.out.g[i]});", 2)
        lowest = [f"INT64_C({min(0, 3 * rows.out.g[i]) + min(0, 3 * cols.out.g[i])})" for i in range(len(guards))]
        if vector:
            whole = inside + [f"gt{i} + {low} >= 0" for i, low in enumerate(lowest)]
            w(f"const int whole = {' && '.join(whole)};", 2)
        w(f"for (int64_t l = 0; l < {nr}; l++) {{", 2)
        w(f"{T} *v = vs + t * {nr} + l;", 3)
        w(f"const int64_t j = jr * {nr} + l;", 3)
        if vector:
            cs = form.n[0].image
            w(f"if (l % {L} == 0 && whole && j + {L} <= {form.N}) {{", 3)
            w(f"const {TI} *s = src + {p}_wi_n(j);", 4)
            w(f"{p}_v d[4][4];", 4)
            lanes = ", ".join(f"s[o + INT64_C({i * cs})]" for i in range(L))
            w("for (int r = 0; r < 4; r++) for (int c = 0; c < 4; c++) {", 4)
            w(f"const int64_t o = r * INT64_C({rows.out.image}) + c * INT64_C({cols.out.image});", 5)
            w(f"d[r][c] = ({p}_v){{{lanes}}};", 5)
            w("}", 4)
            self.transform_patch(w, 4, f"{p}_v", lambda at: f"*({p}_v *)(v + {at})")
            w(f"l += {L - 1};", 4)
            w("continue;", 4)
            w("}", 3)
        w(f"if (j >= {form.N}) {{ for (int q = 0; q < {POINTS}; q++) v[q * INT64_C({point})] = 0; continue; }}", 3)
        w(f"const {TI} *s = src + {p}_wi_n(j);", 3)
        holds = [f"y + r < {rows.window}", f"x + c < {cols.window}"]
        for i, g in enumerate(guards):
            w(f"const int64_t gj{i} = gt{i} + {p}_wg{i}_n(j);", 3)
            inside.append(f"gj{i} + {lowest[i]} >= 0")
            holds.append(f"gj{i} + r * INT64_C({rows.out.g[i]}) + c * INT64_C({cols.out.g[i]}) >= 0")
        read = f"({T})s[r * INT64_C({rows.out.image}) + c * INT64_C({cols.out.image})]"
        w(f"{T} d[4][4];", 3)
        w(f"if ({' && '.join(inside)}) for (int r = 0; r < 4; r++) for (int c = 0; c < 4; c++) d[r][c] = {read};", 3)
        w(f"else for (int r = 0; r < 4; r++) for (int c = 0; c < 4; c++) d[r][c] = {' && '.join(holds)} ? {read} : 0;",
          3)
        self.transform_patch(w, 3, T, lambda at: f"v[{at}]")
        w("}", 2)
        w("}", 1)
        w("}")

    def transform_patch(self, w: CWriter, depth: int, elem: str, at):
        """B^T d B of the patch ``d[4][4]`` (scalars or vectors of channels, type ``elem``) stored
        through ``at(offset)`` at each point's offset."""
        point = self.v_point
        w(f"{elem} e[4][4];", depth)
        w("for (int c = 0; c < 4; c++) { e[0][c] = d[0][c] - d[2][c]; e[1][c] = d[1][c] + d[2][c]; "
          "e[2][c] = d[2][c] - d[1][c]; e[3][c] = d[1][c] - d[3][c]; }", depth)
        w("for (int r = 0; r < 4; r++) {", depth)
        w(f"{at(f'INT64_C({point}) * (4 * r)')} = e[r][0] - e[r][2]; {at(f'INT64_C({point}) * (4 * r + 1)')} = "
          f"e[r][1] + e[r][2];", depth + 1)
        w(f"{at(f'INT64_C({point}) * (4 * r + 2)')} = e[r][2] - e[r][1]; {at(f'INT64_C({point}) * (4 * r + 3)')} = "
          f"e[r][1] - e[r][3];", depth + 1)
        w("}", depth)

    def kernel(self, w: CWriter):
        """``<p>_ukr``: one MR x NR tile of one point's product over kc tiles, set (``first``) or
        added into the products (row stride ldp)."""
        p, T, mr, nr = self.ctx.prefix, self.ctx.T, self.ctx.plan.mr, self.ctx.plan.nr
        w(f"static __attribute__((noinline)) void {p}_ukr(int64_t kc, const {T} *TCPY_RESTRICT a, "
          f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT pw, int first) {{")
        accumulate_loop(self.ctx, w, "kc", lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * self.ctx.plan.lanes})",
                        lambda r: f"a[k * {mr} + {r}]", 1)
        whole_tile(self.ctx, w, 1, lambda r: f"pw + {r * self.ldp}", "first", "")
        w("}")

    def products(self, w: CWriter):
        """``<p>_products``: point xi's products for column sliver jr over a chunk's count tiles."""
        p, T = self.ctx.prefix, self.ctx.T
        mr, nr, kc, chunk = self.ctx.plan.mr, self.ctx.plan.nr, self.ctx.plan.kc, self.chunk
        w(f"static void {p}_products(const {T} *TCPY_RESTRICT U, const {T} *TCPY_RESTRICT V, {T} *TCPY_RESTRICT P, "
          f"int64_t xi, int64_t jr, int64_t count, int first) {{")
        w(f"for (int64_t pc = 0; pc < count; pc += {kc}) {{", 1)
        w(f"const int64_t kc = count - pc < {kc} ? count - pc : {kc};", 2)
        w(f"for (int64_t ir = 0; ir < {self.mt}; ir++)", 2)
        w(f"{p}_ukr(kc, U + xi * INT64_C({self.u_point}) + ir * INT64_C({chunk * mr}) + pc * {mr}, "
          f"V + xi * INT64_C({self.v_point}) + jr * INT64_C({chunk * nr}) + pc * {nr}, "
          f"P + xi * INT64_C({self.p_point}) + ir * INT64_C({mr * self.ldp}) + jr * {nr}, first && pc == 0);", 3)
        w("}", 1)
        w("}")

    def output(self, w: CWriter):
        """``<p>_output``: G^T P G into the output for gradient channel m (every image channel)."""
        p, T, form, con = self.ctx.prefix, self.ctx.T, self.form, self.ctx.con
        rows, cols = form.rows, form.cols
        half = c_literal(0.5, con.dtype)
        N = form.N
        w(f"static void {p}_output(const {T} *TCPY_RESTRICT P, {T} *TCPY_RESTRICT C, int64_t m, "
          f"{T} alpha{self.ctx.cell_params}) {{")
        w(f"const {T} *pm = P + m * INT64_C({self.ldp});", 1)
        lanes = self.ctx.plan.lanes  # image channels per block: whole vectors filling the stack budget
        block = max(lanes, OUTPUT_STACK_BYTES // (TAPS * TAPS * self.ctx.element_bytes) // lanes * lanes)
        w(f"for (int64_t j0 = 0; j0 < {N}; j0 += {block}) {{", 1)
        w(f"const int64_t j1 = tcpy_min_int64(j0 + {block}, {N});", 1)
        w(f"{T} y[{TAPS * TAPS}][{block}];", 1)
        w("for (int64_t j = j0; j < j1; j++) {  /* G^T P G, vectorised along the image's channels */", 1)
        w(f"{T} s[4][4], t[3][4];", 2)
        w(f"for (int q = 0; q < {POINTS}; q++) s[q / 4][q % 4] = pm[q * INT64_C({self.p_point}) + j];", 2)
        w(f"for (int c = 0; c < 4; c++) {{ t[0][c] = s[0][c] + (s[1][c] + s[2][c]) * {half}; "
          f"t[1][c] = (s[1][c] - s[2][c]) * {half}; t[2][c] = (s[1][c] + s[2][c]) * {half} + s[3][c]; }}", 2)
        w(f"for (int r = 0; r < 3; r++) {{ y[3 * r][j - j0] = t[r][0] + (t[r][1] + t[r][2]) * {half}; "
          f"y[3 * r + 1][j - j0] = (t[r][1] - t[r][2]) * {half}; "
          f"y[3 * r + 2][j - j0] = (t[r][1] + t[r][2]) * {half} + t[r][3]; }}", 2)
        w("}", 1)
        w(f"{T} *cm = C + INT64_C({con.c.offset}) + {p}_wc_m(m);", 1)
        w("for (int64_t j = j0; j < j1; j++) {", 1)
        w(f"{T} *cj = cm + {p}_wc_n(j);", 2)
        w(f"for (int r = 0; r < {TAPS}; r++) for (int c = 0; c < {TAPS}; c++) {{", 2)
        w(f"{T} *e = cj + r * INT64_C({rows.tap.c}) + c * INT64_C({cols.tap.c});", 3)
        value = f"alpha * y[{TAPS} * r + c][j - j0]"
        w(f"*e = {value if con.init else '*e + ' + value};", 3)
        if self.ctx.epilogue:  # (M, N) coordinates: (gradient channel, image channel and taps) or the reverse
            taps = f"{p}_wl_n(j) + r * INT64_C({rows.tap.line}) + c * INT64_C({cols.tap.line})"
            at = f"{p}_wl_m(m), {taps}" if form.image == "b" else f"{taps}, {p}_wl_m(m)"
            w(f"{self.ctx.epilogue}(tcpy_buffers, 0, {at}, 1, e);", 3)
        w("}", 2)
        w("}", 1)
        w("}", 1)
        w("}")

    def body(self, w: CWriter):
        """The statement's C in the kernel: the scan, then per chunk the transforms and the
        products, then the output transform; the exact sums when an operand holds inf, NaN or a
        huge value."""
        T, con, plan, form = self.ctx.T, self.ctx.con, self.ctx.plan, self.form
        p, kc, chunk = self.ctx.prefix, plan.kc, self.chunk
        A, B, C = (self.ctx.names[x.tensor] for x in (con.a, con.b, con.c))
        image, grad = (A, B) if form.image == "a" else (B, A)
        chunks = -(-form.tiles // chunk)
        blocks = -(-chunk // kc)  # transform items per sliver and chunk
        transforms = (self.mt + self.nt) * blocks
        products = POINTS * self.nt
        w("{")
        w(f"const {T} alpha = {self.ctx.alpha()};", 1)
        if con.alpha_tensors:  # a rank-0 scale of inf or NaN scales every term (see .exact)
            w(f"int bad = {nonfinite(T, 'alpha')};  /* an operand holds inf, NaN or a huge value */", 1)
        else:
            w("int bad = 0;  /* an operand holds inf, NaN or a huge value */", 1)
        w(f"{T} *U = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, sizeof({T}) * INT64_C({POINTS * self.u_point}));", 1)
        w(f"{T} *V = ({T} *)tcpy_scratch({ScratchSlot.PACKED_B}, sizeof({T}) * INT64_C({POINTS * self.v_point}));", 1)
        w(f"{T} *P = ({T} *)tcpy_scratch({ScratchSlot.PARTIALS}, sizeof({T}) * INT64_C({POINTS * self.p_point}));", 1)
        scans = [(-(-x.elements // SCAN_BLOCK), x.elements, name) for x, name in ((self.img, image), (self.grad, grad))]
        # items claimed (tcpy_claim); a chunk's counters are those of chunk ci % 2, set to 0 again
        # for the next chunk but one once every thread is past their last claim
        w("int64_t next_scan[2] = {0, 0}, next_transform[2] = {0, 0}, next_product[2] = {0, 0}, next_row = 0;", 1)
        w(f"const int team = tcpy_num_threads < {products} ? tcpy_num_threads : {products};", 1)
        w("#pragma omp parallel num_threads(team) if(team > 1)", 1)
        w("{", 1)
        w("TCPY_TEAM_START();", 2)
        w("int mine = 0;  /* int: gcc vectorises no bool or-reduction */", 2)
        for i, (count, elements, name) in enumerate(scans):
            w(f"for (int64_t sb; (sb = tcpy_claim(&next_scan[{i}], {count})) < {count}; )", 2)
            w(f"for (int64_t e = sb * {SCAN_BLOCK}, e1 = tcpy_min_int64(e + {SCAN_BLOCK}, INT64_C({elements})); "
              f"e < e1; e++) mine |= {self.unusual(f'({T}){name}[e]')};", 3)
        w("if (mine) {", 2)
        w("#pragma omp atomic write", 0)
        w("bad = 1;", 3)
        w("}", 2)
        w("#pragma omp barrier", 0)
        w("int stop_all;", 2)
        w("#pragma omp atomic read", 0)
        w("stop_all = bad;", 2)
        w("if (!stop_all) {", 2)
        w(f"for (int64_t ci = 0; ci < {chunks}; ci++) {{", 3)
        w(f"const int64_t c0 = ci * {chunk}, count = tcpy_min_int64({chunk}, {form.tiles} - c0);", 4)
        w(f"for (int64_t item; (item = tcpy_claim(&next_transform[ci % 2], {transforms})) < {transforms}; ) {{", 4)
        w(f"const int64_t sliver = item / {blocks}, t0 = item % {blocks} * {kc};", 5)
        w("if (t0 >= count) continue;", 5)
        w(f"const int64_t t1 = tcpy_min_int64(t0 + {kc}, count);", 5)
        w(f"if (sliver < {self.mt}) {p}_gradient({grad}, U, c0, sliver, t0, t1);", 5)
        w(f"else {p}_image({image}, V, c0, sliver - {self.mt}, t0, t1);", 5)
        w("}", 4)
        w("#pragma omp barrier", 0)
        w("#pragma omp single nowait", 0)
        w("{ next_transform[(ci + 1) % 2] = 0; next_product[(ci + 1) % 2] = 0; }", 4)
        w(f"for (int64_t item; (item = tcpy_claim(&next_product[ci % 2], {products})) < {products}; ) {{", 4)
        w("if (TCPY_UNLIKELY(*tcpy_stop)) break;  /* Ctrl-C: the kernel reports it after the nest */", 5)
        w(f"{p}_products(U, V, P, item / {self.nt}, item % {self.nt}, count, ci == 0);", 5)
        w("}", 4)
        w("#pragma omp barrier", 0)
        w("}", 3)
        w(f"for (int64_t m; (m = tcpy_claim(&next_row, {form.M})) < {form.M}; )", 3)
        w(f"{p}_output(P, {C}, m, alpha{self.ctx.cell_args});", 4)
        w("}", 2)
        w("}", 1)
        w("if (TCPY_UNLIKELY(bad)) {  /* inf, NaN or huge: the sums as TC states them */", 1)
        w("#pragma omp parallel for num_threads(tcpy_num_threads) if(tcpy_num_threads > 1)", 2)
        w(f"for (int64_t row = 0; row < {self.ctx.M}; row++) {{", 2)
        w("const int64_t bi = 0;", 3)
        exact_sums(self.ctx, w, 3, (A, B, C), ("row", "row + 1"), ("0", str(self.ctx.N)))
        w("}", 2)
        w("}", 1)
        w("}")

    def render(self) -> tuple[str, str]:
        """``(helpers, body)``."""
        helpers = CWriter()
        header(self.ctx, helpers)
        self.offsets(helpers)
        self.gradient(helpers)
        self.image(helpers)
        self.kernel(helpers)
        self.products(helpers)
        self.output(helpers)
        body = CWriter()
        self.body(body)
        return helpers.text(), body.text()
