"""Render the C source of a kernel from its loop IR (:mod:`tcpy.loopir`).

One C function per (def, dtypes, shapes, options), following the kernel ABI of
:mod:`tcpy.runtime.launch`::

    int <symbol>(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop);

Rendering is mechanical: every decision (loop order, tiles, parallel and SIMD loops, register
tiles, copies) is in the IR. Sizes are baked in as constants, except in a size-generic kernel
(:mod:`tcpy.generic`), which reads them from its last buffer, the size block, and whose
extents and strides are expressions of them. Expressions are emitted in the
types sema gave them (index values, int32 by type, are computed in int64 and then converted),
with TC's semantics: C-like promotion, integer ``/`` and ``%`` truncating in values and flooring
in index expressions, division by zero and out-of-bounds data-dependent indices reported through
the return code, lazy ternaries (a branch not taken reads no memory), saturating casts. The C is the same for every target; what differs between targets (``-march``
and tuning flags) comes from the :class:`~tcpy.target.Target` at build time.

This module is Python source that ``setup.py`` compiles with Cython (pure-Python mode): the
installed package runs the compiled module (``COMPILED``), while linters, type checkers and
coverage read this file, and ``TCPY_PURE_PYTHON=1`` runs it uncompiled (see
:mod:`tcpy.codegen`).
"""
import contextlib
import dataclasses

import cython

from tcpy.lang import ast
from tcpy.lang.types import accumulator_type
from tcpy.loopir import (
    TILE_COL, TILE_COL0, TILE_ROW, TILE_ROW0, Accumulate, BinOp, Block, BlockChain, Call, Const, ContractionNest, Guard,
    Loop, Mode, NestKind, OnlineStep, Point, RegisterTile, TileUpdate, Var, substitute,
)
from tcpy.codegen import contraction as contraction_c
from tcpy.codegen.chains import block_chain, online_step
from tcpy.codegen.cwriter import CLAIMS_PER_THREAD, CWriter, ScratchSlot, dynamic_schedule
from tcpy.codegen.units import units
from tcpy.codegen.expressions import (
    access, c_name, combine, convert, identity, index_c, nan_flagged, size_divisor, typed, value,
)
from tcpy.generic import engine_statements, size_c_name
from tcpy.schedule import PARALLEL_MIN_WORK
from tcpy.transform.phases import phase_piece
from tcpy.runtime.build import GENERIC_MARK

#: True when this module runs compiled by Cython.
COMPILED: bool = cython.compiled

_PRELUDE = """\
/* Bounds check of a data-dependent index: record error `code` (first one wins) and read
 * element 0 instead, so a bad index never touches memory outside the tensor (a tensor with no
 * elements is never read: see _Emitter.access). */
static inline int64_t tcpy_checked_index(int64_t i, int64_t n, int *err, int code, int64_t *info) {
    if (TCPY_LIKELY(i >= 0 && i < n)) return i;
    int expected = 0;
    if (__atomic_compare_exchange_n(err, &expected, code, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        info[0] = i;
        info[1] = n;
    }
    return 0;
}
"""


# Whether dividing by v is multiplying by 1 / v exactly: v is +-2^k, its reciprocal a normal
# float (so is v): both are the correctly rounded x * 2^-k, whatever x.
_EXACT_RECIPROCAL = """\
static inline int tcpy_exact_reciprocal(double v) {
    int e;
    const double m = frexp(v, &e);
    return (m == 0.5 || m == -0.5) && e >= -124 && e <= 126;
}
"""

REDUCTION_STRIPS = 4  # accumulators of a long SIMD reduction loop (see _Emitter.strip_reduction)
_PART = "split.part"  # the part index of a split reduction's partial results (a generated name)


class _Emitter:
    """Emits one kernel; collects the error messages its return codes refer to."""

    def __init__(self, ir, symbol):
        self.ir = ir
        self.program = ir.program
        self.stmts = ir.stmts
        self.generic = ir.program.generic
        # a generic kernel's shapes are expressions of the sizes it reads at run time
        shapes = self.generic.shapes if self.generic is not None else ir.program.shapes
        self.shapes = {**shapes, **{s.name: s.shape for s in ir.scratch}}
        self.types = {**ir.program.types, **{s.name: s.type for s in ir.scratch}}
        self.partials = {s.stmt: s for s in ir.scratch}
        self.symbol = symbol
        self.errors = []
        self.out = CWriter()
        self.stmt_index = 0
        self.env = {}
        self.uses_divzero = None
        self.tile = None
        self.in_index = 0  # > 0 while emitting the value of a computed index expression
        self.helpers = []  # file-scope C the contraction engine adds before the kernel
        self.in_simd = 0  # > 0 inside an `omp simd` loop
        self.loops = 0  # loops around the node being emitted
        self.collapsed = 0  # loops still to come that a collapse clause needs perfectly nested
        self.registers = {}  # tensor -> the C local holding the element an epilogue is at
        self.strip = ""  # suffix of the accumulator a reduction point adds to (its strip's: see strip_reduction)
        self.nest_work = None  # a generic kernel's: the iterations of the nest being emitted (an expression)
        self.reciprocals = False  # divisions by sizes multiply by the reciprocal (see nest_body)

    # -- error table -------------------------------------------------------------------------

    def error_code(self, message):
        self.errors.append(message)
        return len(self.errors)

    def stmt_label(self, stmt):
        line = f" (line {stmt.span.line})" if stmt.span.line else ""
        number = self.ir.origins[self.stmt_index] + 1
        return f"statement {number}{line} of def '{self.program.def_.name}': {stmt}"

    # -- expressions -------------------------------------------------------------------------

    # -- statements --------------------------------------------------------------------------

    def emit(self, line, depth):
        """Write a line (or lines) of C at ``depth``."""
        self.out(line, depth)

    def point(self, node, depth):
        self.stmt_index = node.stmt  # (a fused nest holds several statements)
        stmt = self.stmts[node.stmt]
        self.current_stmt = stmt  # (errors name the statement, not a piece)
        if node.residues:
            stmt = phase_piece(stmt, node.residues)
        self.env = self.point_env(node.point)
        target_type = self.types[stmt.target]
        target = access(self, stmt.target, stmt.lhs)
        if node.mode is Mode.INIT:
            self.emit(f"{target} = {identity(stmt.reduction, target_type)};", depth)
            return
        if node.mode is Mode.COMBINE:
            self.combine_partials(stmt, target, target_type, depth)
            return
        rhs_type = stmt.rhs.type
        if node.mode is Mode.REGISTER:
            acc_type = accumulator_type(target_type)
            rhs = convert(value(self, stmt.rhs), rhs_type, acc_type)
            acc, nan = f"tcpy_acc{self.strip}", f"tcpy_nan{self.strip}"
            if nan_flagged(stmt.reduction, acc_type):
                # NaN tracked apart from the comparison so both vectorize (see accumulate)
                cmp = ">" if stmt.reduction == "max" else "<"
                self.emit(f"{{ {acc_type.c_type} tcpy_x = {rhs}; {nan} |= tcpy_x != tcpy_x; "
                          f"{acc} = tcpy_x {cmp} {acc} ? tcpy_x : {acc}; }}", depth)
                return
            self.emit(f"{acc} = {combine(stmt.reduction, acc, rhs, acc_type)};", depth)
            return
        rhs = convert(value(self, stmt.rhs), rhs_type, target_type)
        if node.mode is Mode.ASSIGN:
            self.emit(f"{target} = {rhs};", depth)
        else:
            self.emit(f"{target} = {combine(stmt.reduction, target, rhs, target_type)};", depth)

    def _partial(self, stmt, part):
        """C lvalue of the partial result ``part`` (C text) of the statement being emitted."""
        scratch = self.partials[self.stmt_index]
        self.env[_PART] = part
        return access(self, scratch.name, (ast.IndexVar(_PART),) + stmt.lhs)

    def combine_partials(self, stmt, target, target_type, depth):
        """target (op)= the partial results of a split reduction, combined in part order."""
        acc_type = accumulator_type(target_type)
        parts = self.partials[self.stmt_index].shape[0]
        self.emit("{", depth)
        self.emit(f"{acc_type.c_type} tcpy_acc = {identity(stmt.reduction, acc_type)};", depth + 1)
        self.emit(f"for (int64_t tcpy_part = 0; tcpy_part < {parts}; tcpy_part++)", depth + 1)
        partial = self._partial(stmt, "tcpy_part")
        self.emit(f"    tcpy_acc = {combine(stmt.reduction, 'tcpy_acc', partial, acc_type)};", depth + 1)
        self._store_accumulator(stmt, target, acc_type, target_type, depth + 1)
        self.emit("}", depth)

    def _store_accumulator(self, stmt, target, acc_type, target_type, depth):
        """``T = acc`` for a ``!`` reduction, ``T = T op acc`` otherwise."""
        stored = convert("tcpy_acc", acc_type, target_type)
        if not stmt.init:
            stored = combine(stmt.reduction, target, stored, target_type)
        self.emit(f"{target} = {stored};", depth)

    def accumulate(self, node, depth):
        self.stmt_index = node.stmt
        stmt = self.stmts[node.stmt]
        target_type = self.types[stmt.target]
        acc_type = accumulator_type(target_type)
        self.emit("{", depth)
        self.emit(f"{acc_type.c_type} tcpy_acc = {identity(stmt.reduction, acc_type)};", depth + 1)
        flagged = nan_flagged(stmt.reduction, acc_type)
        if flagged:
            self.emit("int tcpy_nan = 0;  // int: gcc vectorizes no bool or-reduction", depth + 1)
        self.nodes(node.body, depth + 1)
        if flagged:  # max/min propagate NaN (like numpy.max)
            self.emit(f"if (tcpy_nan) tcpy_acc = ({acc_type.c_type})NAN;", depth + 1)
        self.current_stmt = stmt
        self.env = self.point_env(node.point)
        if node.part is not None:  # a split reduction: this part's result, combined later
            self.emit(f"{self._partial(stmt, index_c(node.part))} = tcpy_acc;", depth + 1)
            self.emit("}", depth)
            return
        self._store_accumulator(stmt, access(self, stmt.target, stmt.lhs), acc_type, target_type, depth + 1)
        self.emit("}", depth)

    def register_tile(self, node, depth):
        stmt = self.stmts[node.stmt]
        self.current_stmt = stmt
        t = self.types[stmt.target]
        self.emit("{", depth)
        self.emit(f"const int64_t {TILE_ROW0} = {index_c(node.row_start, top=True)}, "
                  f"{TILE_COL0} = {index_c(node.col_start, top=True)};", depth + 1)
        self.emit(f"if ({index_c(node.full, top=True)}) {{", depth + 1)
        self.emit(f"{t.c_type} tcpy_tile[{node.rows}][{node.cols}];", depth + 2)
        cell = f"tcpy_tile[{TILE_ROW}][{TILE_COL}]"
        self._tile_copy(node, stmt, f"{cell} = {{target}};", depth + 2)
        self.nodes(node.fast, depth + 2)
        self._tile_copy(node, stmt, f"{{target}} = {cell};", depth + 2)
        self.emit("} else {", depth + 1)
        self.nodes(node.slow, depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)
        self.tile = None

    def _tile_loops(self, node, depth):
        """Open the two loops over a register tile; the caller emits the body and closes them."""
        self.tile = node
        self.emit(f"#pragma GCC unroll {node.rows}", depth)
        self.emit(f"for (int64_t {TILE_ROW} = 0; {TILE_ROW} < {node.rows}; {TILE_ROW}++) {{", depth)
        self.emit("#pragma omp simd", depth + 1)
        self.emit(f"for (int64_t {TILE_COL} = 0; {TILE_COL} < {node.cols}; {TILE_COL}++) {{", depth + 1)

    def point_env(self, point):
        """Index variable -> C text at a point."""
        return {v: index_c(e) for v, e in point}

    def _tile_env(self, node, point):
        env = self.point_env(point)
        env[node.row_var] = f"{TILE_ROW0} + {TILE_ROW}"
        env[node.col_var] = f"{TILE_COL0} + {TILE_COL}"
        return env

    def _tile_copy(self, node, stmt, template, depth):
        self.env = self._tile_env(node, node.point)
        target = access(self, stmt.target, stmt.lhs)
        self._tile_loops(node, depth)
        self.emit(template.format(target=target), depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def tile_update(self, node, depth):
        stmt = self.stmts[node.stmt]
        self.current_stmt = stmt
        t = self.types[stmt.target]
        self.env = self._tile_env(self.tile, node.point)
        self.env.update(self.point_env(node.lets))
        rhs = convert(value(self, node.rhs), stmt.rhs.type, t)
        self._tile_loops(self.tile, depth)
        cell = f"tcpy_tile[{TILE_ROW}][{TILE_COL}]"
        self.emit(f"{cell} = {combine(stmt.reduction, cell, rhs, t)};", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def loop(self, node, depth):
        if node.parallel and self.generic is not None and _plain(node.body):
            # A generic kernel decides at run time whether a nest has the work to run in
            # parallel. OpenMP's if clause would still enter (and leave) a parallel region when
            # it does not, about half a microsecond: a call that small runs the loop as a kernel
            # specialised to its sizes does, serially. (Nests holding engine or chain code keep
            # the clause: their helpers are rendered once.)
            self.emit(f"if ({index_c(self.nest_work, top=True)} >= {PARALLEL_MIN_WORK}) {{", depth)
            self.emit_loop(node, depth + 1, run_time_if=False)
            self.emit("} else {", depth)
            self.emit_loop(dataclasses.replace(node, parallel=0), depth + 1)
            self.emit("}", depth)
            return
        self.emit_loop(node, depth)

    def emit_loop(self, node, depth, run_time_if=True):
        """The loop ``node``; ``run_time_if``: a generic kernel's parallel loop has OpenMP's if
        clause (its caller has not decided)."""
        simd = node.simd and (node.simd_reduction or not node.unroll)
        if simd and node.simd_reduction and not node.parallel:
            strips = self._strips(node)
            if strips:
                self.strip_reduction(node, depth, *strips)
                return
        reduction = ""
        if node.simd_reduction:
            reduction = f" reduction({node.simd_reduction}:tcpy_acc)"
            stmt = self.stmts[self.stmt_index]
            if nan_flagged(node.simd_reduction, accumulator_type(self.types[stmt.target])):
                reduction += " reduction(|:tcpy_nan)"
        scoped = False  # the loop is in a scope of its own (a generic kernel's team and chunks)
        if node.parallel:
            collapse = f" collapse({node.parallel})" if node.parallel > 1 else ""
            both = " simd" if simd else ""  # a single loop is both the parallel and the SIMD one
            threads = f"tcpy_num_threads < {node.chunks} ? tcpy_num_threads : {node.chunks}"
            # iterations claimed dynamically; a reduction clause keeps the static split, whose
            # per-thread partials cover the same iterations in every run
            schedule = ("schedule(static)" if simd and reduction
                        else dynamic_schedule(node.chunks, self.ir.options.threads))
            if self.generic is not None:
                threads, schedule, scoped = self.generic_team(node, simd and reduction, depth, run_time_if)
            self.emit(f"#pragma omp parallel for{both} num_threads({threads}) {schedule}"
                      f"{collapse}{reduction if simd else ''}", depth)
        elif simd:
            self.emit(f"#pragma omp simd{reduction}", depth)
        elif node.unroll:  # (gcc takes no loop pragma after an OpenMP one)
            # gcc takes no unroll pragma after `omp simd`; ivdep asserts the same independence
            if node.simd:
                self.emit("#pragma GCC ivdep", depth)
            self.emit(f"#pragma GCC unroll {node.unroll}", depth)
        step = f"{node.var} += {node.step}" if node.step != 1 else f"{node.var}++"
        self.emit(f"for (int64_t {node.var} = {index_c(node.lo, top=True)}; {index_c(node.cond, top=True)}; "
                  f"{step}) {{", depth)
        # Ctrl-C is polled in the outermost loop of a nest and in loops with two or more levels
        # of loops inside (never right around a short innermost loop, where it would cost),
        # outside SIMD loops, and not between the loops a collapse clause needs perfectly nested.
        outer_collapsed, self.collapsed = self.collapsed, max(self.collapsed - 1, node.parallel - 1, 0)
        inner = _loop_depth(node.body)
        if not self.collapsed and not simd and not self.in_simd and (inner >= 2 or inner and not self.loops):
            self.emit("TCPY_POLL(tcpy_stop);", depth + 1)
        self.in_simd += bool(simd)
        self.loops += 1
        self.nodes(node.body, depth + 1)
        self.loops -= 1
        self.in_simd -= bool(simd)
        self.collapsed = outer_collapsed
        self.emit("}", depth)
        if scoped:
            self.emit("}", depth)

    def generic_team(self, node, static, depth, run_time_if=True):
        """A generic kernel's parallel loop ``node``: ``(threads, schedule clause, scoped)``
        as a kernel specialised to the call's sizes has them (no more threads than iterations,
        CLAIMS_PER_THREAD chunks a thread claimed dynamically), computed at run time before the
        loop, in a scope opened here when ``scoped``. It runs in parallel when the call has the
        work (as the schedule decides at fixed sizes): by an if clause when ``run_time_if``."""
        condition = f" if(parallel: {index_c(self.nest_work, top=True)} >= {PARALLEL_MIN_WORK})" if run_time_if else ""
        iterations = _iterations(node)
        if iterations is None:  # (bounds that depend on other loops: guided claims fit any count)
            return "tcpy_num_threads", ("schedule(static)" if static else "schedule(guided)") + condition, False
        self.emit("{", depth)
        self.emit(f"const int64_t tcpy_iterations = {index_c(iterations, top=True)};", depth)
        self.emit("const int tcpy_team = tcpy_iterations < tcpy_num_threads ? "
                  "(tcpy_iterations > 1 ? (int)tcpy_iterations : 1) : tcpy_num_threads;", depth)
        if static:
            return "tcpy_team", "schedule(static)" + condition, True
        self.emit(f"const int64_t tcpy_chunk = tcpy_iterations / ({CLAIMS_PER_THREAD} * tcpy_team) > 0 ? "
                  f"tcpy_iterations / ({CLAIMS_PER_THREAD} * tcpy_team) : 1;", depth)
        return "tcpy_team", "schedule(dynamic, tcpy_chunk)" + condition, True

    def block(self, node, depth):
        """A block of per-iteration buffers (and views): on the stack, or, in a generic kernel,
        those sized at run time carved from per-thread scratch (ScratchSlot.CHAIN_BLOCKS)."""
        self.emit("{", depth + 0)
        runtime = []
        for name, shape, type_, zeroed in node.buffers:
            if self.generic is not None and not all(isinstance(d, Const) for d in self.shapes[name]):
                runtime.append((name, type_, zeroed))
                continue
            size = 1
            for d in shape:
                size *= d
            init = " = {0}" if zeroed else ""
            self.emit(f"{type_.c_type} {c_name(name)}[{max(size, 1)}]{init};  /* per iteration */", depth + 1)
        if runtime:
            line = self.ir.options.target.cache_line
            offset = "0"
            for k, (name, type_, zeroed) in enumerate(runtime):
                elements = " * ".join(index_c(d) for d in self.shapes[name])
                self.emit(f"const int64_t tcpy_elements{k} = {elements};", depth + 1)
                offset = f"{offset} + (tcpy_elements{k} * {type_.bits // 8} + {line - 1}) / {line} * {line}"
            self.emit(f"char *tcpy_rows = (char *)tcpy_scratch({int(ScratchSlot.CHAIN_BLOCKS)}, 1 + {offset});  "
                      "/* per thread, sized per call */", depth + 1)
            offset = "0"
            for k, (name, type_, zeroed) in enumerate(runtime):
                ctype = type_.c_type
                self.emit(f"{ctype} *TCPY_RESTRICT {c_name(name)} = ({ctype} *)(tcpy_rows + {offset});", depth + 1)
                if zeroed:
                    self.emit(f"for (int64_t tcpy_k = 0; tcpy_k < tcpy_elements{k}; tcpy_k++) "
                              f"{c_name(name)}[tcpy_k] = 0;", depth + 1)
                offset = f"{offset} + (tcpy_elements{k} * {type_.bits // 8} + {line - 1}) / {line} * {line}"
        for name, buffer, offset in node.views:
            ctype = self.types[name].c_type
            self.emit(f"{ctype} *TCPY_RESTRICT {c_name(name)} = {c_name(buffer)} + {index_c(offset)};  "
                      "/* a row of the block */", depth + 1)
        self.nodes(node.body, depth + 1)
        self.emit("}", depth)

    def _strips(self, node):
        """``(lo, strip, hi)`` when the SIMD reduction loop ``node`` runs as REDUCTION_STRIPS
        strips: constant bounds, points only in its body, at least two vectors per strip. A
        strip is whole vectors (no scalar tail per strip); what is left runs after them. In a
        size-generic kernel, bounds that depend on the sizes give C texts, and ``strip`` the name
        of a local computed at run time (0 when the strips would be shorter)."""
        if node.step != 1 or not all(isinstance(n, Point) for n in node.body):
            return None
        cond = node.cond
        if not (isinstance(cond, BinOp) and cond.op in ("<", "<=") and cond.lhs == Var(node.var)):
            return None
        acc_type = accumulator_type(self.types[self.stmts[self.stmt_index].target])
        lanes = self.ir.options.target.lanes(acc_type.bits // 8)
        if not (isinstance(node.lo, Const) and isinstance(cond.rhs, Const)):
            if self.generic is None or node.var in index_c(cond.rhs):
                return None
            return (index_c(node.lo), f"{node.var}_strip_length",
                    f"{index_c(cond.rhs)}{' + 1' if cond.op == '<=' else ''}", lanes)
        lo, hi = node.lo.value, cond.rhs.value + (cond.op == "<=")
        strip = (hi - lo) // REDUCTION_STRIPS // lanes * lanes
        if strip < 2 * lanes:
            return None
        return lo, strip, hi

    def strip_reduction(self, node, depth, lo, strip, hi, lanes=None):
        """A long SIMD reduction as REDUCTION_STRIPS contiguous strips, each with its own
        accumulator, one loop over all of them: one accumulator's chain of dependent vector adds
        (or compares) bounds a single loop at one vector per add latency. The strips combine in a
        fixed order after the loop (a reduction's order already differs from the sequential one:
        ``omp simd`` reassociates). ``tcpy_acc`` (and ``tcpy_nan``) carry in and out. With
        ``lanes``, ``lo``, ``strip`` and ``hi`` are C texts (see :meth:`_strips`)."""
        if lanes is not None:  # (the strip's length, at run time)
            lo_c, hi_c = f"{node.var}_lo", f"{node.var}_hi"
            self.emit("{", depth)
            self.emit(f"const int64_t {lo_c} = {lo}, {hi_c} = {hi};", depth + 1)
            self.emit(f"int64_t {strip} = ({hi_c} - {lo_c}) / {REDUCTION_STRIPS} / {lanes} * {lanes};", depth + 1)
            self.emit(f"if ({strip} < {2 * lanes}) {strip} = 0;", depth + 1)
            self._strips_c(node, depth + 1, lo_c, f"{lo_c} + {strip}", f"{lo_c} + {REDUCTION_STRIPS} * {strip}", hi_c,
                           [f"{k} * {strip}" for k in range(REDUCTION_STRIPS)], True)
            self.emit("}", depth)
            return
        self._strips_c(node, depth, lo, lo + strip, lo + REDUCTION_STRIPS * strip, hi,
                       [k * strip for k in range(REDUCTION_STRIPS)], lo + REDUCTION_STRIPS * strip < hi)

    def _strips_c(self, node, depth, lo, strips_end, rest, hi, offsets, tail):
        """:meth:`strip_reduction`'s C: strips from ``lo`` to ``strips_end``, the k-th at
        ``offsets[k]`` from there; then (when ``tail``) the rest from ``rest`` to ``hi``."""
        stmt = self.stmts[self.stmt_index]
        acc_type = accumulator_type(self.types[stmt.target])
        op = node.simd_reduction
        flagged = nan_flagged(op, acc_type)
        accs = ["tcpy_acc"] + [f"tcpy_acc{k}" for k in range(1, REDUCTION_STRIPS)]
        nans = ["tcpy_nan"] + [f"tcpy_nan{k}" for k in range(1, REDUCTION_STRIPS)]
        clause = f" reduction({op}:{', '.join(accs)})" + (f" reduction(|:{', '.join(nans)})" if flagged else "")
        start = f"{node.var}_strip"
        self.emit("{", depth)
        self.emit(f"{acc_type.c_type} {', '.join(f'{a} = {identity(op, acc_type)}' for a in accs[1:])};", depth + 1)
        if flagged:
            self.emit(f"int {', '.join(f'{n} = 0' for n in nans[1:])};", depth + 1)
        runtime = isinstance(hi, str)  # (bounds known at run time only: see _guarded)
        with self._guarded(runtime, lo, strips_end, depth + 1) as d:
            self.emit(f"#pragma omp simd{clause}", d)
            self.emit(f"for (int64_t {start} = {lo}; {start} < {strips_end}; {start}++) {{", d)
            self.in_simd += 1
            for k in range(REDUCTION_STRIPS):
                self.emit(f"{{ const int64_t {node.var} = {start} + {offsets[k]};", d + 1)
                self.strip = str(k) if k else ""  # this strip's accumulator
                self.nodes(node.body, d + 2)
                self.strip = ""
                self.emit("}", d + 1)
            self.emit("}", d)
        if tail:
            with self._guarded(runtime, rest, hi, depth + 1) as d:
                self.emit(f"#pragma omp simd reduction({op}:tcpy_acc)" + (" reduction(|:tcpy_nan)" if flagged else ""),
                          d)
                self.emit(f"for (int64_t {node.var} = {rest}; {node.var} < {hi}; {node.var}++) {{", d)
                self.nodes(node.body, d + 1)
                self.emit("}", d)
        self.in_simd -= 1
        while len(accs) > 1:  # pairwise: ((acc + acc1) + (acc2 + acc3))
            accs = [combine(op, a, b, acc_type) for a, b in zip(accs[::2], accs[1::2])] + accs[len(accs) // 2 * 2:]
        self.emit(f"tcpy_acc = {accs[0]};", depth + 1)
        if flagged:
            self.emit(f"tcpy_nan |= {' | '.join(nans[1:])};", depth + 1)
        self.emit("}", depth)

    @contextlib.contextmanager
    def _guarded(self, guard: bool, first, end, depth: int):
        """With ``guard``, what the block emits (at the depth it is given) runs only when
        ``first < end`` (C): an ``omp simd`` reduction loop that runs no iteration still
        combines its vector accumulator's lanes one by one (a row's dozens of dependent adds,
        in a size-generic kernel whose strips or rest are empty at a call's sizes)."""
        if not guard:
            yield depth
            return
        self.emit(f"if ({first} < {end}) {{", depth)
        yield depth + 1
        self.emit("}", depth)

    def nodes(self, nodes, depth):
        for node in nodes:
            if isinstance(node, Loop):
                self.loop(node, depth)
            elif isinstance(node, Point):
                self.point(node, depth)
            elif isinstance(node, Accumulate):
                self.accumulate(node, depth)
            elif isinstance(node, RegisterTile):
                self.register_tile(node, depth)
            elif isinstance(node, TileUpdate):
                self.tile_update(node, depth)
            elif isinstance(node, Block):
                self.block(node, depth)
            elif isinstance(node, ContractionNest):
                names = {name: c_name(name) for name in self.buffer_names()}  # (snapshots are copies)
                prefix = f"{self.symbol}_s{node.stmt}"
                epilogue = None
                if node.epilogue is not None:
                    epilogue = f"{prefix}_epilogue"
                    self.helpers.append(self.epilogue(node, epilogue))
                if self.generic is not None:  # extents, blocks and grid from its plan buffer
                    slot = len(names) + 1 + engine_statements(self.program).index(node.stmt)
                    helpers, body = contraction_c.render_runtime(node.contraction, node.plan, names, prefix, slot)
                else:
                    helpers, body = contraction_c.render(node.contraction, node.plan, names, prefix, epilogue)
                self.helpers.append(helpers)
                for line in body.splitlines():
                    self.emit(line, depth)
            elif isinstance(node, BlockChain):
                block_chain(self, node, depth)
            elif isinstance(node, OnlineStep):
                online_step(self, node, depth)
            elif isinstance(node, Guard):
                self.emit(f"if ({index_c(node.cond, top=True)}) {{", depth)
                self.nodes(node.then, depth + 1)
                if node.other:
                    self.emit("} else {", depth)
                    self.nodes(node.other, depth + 1)
                self.emit("}", depth)
            else:
                raise NotImplementedError(type(node).__name__)

    def epilogue(self, node, name):
        """The C function that runs a contraction's epilogue statements on final output values
        (see :func:`tcpy.codegen.contraction.render`): one ``omp simd`` loop over the columns,
        the contraction's and each statement's value kept in a local the later ones read."""
        con, stmt_index = node.contraction, self.stmt_index
        ranges = self.program.statements[node.stmt].ranges
        T = con.dtype.c_type
        w = CWriter()
        w(f"static inline void {name}(void *const *tcpy_buffers, int64_t bi, int64_t m, int64_t j, "
          f"int64_t cols, const {T} *v) {{")
        used = set()
        for index in node.epilogue.members:
            stmt = self.stmts[index]
            used.add(stmt.target)
            used.update(a.tensor for a in stmt.rhs.walk() if isinstance(a, ast.Access))
        for slot, tensor in enumerate(self.buffer_names()):
            if tensor in used:
                ctype = self.types[tensor].c_type
                w(f"{ctype} *TCPY_RESTRICT {c_name(tensor)} = ({ctype} *)tcpy_buffers[{slot}];", 1)
        w("#pragma omp simd", 1)
        w("for (int64_t c = 0; c < cols; c++) {", 1)
        # the producer's index variables, from the linear batch, M and N indices of the engine
        # (a variable of one value has no role: its value is its range's start)
        producer_vars = {var: f"INT64_C({lo})" for var, (lo, hi) in ranges.items() if hi - lo == 1}
        for role, linear in (("batch", "bi"), ("m", "m"), ("n", "(j + c)")):
            role_vars = con.role_vars(role)
            inner = 1
            for var in reversed(role_vars):
                lo, hi = ranges[var]
                text = f"{linear} / INT64_C({inner})" if inner > 1 else linear
                if var != role_vars[0]:
                    text = f"({text}) % INT64_C({hi - lo})"
                producer_vars[var] = f"tcpy_v{len(producer_vars)}"
                w(f"const int64_t {producer_vars[var]} = INT64_C({lo}) + {text};", 2)
                inner *= hi - lo
        self.registers = {con.c.tensor: "tcpy_e0"}
        w(f"const {T} tcpy_e0 = v[c];", 2)
        for k, (index, var_map) in enumerate(node.epilogue.statements, start=1):
            self.stmt_index = index
            stmt = self.current_stmt = self.stmts[index]
            self.env = {var: producer_vars[producer_var] for var, producer_var in var_map}
            target_type = self.types[stmt.target]
            rhs = convert(value(self, stmt.rhs), stmt.rhs.type, target_type)
            w(f"const {target_type.c_type} tcpy_e{k} = {rhs};", 2)
            w(f"{access(self, stmt.target, stmt.lhs)} = tcpy_e{k};", 2)
            self.registers[stmt.target] = f"tcpy_e{k}"
        self.registers = {}
        self.stmt_index = stmt_index
        w("}", 1)
        w("}")
        return w.text()

    def nest_body(self, nest):
        """A nest's loops. In a generic kernel, a nest dividing floats by values of the sizes
        alone (``X(n, d) / D``) runs twice over: where every such divisor is a power of two
        (whose reciprocal is exact, so ``x / v`` is ``x * (1 / v)`` to the bit) it multiplies,
        as a kernel specialised to such sizes does, else it divides."""
        divisors = []
        if self.generic is not None:
            members = nest.group.statements if nest.group is not None else (nest.stmt,)
            engines = engine_statements(self.program)  # (their scale is the engine's alpha)
            for index in (i for i in members if i not in engines):
                self.stmt_index, self.current_stmt = index, self.stmts[index]
                for node in self.stmts[index].rhs.walk():
                    if size_divisor(node):
                        divisors.append(typed(self, node.rhs, node.type))
            self.stmt_index, self.current_stmt = nest.stmt, self.stmts[nest.stmt]
        if not divisors:
            self.nodes(nest.body, 1)
            return
        if _EXACT_RECIPROCAL not in self.helpers:
            self.helpers.append(_EXACT_RECIPROCAL)
        test = " && ".join(f"tcpy_exact_reciprocal({d})" for d in dict.fromkeys(divisors))
        self.emit(f"if ({test}) {{", 1)
        self.reciprocals = True
        self.nodes(nest.body, 2)
        self.reciprocals = False
        self.emit("} else {", 1)
        self.nodes(nest.body, 2)
        self.emit("}", 1)

    def size_locals(self, slot):
        """A generic kernel's sizes, read from the size block (buffer ``slot``), and each
        tensor dimension that is an expression of them, computed once as a local."""
        self.emit(f"const int64_t *tcpy_sizes = (const int64_t *)tcpy_buffers[{slot}];", 1)
        for k, name in enumerate(self.generic.names):
            self.emit(f"const int64_t {size_c_name(name)} = tcpy_sizes[{k}]; (void){size_c_name(name)};", 1)
        for tensor, shape in self.generic.shapes.items():
            dims = []
            for d, extent in enumerate(shape):
                if not isinstance(extent, (Const, Var)):
                    local = f"{c_name(tensor)}_dim{d}"
                    self.emit(f"const int64_t {local} = {index_c(extent, top=True)}; (void){local};", 1)
                    extent = Var(local)
                dims.append(extent)
            self.shapes[tensor] = tuple(dims)

    def buffer_names(self):
        """The tensors in the order of the kernel's ``tcpy_buffers``."""
        d = self.program.def_
        return ([p.name for p in d.params] + [r.name for r in d.returns] + [t.name for t in d.temporaries]
                + list(self.program.copies) + [s.name for s in self.ir.scratch])

    def kernel(self):
        ir = self.ir
        d = self.program.def_
        names = self.buffer_names()
        sizes = ", ".join(f"{k}={v}" for k, v in sorted(self.program.sizes.items())) or "none"
        if self.generic is not None:
            sizes = f"any (read from the size block; planned at {sizes})"
        w = self.out
        w(GENERIC_MARK if self.generic is not None else "/* Generated by tcpy. */")
        w('#include "tcpy_runtime.h"')
        w("")
        w(_PRELUDE)
        w(f"/* {d.signature()}")
        w(f" * sizes: {sizes}")
        w(f" * target: {ir.options.target.describe()} */")
        w(f"int {self.symbol}(void *const *tcpy_buffers, int tcpy_num_threads, int64_t *err, "
          "const volatile int *tcpy_stop) {")
        for slot, name in enumerate(names):
            ctype = self.types[name].c_type
            self.emit(f"{ctype} *TCPY_RESTRICT {c_name(name)} = ({ctype} *)tcpy_buffers[{slot}];", 1)
        if self.generic is not None:
            self.size_locals(len(names))
        self.emit("int tcpy_err = 0, tcpy_divzero = 0;", 1)
        self.emit("(void)tcpy_err; (void)tcpy_divzero; (void)err;", 1)
        self.emit("if (tcpy_num_threads <= 0) tcpy_num_threads = omp_get_max_threads();  "
                  "/* OMP_NUM_THREADS, threadpoolctl */", 1)
        for nest in ir.nests:
            self.stmt_index = nest.stmt
            stmt = self.stmts[nest.stmt]
            self.current_stmt = stmt
            what = {NestKind.INIT: "initialise", NestKind.COMPUTE: "compute",
                    NestKind.COMBINE: "combine the parts of"}[nest.kind]
            comment = f"/* {what} {stmt}"
            if nest.group is not None:
                comment = "/* fused: " + "\n *        ".join(str(self.stmts[i]) for i in nest.group.statements)
            elif nest.schedule is not None and nest.kind is NestKind.COMPUTE:
                comment += f"\n * schedule: {nest.schedule.describe()}"
            self.emit(comment.replace("*/", "* /") + " */", 1)
            self.uses_divzero = None  # the statement that divides, if one does
            if self.generic is not None:  # the nest's iterations at the call's sizes
                members = nest.group.statements if nest.group is not None else (nest.stmt,)
                works = [self.generic.work[self.program.statements[i].origin] for i in members]
                self.nest_work = works[0]
                for work in works[1:]:
                    self.nest_work = BinOp("+", self.nest_work, work)
            n_errors = len(self.errors)
            self.nest_body(nest)
            if self.uses_divzero is not None:
                self.stmt_index = self.uses_divzero
                code = self.error_code(f"integer division by zero in {self.stmt_label(self.stmts[self.stmt_index])}")
                self.emit(f"if (tcpy_divzero) return {code};", 1)
            if len(self.errors) > n_errors:
                self.emit("if (tcpy_err) return tcpy_err;", 1)
            self.emit("if (*tcpy_stop) return TCPY_INTERRUPTED;", 1)
        self.emit("return 0;", 1)
        w("}")
        if self.helpers:  # before the kernel function (its line starts with `int <symbol>(`)
            at = next(i for i, line in enumerate(w.lines) if line.startswith(f"int {self.symbol}("))
            w.lines[at:at] = self.helpers
        # a generic library holds every routine its shapes may need: gcc compiles them side by side
        return units(w.text()) if self.generic is not None else w.text()


def _iterations(loop):
    """The iterations of ``loop`` and the loops its collapse clause takes with it, as an
    expression of the sizes; None when a bound depends on another of those loops or a loop
    is not ``var < bound`` (or ``<=``) by steps of 1."""
    count, names, node = None, set(), loop
    for _ in range(loop.parallel):
        cond = node.cond
        if not (isinstance(node, Loop) and node.step == 1 and isinstance(cond, BinOp) and cond.op in ("<", "<=")
                and cond.lhs == Var(node.var)):
            return None
        names.add(node.var)
        hi = cond.rhs if cond.op == "<" else BinOp("+", cond.rhs, Const(1))
        trips = Call("max", (BinOp("-", hi, node.lo), Const(0)))
        count = trips if count is None else BinOp("*", count, trips)
        node = node.body[0] if len(node.body) == 1 else None
    if substitute(count, {name: Const(0) for name in names}) != count:
        return None
    return count


def _plain(nodes) -> bool:
    """Whether ``nodes`` hold only loops, points and the like: no contraction engine, register
    tile or chain code (which add file-scope helpers as they are rendered)."""
    return all(not isinstance(node, (ContractionNest, RegisterTile, BlockChain, OnlineStep))
               and all(_plain(children) for children in node.children()) for node in nodes)


def _loop_depth(nodes):
    """How deeply loops nest under ``nodes`` (through every node that holds others)."""
    depth = 0
    for node in nodes:
        below = max((_loop_depth(children) for children in node.children()), default=0)
        depth = max(depth, below + isinstance(node, Loop))
    return depth


def emit_kernel(ir, symbol):
    """C source of the kernel for ``ir`` (a :class:`tcpy.loopir.KernelIR`) named ``symbol``.

    Returns ``(source, error_messages)``: a nonzero return value k of the kernel means
    ``error_messages[k - 1]`` (formatted with the kernel's ``err`` values).
    """
    emitter = _Emitter(ir, symbol)
    source = emitter.kernel()
    return source, tuple(emitter.errors)
