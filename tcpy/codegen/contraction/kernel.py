"""The micro-kernel: ``MR x NR/lanes`` accumulators in vector registers (GCC vector extensions),
``kc`` rank-1 updates from an A sliver (broadcast elements) and a B sliver (vectors), then one
store (:mod:`.stores`)."""
from __future__ import annotations

import dataclasses

from ..cwriter import CWriter
from .context import Context
from .stores import prefetch_c, store_c, store_partial


def accumulate_loop(ctx: Context, w: CWriter, kc: str, b_load, a_load, depth: int, after_b=()):
    """Zeroed accumulators ``c<r>_<v>``, then ``kc`` rank-1 updates: vector v of B's row k is
    ``b_load(v)``, element r of A's column k is ``a_load(r)``; ``after_b``: C statements run
    after B's row is loaded (into ``b<v>``)."""
    mr, nv = ctx.plan.mr, ctx.plan.nr_vectors
    p = ctx.prefix
    for r in range(mr):
        w(f"{p}_v " + ", ".join(f"c{r}_{v} = {{0}}" for v in range(nv)) + ";", depth)
    w(f"#pragma GCC unroll {ctx.plan.unroll}", depth)
    w(f"for (int64_t k = 0; k < {kc}; k++) {{", depth)
    for v in range(nv):
        w(f"const {p}_v b{v} = {b_load(v)};", depth + 1)
    for line in after_b:
        w(line, depth + 1)
    for r in range(mr):
        w(f"{{ const {ctx.T} x = {a_load(r)}; "
          + " ".join(f"c{r}_{v} += x * b{v};" for v in range(nv)) + " }", depth + 1)
    w("}", depth)


def micro_kernels(ctx: Context, w: CWriter):
    """The packed path's micro-kernels on packed slivers: into the output, and (split K) into a
    partial-sum tile."""
    p, T, mr, nr = ctx.prefix, ctx.T, ctx.plan.mr, ctx.plan.nr
    b_load = lambda v: f"*(const {p}_v *)(b + k * {nr} + {v * ctx.plan.lanes})"  # noqa: E731
    a_load = lambda r: f"a[k * {mr} + {r}]"  # noqa: E731
    full = ctx.plan
    # ukr1: the last tile of N when it needs one vector: half the FMAs of a full tile (its
    # B sliver keeps the full width's layout); ukr_r: the last tile of M, its M % MR rows
    # only (the A sliver keeps MR rows per k): 64 rows in tiles of 6 would compute 66
    kernels = [("ukr", full)]
    if full.nr_vectors > 1:
        kernels.append(("ukr1", dataclasses.replace(full, nr=full.lanes)))
    if ctx.M % mr:
        kernels.append(("ukr_r", dataclasses.replace(full, mr=ctx.M % mr)))
    for name, plan in kernels:
        tile = ctx.with_plan(plan)
        w(f"static __attribute__((noinline)) void {p}_{name}(int64_t kc, const {T} *TCPY_RESTRICT a, "
          f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT cb, int64_t i, int64_t j, int64_t mr, int64_t nr, "
          f"int overwrite, {T} alpha{ctx.epi_params}) {{")
        prefetch_c(tile, w, 1)
        accumulate_loop(tile, w, "kc", b_load, a_load, 1)
        store_c(tile, w, "overwrite", 1)
        w("}")
    if ctx.plan.grid[3] > 1:
        w(f"static __attribute__((noinline)) void {p}_ukr_p(int64_t kc, const {T} *TCPY_RESTRICT a, "
          f"const {T} *TCPY_RESTRICT b, {T} *TCPY_RESTRICT pp, int64_t ldp, int64_t mr, int64_t nr, "
          f"int first) {{")
        accumulate_loop(ctx, w, "kc", b_load, a_load, 1)
        store_partial(ctx, w, 1)
        w("}")


def packing_kernel(ctx: Context, w: CWriter):
    """``<p>_ukr_pk``: the micro-kernel on a whole B sliver read in place (rows ``src + k * ldb``,
    the inner N group unit-stride) that also stores each row into its packed sliver ``bp`` for
    the block's other micro-tiles, and prefetches the rows at ``pf`` (the next sliver): B is read
    from memory once, by the FMAs' own loads, instead of by a packing pass before them."""
    p, T, mr, nr, L = ctx.prefix, ctx.T, ctx.plan.mr, ctx.plan.nr, ctx.plan.lanes
    ldb = ctx.con.linear_stride("k", "b")
    size, line = ctx.element_bytes, ctx.plan.cache_line
    span = (nr - 1) * size  # first to last byte of a sliver's row
    after_b = [" ".join(f"*({p}_v *)(bp + k * {nr} + {v * L}) = b{v};" for v in range(ctx.plan.nr_vectors)),
               " ".join(f"__builtin_prefetch((const char *)(pf + k * INT64_C({ldb})) + {at}, 0, 3);"
                        for at in [*range(0, span, line), span])]
    w(f"static __attribute__((noinline)) void {p}_ukr_pk(int64_t kc, const {T} *TCPY_RESTRICT a, "
      f"const {T} *TCPY_RESTRICT src, const {T} *pf, {T} *TCPY_RESTRICT bp, {T} *TCPY_RESTRICT cb, int64_t i, "
      f"int64_t j, int64_t mr, int64_t nr, int overwrite, {T} alpha{ctx.epi_params}) {{")
    prefetch_c(ctx, w, 1)
    accumulate_loop(ctx, w, "kc", lambda v: f"*(const {p}_vu *)(src + k * INT64_C({ldb}) + {v * L})",
                    lambda r: f"a[k * {mr} + {r}]", 1, after_b)
    store_c(ctx, w, "overwrite", 1)
    w("}")
