"""C for the direct_conv path of a contraction (:mod:`tcpy.transform.direct_conv`)::

    the threads claim (batch index, block of nr output channels) items and rearrange the
      weights into Wr [batch][block][tap][nr] (zeros past the last channel); a barrier
    each thread claims (batch index, row, segment of nc pixels, block) items until none is left:
      for each tile of mr pixels along the segment (the row's last one shorter):
        mr x nr/lanes accumulators: for each tap, nr/lanes weight vectors, and per pixel one
          broadcast image element times them (the image read in place)
        the tile stored into the output (alpha, +=, the epilogue)

A tile whose pixels and taps all pass the guards (the interior of a padded image) runs with no
test; a tile that touches the padding clamps each tap's pixels to where every guard holds
(taps of a padded row are skipped whole). Guards leave terms out, while a broadcast 0 would
multiply an inf weight into NaN: a weight that is not finite makes the sums run point by point
(the engine's exact fallback), after a scan of the weights.
"""
from __future__ import annotations

from ..cwriter import CWriter, ScratchSlot
from .context import Context, header
from .exact import exact_fallback, has_exact_fallback
from .guarded import clamp_run
from .winograd import var_offset_fn


def render(ctx: Context) -> tuple[str, str]:
    """``(helpers, body)`` of a contraction on the direct_conv path, as
    :func:`tcpy.codegen.contraction.render` returns them."""
    return _DirectConv(ctx).render()


class _DirectConv:
    """The direct_conv path's C over a render context: the tap tables, the weights'
    rearrangement, the register-tile kernels, the row driver and the claimed items."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        con, plan = ctx.con, ctx.plan
        self.con, self.plan, self.p, self.T, self.epi = con, plan, ctx.prefix, ctx.T, ctx.epilogue
        self.form = form = plan.conv
        self.img, self.wts = getattr(con, form.image), getattr(con, form.weights)
        self.TW = self.wts.dtype.c_type
        self.channels, self.taps = form.channel_count, form.tap_count
        self.blocks = -(-self.channels // plan.nr)
        self.tail = form.run.extent % plan.mr
        self.tap_image = self.tap_values(lambda v: v.image)
        self.tap_guards = [self.tap_values(lambda v, i=i: v.g[i]) for i in range(len(con.guards))]

    def tap_values(self, value) -> list[int]:
        """``value(var)`` summed over the tap variables' digits, for every tap."""
        out = []
        for k in range(self.taps):
            total, i = 0, k
            for v in reversed(self.form.taps):
                total += value(v) * (i % v.extent)
                i //= v.extent
            out.append(total)
        return out

    def tables(self, w: CWriter):
        """The offset functions of the rows and channels, and the taps' image offsets and guard
        values as tables."""
        p, form = self.p, self.form
        for name, variables, stride in (("ci_rows", form.rows, lambda v: v.image), ("cc_rows", form.rows, lambda v: v.c),
                                        ("cl_rows", form.rows, lambda v: v.line),
                                        ("cc_ch", form.channels, lambda v: v.c),
                                        ("cw_ch", form.channels, lambda v: v.weights),
                                        ("cl_ch", form.channels, lambda v: v.line),
                                        ("cw_tap", form.taps, lambda v: v.weights)):
            var_offset_fn(w, f"{p}_{name}", variables, stride)
        for i in range(len(self.con.guards)):
            var_offset_fn(w, f"{p}_cg{i}_rows", form.rows, lambda v, i=i: v.g[i])
        for name, values in (("tap_i", self.tap_image), *((f"tap_g{i}", g) for i, g in enumerate(self.tap_guards))):
            w(f"static const int64_t {p}_{name}[{self.taps}] = {{{', '.join(map(str, values))}}};")

    def weights(self, w: CWriter):
        """``<p>_weights``: block ``blk`` of batch index ``bi``'s weights as ``[tap][nr]``, cast to
        the contraction's type, zeros past the last channel."""
        p, T, TW, nr, K = self.p, self.T, self.TW, self.plan.nr, self.taps
        w(f"static void {p}_weights(const {TW} *TCPY_RESTRICT Wt, {T} *TCPY_RESTRICT Wr, int64_t bi, int64_t blk) {{")
        w(f"const {TW} *wb = Wt + INT64_C({self.wts.offset}) + {p}_off_{self.form.weights}_batch(bi);", 1)
        w(f"{T} *dst = Wr + (bi * {self.blocks} + blk) * INT64_C({K * nr});", 1)
        w(f"int64_t off[{nr}]; int ok[{nr}];", 1)
        w(f"for (int j = 0; j < {nr}; j++) {{ ok[j] = blk * {nr} + j < {self.channels}; "
          f"off[j] = ok[j] ? {p}_cw_ch(blk * {nr} + j) : 0; }}", 1)
        w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
        w(f"const {TW} *wk = wb + {p}_cw_tap(k);", 2)
        w(f"for (int j = 0; j < {nr}; j++) dst[k * {nr} + j] = ok[j] ? ({T})wk[off[j]] : ({T})0;", 2)
        w("}", 1)
        w("}")

    def fmas(self, w: CWriter, width: int, depth: int, masked: bool):
        """Each pixel's broadcast times the weight vectors into its accumulators; ``masked``:
        pixels outside ``[lo, hi)`` read nothing."""
        step, nv = self.form.run.image, self.plan.nr_vectors
        for r in range(width):
            value = f"xk[{r * step}]"
            if masked:
                value = f"({r} >= lo && {r} < hi) ? {value} : ({self.T})0"
            w(f"{{ const {self.T} e = {value}; " + " ".join(f"c{r}_{v} += e * w{v};" for v in range(nv)) + " }",
              depth)

    def kernel(self, w: CWriter, width: int, guarded: bool):
        """``<p>_k<width>[g]``: a tile of ``width`` pixels at ``x`` (the image at its first pixel)
        into ``tile`` ([width][nr]); ``guarded``: ``gb`` holds each guard's value at the tile's
        first pixel and tap 0."""
        p, T, nr, nv, L = self.p, self.T, self.plan.nr, self.plan.nr_vectors, self.plan.lanes
        name = f"{p}_k{width}{'g' if guarded else ''}"
        gb = ", const int64_t *TCPY_RESTRICT gb" if guarded else ""
        w(f"static void {name}(const {T} *TCPY_RESTRICT x, const {T} *TCPY_RESTRICT wr, {T} *TCPY_RESTRICT tile{gb}) {{")
        for r in range(width):
            w(f"{p}_v " + ", ".join(f"c{r}_{v} = {{0}}" for v in range(nv)) + ";", 1)
        w(f"for (int64_t k = 0; k < {self.taps}; k++) {{", 1)
        if guarded:
            w(f"int64_t lo = 0, hi = {width};", 2)
            for i, g in enumerate(self.con.guards):
                clamp_run(w, f"gb[{i}] + {p}_tap_g{i}[k]", self.form.run.g[i], 2)
            w("if (lo >= hi) continue;", 2)
        w(f"const {T} *xk = x + {p}_tap_i[k];", 2)
        w(f"const {T} *wk = wr + k * {nr};", 2)
        for v in range(nv):
            w(f"const {p}_v w{v} = *(const {p}_v *)(wk + {v * L});", 2)
        if guarded:
            w(f"if (lo == 0 && hi == {width}) {{", 2)
            self.fmas(w, width, 3, False)
            w("} else {", 2)
            self.fmas(w, width, 3, True)
            w("}", 2)
        else:
            self.fmas(w, width, 2, False)
        w("}", 1)
        for r in range(width):
            w(" ".join(f"*({p}_v *)(tile + {r * nr + v * L}) = c{r}_{v};" for v in range(nv)), 1)
        w("}")

    def interior(self, width: int) -> str:
        """C: every guard holds for every tap of a tile of ``width`` pixels (``gb`` at its start)."""
        tests = []
        for i, values in enumerate(self.tap_guards):
            least = min(values) + min(0, self.form.run.g[i] * (width - 1))
            tests.append(f"gb[{i}] + INT64_C({least}) >= 0")
        return " && ".join(tests) or "1"

    def store(self, w: CWriter, depth: int):
        """The tile's ``count`` pixels x ``nch`` channels into the output at ``cr`` (alpha, +=,
        the epilogue)."""
        p, T, nr, form, con = self.p, self.T, self.plan.nr, self.form, self.con
        run_c = form.run.c

        def put(target: str, value: str, d: int):
            w(f"{target} = {'alpha * ' + value if con.init else target + ' + alpha * ' + value};", d)

        w(f"{T} *o = cr + x0 * INT64_C({run_c});", depth)
        if form.channels_last:  # a tile row is contiguous in the output
            w("for (int64_t r = 0; r < count; r++)", depth)
            w(f"for (int64_t j = 0; j < nch; j++) {{", depth + 1)
            put(f"o[r * INT64_C({run_c}) + blk * {nr} + j]", f"tile[r * {nr} + j]", depth + 2)
            w("}", depth + 1)
        elif self.transposed:
            self.transposed_store(w, depth)
        else:  # a channel's pixels along the run
            w("for (int64_t j = 0; j < nch; j++)", depth)
            w("for (int64_t r = 0; r < count; r++) {", depth + 1)
            put(f"o[coff[j] + r * INT64_C({run_c})]", f"tile[r * {nr} + j]", depth + 2)
            w("}", depth + 1)
        if self.epi:
            pixel = f"{p}_cl_rows(row) + (x0 + r) * INT64_C({form.run.line})"
            channel = f"{p}_cl_ch(blk * {nr} + j)"
            at = f"{channel}, {pixel}" if form.image == "b" else f"{pixel}, {channel}"
            w("for (int64_t j = 0; j < nch; j++)", depth)
            w("for (int64_t r = 0; r < count; r++)", depth + 1)
            w(f"{self.epi}(tcpy_buffers, bi, {at}, 1, o + coff[j] + r * INT64_C({run_c}));", depth + 2)

    @property
    def transposed(self) -> bool:
        """Whether the tile is stored transposed in registers (NCHW: a channel's pixels are
        contiguous in the output): blocks of lanes x lanes, pixels x channels."""
        return not self.form.channels_last and self.form.run.c == 1 and self.plan.lanes > 1

    def transposed_store(self, w: CWriter, depth: int):
        """The tile into the output as blocks of ``lanes`` pixels x ``lanes`` channels, each
        transposed by shuffles (log2(lanes) rounds) into one vector of pixels per channel; a
        block of fewer pixels is stored whole when its overhang stays within the item's pixels
        (a later tile of this item overwrites it, before its epilogue reads it) and the output
        is overwritten, else element by element."""
        p, T, nr, L, con = self.p, self.T, self.plan.nr, self.plan.lanes, self.con
        for g in range(-(-self.plan.mr // L)):
            w(f"if (count > {g * L}) {{", depth)
            w(f"const int64_t n = count - {g * L};", depth + 1)
            for v in range(self.plan.nr_vectors):
                w("{", depth + 1)
                d = depth + 2
                w(f"{p}_v " + ", ".join(f"t{r} = *(const {p}_v *)(tile + {(g * L + r) * nr + v * L})" for r in range(L))
                  + ";", d)
                h = L // 2
                while h >= 1:
                    lo = ", ".join(str(j if not j & h else L + j - h) for j in range(L))
                    hi = ", ".join(str(j + h if not j & h else L + j) for j in range(L))
                    for i in range(L):
                        if not i & h:
                            w(f"{{ const {p}_v a = t{i}, b = t{i + h}; t{i} = __builtin_shuffle(a, b, ({p}_m){{{lo}}}); "
                              f"t{i + h} = __builtin_shuffle(a, b, ({p}_m){{{hi}}}); }}", d)
                    h //= 2
                whole = "n >= " + str(L)
                if con.init:
                    whole += f" || x0 + {g * L + L} <= x2"
                for j in range(L):
                    ch = v * L + j
                    w(f"if ({ch} < nch) {{", d)
                    w(f"{T} *e = o + coff[{ch}] + {g * L};", d + 1)
                    value = f"alpha * t{j}" if con.init else f"*({p}_vu *)e + alpha * t{j}"
                    w(f"if ({whole}) *({p}_vu *)e = {value};", d + 1)
                    w(f"else for (int64_t r = 0; r < n; r++) e[r] = {'' if con.init else 'e[r] + '}alpha * t{j}[r];",
                      d + 1)
                    w("}", d)
                w("}", depth + 1)
            w("}", depth)

    def row(self, w: CWriter):
        """``<p>_row``: one item, all tiles of one row for one block of output channels."""
        p, T, nr, mr, form, con = self.p, self.T, self.plan.nr, self.plan.mr, self.form, self.con
        guards = con.guards
        w(f"static void {p}_row(const {T} *TCPY_RESTRICT X, const {T} *TCPY_RESTRICT Wr, {T} *TCPY_RESTRICT C, "
          f"int64_t bi, int64_t row, int64_t x1, int64_t x2, int64_t blk, {T} alpha{self.ctx.cell_params}) {{")
        w(f"const {T} *xr = X + INT64_C({self.img.offset}) + {p}_off_{form.image}_batch(bi) + {p}_ci_rows(row);", 1)
        w(f"{T} *cr = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi) + {p}_cc_rows(row);", 1)
        w(f"const {T} *wr = Wr + (bi * {self.blocks} + blk) * INT64_C({self.taps * nr});", 1)
        w(f"const int64_t nch = tcpy_min_int64({nr}, {self.channels} - blk * {nr});", 1)
        w(f"int64_t coff[{nr}];", 1)
        w(f"for (int64_t j = 0; j < nch; j++) coff[j] = {p}_cc_ch(blk * {nr} + j);", 1)
        if guards:
            w(f"int64_t g0[{len(guards)}];", 1)
            for i, g in enumerate(guards):
                w(f"g0[{i}] = INT64_C({g.const}) + {p}_off_g{i}_batch(bi) + {p}_cg{i}_rows(row);", 1)
        align = max(self.plan.lanes * self.ctx.element_bytes, 16)
        rows = -(-mr // self.plan.lanes) * self.plan.lanes if self.transposed else mr  # (whole blocks to transpose)
        w(f"{T} tile[{rows * nr}] __attribute__((aligned({align})));", 1)
        w(f"for (int64_t x0 = x1; x0 < x2; x0 += {mr}) {{", 1)
        w(f"const int64_t count = tcpy_min_int64({mr}, {form.run.extent} - x0);", 2)
        w(f"const {T} *x = xr + x0 * INT64_C({form.run.image});", 2)
        widths = [mr] + ([self.tail] if self.tail else [])
        if guards:
            w(f"int64_t gb[{len(guards)}];", 2)
            for i in range(len(guards)):
                w(f"gb[{i}] = g0[{i}] + x0 * INT64_C({form.run.g[i]});", 2)
        for n, width in enumerate(widths):
            w(f"{'if' if n == 0 else 'else if'} (count == {width}) {{", 2)
            if guards:
                w(f"if ({self.interior(width)}) {p}_k{width}(x, wr, tile); else {p}_k{width}g(x, wr, tile, gb);", 3)
            else:
                w(f"{p}_k{width}(x, wr, tile);", 3)
            w("}", 2)
        self.store(w, 2)
        w("}", 1)
        w("}")

    def body(self, w: CWriter):
        T, con, plan, form, p = self.T, self.con, self.plan, self.form, self.p
        A, B, C = (self.ctx.names[x.tensor] for x in (con.a, con.b, con.c))
        image, weights = (A, B) if form.image == "a" else (B, A)
        batch = self.ctx.batch
        packs = batch * self.blocks
        segments = -(-form.run.extent // plan.nc)
        items = batch * form.row_count * segments * self.blocks
        w("{")
        w(f"const {T} alpha = {self.ctx.alpha()};", 1)
        if exact_fallback(self.ctx, w, A, B, C):
            w("} else {", 1)
        w(f"{T} *Wr = ({T} *)tcpy_scratch({ScratchSlot.PACKED_A}, sizeof({T}) * INT64_C({packs * self.taps * plan.nr}));",
          1)
        w("int64_t next_pack = 0, next_item = 0;  /* items claimed (tcpy_claim) */", 1)
        w(f"const int team = tcpy_num_threads < {items} ? tcpy_num_threads : {items};", 1)
        w("#pragma omp parallel num_threads(team) if(team > 1)", 1)
        w("{", 1)
        w("TCPY_TEAM_START();", 2)
        w(f"for (int64_t q; (q = tcpy_claim(&next_pack, {packs})) < {packs}; )", 2)
        w(f"{p}_weights({weights}, Wr, q / {self.blocks}, q % {self.blocks});", 3)
        w("#pragma omp barrier", 0)
        w(f"for (int64_t item; (item = tcpy_claim(&next_item, {items})) < {items}; ) {{", 2)
        w("if (TCPY_UNLIKELY(*tcpy_stop)) break;  /* Ctrl-C: the kernel reports it after the nest */", 3)
        # the channel blocks innermost: consecutive items read the same image rows
        w(f"const int64_t seg = item / {self.blocks} % {segments}, line = item / {self.blocks * segments};", 3)
        w(f"{p}_row({image}, Wr, {C}, line / {form.row_count}, line % {form.row_count}, seg * {plan.nc}, "
          f"tcpy_min_int64(seg * {plan.nc} + {plan.nc}, {form.run.extent}), item % {self.blocks}, "
          f"alpha{self.ctx.cell_args});", 3)
        w("}", 2)
        w("}", 1)
        if has_exact_fallback(self.ctx):  # (the else of exact_fallback)
            w("}", 1)
        w("}")

    def render(self) -> tuple[str, str]:
        helpers = CWriter()
        header(self.ctx, helpers)
        self.tables(helpers)
        self.weights(helpers)
        widths = [self.plan.mr] + ([self.tail] if self.tail else [])
        for width in widths:
            self.kernel(helpers, width, False)
            if self.con.guards:
                self.kernel(helpers, width, True)
        self.row(helpers)
        body = CWriter()
        self.body(body)
        return helpers.text(), body.text()
