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

With ``Plan.pack_b_in_kernel`` (B beyond L2, unguarded, linear along K, unit-stride along N's
inner group: an NCHW 1x1 convolution's images, a GEMM's B) no pass packs B: in the first A
block, the first micro-tile of each whole sliver reads B's rows where they lie, stores them into
the packed sliver for the block's other micro-tiles and prefetches the next sliver's rows, so
B is read from memory once (:func:`.kernel.packing_kernel`).

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

The package is cut along BLIS's seams, each module a set of functions over one render
:class:`~.context.Context`: :mod:`.kernel` (micro-kernel), :mod:`.stores`, :mod:`.packing`,
:mod:`.copies` and :mod:`.guarded` (packm), one module per path (:mod:`.packed`,
:mod:`.stream`, :mod:`.small`, :mod:`.direct`, :mod:`.batch_lanes`, :mod:`.winograd`,
:mod:`.winograd_taps`, :mod:`.direct_conv`),
:mod:`.grid` (the thread grid's driver and the split-K combine), :mod:`.exact` (the point by
point fallback) and :mod:`.rows` (what a fused chain renders of its products).
"""
from __future__ import annotations

from typing import Optional

from ...contraction_ir import Contraction, Path, Plan
from ..cwriter import CWriter
from . import direct_conv, runtime, winograd, winograd_taps
from .context import Context, header
from .grid import driver, path_helpers
from .rows import render_block as _render_block


def render(con: Contraction, plan: Plan, names: dict, prefix: str, epilogue: Optional[str] = None) -> tuple[str, str]:
    """``(helpers, body)``: file-scope C and the statement's C inside the kernel function.

    ``names`` maps tensor names to their C pointers in the kernel; ``prefix`` makes the
    helpers' names unique in the file. The body reads ``tcpy_num_threads``. ``epilogue`` names
    a function ``void f(void *const *tcpy_buffers, int64_t bi, int64_t m, int64_t j,
    int64_t cols, const T *v)`` that consumes the final values ``v[0:cols]`` of the output at
    batch ``bi``, row ``m``, columns ``j..`` (linear indices of the roles); it is called once per
    output element, after the element's last store. The winograd path is :mod:`.winograd`'s, the
    winograd_taps path :mod:`.winograd_taps`'s, the direct_conv path :mod:`.direct_conv`'s.
    """
    ctx = Context(con, plan, names, prefix, epilogue)
    if plan.path == Path.WINOGRAD:
        return winograd.render(ctx)
    if plan.path == Path.DIRECT_CONV:
        return direct_conv.render(ctx)
    if plan.path == Path.WINOGRAD_TAPS:
        return winograd_taps.render(ctx)
    helpers = CWriter()
    header(ctx, helpers)
    path_helpers(ctx, helpers)
    body = CWriter()
    driver(ctx, body)
    return helpers.text(), body.text()


def render_runtime(con: Contraction, plan: Plan, names: dict, prefix: str, plan_slot: int) -> tuple[str, str]:
    """``(helpers, body)`` of a contraction in a size-generic kernel (:mod:`.runtime`): ``con``
    and ``plan`` as recognised and planned at the kernel's nominal sizes give what holds at
    every size (operands, types, scale, guards, micro-tile); the rest comes at run time from
    the plan buffer ``tcpy_buffers[plan_slot]``."""
    return runtime.render(Context(con, plan, names, prefix), plan_slot)


def render_block(con: Contraction, plan: Plan, names: dict, prefix: str, pointers: tuple[str, str, str], rows: str,
                 prepacked, divided: bool = False, online: bool = False,
                 cleared: bool = False) -> tuple[str, str, str]:
    """``(helpers, prepack, call)`` of a contraction on one block of rows inside a fused chain
    (see :func:`.rows.render_block`); ``divided`` adds ``<prefix>_divide_rows``, ``online`` the
    row helpers of an online chain's last product, ``cleared`` ``<prefix>_clear_rows``."""
    return _render_block(Context(con, plan, names, prefix), pointers, rows, prepacked, divided, online, cleared)


def render_runtime_block(con: Contraction, plan: Plan, names: dict, prefix: str, online: bool = False) -> str:
    """The helpers of a size-generic kernel's chain product on one block of rows
    (:func:`.runtime.render_block`): its cell runs with a plan buffer made per call shape;
    ``online`` adds the row helpers of an online chain's last product."""
    return runtime.render_block(Context(con, plan, names, prefix), online)
