"""C for one contraction (:class:`tcpy.contraction_ir.Contraction`) on a Target.

:func:`render` returns file-scope helpers (vector types, offset functions, packing routines,
micro-kernels, the per-cell driver) and the statement's body inside the kernel function.

**Packed path** (BLIS's five loops around a micro-kernel)::

    for each cell of the thread grid (batch x M x N x K parts), claimed by the next free thread:
      for b in the cell's batch range
        for jc in N, step nc                  B panel kc x nc: this core's L3 share
          for pc in K, step kc
            pack B(pc:pc+kc, jc:jc+nc) into NR-wide slivers (zero-padded)
            for ic in M, step mc              A block mc x kc: L2
              pack A(ic:ic+mc, pc:pc+kc) into MR-tall slivers (zero-padded)
              for jr in nc, step NR           B sliver kc x NR: L1
                for ir in mc, step MR
                  MR x NR micro-kernel: kc rank-1 updates in registers, then one store

Packing reads through the affine accesses (offset functions of the linear M, N, K and batch
indices, with one ``/`` and ``%`` by a constant per merged group), so transposed, strided,
offset, batched and multi-variable operands reach the micro-kernel as the same contiguous
slivers. The micro-kernel keeps ``MR x NR/lanes`` accumulators in vector registers (GCC vector
extensions, ``vector_size`` = the Target's vector bytes); edge tiles compute on zero padding and
store only their valid part. Packing buffers are per-thread scratch reused across calls
(``tcpy_scratch`` in csrc/tcpy_runtime.h). With a split K, each cell writes its partial sums
into a buffer of its own and the partials are added in a fixed order, so results do not depend
on the thread count at run time.

A guarded operand (a padded convolution's input) is packed by one routine for A or B: a
sliver's lanes split into runs of the innermost M or N group, along which the offset and every
guard are linear, so each run's valid part per k is one clamped interval; zeros elsewhere.
Slivers away from the padding copy plain rows; the others classify their rows once per period
of the guards along K (a 3x3 window: 9 classes, repeated for every input channel), and a B
sliver contiguous in B (stride 1, also across the ends of image rows) copies a row that crosses
the padding as whole vectors with a lane mask. With
``a_once`` the whole of a cell's A is packed before its N loop and B panels are sized for L2.

**Small path**: operands read in place (B rows as unaligned vectors, A elements broadcast), no
packing except a zero-padded copy of the last, partial B sliver; rows past M are clamped to the
last valid row and never stored.

**Direct path** (M = 1, a short K: depthwise convolution): each output row is the sum over the
K taps of one A value times B's shifted row, vectorised along the row where every guard holds.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang.types import ScalarType
from ..contraction_ir import Contraction, Group, Plan


DIRECT_ENDS = 8  # padded positions of a run whose taps the direct path lists (beyond: tested per tap)
PACK_B_AHEAD = 2  # pack_b asks for the rows of the sliver this many slivers ahead
GUARD_PERIOD_MAX = 64  # longest period of the guards along K for which a sliver classifies its rows once


# A parallel loop's iterations are claimed in about this many chunks per thread: a thread the
# OS deschedules holds back one small chunk, and a few claims per thread cost nothing.
CLAIMS_PER_THREAD = 8


def dynamic_schedule(iterations: int, threads: int) -> str:
    """The ``schedule`` clause of a parallel loop of ``iterations`` planned for ``threads``:
    chunks claimed dynamically, each iteration still computing the same data whichever thread
    claims it (a reduction's parts are iterations, combined in order afterwards)."""
    chunk = max(1, iterations // (CLAIMS_PER_THREAD * max(1, threads)))
    return f"schedule(dynamic, {chunk})"


def _c(stype: ScalarType) -> str:
    return stype.c_type


def _lit(value: float, stype: ScalarType) -> str:
    text = repr(float(value))
    return text + "f" if stype is ScalarType.FLOAT32 else text


def _clamp_run(w: "_Writer", value: str, slope: int, depth: int):
    """Narrow a run's ``[lo, hi)`` to the positions c where a guard ``value + slope * c >= 0``
    holds (``value``: the guard at the run's start)."""
    if slope == 0:
        w(f"if (({value}) < 0) hi = 0;", depth)
    elif slope > 0:
        w(f"if (({value}) < 0) lo = tcpy_max_int64(lo, (-({value}) + {slope - 1}) / {slope});", depth)
    else:
        w(f"hi = tcpy_min_int64(hi, ({value}) < 0 ? 0 : ({value}) / {-slope} + 1);", depth)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str = "", depth: int = 0):
        for line in text.split("\n"):
            self.lines.append("    " * depth + line if line else "")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render_block(con: Contraction, plan: Plan, names: dict, prefix: str, pointers: tuple[str, str, str], rows: str,
                 prepacked, divided: bool = False, online: bool = False) -> tuple[str, str, str]:
    """``(helpers, prepack, call)`` of a contraction on one block of rows (see
    :meth:`_Renderer.render_block`); ``divided`` adds ``<prefix>_divide_rows``
    (:meth:`_Renderer.divide_rows`), ``online`` the row helpers of an online chain's last
    product (:meth:`_Renderer.online_rows`)."""
    return _Renderer(con, plan, names, prefix, None).render_block(pointers, rows, prepacked, divided, online)


def render(con: Contraction, plan: Plan, names: dict, prefix: str, epilogue: Optional[str] = None) -> tuple[str, str]:
    """``(helpers, body)``: file-scope C and the statement's C inside the kernel function.

    ``names`` maps tensor names to their C pointers in the kernel; ``prefix`` makes the
    helpers' names unique in the file. The body reads ``tcpy_num_threads``. ``epilogue`` names
    a function ``void f(void *const *tcpy_buffers, int64_t bi, int64_t m, int64_t j,
    int64_t cols, const T *v)`` that consumes the final values ``v[0:cols]`` of the output at
    batch ``bi``, row ``m``, columns ``j..`` (linear indices of the roles); it is called once per
    output element, after the element's last store.
    """
    return _Renderer(con, plan, names, prefix, epilogue).render()


class _Renderer:
    def __init__(self, con: Contraction, plan: Plan, names: dict, prefix: str, epilogue: Optional[str]):
        self.con, self.plan, self.names, self.p, self.epi = con, plan, names, prefix, epilogue
        # what the micro-kernels and cells take and pass on for the epilogue
        self.epi_params = ", int last, int64_t bi, void *const *tcpy_buffers" if epilogue else ""
        self.cell_params = ", void *const *tcpy_buffers" if epilogue else ""
        self.cell_args = ", tcpy_buffers" if epilogue else ""
        self.T = _c(con.dtype)
        self.TA, self.TB = _c(con.a.dtype), _c(con.b.dtype)
        self.s = con.dtype.bits // 8
        self.batch, self.M, self.N, self.K = con.sizes

    # -- pieces -----------------------------------------------------------------------------

    def offset_fn(self, w: _Writer, which: str, role: str):
        """``int64_t <p>_off_<which>_<role>(int64_t i)``: element offset of linear index i."""
        groups = [g for g in getattr(self.con, role)]
        w(f"static inline int64_t {self.p}_off_{which}_{role}(int64_t i) {{")  # g<i>: guard i's value
        if not groups or all(g.stride(which) == 0 for g in groups):
            w("(void)i; return 0;", 1)
        elif len(groups) == 1:
            w(f"return INT64_C({groups[0].stride(which)}) * i;", 1)
        else:
            w("int64_t o = 0;", 1)
            for g in reversed(groups[1:]):
                w(f"o += INT64_C({g.stride(which)}) * (i % {g.extent}); i /= {g.extent};", 1)
            w(f"o += INT64_C({groups[0].stride(which)}) * i;", 1)
            w("return o;", 1)
        w("}")

    def cell_head(self, w: _Writer, name: str):
        """``static void <p>_<name>(A, B, C, b0, b1, m0, m1, n0, n1, alpha, stop...) {``: a cell of
        the paths that take no packing buffers from their caller (small, direct, batch lanes)."""
        w(f"static void {self.p}_{name}(const {self.TA} *TCPY_RESTRICT A, const {self.TB} *TCPY_RESTRICT B, "
          f"{self.T} *TCPY_RESTRICT C, int64_t b0, int64_t b1, int64_t m0, int64_t m1, int64_t n0, int64_t n1, "
          f"{self.T} alpha, const volatile int *stop{self.cell_params}) {{")

    def k_offsets(self, which: str) -> list[int]:
        """``<p>_off_<which>_k(k)`` for every k, computed here (as :meth:`offset_fn` computes it)."""
        out = []
        for k in range(self.K):
            o, i = 0, k
            for g in reversed(self.con.k[1:]):
                o += g.stride(which) * (i % g.extent)
                i //= g.extent
            out.append(o + (self.con.k[0].stride(which) * i if self.con.k else 0))
        return out

    def single(self, role: str):
        """The stride of each tensor when the role is one group (None otherwise)."""
        groups = getattr(self.con, role)
        if not groups:  # the role is absent: one index, offset 0
            return Group((), 1, 0, 0, 0)
        return groups[0] if len(groups) == 1 else None

    def header(self, w: _Writer):
        p, T, vb = self.p, self.T, self.plan.lanes * self.s
        w(f"/* contraction {self.con.stmt.replace('*/', '* /')}")
        w(f" * {self.con.describe()}")
        w(f" * {self.plan.describe()} */")
        w(f"typedef {T} {p}_v __attribute__((vector_size({vb}), aligned({vb}), __may_alias__));")
        w(f"typedef {T} {p}_vu __attribute__((vector_size({vb}), aligned({self.s}), __may_alias__));")
        w(f"typedef int{self.s * 8}_t {p}_m __attribute__((vector_size({vb})));  /* shuffle masks */")
        own = "m" if self.con.guarded == "a" else "n"
        guards = tuple((f"g{i}", ("batch", own, "k")) for i in range(len(self.con.guards)))
        for which, roles in (("a", ("batch", "m", "k")), ("b", ("batch", "n", "k")), ("c", ("batch", "m", "n")),
                             *guards):
            for role in roles:
                self.offset_fn(w, which, role)

    def accumulate_loop(self, w: _Writer, kc: str, b_load, a_load, depth: int):
        mr, nv = self.plan.mr, self.plan.nr_vectors
        p = self.p
        for r in range(mr):
            w(f"{p}_v " + ", ".join(f"c{r}_{v} = {{0}}" for v in range(nv)) + ";", depth)
        w(f"#pragma GCC unroll {self.plan.unroll}", depth)
        w(f"for (int64_t k = 0; k < {kc}; k++) {{", depth)
        for v in range(nv):
            w(f"const {p}_v b{v} = {b_load(v)};", depth + 1)
        for r in range(mr):
            w(f"{{ const {self.T} x = {a_load(r)}; "
              + " ".join(f"c{r}_{v} += x * b{v};" for v in range(nv)) + " }", depth + 1)
        w("}", depth)

    def contiguous_tile(self) -> Optional[str]:
        """The C condition under which a whole tile's rows are contiguous in the output (N's
        innermost groups are contiguous in it and the tile does not cross to the next run), or
        None."""
        mr, nr, groups = self.plan.mr, self.plan.nr, self.con.n
        if not groups or groups[-1].c != 1:
            return None
        whole = f"mr == {mr} && nr == {nr}"
        # the run: N's inner groups that follow each other in the output (an image's rows, which
        # a guard keeps apart as groups, are one run of the output)
        run, outer = groups[-1].extent, len(groups) - 1
        while outer > 0 and groups[outer - 1].c == run:
            outer -= 1
            run *= groups[outer].extent
        return whole if outer == 0 else f"{whole} && j % {run} + {nr} <= {run}"

    @property
    def nontemporal(self) -> bool:
        """Whole tiles bypass the caches (no epilogue reads them back)."""
        return self.plan.stream_stores and not self.epi

    def prefetch_c(self, w: _Writer, depth: int):
        """Start loading the output tile's rows while the rank-1 updates run."""
        if self.contiguous_tile() is None or self.nontemporal:
            return
        w(f"for (int64_t r = 0; r < mr; r++) {{ {self.T} *q = cb + {self.p}_off_c_m(i + r) + {self.p}_off_c_n(j); "
          f"__builtin_prefetch(q, 1, 3); __builtin_prefetch(q + nr - 1, 1, 3); }}", depth)

    def _whole_tile(self, w: _Writer, depth: int, row, first: str, scale: str, nontemporal: bool = False):
        """Vector stores of a whole tile: row r at ``row(r)`` is set (when ``first``) or added to;
        ``nontemporal``: set with non-temporal stores when every row is vector-aligned."""
        p, nv, L = self.p, self.plan.nr_vectors, self.plan.lanes
        w(f"if ({first}) {{", depth)
        if nontemporal:
            rows = " | ".join(f"(uintptr_t){row(r)}" for r in range(self.plan.mr))
            vb = L * self.con.dtype.bits // 8
            w(f"if ((({rows}) & {vb - 1}) == 0) {{", depth + 1)
            for r in range(self.plan.mr):
                w(" ".join(f"tcpy_store_nt{vb}({row(r)} + {v * L}, (tcpy_nt{vb})({scale}c{r}_{v}));"
                           for v in range(nv)), depth + 2)
            w("} else {", depth + 1)
        inner = depth + 1 + nontemporal
        for r in range(self.plan.mr):
            w(" ".join(f"*({p}_vu *)({row(r)} + {v * L}) = {scale}c{r}_{v};" for v in range(nv)), inner)
        if nontemporal:
            w("}", depth + 1)
        w("} else {", depth)
        for r in range(self.plan.mr):
            w(" ".join(f"*({p}_vu *)({row(r)} + {v * L}) += {scale}c{r}_{v};" for v in range(nv)), depth + 1)
        w("}", depth)

    def _spill(self, w: _Writer, depth: int):
        """The accumulators into ``t[mr][nr]``, for the element-wise store of a partial tile."""
        mr, nr, nv, L = self.plan.mr, self.plan.nr, self.plan.nr_vectors, self.plan.lanes
        # on lines of its own, and aligned for the vector stores below
        align = max(self.plan.cache_line, self.plan.lanes * self.s)
        w(f"{self.T} t[{mr}][{nr}] __attribute__((aligned({align})));", depth)
        for r in range(mr):
            w(" ".join(f"*({self.p}_v *)&t[{r}][{v * L}] = c{r}_{v};" for v in range(nv)), depth)

    def store_c(self, w: _Writer, overwrite: str, depth: int):
        """Store the accumulators at rows i.., columns j.. of the output (``cb`` is its batch
        base): whole tiles with vector stores when the output's N is contiguous."""
        mr, nr = self.plan.mr, self.plan.nr
        p, T = self.p, self.T
        contiguous = self.contiguous_tile()
        if contiguous is not None:
            w(f"if ({contiguous}) {{", depth)
            for r in range(mr):
                w(f"{T} *q{r} = cb + {p}_off_c_m(i + {r}) + {p}_off_c_n(j);", depth + 1)
            self._whole_tile(w, depth + 1, lambda r: f"q{r}", overwrite, "alpha * ", self.nontemporal)
            if self.epi:  # the rows are contiguous and final: the epilogue reads them in place
                w("if (last) {", depth + 1)
                for r in range(mr):
                    w(f"{self.epi}(tcpy_buffers, bi, i + {r}, j, {nr}, q{r});", depth + 2)
                w("}", depth + 1)
            w("return;", depth + 1)
            w("}", depth)
        self._spill(w, depth)
        w(f"int64_t co[{nr}];  /* the columns' offsets, once for all rows */", depth)
        w(f"for (int64_t c = 0; c < nr; c++) co[c] = {p}_off_c_n(j + c);", depth)
        w("for (int64_t r = 0; r < mr; r++) {", depth)
        w(f"{T} *q = cb + {p}_off_c_m(i + r);", depth + 1)
        if self.epi:
            w(f"{T} row[{nr}];", depth + 1)
        w("for (int64_t c = 0; c < nr; c++) {", depth + 1)
        w(f"{T} *e = q + co[c];", depth + 2)
        w(f"*e = {overwrite} ? alpha * t[r][c] : *e + alpha * t[r][c];", depth + 2)
        if self.epi:
            w("row[c] = *e;", depth + 2)
        w("}", depth + 1)
        if self.epi:
            w(f"if (last) {self.epi}(tcpy_buffers, bi, i + r, j, nr, row);", depth + 1)
        w("}", depth)

    def store_partial(self, w: _Writer, depth: int):
        """Store the accumulators into a dense partial-sum tile ``pp`` (row stride ``ldp``)."""
        mr, nr = self.plan.mr, self.plan.nr
        w(f"if (mr == {mr} && nr == {nr}) {{", depth)
        self._whole_tile(w, depth + 1, lambda r: f"pp + {r} * ldp", "first", "")
        w("return;", depth + 1)
        w("}", depth)
        self._spill(w, depth)
        w("for (int64_t r = 0; r < mr; r++)", depth)
        w("for (int64_t c = 0; c < nr; c++)", depth + 1)
        w("pp[r * ldp + c] = first ? t[r][c] : pp[r * ldp + c] + t[r][c];", depth + 2)

    # -- packed path ------------------------------------------------------------------------

    def guard_base(self, w: _Writer, depth: int):
        """``gb``: each guard's constant plus its batch part, for the guarded operand's packing."""
        if self.con.guards:
            values = ", ".join(f"INT64_C({g.const}) + {self.p}_off_g{i}_batch(bi)" for i, g in enumerate(self.con.guards))
            w(f"const int64_t gb[{len(self.con.guards)}] = {{{values}}};", depth)

    @property
    def tables_kc(self) -> int:
        """Entries of the guarded operand's K tables (one K block)."""
        return max(1, min(self.K, self.plan.kc))

    def declare_tables(self, w: _Writer, depth: int):
        """The guarded operand's K tables in the cell, and the K block they hold (none yet)."""
        if self.con.guards:
            count = len(self.con.guards)
            w(f"int64_t kt[{self.tables_kc}], gt[{count}][{self.tables_kc}], gkmin[{count}], tables_p0 = -1;", depth)

    def tables_for(self, w: _Writer, pc: str, kc: str, depth: int) -> str:
        """Fill the K tables for the block at ``pc`` unless they hold it; the pack's arguments
        (gb and the tables) for a guarded operand."""
        if not self.con.guards:
            return ""
        w(f"if (tables_p0 != {pc}) {{ {self.p}_tables({pc}, {kc}, kt, gt, gkmin); tables_p0 = {pc}; }}", depth)
        args = ", gb, kt, (const int64_t (*)[" + str(self.tables_kc) + "])gt, gkmin"
        if self.con.guarded == "b":
            args += f", B, B + INT64_C({self.con.b.elements})"
        return args

    def packed_guarded(self, w: _Writer, which: str):
        """``<p>_pack_a`` or ``<p>_pack_b`` of the guarded operand: zeros where a guard fails.
        A sliver's rows (A) or columns (B) split into runs of the innermost M or N group, along
        which the operand's offset and every guard are linear, so per k each run's valid part is
        one interval (clamped from the guards). A sliver whose guards hold on every lane of
        every row of the K block (away from the padding) is copied row by row without tests.
        Otherwise, when the guards repeat along K (:meth:`guard_period`), the rows of one period
        are classified once (:meth:`row_classes`). B's slivers whose lanes are contiguous in B
        (a stride-1 convolution's output pixels, across the ends of image rows) copy a row that
        crosses the padding as whole vectors with the failing lanes zeroed (:meth:`masked_row`);
        other rows copy each run's valid interval."""
        p, T, con = self.p, self.T, self.con
        role, width, src_t = ("m", self.plan.mr, self.TA) if which == "a" else ("n", self.plan.nr, self.TB)
        count = len(con.guards)
        groups = getattr(con, role)
        inner = groups[-1] if groups else Group((), 1, 0, 0, 0, (0,) * count)
        step = inner.stride(which)
        # the K block's offsets and guard parts (div/mod chains over the K groups: per sliver and
        # k they would cost as much as the copy), computed by the caller once per K block
        kc_max = self.tables_kc
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
        # guard i along a run: gk + rg + d_i * c >= 0, d_i its coefficient of the inner group
        slopes = [inner.stride(f"g{i}") for i in range(count)]
        # each guard's least value over the sliver's lanes: a guard is its K part plus its N (or
        # M) part, so it holds on every lane of row k when gt[k] is at least minus that
        w(f"int64_t gmin[{count}];", 2)
        for i, d in enumerate(slopes):
            w(f"gmin[{i}] = INT64_MAX;", 2)
            w(f"for (int r = 0; r < runs; r++) gmin[{i}] = tcpy_min_int64(gmin[{i}], rg[r][{i}] + {min(0, d)} * "
              "(rn[r] - 1));", 2)
        masked = which == "b" and self.masked_rows_ok(step, src_t)
        if masked:
            self.contiguous_sliver(w, slopes)
        # a sliver read at one stride (its lanes contiguous in B, or one run) whose guards hold
        # on every lane of every row of the K block (away from the padding): copies without tests
        contiguous = "lin" if masked else f"runs == 1 && len == {width}"
        everywhere = " && ".join(f"gkmin[{i}] + gmin[{i}] >= 0" for i in range(count))
        w(f"if ({contiguous} && {everywhere}) {{", 2)
        w("for (int64_t k = 0; k < kc; k++) {", 3)
        w(f"const {src_t} *TCPY_RESTRICT src = ab + kt[k] + ro[0];", 4)
        w(f"{T} *TCPY_RESTRICT dk = d + k * {width};", 4)
        self.copy_sliver_row(w, "dk", "src", width, step, src_t, 4)
        w("}", 3)
        w("continue;", 3)
        w("}", 2)
        period = self.guard_period()
        if period:
            self.row_classes(w, period, masked, contiguous)
            w(f"for (int64_t k = 0, kp = 0; k < kc; k++, kp = kp + 1 == {period} ? 0 : kp + 1) {{", 2)
        else:
            w("for (int64_t k = 0; k < kc; k++) {", 2)
        w(f"const {src_t} *TCPY_RESTRICT src = ab + kt[k];", 3)
        w(f"{T} *TCPY_RESTRICT dk = d + k * {width};", 3)
        w("const int64_t " + ", ".join(f"gk{i} = gt[{i}][k]" for i in range(count)) + ";", 3)
        if period:
            w("if (cls[kp] == 0) {", 3)
            self.copy_sliver_row(w, "dk", "src + ro[0]", width, step, src_t, 4)
            w("continue;", 4)
            w("}", 3)
            if masked:
                self.masked_row(w, lambda v: f"mk[kp][{v}]", 3)
        elif masked:
            self.contiguous_row(w, 3)
        else:  # a sliver that is one valid run is copied without tests
            whole = " && ".join(f"gk{i} + rg[0][{i}] >= {max(0, -d * (width - 1))}" for i, d in enumerate(slopes))
            w(f"if (runs == 1 && len == {width} && {whole}) {{", 3)
            self.copy_sliver_row(w, "dk", "src + ro[0]", width, step, src_t, 4)
            w("continue;", 4)
            w("}", 3)
        w(f"for (int64_t c = 0; c < {width}; c++) dk[c] = ({T})0;", 3)
        w("for (int r = 0; r < runs; r++) {", 3)
        w("int64_t lo = 0, hi = rn[r];", 4)
        for i, d in enumerate(slopes):
            _clamp_run(w, f"gk{i} + rg[r][{i}]", d, 4)
        if not self.copy_run(w, "dk + r0[r]", "src + ro[r]", width, step, src_t, 4):
            w(f"for (int64_t c = lo; c < hi; c++) dk[r0[r] + c] = ({T})src[ro[r] + INT64_C({step}) * c];", 4)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        w("}")

    def copy_sliver_row(self, w: _Writer, dst: str, src: str, width: int, step: int, src_t: str, depth: int):
        """``dst[c] = src[step * c]`` for a whole sliver row (``width`` elements)."""
        p, T, L = self.p, self.T, self.plan.lanes
        if step == 1 and src_t == T and width % L == 0 and L >= 2:
            for v in range(width // L):
                w(f"*({p}_vu *)({dst} + {v * L}) = *(const {p}_vu *)({src} + {v * L});", depth)
        elif not self.copy_every_other(w, dst, src, width, step, src_t, depth):
            w(f"#pragma GCC unroll {width}", depth)
            w(f"for (int64_t c = 0; c < {width}; c++) ({dst})[c] = ({T})({src})[INT64_C({step}) * c];", depth)

    def masked_rows_ok(self, step: int, src_t: str) -> bool:
        """Whether B's packing may copy a contiguous sliver's row as whole vectors with the lanes
        where a guard fails zeroed (:meth:`masked_row`): unit step, same type, whole vectors,
        B's extent known, and every guard's value fits the lanes' integer type."""
        con, L = self.con, self.plan.lanes
        if step != 1 or src_t != self.T or self.plan.nr % L or L < 2 or not con.b.elements:
            return False
        groups = (*con.batch, *con.m, *con.n, *con.k)
        bound = max(abs(g.const) + sum(abs(grp.stride(f"g{i}")) * grp.extent for grp in groups)
                    for i, g in enumerate(con.guards))
        return bound < 2 ** (self.s * 8 - 2)

    def contiguous_sliver(self, w: _Writer, slopes):
        """Per sliver of B: whether its lanes follow each other in B (``lin``: whole, each run
        starting where the one before ended) and the guards' N parts lane by lane as vectors."""
        p, T, width = self.p, self.T, self.plan.nr
        count, nv = len(self.con.guards), self.plan.nr_vectors
        lane_t = f"int{self.s * 8}_t"
        w(f"int lin = len == {width};", 2)
        w("for (int r = 1; r < runs; r++) lin &= ro[r] == ro[0] + r0[r];", 2)
        w(f"{p}_m gv[{count}][{nv}];", 2)
        w(f"{lane_t} *lanes = ({lane_t} *)gv;", 2)
        for i, d in enumerate(slopes):
            w("for (int r = 0; r < runs; r++)", 2)
            w(f"for (int64_t c = 0; c < rn[r]; c++) lanes[{i * width} + r0[r] + c] = ({lane_t})(rg[r][{i}] + "
              f"{d} * c);", 3)
        w(f"const {T} *TCPY_RESTRICT row0 = ab + ro[0];", 2)

    def guard_period(self) -> Optional[int]:
        """The period of the guarded operand's guards along K: K groups that no guard reads
        (a convolution's input channels, outermost) repeat the inner groups' guard values, so
        the rows of a sliver fall into as many classes as the inner groups have positions
        (a 3x3 window: 9). None when that is more than GUARD_PERIOD_MAX."""
        groups = list(self.con.k)
        while groups and not any(groups[0].g):
            groups.pop(0)
        period = 1
        for g in groups:
            period *= g.extent
        return period if period <= GUARD_PERIOD_MAX else None

    def lane_mask(self, v: int, gk) -> str:
        """Vector v of a contiguous sliver's row: lanes where every guard holds, given the
        guards' K parts ``gk(i)`` (C expressions)."""
        lane_t = f"int{self.s * 8}_t"
        return " & ".join(f"(gv[{i}][{v}] + ({lane_t}){gk(i)} >= 0)" for i in range(len(self.con.guards)))

    def row_classes(self, w: _Writer, period: int, masked: bool, contiguous: str):
        """A sliver's row classes over one period of K: 0 every guard holds on every lane (a
        plain copy), 1 some lanes of a contiguous sliver fail (copied whole with the lane mask
        ``mk``), 2 the runs' copy."""
        p, count, nv = self.p, len(self.con.guards), self.plan.nr_vectors
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
                w(f"mk[k][{v}] = {self.lane_mask(v, lambda i: f'gt[{i}][k]')};", 4)
            w("}", 3)
        w("}", 2)

    def masked_row(self, w: _Writer, mask, depth: int):
        """Row k of a contiguous sliver (:meth:`contiguous_sliver`) loaded whole, with the lanes
        where a guard fails zeroed (``mask(v)``: the mask of vector v), when it lies inside B;
        other rows fall through to the runs' copy."""
        p, T, L, nv, width = self.p, self.T, self.plan.lanes, self.plan.nr_vectors, self.plan.nr
        w("if (lin) {", depth)
        w(f"const {T} *TCPY_RESTRICT row = row0 + kt[k];", depth + 1)
        w(f"if ((uintptr_t)row >= (uintptr_t)lo_b && (uintptr_t)(row + {width}) <= (uintptr_t)hi_b) {{", depth + 1)
        for v in range(nv):
            w(f"*({p}_vu *)(dk + {v * L}) = ({p}_v)((({p}_m)*(const {p}_vu *)(row + {v * L})) & ({mask(v)}));",
              depth + 2)
        w("continue;", depth + 2)
        w("}", depth + 1)
        w("}", depth)

    def contiguous_row(self, w: _Writer, depth: int):
        """Row k of a contiguous sliver when the guards have no short period along K: copied as
        whole vectors when every guard holds on every lane, else :meth:`masked_row` with the
        mask computed here."""
        count, width = len(self.con.guards), self.plan.nr
        everywhere = " && ".join(f"gk{i} + gmin[{i}] >= 0" for i in range(count))
        w(f"if (lin && {everywhere}) {{", depth)
        self.copy_sliver_row(w, "dk", "src + ro[0]", width, 1, self.T, depth + 1)
        w("continue;", depth + 1)
        w("}", depth)
        self.masked_row(w, lambda v: self.lane_mask(v, lambda i: f"gk{i}"), depth)

    def copy_run(self, w: _Writer, dst: str, src: str, width: int, step: int, src_t: str, depth: int) -> bool:
        """``dst[c] = src[step * c]`` for ``lo <= c < hi`` (a run's valid part, at most ``width``)
        by whole vectors (of every other element for step 2: :meth:`copy_every_other`), the last
        one overlapping the one before; a run shorter than a vector by one masked copy (step 1)
        or element by element: nothing outside the part is read or written. False (nothing
        written) unless the step is 1 or 2 and the types agree."""
        p, T, L, s = self.p, self.T, self.plan.lanes, self.s
        if step not in (1, 2) or src_t != T or s not in (4, 8) or L < 2:
            return False
        w("{", depth)
        w(f"const int64_t n = hi - lo; {T} *TCPY_RESTRICT o = {dst} + lo; "
          f"const {T} *TCPY_RESTRICT i = {src} + {step} * lo;", depth + 1)
        w(f"if (n >= {L}) {{", depth + 1)

        def chunk(at: str, guard: str):  # (no loop: gcc would turn a loop of vector copies into memcpy)
            w(f"if ({guard}) {{", depth + 2)
            if step == 1:
                w(f"*({p}_vu *)(o + {at}) = *(const {p}_vu *)(i + {at});", depth + 3)
            else:
                self.copy_every_other(w, f"o + {at}", f"i + 2 * ({at})", L, 2, src_t, depth + 3)
            w("}", depth + 2)

        for v in range(width // L):
            chunk(str(v * L), f"n >= {(v + 1) * L}")
        chunk(f"n - {L}", f"n % {L}")
        w("} else if (n > 0) {", depth + 1)
        if step == 1:
            w(f"tcpy_copy_short{s}(o, i, n);", depth + 2)
        else:
            w("for (int64_t c = 0; c < n; c++) o[c] = i[2 * c];", depth + 2)
        w("}", depth + 1)
        w("}", depth)
        return True

    def copy_every_other(self, w: _Writer, dst: str, src: str, width: int, step: int, src_t: str,
                         depth: int) -> bool:
        """``dst[c] = src[2 c]`` for ``c < width`` (a stride-2 convolution's row) by whole-vector
        loads and even-lane shuffles instead of one insert per element; the last load ends at the
        last element read (it overlaps the one before), so nothing past the row is touched.
        False (nothing written) unless the step is 2, the types agree and width is whole vectors."""
        p, T, L = self.p, self.T, self.plan.lanes
        if step != 2 or src_t != T or width % L or L < 2:
            return False
        loads = 2 * width // L
        w("{", depth)
        for v in range(loads):
            at = v * L - (1 if v == loads - 1 else 0)
            w(f"const {p}_v x{v} = *(const {p}_vu *)({src} + {at});", depth + 1)
        for u in range(width // L):
            last = u == width // L - 1
            mask = ", ".join(str(2 * c + (1 if last and c >= L // 2 else 0)) for c in range(L))
            w(f"*({p}_vu *)({dst} + {u * L}) = __builtin_shuffle(x{2 * u}, x{2 * u + 1}, ({p}_m){{{mask}}});",
              depth + 1)
        w("}", depth)
        return True

    def packed_b(self, w: _Writer):
        """``<p>_pack_b``: B(p0:p0+kc, j0:j0+nc) into NR-wide slivers, k-major, zero-padded."""
        if self.con.guarded == "b":
            self.packed_guarded(w, "b")
            return
        p, T, TB = self.p, self.T, self.TB
        nr = self.plan.nr
        n = self.single("n")
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
            w("int64_t *co = (int64_t *)tcpy_scratch(5, sizeof(int64_t) * nc);", 1)
            w(f"for (int64_t c = 0; c < nc; c++) co[c] = {p}_off_b_n(j0 + c);", 1)
            col = lambda c: f"co[s + {c}]"  # noqa: E731
            step, run = self.con.n[-1].b, self.con.n[-1].extent
        size, line = self.con.b.dtype.bits // 8, self.plan.cache_line
        if abs(step) * size >= line:  # each element of a sliver's row on a line of its own
            lines = [c * abs(step) * size for c in range(nr)]
        else:  # first to last element of a sliver's row, in bytes
            span = abs(step) * (nr - 1) * size
            lines = [*range(0, span, line), span]
        # rows of successive k that share their lines (B transposed: k runs along memory) are
        # asked for once per line, not once per k
        k = self.single("k")
        every = max(1, line // (abs(k.b) * size)) if k is not None and k.b else 1
        w(f"for (int64_t s = 0; s < nc; s += {nr}) {{", 1)
        w(f"{T} *TCPY_RESTRICT d = bp + s * kc;", 2)
        # a whole sliver inside one run of the inner N group is read at that group's stride in B
        inside = f"s + {nr} <= nc" + (f" && (j0 + s) % {run} + {nr} <= {run}" if run else "")
        w(f"if ({inside}) {{", 2)
        w(f"const {TB} *TCPY_RESTRICT src = bb + {col('0')};", 3)
        w(f"const int ahead = s + {PACK_B_AHEAD * nr + nr} <= nc;", 3)
        w(f"const {TB} *TCPY_RESTRICT pf = bb + (ahead ? {col(str(PACK_B_AHEAD * nr))} : {col('0')});", 3)
        L = self.plan.lanes
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
                self.copy_sliver_row(w, f"d + k * {nr}", "r", nr, step, TB, 4)
            else:
                for h in range(nr // L):
                    self.transpose_block(w, 4, lambda c, h=h: f"*(const {p}_vu *)(r + INT64_C({step}) * {h * L + c})",
                                         lambda l, h=h: f"d + (k + {l}) * {nr} + {h * L}")
            w("}", 3)
        w("continue;", 3)
        w("}", 2)
        w("for (int64_t k = 0; k < kc; k++) {", 2)
        w(f"const {TB} *TCPY_RESTRICT src = bb + {p}_off_b_k(p0 + k);", 3)
        w(f"for (int64_t c = 0; c < {nr}; c++) d[k * {nr} + c] = s + c < nc ? ({T})src[{col('c')}] : ({T})0;", 3)
        w("}", 2)
        w("}", 1)
        w("}")

    def packed(self, w: _Writer):
        self.packed_b(w)
        self.packed_a(w)
        self.micro_kernels(w)
        self.packed_cell(w)

    def packed_a(self, w: _Writer):
        """``<p>_pack_a``: A(i0:i0+mc, p0:p0+kc) into MR-tall slivers, k-major, zero-padded rows."""
        if self.con.guarded == "a":
            self.packed_guarded(w, "a")
            return
        p, T, TA, mr = self.p, self.T, self.TA, self.plan.mr
        m = self.single("m")
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
        k = self.single("k")
        L = self.plan.lanes
        if m is not None and k is not None and k.a == 1 and TA == T and mr <= L <= 2 * mr:
            self.transposed_rows(w, 3, m.a)
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

    def transposed_rows(self, w: _Writer, depth: int, row_stride: int):
        """The whole-sliver case of packing A when its rows are contiguous along K: blocks of
        ``lanes`` K steps are loaded as one vector per row, transposed in registers
        (:meth:`transpose_block`) and written one vector per K step. A store writes ``lanes -
        MR`` lanes past its K step; the next step's store (or the remainder loop, the next
        sliver, the buffer's slack) overwrites them. Leaves the remaining K steps to a scalar
        loop."""
        p, T, mr, L = self.p, self.T, self.plan.mr, self.plan.lanes
        w(f"const {T} *TCPY_RESTRICT s0 = ab + {p}_off_a_k(p0) + INT64_C({row_stride}) * (i0 + s);", depth)
        w("int64_t k = 0;", depth)
        w(f"for (; k + {L} <= kc; k += {L}) {{", depth)
        self.transpose_block(w, depth + 1, lambda r: f"*(const {p}_vu *)(s0 + {r * row_stride} + k)" if r < mr else "x0",
                             lambda l: f"d + (k + {l}) * {mr}")
        w("}", depth)
        w("for (; k < kc; k++)", depth)
        w(f"for (int64_t r = 0; r < {mr}; r++) d[k * {mr} + r] = s0[{row_stride} * r + k];", depth + 1)

    def transpose_block(self, w: _Writer, depth: int, load, store):
        """A ``lanes`` x ``lanes`` block transposed in registers: vector ``r`` is ``load(r)``
        (a row: one element per column), then log2(lanes) stages each swap the off-diagonal
        blocks of half the size, and column ``l`` is stored at ``store(l)``."""
        p, L = self.p, self.plan.lanes
        w("{", depth)
        depth += 1
        names = []
        for r in range(L):
            names.append(f"x{r}")
            w(f"const {p}_v x{r} = {load(r)};", depth)
        b, stage = L // 2, 0
        while b >= 1:
            stage += 1
            lo = ", ".join(str(j if not j & b else L + j - b) for j in range(L))
            hi = ", ".join(str(j + b if not j & b else L + j) for j in range(L))
            out = list(names)
            for i in range(L):
                if i & b:
                    continue
                x, y = names[i], names[i + b]
                out[i], out[i + b] = f"t{stage}_{i}", f"t{stage}_{i + b}"
                w(f"const {p}_v {out[i]} = __builtin_shuffle({x}, {y}, ({p}_m){{{lo}}});", depth)
                w(f"const {p}_v {out[i + b]} = __builtin_shuffle({x}, {y}, ({p}_m){{{hi}}});", depth)
            names, b = out, b // 2
        for l in range(L):
            w(f"*({p}_vu *)({store(l)}) = {names[l]};", depth)
        w("}", depth - 1)

    def micro_kernels(self, w: _Writer):
        """Into the output, and (split K) into a partial-sum tile."""
        p, T, mr, nr = self.p, self.T, self.plan.mr, self.plan.nr
        b_load = lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * self.plan.lanes})"  # noqa: E731
        a_load = lambda r: f"a[k * {mr} + {r}]"  # noqa: E731
        full = self.plan
        # ukr1: the last tile of N when it needs one vector: half the FMAs of a full tile (its
        # B sliver keeps the full width's layout); ukr_r: the last tile of M, its M % MR rows
        # only (the A sliver keeps MR rows per k): 64 rows in tiles of 6 would compute 66
        kernels = [("ukr", full)]
        if full.nr_vectors > 1:
            kernels.append(("ukr1", dataclasses.replace(full, nr=full.lanes)))
        if self.M % mr:
            kernels.append(("ukr_r", dataclasses.replace(full, mr=self.M % mr)))
        for name, plan in kernels:
            self.plan = plan
            w(f"static __attribute__((noinline)) void {p}_{name}(int64_t kc, const {T} *TCPY_RESTRICT a, "
              f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT cb, int64_t i, int64_t j, int64_t mr, int64_t nr, "
              f"int overwrite, {T} alpha{self.epi_params}) {{")
            self.prefetch_c(w, 1)
            self.accumulate_loop(w, "kc", b_load, a_load, 1)
            self.store_c(w, "overwrite", 1)
            w("}")
        self.plan = full
        if self.plan.grid[3] > 1:
            w(f"static __attribute__((noinline)) void {p}_ukr_p(int64_t kc, const {T} *TCPY_RESTRICT a, "
              f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT pp, int64_t ldp, int64_t mr, int64_t nr, "
              f"int first) {{")
            self.accumulate_loop(w, "kc", b_load, a_load, 1)
            self.store_partial(w, 1)
            w("}")

    def packed_cell(self, w: _Writer):
        """One cell of the thread grid: the five loops around the micro-kernel."""
        p, T, TA, TB = self.p, self.T, self.TA, self.TB
        mr, nr = self.plan.mr, self.plan.nr
        KC, MC, NC = self.plan.kc, self.plan.mc, self.plan.nc
        con = self.con
        w(f"static void {p}_cell(const {TA} *TCPY_RESTRICT A, const {TB} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C,"
          f" {T} *TCPY_RESTRICT P, int64_t ldp, int64_t prows, int64_t b0, int64_t b1, int64_t m0, int64_t m1,"
          f" int64_t n0, int64_t n1, int64_t k0, int64_t k1, {T} alpha, const volatile int *stop,"
          f" const {T} *TCPY_RESTRICT bpre{self.cell_params}) {{")
        once = self.plan.a_once
        regions = -(-self.K // KC) if once else 1  # a_once: every K block of A, packed up front
        # (+ lanes: the transposing pack's last store may write past the last sliver)
        w(f"{T} *ap = ({T} *)tcpy_scratch(0, sizeof({T}) * {regions * MC * KC + self.plan.lanes});", 1)
        w(f"{T} *bp = bpre ? 0 : ({T} *)tcpy_scratch(1, sizeof({T}) * {KC * NC});", 1)
        self.declare_tables(w, 1)
        w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
        w(f"const {TA} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
        w(f"const {TB} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
        w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
        w(f"{T} *pb = P ? P + (bi - b0) * prows * ldp : 0;", 2)
        self.guard_base(w, 2)
        if once:  # one M block (mc >= the cell's rows): the K blocks of A, each at its region
            w(f"for (int64_t pc = k0; pc < k1; pc += {KC}) {{", 2)
            w(f"const int64_t kc = k1 - pc < {KC} ? k1 - pc : {KC};", 3)
            guard = self.tables_for(w, "pc", "kc", 3) if con.guarded == "a" else ""
            w(f"{p}_pack_a(ab, m0, m1 - m0, pc, kc, ap + (pc - k0) / {KC} * {MC * KC}{guard});", 3)
            w("}", 2)
        w(f"for (int64_t jc = n0; jc < n1; jc += {NC}) {{", 2)
        w(f"const int64_t nc = n1 - jc < {NC} ? n1 - jc : {NC};", 3)
        w(f"for (int64_t pc = k0; pc < k1; pc += {KC}) {{", 3)
        w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 4)
        w(f"const int64_t kc = k1 - pc < {KC} ? k1 - pc : {KC};", 4)
        guard_b = self.tables_for(w, "pc", "kc", 4) if con.guarded == "b" else ""
        w(f"const {T} *bq = bpre ? bpre + pc * INT64_C({self.npad}) + jc * kc : bp;", 4)
        w(f"if (!bpre) {p}_pack_b(bb, pc, kc, jc, nc, bp{guard_b});", 4)
        w(f"for (int64_t ic = m0; ic < m1; ic += {MC}) {{", 4)
        w(f"const int64_t mc = m1 - ic < {MC} ? m1 - ic : {MC};", 5)
        if once:
            w(f"const {T} *TCPY_RESTRICT ak = ap + (pc - k0) / {KC} * {MC * KC};", 5)
        else:
            guard_a = self.tables_for(w, "pc", "kc", 5) if con.guarded == "a" else ""
            w(f"{p}_pack_a(ab, ic, mc, pc, kc, ap{guard_a});", 5)
            w(f"const {T} *TCPY_RESTRICT ak = ap;", 5)
        w(f"for (int64_t jr = 0; jr < nc; jr += {nr}) {{", 5)
        w(f"const int64_t nr = nc - jr < {nr} ? nc - jr : {nr};", 6)
        w(f"for (int64_t ir = 0; ir < mc; ir += {mr}) {{", 6)
        w(f"const int64_t mr = mc - ir < {mr} ? mc - ir : {mr};", 7)
        if self.plan.grid[3] > 1:
            w(f"if (pb) {{ {p}_ukr_p(kc, ak + ir * kc, bq + jr * kc, pb + (ic - m0 + ir) * ldp + (jc - n0 + jr),"
              f" ldp, mr, nr, pc == k0); continue; }}", 7)
        overwrite = "pc == k0" if con.init else "0"
        last = ", pc + kc >= k1, bi, tcpy_buffers" if self.epi else ""
        args = f"(kc, ak + ir * kc, bq + jr * kc, cb, ic + ir, jc + jr, mr, nr, {overwrite}, alpha{last});"
        # direct calls: gcc specialises each for the constant arguments
        call = f"{p}_ukr{args}"
        if self.plan.nr_vectors > 1:
            call = f"if (nr <= {self.plan.lanes}) {p}_ukr1{args} else {call}"
        if self.M % mr:
            call = f"if (mr == {self.M % mr}) {p}_ukr_r{args} else {call}"
        w(call, 7)
        for depth in range(6, 1, -1):
            w("}", depth)
        w("}", 1)
        self.fence(w)
        w("}")

    def fence(self, w: _Writer):
        """Non-temporal stores are weakly ordered: a full fence before the cell's results are read."""
        if self.nontemporal:
            w("__atomic_thread_fence(__ATOMIC_SEQ_CST);", 1)

    def _last(self, K: int) -> str:
        """The epilogue arguments of a call in a ``pc`` loop over all of K."""
        return f", pc + kc >= {K}, bi, tcpy_buffers" if self.epi else ""

    # -- small path -------------------------------------------------------------------------

    def stream(self, w: _Writer):
        """A read in place, M tiles outer, against a packed K block of B (all of the cell's N)."""
        p, T, TB = self.p, self.T, self.TB
        mr, nr, K, KC = self.plan.mr, self.plan.nr, self.K, self.plan.kc
        self.packed_b(w)
        self.small_kernel(w)
        con = self.con
        tn = self.plan.grid[2]
        npart = -(-(-(-self.N // nr)) // tn) * nr
        w(f"static void {p}_cell(const {T} *TCPY_RESTRICT A, const {TB} *TCPY_RESTRICT B, {T} *TCPY_RESTRICT C,"
          f" int64_t b0, int64_t b1, int64_t m0, int64_t m1, int64_t n0, int64_t n1, {T} alpha,"
          f" const volatile int *stop, const {T} *TCPY_RESTRICT bpre{self.cell_params}) {{")
        w(f"{T} *bp = bpre ? 0 : ({T} *)tcpy_scratch(1, sizeof({T}) * {min(K, KC) * npart});", 1)
        self.declare_tables(w, 1)
        w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
        w(f"const {T} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
        w(f"const {TB} *bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
        w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
        self.guard_base(w, 2)
        w(f"for (int64_t pc = 0; pc < {K}; pc += {KC}) {{", 2)
        w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 3)
        w(f"const int64_t kc = {K} - pc < {KC} ? {K} - pc : {KC};", 3)
        w(f"const {T} *bq = bpre ? bpre + pc * INT64_C({self.npad}) + n0 * kc : bp;", 3)
        w("if (!bpre) {", 3)
        guard = self.tables_for(w, "pc", "kc", 4)
        w(f"{p}_pack_b(bb, pc, kc, n0, n1 - n0, bp{guard});", 4)
        w("}", 3)
        overwrite = "pc == 0" if con.init else "0"
        w(f"for (int64_t i = m0; i < m1; i += {mr})", 3)
        w(f"for (int64_t jr = 0; jr < n1 - n0; jr += {nr})", 4)
        w(f"{p}_small(kc, ab + pc * INT64_C({con.linear_stride('k', 'a')}), i, m1 - i < {mr} ? m1 - i : {mr}, bq + jr * kc, {nr}, cb, "
          f"n0 + jr, n1 - n0 - jr < {nr} ? n1 - n0 - jr : {nr}, {overwrite}, alpha{self._last(K)});", 5)
        w("}", 2)
        w("}", 1)
        self.fence(w)
        w("}")

    def small_kernel(self, w: _Writer):
        p, T = self.p, self.T
        mr, K, KC = self.plan.mr, self.K, self.plan.kc
        # A is read in place: its M and K offsets are linear (one group each, or groups that compose)
        m_a, k_a = self.con.linear_stride("m", "a"), self.con.linear_stride("k", "a")
        L = self.plan.lanes
        w(f"static __attribute__((noinline)) void {p}_small(int64_t kc, const {T} *TCPY_RESTRICT ab, int64_t i, "
          f"int64_t mr, const {T} *TCPY_RESTRICT b, int64_t ldb, {T} *TCPY_RESTRICT cb, int64_t j, int64_t nr, "
          f"int overwrite, {T} alpha{self.epi_params}) {{")
        for r in range(mr):
            w(f"const {T} *TCPY_RESTRICT a{r} = ab + INT64_C({m_a}) * (i + ({r} < mr ? {r} : mr - 1));", 1)
        self.accumulate_loop(w, "kc" if K > KC else str(K), lambda v: f"*(const {p}_vu *)(b + k * ldb + {v * L})",
                             lambda r: f"a{r}[k * INT64_C({k_a})]", 1)
        self.store_c(w, "overwrite", 1)
        w("}")

    def small(self, w: _Writer):
        p, T = self.p, self.T
        mr, nr, K, KC = self.plan.mr, self.plan.nr, self.K, self.plan.kc
        k = self.single("k")
        self.small_kernel(w)
        con = self.con
        self.cell_head(w, "cell")
        w(f"{T} *edge = ({T} *)tcpy_scratch(1, sizeof({T}) * {max(1, min(K, KC)) * nr});", 1)
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
        w(f"if (nr < {nr} || {int(self.plan.copy_b)}) {{", 4)
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
          f"{self._last(K)});", 5)
        w("}", 3)
        w("}", 2)
        w("}", 1)
        self.fence(w)
        w("}")

    # -- direct path ------------------------------------------------------------------------

    def direct(self, w: _Writer):
        """M = 1: the output along each run of its inner N group (a row, at most nc long) is
        the sum over K of one A value times B's row shifted by the tap. A table of the taps
        that read the run (and the interval where each does) is kept from run to run; the
        interior, where every listed tap reads, is vectorised (:meth:`_direct_vectors`), and
        the row's padded ends sum the taps listed for each position (with a padded copy,
        :meth:`padded_direct`, the runs read the copy with no guards)."""
        if self.plan.padded_copy:
            self.padded_direct(w)
            return
        self.direct_cell(w, "cell")

    def padded_direct(self, w: _Writer):
        """``<p>_cell`` of the direct path with a padded copy (:class:`PaddedCopy`): per batch
        index, B's slice is copied into a zeroed buffer (its pads stay zero) and the unguarded
        contraction reads the copy; a batch index whose taps are not all finite sums point by
        point instead (:meth:`exact_sums`: 0 x inf is NaN where TC adds nothing)."""
        p, T, TA, TB, con = self.p, self.T, self.TA, self.TB, self.con
        copy = con.padded
        inner = _Renderer(copy.contraction, dataclasses.replace(self.plan, padded_copy=False), self.names,
                          f"{p}_pd", self.epi)
        inner.header(w)
        inner.direct_cell(w, "cell")
        pitch = copy.pitch
        self.cell_head(w, "cell")
        w(f"{T} *pad = ({T} *)tcpy_scratch(1, sizeof({T}) * {copy.elements});", 1)
        w(f"memset(pad, 0, sizeof({T}) * {copy.elements});", 1)
        w("for (int64_t bi = b0; bi < b1; bi++) {", 1)
        w(f"const {TA} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
        if not con.padding_multiplies:  # (a guarded factor's zeros multiply the taps, as written)
            w("int finite = 1;", 2)
            w(f"for (int64_t k = 0; k < {self.K}; k++) finite &= __builtin_isfinite(({T})ab[{p}_off_a_k(k)]);", 2)
            w("if (!finite) {", 2)
            self.exact_sums(w, 3, ("A", "B", "C"), ("m0", "m1"), ("n0", "n1"))
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
        w(f"{p}_pd_cell(A, pad, C, bi, bi + 1, m0, m1, n0, n1, alpha, stop{self.cell_args});", 2)
        w("}", 1)
        w("}")

    def direct_cell(self, w: _Writer, name: str):
        """``<p>_<name>``: the direct path's runs over batch indices ``b0..b1`` (see :meth:`direct`)."""
        p, T, TA, TB, con = self.p, self.T, self.TA, self.TB, self.con
        NC, K = self.plan.nc, self.K
        count = len(con.guards)
        inner = con.n[-1]
        step, extent = inner.stride("b"), inner.extent
        self.cell_head(w, name)
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
        self.guard_base(w, 2)
        w(f"int64_t nt = 0, lo_all = 0, hi_all = 0, key_len = -1, key_g[{max(1, len(sloped))}] = {{0}};", 2)
        w(f"int64_t nb = 0, ne = 0, bc[{DIRECT_ENDS}], bs[{DIRECT_ENDS + 1}] = {{0}}, eo[{DIRECT_ENDS * K}];", 2)
        w(f"{T} ea[{DIRECT_ENDS * K}];", 2)
        w("uint64_t key_on = 0;", 2)
        w("for (int64_t x = n0; x < n1; ) {", 2)
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
            _clamp_run(w, f"gk[{i}][k] + rg{i}", inner.stride(f"g{i}"), 5)
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
            self._direct_vectors(w, 3)
        w("for (; c < hi_all; c++) {", 3)
        w(f"{T} s = 0;", 4)
        w("for (int64_t t = 0; t < nt; t++)", 4)
        w(f"s += ta[t] * ({T})row[to[t] + INT64_C({step}) * c];", 5)
        w(f"q[c] = {store};", 4)
        w("}", 3)
        if self.epi:  # the run is final and contiguous (M = 1: row 0)
            w(f"{self.epi}(tcpy_buffers, bi, 0, x, len, q);", 3)
        w("x += len;", 3)
        w("}", 2)
        w("}", 1)
        w("}")

    def _direct_vectors(self, w: _Writer, depth: int):
        """The direct path's interior ``[c, hi_all)`` of a contiguous run in steps of four
        vectors when overwriting (two or one when shorter), two when accumulating, one sum per
        vector: four independent chains of K FMAs hide the FMA latency within a step (a second
        partial sum per vector instead ran 6% slower, its registers spilling the taps'
        weights); all K taps unrolled, at constant offsets, when all read the run (a table's
        offsets cost a load per tap and step). An overwriting store ends with a
        step that overlaps the previous one (the same values again) instead of leftovers; an
        accumulating one leaves them to the scalar loop."""
        p, T, L, K = self.p, self.T, self.plan.lanes, self.K

        offsets = self.k_offsets("b")

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
                w(f"{target} = alpha * s{u};" if self.con.init else f"{target} += alpha * s{u};", d)
            w("}", d - 1)

        for taps, test in ((str(K), f"nt == {K}"), ("nt", None)):
            w(f"if ({test}) {{" if test else "else {", depth)
            if self.con.init:
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

    # -- batch-lanes path --------------------------------------------------------------------

    def batch_lanes(self, w: _Writer):
        """N = 1, the batch contiguous in every tensor (:func:`_batch_lanes_ok`): per output
        row m (a pixel), runs of consecutive batch indices (channels) in vectors, four at a
        time, each summing the K taps whose guards hold at (m, k): the guards do not depend on
        the batch, so a tap is kept or skipped for all lanes; a pixel away from the padding
        sums all K unrolled, with constant offsets. Leftover batch indices are summed one by one."""
        p, T, con, K, L = self.p, self.T, self.con, self.K, self.plan.lanes
        count = len(con.guards)
        inner = con.batch[-1]
        a_k, b_k = self.k_offsets("a"), self.k_offsets("b")
        self.cell_head(w, "cell")
        w("(void)n0; (void)n1;", 1)
        if count:
            w(f"int64_t gk[{count}][{K}], gmin[{count}];  /* the guards' tap parts, their least */", 1)
            w(f"for (int64_t k = 0; k < {K}; k++) {{", 1)
            for i in range(count):
                w(f"gk[{i}][k] = {p}_off_g{i}_k(k);", 2)
                w(f"gmin[{i}] = k == 0 ? gk[{i}][0] : tcpy_min_int64(gmin[{i}], gk[{i}][k]);", 2)
            w("}", 1)

        def sums(width: int, every: bool, d: int):
            """``width`` vectors (one scalar when ``width`` is 0) at lane offset ``c``."""
            vec = width > 0
            n_acc = width if vec else 1
            w(f"{p}_v " + ", ".join(f"s{u} = {{0}}" for u in range(n_acc)) + ";" if vec else f"{T} s0 = 0;", d)
            load = (lambda base, u: f"*(const {p}_vu *)({base} + c + {u * L})") if vec else \
                (lambda base, u: f"({base})[c]")
            if every:
                for k in range(K):
                    w(" ".join(f"s{u} += {load(f'ar + INT64_C({a_k[k]})', u)} * {load(f'bb + INT64_C({b_k[k]})', u)};"
                               for u in range(n_acc)), d)
            else:
                w(f"for (int64_t k = 0; k < {K}; k++) {{", d)
                if count:
                    holds = " && ".join(f"g{i} + gk[{i}][k] >= 0" for i in range(count))
                    w(f"if (!({holds})) continue;", d + 1)
                w(f"const {T} *ak = ar + {p}_off_a_k(k), *bk = bb + {p}_off_b_k(k);", d + 1)
                w(" ".join(f"s{u} += {load('ak', u)} * {load('bk', u)};" for u in range(n_acc)), d + 1)
                w("}", d)
            for u in range(n_acc):
                target = f"*({p}_vu *)(q + c + {u * L})" if vec else "q[c]"
                w(f"{target} {'=' if con.init else '+='} alpha * s{u};", d)

        w("for (int64_t bi = b0; bi < b1; ) {", 1)
        w("if (TCPY_UNLIKELY(*stop)) return;  /* Ctrl-C: the kernel reports it after the nest */", 2)
        w(f"const int64_t len = tcpy_min_int64(b1 - bi, {inner.extent} - bi % {inner.extent});", 2)
        w(f"const {T} *ab = A + INT64_C({con.a.offset}) + {p}_off_a_batch(bi);", 2)
        w(f"const {T} *TCPY_RESTRICT bb = B + INT64_C({con.b.offset}) + {p}_off_b_batch(bi);", 2)
        w(f"{T} *cb = C + INT64_C({con.c.offset}) + {p}_off_c_batch(bi);", 2)
        w("for (int64_t m = m0; m < m1; m++) {", 2)
        w(f"const {T} *TCPY_RESTRICT ar = ab + {p}_off_a_m(m);", 3)
        w(f"{T} *TCPY_RESTRICT q = cb + {p}_off_c_m(m);", 3)
        for i, g in enumerate(con.guards):
            w(f"const int64_t g{i} = INT64_C({g.const}) + {p}_off_g{i}_m(m);", 3)
        every = " && ".join(f"gmin[{i}] + g{i} >= 0" for i in range(count)) or "1"
        w("int64_t c = 0;", 3)
        for cond, all_taps in ((every, True), (None, False)):
            w(f"if ({cond}) {{" if cond else "else {", 3)
            for width in (4, 1):
                w(f"for (; c + {width * L} <= len; c += {width * L}) {{", 4)
                sums(width, all_taps, 5)
                w("}", 4)
            w("for (; c < len; c++) {", 4)
            sums(0, all_taps, 5)
            w("}", 4)
            w("}", 3)
        if self.epi:
            w(f"for (int64_t c = 0; c < len; c++) {self.epi}(tcpy_buffers, bi + c, m, 0, 1, q + c);", 3)
        w("}", 2)
        w("bi += len;", 2)
        w("}", 1)
        w("}")

    # -- driver -----------------------------------------------------------------------------

    def body(self, w: _Writer):
        T, con, plan = self.T, self.con, self.plan
        tb, tm, tn, tk = plan.grid
        mt, nt = -(-self.M // plan.mr), -(-self.N // plan.nr)
        cells = tb * tm * tn * tk
        bpart = -(-self.batch // tb)
        mpart, npart = -(-mt // tm) * plan.mr, -(-nt // tn) * plan.nr
        part = bpart * mpart * npart
        A, B, C = (self.names[x.tensor] for x in (con.a, con.b, con.c))
        w("{")
        w(f"const {T} alpha = {self.alpha()};", 1)
        if self.exact_fallback(w, A, B, C):
            w("} else {", 1)
        if tk > 1:
            w(f"{T} *partials = ({T} *)tcpy_scratch(2, sizeof({T}) * {cells * part});", 1)
        if cells > 1:
            w("int64_t next_cell = 0;  /* the cells are claimed one by one (tcpy_claim) */", 1)
            w(f"const int nt = tcpy_num_threads < {cells} ? tcpy_num_threads : {cells};", 1)
            w("#pragma omp parallel num_threads(nt) if(nt > 1)", 1)
        w("{", 1)
        if cells > 1:
            w("TCPY_TEAM_START();", 2)
            w(f"for (int64_t cell; (cell = tcpy_claim(&next_cell, {cells})) < {cells}; ) {{", 2)
        else:
            w("for (int64_t cell = 0; cell < 1; cell++) {", 2)
        w(f"const int64_t cb = cell / {tm * tn * tk}, cm = cell / {tn * tk} % {tm}, cn = cell / {tk} % {tn}, "
          f"ck = cell % {tk};", 3)
        w(f"const int64_t b0 = cb * {self.batch} / {tb}, b1 = (cb + 1) * {self.batch} / {tb};", 3)
        w(f"const int64_t m0 = cm * {mt} / {tm} * {plan.mr}, m1 = tcpy_min_int64((cm + 1) * {mt} / {tm} * {plan.mr},"
          f" {self.M});", 3)
        w(f"const int64_t n0 = cn * {nt} / {tn} * {plan.nr}, n1 = tcpy_min_int64((cn + 1) * {nt} / {tn} * {plan.nr},"
          f" {self.N});", 3)
        w(f"const int64_t k0 = ck * {self.K} / {tk}, k1 = (ck + 1) * {self.K} / {tk};", 3)
        w("if (b0 >= b1 || m0 >= m1 || n0 >= n1) continue;", 3)
        w("(void)k0; (void)k1;", 3)
        P = f"partials + (int64_t)cell * {part}" if tk > 1 else "0"
        w(f"{self.cell_call(A, B, C, 'b0, b1', 'm0, m1', 'n0, n1', 'k0, k1', P, npart, mpart, '0')};", 3)
        w("}", 2)
        w("}", 1)
        if tk > 1:
            self.combine(w, mt, nt, bpart, mpart, npart, part)
        if self.guarded_products:  # (the else of exact_fallback)
            w("}", 1)
        w("}")

    def alpha(self) -> str:
        """C: the contraction's scale (its literal times its rank-0 tensors)."""
        alpha = _lit(self.con.alpha, self.con.dtype)
        for s in self.con.alpha_tensors:
            alpha += f" * ({self.T}){self.names[s]}[0]"
        return alpha

    @property
    def guarded_products(self) -> bool:
        """Whether the other operand of a guarded one is scanned for inf and NaN before the
        engine runs (see :meth:`exact_fallback`): whenever a failing guard leaves its term out,
        whatever the sizes (the direct paths test the guard per tap instead). A guarded factor's
        packed zeros multiply the other operand, as written: nothing to scan."""
        con = self.con
        other = con.b if con.guarded == "a" else con.a
        return (bool(con.guards) and not con.padding_multiplies and self.plan.path not in ("direct", "batch_lanes")
                and other.elements > 0)

    def exact_fallback(self, w: _Writer, A: str, B: str, C: str) -> bool:
        """Packing writes 0 where a guard fails, and 0 x inf is NaN where TC adds nothing; so
        when the operand that is not guarded holds inf or NaN, the sums run as TC states them,
        point by point, skipping the terms whose guard fails (slow, for such inputs only).
        Opens ``if (...) { <that> `` and returns True, or returns False (no guard, or a scan
        too costly next to the products: the engine then runs alone)."""
        if not self.guarded_products:
            return False
        T, con = self.T, self.con
        other, name = (con.b, B) if con.guarded == "a" else (con.a, A)
        w("int64_t nonfinite = 0;", 1)
        w(f"for (int64_t e = 0; e < INT64_C({other.elements}); e++) "
          f"nonfinite |= ({T}){name}[e] - ({T}){name}[e] != 0;  /* inf - inf and NaN are NaN */", 1)
        w("if (TCPY_UNLIKELY(nonfinite)) {", 1)
        w("#pragma omp parallel for collapse(2) num_threads(tcpy_num_threads) if(tcpy_num_threads > 1)", 2)
        w(f"for (int64_t bi = 0; bi < {self.batch}; bi++)", 2)
        self.exact_sums(w, 3, (A, B, C), ("0", str(self.M)), ("0", str(self.N)))
        return True

    def exact_sums(self, w: _Writer, depth: int, tensors, rows, cols):
        """The outputs of batch index ``bi`` in ``rows`` x ``cols`` (C ranges), each summed point by
        point as the statement is written: a term whose guard fails is left out, or for a guarded
        factor is 0 times the other operand (slow: for inputs with inf or NaN where packed zeros
        would make 0 x inf, or the winograd transforms NaN)."""
        p, T, con = self.p, self.T, self.con
        A, B, C = tensors
        own = "m" if con.guarded == "a" else "n"
        w(f"for (int64_t i = {rows[0]}; i < {rows[1]}; i++) {{", depth)
        w(f"const {self.TA} *ar = {A} + INT64_C({con.a.offset}) + {p}_off_a_batch(bi) + {p}_off_a_m(i);", depth + 1)
        w(f"{T} *cr = {C} + INT64_C({con.c.offset}) + {p}_off_c_batch(bi) + {p}_off_c_m(i);", depth + 1)
        w(f"for (int64_t j = {cols[0]}; j < {cols[1]}; j++) {{", depth + 1)
        w(f"const {self.TB} *br = {B} + INT64_C({con.b.offset}) + {p}_off_b_batch(bi) + {p}_off_b_n(j);", depth + 2)
        index = "i" if own == "m" else "j"
        parts = [f"INT64_C({g.const}) + {p}_off_g{g_i}_batch(bi) + {p}_off_g{g_i}_{own}({index})"
                 for g_i, g in enumerate(con.guards)]
        if parts:
            w(f"const int64_t g[{len(parts)}] = {{{', '.join(parts)}}};", depth + 2)
        w(f"{T} s = 0;", depth + 2)
        w(f"for (int64_t k = 0; k < {self.K}; k++) {{", depth + 2)
        holds = " && ".join(f"g[{g_i}] + {p}_off_g{g_i}_k(k) >= 0" for g_i in range(len(parts))) or "1"
        a_k, b_k = f"({T})ar[{p}_off_a_k(k)]", f"({T})br[{p}_off_b_k(k)]"
        if con.padding_multiplies:
            if con.guarded == "a":
                a_k = f"({holds} ? {a_k} : ({T})0)"
            else:
                b_k = f"({holds} ? {b_k} : ({T})0)"
            w(f"s += {a_k} * {b_k};", depth + 3)
        else:
            w(f"if ({holds}) s += {a_k} * {b_k};", depth + 3)
        w("}", depth + 2)
        w(f"{T} *e = cr + {p}_off_c_n(j);", depth + 2)
        w(f"*e = {'alpha * s' if con.init else '*e + alpha * s'};", depth + 2)
        if self.epi:
            w(f"{{ const {T} v = *e; {self.epi}(tcpy_buffers, bi, i, j, 1, &v); }}", depth + 2)
        w("}", depth + 1)
        w("}", depth)

    def cell_call(self, A, B, C, b, m, n, k, P="0", ldp=0, prows=0, bpre="0") -> str:
        """The call of ``<p>_cell`` on the given ranges (``"lo, hi"`` each); ``bpre``: B packed
        beforehand by ``<p>_prepack`` (0: the cell packs its own)."""
        if self.plan.path in ("small", "direct", "batch_lanes"):
            return f"{self.p}_cell({A}, {B}, {C}, {b}, {m}, {n}, alpha, tcpy_stop{self.cell_args})"
        if self.plan.path == "stream":
            return f"{self.p}_cell({A}, {B}, {C}, {b}, {m}, {n}, alpha, tcpy_stop, {bpre}{self.cell_args})"
        return (f"{self.p}_cell({A}, {B}, {C}, {P}, {ldp}, {prows}, {b}, {m}, {n}, {k}, alpha, tcpy_stop, {bpre}"
                f"{self.cell_args})")

    @property
    def npad(self) -> int:
        """N rounded up to whole B slivers: a K block's share of a prepacked B."""
        return -(-self.N // self.plan.nr) * self.plan.nr

    def prepack(self, w: _Writer):
        """``<p>_prepack``: all of B (one batch), K block after K block, as the cell packs it."""
        p, T, TB, K, KC = self.p, self.T, self.TB, self.K, self.plan.kc
        w(f"static void {p}_prepack(const {TB} *TCPY_RESTRICT bb, {T} *TCPY_RESTRICT bp) {{")
        w(f"for (int64_t pc = 0; pc < {K}; pc += {KC})", 1)
        w(f"{p}_pack_b(bb, pc, {K} - pc < {KC} ? {K} - pc : {KC}, 0, {self.N}, bp + pc * INT64_C({self.npad}));", 2)
        w("}")

    def combine(self, w: _Writer, mt, nt, bpart, mpart, npart, part):
        """C (=|+=) alpha * the sum of the K cells' partials, in the order of the K cells."""
        p, T, con, plan = self.p, self.T, self.con, self.plan
        tb, tm, tn, tk = plan.grid
        groups = tb * tm * tn
        C = self.names[con.c.tensor]
        rows = groups * bpart * mpart
        w(f"#pragma omp parallel for num_threads(tcpy_num_threads) {dynamic_schedule(rows, plan.threads)} "
          "if(tcpy_num_threads > 1)", 1)
        w(f"for (int64_t row = 0; row < {rows}; row++) {{", 1)
        w(f"const int64_t g = row / {bpart * mpart}, local = row % {bpart * mpart};", 2)
        w(f"const int64_t cb = g / {tm * tn}, cm = g / {tn} % {tm}, cn = g % {tn};", 2)
        w(f"const int64_t bi = cb * {self.batch} / {tb} + local / {mpart};", 2)
        w(f"const int64_t m0 = cm * {mt} / {tm} * {plan.mr}, m = m0 + local % {mpart};", 2)
        w(f"const int64_t n0 = cn * {nt} / {tn} * {plan.nr}, n1 = tcpy_min_int64((cn + 1) * {nt} / {tn} * {plan.nr},"
          f" {self.N});", 2)
        w(f"if (bi >= (cb + 1) * {self.batch} / {tb} || m >= tcpy_min_int64((cm + 1) * {mt} / {tm} * {plan.mr}, "
          f"{self.M})) continue;", 2)
        w(f"const {T} *src = partials + g * {tk * part} + local * {npart};", 2)
        w(f"{T} *q = {C} + INT64_C({con.c.offset}) + {p}_off_c_batch(bi) + {p}_off_c_m(m);", 2)
        w("for (int64_t n = n0; n < n1; n++) {", 2)
        w(f"{T} s = src[n - n0];", 3)
        for ck in range(1, tk):
            w(f"s += src[{ck * part} + n - n0];", 3)
        w(f"{T} *e = q + {p}_off_c_n(n);", 3)
        w(f"*e = {'alpha * s' if con.init else '*e + alpha * s'};", 3)
        if self.epi:
            w(f"{{ const {T} v = *e; {self.epi}(tcpy_buffers, bi, m, n, 1, &v); }}", 3)
        w("}", 2)
        w("}", 1)

    def render_block(self, pointers: tuple[str, str, str], rows: str, prepacked,
                     divided: bool = False, online: bool = False) -> tuple[str, str, str]:
        """``(helpers, prepack, call)`` for one block of rows inside a fused chain (one thread,
        no grid): ``pointers`` are the C pointers of a, b and c at the block; ``prepacked`` the
        C buffer holding B packed once per batch (None: the cell packs or reads B itself)."""
        helpers = _Writer()
        self.header(helpers)
        getattr(self, self.plan.path)(helpers)
        if divided:
            self.divide_rows(helpers)
        if online:
            self.online_rows(helpers)
        prepack = ""
        if prepacked is not None:
            self.prepack(helpers)
            prepack = f"{self.p}_prepack({pointers[1]}, {prepacked});"
        call = (f"{{ const {self.T} alpha = {self.alpha()}; "
                + self.cell_call(*pointers, "0, 1", f"0, {rows}", f"0, {self.N}", f"0, {self.K}",
                                 bpre=prepacked or "0") + "; }")
        return helpers.text(), prepack, call

    def rows_helper(self, w: _Writer, name: str, params: str, row=(), element=(), after=()):
        """``<p>_<name>(T *C, int64_t rows<params>)``: for each output row r of a block, ``row``
        lines, then ``element`` lines for each of its elements ``*e``, then ``after`` lines; with
        ``after`` it returns ``int any`` (which those lines set), else nothing."""
        p, T = self.p, self.T
        w(f"static {'int' if after else 'void'} {p}_{name}({T} *TCPY_RESTRICT C, int64_t rows{params}) {{")
        if after:
            w("int any = 0;", 1)
        w("for (int64_t r = 0; r < rows; r++) {", 1)
        w(f"{T} *TCPY_RESTRICT o = C + {p}_off_c_m(r);", 2)
        for line in row:
            w(line, 2)
        w(f"for (int64_t j = 0; j < {self.N}; j++) {{", 2)
        w(f"{T} *e = o + {p}_off_c_n(j);", 3)
        for line in element:
            w(line, 3)
        w("}", 2)
        for line in after:
            w(line, 2)
        w("}", 1)
        if after:
            w("return any;", 1)
        w("}")

    def online_rows(self, w: _Writer):
        """The row helpers of an online chain's last product (its output rows summed over blocks
        of columns): ``void <p>_clear_rows(T *C, int64_t rows)`` sets a block's rows to 0;
        ``void <p>_scale_rows(T *C, int64_t rows, const T *f)`` multiplies row r by ``f[r]``
        (when it is not 1: the running maximum grew); ``int <p>_finish_rows(T *C, int64_t rows,
        const T *m, const T *z, int32_t *redo)`` divides row r by ``z[r]`` (the running sum) and
        sets ``redo[r]`` when the row cannot stand (``m[r]`` or ``z[r]`` not finite, ``z[r]``
        below 1 in magnitude, a result not finite); it returns whether any row is set."""
        T = self.T
        self.rows_helper(w, "clear_rows", "", element=(f"*e = ({T})0;",))
        self.rows_helper(w, "scale_rows", f", const {T} *TCPY_RESTRICT f",
                         (f"const {T} s = f[r];", "if (s == 1) continue;"), ("*e = *e * s;",))
        self.rows_helper(w, "finish_rows",
                         f", const {T} *TCPY_RESTRICT m, const {T} *TCPY_RESTRICT z, int32_t *TCPY_RESTRICT redo",
                         (f"const {T} d = z[r];", f"int bad = !(isfinite(m[r]) && isfinite(d) && fabs(d) >= ({T})1);"),
                         ("*e = *e / d;", "bad |= !isfinite(*e);"), ("redo[r] = bad;", "any |= bad;"))

    def divide_rows(self, w: _Writer):
        """``int <p>_divide_rows(T *C, int64_t rows, const T *z)``: a block's output rows, row r
        divided by ``z[r]`` (a quotient deferred past the product); returns 1 when a row whose
        ``z`` is not 1 came out inf or NaN (its sum may have overflowed before the division)."""
        T = self.T
        self.rows_helper(w, "divide_rows", f", const {T} *TCPY_RESTRICT z", (f"const {T} d = z[r];", "int bad = 0;"),
                         ("*e = *e / d;", "bad |= !isfinite(*e);"), (f"any |= bad && d != ({T})1;",))

    def render(self) -> tuple[str, str]:
        helpers = _Writer()
        self.header(helpers)
        getattr(self, self.plan.path)(helpers)  # small, stream, direct, batch_lanes or packed
        body = _Writer()
        self.body(body)
        return helpers.text(), body.text()
