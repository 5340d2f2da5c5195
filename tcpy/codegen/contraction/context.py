"""The render context of one contraction: what every part of its C reads (the contraction, its
plan, the tensors' C names, the helpers' prefix, the epilogue), with the pieces all paths share:
the vector types and offset functions (:func:`header`), the cell's signature, the scale."""
from __future__ import annotations

import dataclasses
from typing import Optional

from ...contraction_ir import Contraction, Group, Plan
from ..cwriter import CWriter, c_literal


@dataclasses.dataclass(frozen=True)
class Context:
    """One contraction rendered with one plan. ``names`` maps tensor names to their C pointers
    in the kernel; ``prefix`` makes the helpers' names unique in the file; ``epilogue`` names the
    function that consumes the output's final values (see :func:`tcpy.codegen.contraction.render`)."""
    con: Contraction
    plan: Plan
    names: dict
    prefix: str
    epilogue: Optional[str] = None
    # derived (__post_init__): the C types of the output (and packed operands), A and B, the
    # output's element size, and the linear extents of the roles
    T: str = dataclasses.field(init=False)
    TA: str = dataclasses.field(init=False)
    TB: str = dataclasses.field(init=False)
    element_bytes: int = dataclasses.field(init=False)
    batch: int = dataclasses.field(init=False)
    M: int = dataclasses.field(init=False)
    N: int = dataclasses.field(init=False)
    K: int = dataclasses.field(init=False)

    def __post_init__(self):
        con = self.con
        derived = (con.dtype.c_type, con.a.dtype.c_type, con.b.dtype.c_type, con.dtype.bits // 8, *con.sizes)
        for name, value in zip(("T", "TA", "TB", "element_bytes", "batch", "M", "N", "K"), derived):
            object.__setattr__(self, name, value)  # (frozen)

    def with_plan(self, plan: Plan) -> "Context":
        """The same contraction with another plan (a micro-kernel's narrower tile)."""
        return dataclasses.replace(self, plan=plan)

    # what the micro-kernels and cells take and pass on for the epilogue
    @property
    def epi_params(self) -> str:
        return ", int last, int64_t bi, void *const *tcpy_buffers" if self.epilogue else ""

    @property
    def cell_params(self) -> str:
        return ", void *const *tcpy_buffers" if self.epilogue else ""

    @property
    def cell_args(self) -> str:
        return ", tcpy_buffers" if self.epilogue else ""

    @property
    def nontemporal(self) -> bool:
        """Whole tiles bypass the caches (no epilogue reads them back)."""
        return self.plan.stream_stores and not self.epilogue

    @property
    def npad(self) -> int:
        """N rounded up to whole B slivers: a K block's share of a prepacked B."""
        return -(-self.N // self.plan.nr) * self.plan.nr

    def single(self, role: str):
        """The stride of each tensor when the role is one group (None otherwise)."""
        groups = getattr(self.con, role)
        if not groups:  # the role is absent: one index, offset 0
            return Group((), 1, 0, 0, 0)
        return groups[0] if len(groups) == 1 else None

    def k_offsets(self, which: str) -> list[int]:
        """``<p>_off_<which>_k(k)`` for every k, computed here (as :func:`offset_fn` computes it)."""
        out = []
        for k in range(self.K):
            o, i = 0, k
            for g in reversed(self.con.k[1:]):
                o += g.stride(which) * (i % g.extent)
                i //= g.extent
            out.append(o + (self.con.k[0].stride(which) * i if self.con.k else 0))
        return out

    def alpha(self) -> str:
        """C: the contraction's scale (its literal times its rank-0 tensors)."""
        alpha = c_literal(self.con.alpha, self.con.dtype)
        for s in self.con.alpha_tensors:
            alpha += f" * ({self.T}){self.names[s]}[0]"
        return alpha

    def last(self, K: int) -> str:
        """The epilogue arguments of a call in a ``pc`` loop over all of K."""
        return f", pc + kc >= {K}, bi, tcpy_buffers" if self.epilogue else ""


def offset_fn(ctx: Context, w: CWriter, which: str, role: str):
    """``int64_t <p>_off_<which>_<role>(int64_t i)``: element offset of linear index i."""
    groups = [g for g in getattr(ctx.con, role)]
    w(f"static inline int64_t {ctx.prefix}_off_{which}_{role}(int64_t i) {{")  # g<i>: guard i's value
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


def header(ctx: Context, w: CWriter):
    """The contraction's comment, its vector types and the offset functions of every tensor and
    guard along every role."""
    p, T, s = ctx.prefix, ctx.T, ctx.element_bytes
    vb = ctx.plan.lanes * s
    w(f"/* contraction {ctx.con.stmt.replace('*/', '* /')}")
    w(f" * {ctx.con.describe()}")
    w(f" * {ctx.plan.describe()} */")
    w(f"typedef {T} {p}_v __attribute__((vector_size({vb}), aligned({vb}), __may_alias__));")
    w(f"typedef {T} {p}_vu __attribute__((vector_size({vb}), aligned({s}), __may_alias__));")
    w(f"typedef int{s * 8}_t {p}_m __attribute__((vector_size({vb})));  /* shuffle masks */")
    own = "m" if ctx.con.guarded == "a" else "n"
    guards = tuple((f"g{i}", ("batch", own, "k")) for i in range(len(ctx.con.guards)))
    for which, roles in (("a", ("batch", "m", "k")), ("b", ("batch", "n", "k")), ("c", ("batch", "m", "n")),
                         *guards):
        for role in roles:
            offset_fn(ctx, w, which, role)


def cell_head(ctx: Context, w: CWriter, name: str):
    """``static void <p>_<name>(A, B, C, b0, b1, m0, m1, n0, n1, alpha, stop...) {``: a cell of
    the paths that take no packing buffers from their caller (small, direct, batch lanes)."""
    w(f"static void {ctx.prefix}_{name}(const {ctx.TA} *TCPY_RESTRICT A, const {ctx.TB} *TCPY_RESTRICT B, "
      f"{ctx.T} *TCPY_RESTRICT C, int64_t b0, int64_t b1, int64_t m0, int64_t m1, int64_t n0, int64_t n1, "
      f"{ctx.T} alpha, const volatile int *stop{ctx.cell_params}) {{")


def fence(ctx: Context, w: CWriter):
    """Non-temporal stores are weakly ordered: a full fence before the cell's results are read."""
    if ctx.nontemporal:
        w("__atomic_thread_fence(__ATOMIC_SEQ_CST);", 1)
