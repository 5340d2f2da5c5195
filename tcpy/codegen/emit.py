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
import cython

from tcpy.lang import ast
from tcpy.lang.types import INDEX_VALUE_TYPE, ScalarType, accumulator_type, promote
from tcpy.lang.visit import exact_index_value, is_index_value, is_static_index
from tcpy.loopir import (
    BLOCK_ROWS, BLOCK_START, OLD_MAXIMUM, TILE_COL, TILE_COL0, TILE_ROW, TILE_ROW0, Accumulate, BinOp, Block,
    BlockChain, Call, Const, ContractionNest, Guard, IExpr, Loop, Mode, Neg, NestKind, OnlineStep, Point, Prepack,
    RegisterTile, Select, TileUpdate, Var,
)
from tcpy.codegen import contraction as contraction_c
from tcpy.codegen.cwriter import dynamic_schedule
from tcpy.generic import size_c_name
from tcpy.schedule import PARALLEL_MIN_WORK
from tcpy.runtime.build import GENERIC_MARK

#: True when this module runs compiled by Cython.
COMPILED: bool = cython.compiled

# Builtins that csrc/tcpy_runtime.h defines (as tcpy_<name>f / tcpy_<name>); the others are libm's.
RUNTIME_BUILTINS = frozenset({
    "fmax", "fmin", "rsqrt", "rcbrt", "exp10", "fdivide", "rhypot", "norm3d", "norm4d", "rnorm3d", "rnorm4d",
    "sinpi", "cospi", "erfcx", "erfinv", "erfcinv", "normcdf", "normcdfinv",
    "cyl_bessel_i0", "cyl_bessel_i1",
})

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


_C_BINARY = {"+", "-", "*", "<=", "<", ">=", ">", "==", "&&", "||"}
REDUCTION_STRIPS = 4  # accumulators of a long SIMD reduction loop (see _Emitter.strip_reduction)
_PART = "split.part"  # the part index of a split reduction's partial results (a generated name)


def index_c(expr: IExpr, top: bool = False) -> str:
    """C text (int64 arithmetic) of a loop-IR index expression.

    ``top`` leaves the outermost operation unparenthesised: OpenMP wants ``c0 <= N`` as a
    loop condition, not ``(c0 <= N)``.
    """
    if isinstance(expr, Const):
        return str(expr.value)
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, BinOp):
        a, b = index_c(expr.lhs), index_c(expr.rhs)
        if expr.op in _C_BINARY:
            return f"{a} {expr.op} {b}" if top else f"({a} {expr.op} {b})"
        if expr.op == "floordiv":
            return f"tcpy_floordiv_int64({a}, {b})"
        return f"({a} {'/' if expr.op == 'div' else '%'} {b})"  # exact division, remainder
    if isinstance(expr, Neg):
        return f"(-{index_c(expr.operand)})"
    if isinstance(expr, Call):
        fn = "tcpy_min_int64" if expr.fn == "min" else "tcpy_max_int64"
        out = index_c(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}({out}, {index_c(a)})"
        return out
    if isinstance(expr, Select):
        return f"({index_c(expr.cond)} ? {index_c(expr.then)} : {index_c(expr.other)})"
    raise NotImplementedError(f"index expression {expr!r}")


def c_name(tensor):
    """C identifier of a tensor: prefixed so TC names never clash with C or runtime names, and
    names passes generate (``pack.0``, with a ".") never clash with the def's own."""
    if "." in tensor:
        return "x_" + tensor.replace(".", "_")
    return "t_" + tensor


def _literal(value, stype):
    if stype.is_float:
        text = repr(float(value))
        if text in ("inf", "-inf", "nan"):
            text = {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[text]
            return f"(({stype.c_type}){text})"
        if stype is ScalarType.FLOAT32:
            return text + "f"
        return f"(({stype.c_type}){text})" if stype is ScalarType.FLOAT16 else text
    return f"(({stype.c_type}){int(value)})"


def identity(op, stype):
    """C expression of the identity of reduction ``op`` in type ``stype``."""
    if op == "+":
        return f"(({stype.c_type})0)"
    if op == "*":
        return f"(({stype.c_type})1)"
    return f"TCPY_{op.upper()}_IDENTITY_{stype.numpy_name}"


def combine(op, a, b, stype):
    """C expression of ``a op b`` for a reduction operator, in type ``stype``."""
    if op in ("+", "*"):
        return f"(({stype.c_type})({a} {op} {b}))"
    return f"tcpy_{op}_{stype.numpy_name}({a}, {b})"


def convert(text, src, dst):
    """C expression converting ``text`` of type ``src`` to ``dst`` with TC's cast rules."""
    if src is dst:
        return text
    return f"tcpy_cast_{src.numpy_name}_to_{dst.numpy_name}({text})"


def _nan_flagged(op, acc_type):
    """Float max/min register reductions keep a separate NaN flag: gcc vectorizes a plain
    comparison reduction plus an or-reduction, but not a NaN-propagating select."""
    return op in ("max", "min") and acc_type.is_float


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
        self.lines = []
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

    # -- error table -------------------------------------------------------------------------

    def error_code(self, message):
        self.errors.append(message)
        return len(self.errors)

    def _stmt_label(self, stmt):
        line = f" (line {stmt.span.line})" if stmt.span.line else ""
        number = self.ir.origins[self.stmt_index] + 1
        return f"statement {number}{line} of def '{self.program.def_.name}': {stmt}"

    # -- expressions -------------------------------------------------------------------------

    def extent(self, tensor, dim):
        """C text (int64) of dimension ``dim`` of ``tensor``."""
        extent = self.shapes[tensor][dim]
        if isinstance(extent, int):
            return f"INT64_C({extent})"
        return index_c(extent) if isinstance(extent, (Const, Var)) else f"({index_c(extent, top=True)})"

    def size(self, name):
        """C text (int64) of size variable ``name``."""
        if self.generic is not None:
            return size_c_name(name)
        return f"INT64_C({self.program.sizes[name]})"

    def index(self, expr):
        """C text (int64) of an index expression; floor semantics for / and %."""
        if isinstance(expr, ast.IntLit):
            return f"INT64_C({int(expr.value)})"
        if isinstance(expr, ast.IndexVar):
            return f"({self.env[expr.name]})"
        if isinstance(expr, ast.SizeVar):
            return self.size(expr.name)
        if isinstance(expr, ast.DimRef):
            return self.extent(expr.tensor, expr.dim)
        if isinstance(expr, ast.Unary) and expr.op == "-":
            return f"(-{self.index(expr.operand)})"
        if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
            return f"({self.index(expr.lhs)} {expr.op} {self.index(expr.rhs)})"
        if isinstance(expr, ast.Binary) and expr.op in ("/", "%"):
            fn = "tcpy_floordiv_int64" if expr.op == "/" else "tcpy_floormod_int64"
            if isinstance(expr.rhs, ast.IntLit) and expr.rhs.value != 0:
                return f"{fn}({self.index(expr.lhs)}, {self.index(expr.rhs)})"
            divisor = self.index(expr.rhs)
            self.uses_divzero = self.stmt_index
            return (f"({divisor} == 0 ? (tcpy_divzero = 1, INT64_C(0)) : "
                    f"{fn}({self.index(expr.lhs)}, {divisor}))")
        # Data-dependent or otherwise computed: evaluate as a value (still with floor / and %,
        # as everything inside an index), widen to int64.
        self.in_index += 1
        try:
            return f"((int64_t)({self.value(expr)}))"
        finally:
            self.in_index -= 1

    def access(self, tensor, indices, read=False):
        """C lvalue of ``tensor(indices)``, bounds-checked where range inference cannot prove it
        (an rvalue for a ``read`` of a tensor without elements)."""
        shape = self.shapes[tensor]
        if not indices:
            return f"{c_name(tensor)}[0]"
        terms = []
        for dim, index in enumerate(indices):
            text = self.index(index)
            if self.ir.options.check_indices and not is_static_index(index):
                code = self.error_code(
                    f"index out of bounds in {self._stmt_label(self.current_stmt)}: "
                    f"dimension {dim} of {tensor} is {{0}}, expected 0 <= index < {{1}}")
                text = f"tcpy_checked_index({text}, {self.extent(tensor, dim)}, &tcpy_err, {code}, err)"
            terms.append((text, self.extent(tensor, dim)))
        flat = terms[0][0]
        for text, extent in terms[1:]:
            flat = f"({flat}) * {extent} + {text}"
        nothing = f"((void)({flat}), ({self.types[tensor].c_type})0)"  # evaluate the checks, read nothing
        if read and self.generic is not None and not all(is_static_index(i) for i in indices):
            empty = " || ".join(f"{extent} == 0" for _, extent in terms)
            return f"({empty} ? {nothing} : {c_name(tensor)}[{flat}])"
        if read and 0 in shape:  # no element to fall back to
            return nothing
        return f"{c_name(tensor)}[{flat}]"

    def value(self, expr):
        """C text of a value expression, of C type ``expr.type``."""
        t = expr.type
        if t is not INDEX_VALUE_TYPE and is_index_value(expr):
            # exact in 64 bits; the launcher refused sizes for which the int32 result overflows
            return f"(({t.c_type}){self.value(exact_index_value(expr))})"
        if isinstance(expr, ast.IntLit):
            return _literal(expr.value, t)
        if isinstance(expr, ast.FloatLit):
            return _literal(expr.value, t)
        if isinstance(expr, ast.IndexVar):
            return f"(({t.c_type})({self.env[expr.name]}))"
        if isinstance(expr, ast.SizeVar):
            if self.generic is not None:
                return f"(({t.c_type}){self.size(expr.name)})"
            return _literal(self.program.sizes[expr.name], t)
        if isinstance(expr, ast.DimRef):
            if self.generic is not None:
                return f"(({t.c_type}){self.extent(expr.tensor, expr.dim)})"
            return _literal(self.shapes[expr.tensor][expr.dim], t)
        if isinstance(expr, ast.Access):
            if expr.tensor in self.registers:  # an epilogue reads the element it is at
                return self.registers[expr.tensor]
            return self.access(expr.tensor, expr.indices, read=True)
        if isinstance(expr, ast.Cast):
            operand = exact_index_value(expr.operand)  # int64(i * N) is exact
            return convert(self.value(operand), operand.type, expr.to)
        if isinstance(expr, ast.Unary):
            if expr.op == "!":
                return f"(!{self.value(expr.operand)})"
            return f"(({t.c_type})(-{self.typed(expr.operand, t)}))"
        if isinstance(expr, ast.Ternary):
            return (f"({self.value(expr.cond)} ? {self.typed(expr.then, t)} : "
                    f"{self.typed(expr.other, t)})")
        if isinstance(expr, ast.Binary):
            return self.binary(expr)
        if isinstance(expr, ast.Call):
            return self.call(expr)
        raise NotImplementedError(f"cannot emit {type(expr).__name__}")

    def typed(self, expr, t):
        """``expr`` converted to ``t`` the way C promotion does (no saturation)."""
        text = self.value(expr)
        return text if expr.type is t else f"(({t.c_type}){text})"

    def binary(self, expr):
        op = expr.op
        if op in ("&&", "||"):
            return f"({self.value(expr.lhs)} {op} {self.value(expr.rhs)})"
        if op in ("<", ">", "<=", ">=", "==", "!="):
            common = promote(expr.lhs.type, expr.rhs.type)
            return f"({self.typed(expr.lhs, common)} {op} {self.typed(expr.rhs, common)})"
        t = expr.type
        a, b = self.typed(expr.lhs, t), self.typed(expr.rhs, t)
        if op in ("/", "%") and not t.is_float:
            self.uses_divzero = self.stmt_index
            if self.in_index:  # TC: index arithmetic floors
                fn = f"tcpy_floor{'div' if op == '/' else 'mod'}_{t.numpy_name}"
                text = f"{fn}({a}, {b})"
                if t.is_signed:  # MIN / -1 traps on x86: -1 needs no division anyway
                    minus_one = f"({t.c_type})(-({a}))" if op == "/" else f"({t.c_type})0"
                    text = f"({b} == -1 ? {minus_one} : {text})"
                return f"({b} == 0 ? (tcpy_divzero = 1, ({t.c_type})0) : {text})"
            return f"tcpy_{'div' if op == '/' else 'mod'}_{t.numpy_name}({a}, {b}, &tcpy_divzero)"
        if op == "%":
            return f"(({t.c_type})fmod{'f' if t is ScalarType.FLOAT32 else ''}({a}, {b}))"
        return f"(({t.c_type})({a} {op} {b}))"

    def call(self, expr):
        t = expr.type
        args = [self.typed(a, t) for a in expr.args]
        if expr.func in ("min", "max"):
            return f"tcpy_{expr.func}_{t.numpy_name}({args[0]}, {args[1]})"
        if t is ScalarType.FLOAT64:
            suffix = ""
        else:  # builtins compute in float32 at least (TC: promote(float, args))
            suffix = "f"
            t = ScalarType.FLOAT32
        name = ("tcpy_" if expr.func in RUNTIME_BUILTINS else "") + expr.func + suffix
        return f"{name}({', '.join(args)})"

    # -- statements --------------------------------------------------------------------------

    def emit(self, line, depth):
        self.lines.append("    " * depth + line)

    def point(self, node, depth):
        self.stmt_index = node.stmt  # (a fused nest holds several statements)
        stmt = self.stmts[node.stmt]
        self.current_stmt = stmt
        self.env = self._env(node.point)
        target_type = self.types[stmt.target]
        target = self.access(stmt.target, stmt.lhs)
        if node.mode is Mode.INIT:
            self.emit(f"{target} = {identity(stmt.reduction, target_type)};", depth)
            return
        if node.mode is Mode.COMBINE:
            self.combine_partials(stmt, target, target_type, depth)
            return
        rhs_type = stmt.rhs.type
        if node.mode is Mode.REGISTER:
            acc_type = accumulator_type(target_type)
            rhs = convert(self.value(stmt.rhs), rhs_type, acc_type)
            acc, nan = f"tcpy_acc{self.strip}", f"tcpy_nan{self.strip}"
            if _nan_flagged(stmt.reduction, acc_type):
                # NaN tracked apart from the comparison so both vectorize (see accumulate)
                cmp = ">" if stmt.reduction == "max" else "<"
                self.emit(f"{{ {acc_type.c_type} tcpy_x = {rhs}; {nan} |= tcpy_x != tcpy_x; "
                          f"{acc} = tcpy_x {cmp} {acc} ? tcpy_x : {acc}; }}", depth)
                return
            self.emit(f"{acc} = {combine(stmt.reduction, acc, rhs, acc_type)};", depth)
            return
        rhs = convert(self.value(stmt.rhs), rhs_type, target_type)
        if node.mode is Mode.ASSIGN:
            self.emit(f"{target} = {rhs};", depth)
        else:
            self.emit(f"{target} = {combine(stmt.reduction, target, rhs, target_type)};", depth)

    def _partial(self, stmt, part):
        """C lvalue of the partial result ``part`` (C text) of the statement being emitted."""
        scratch = self.partials[self.stmt_index]
        self.env[_PART] = part
        return self.access(scratch.name, (ast.IndexVar(_PART),) + stmt.lhs)

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
        value = convert("tcpy_acc", acc_type, target_type)
        if not stmt.init:
            value = combine(stmt.reduction, target, value, target_type)
        self.emit(f"{target} = {value};", depth)

    def accumulate(self, node, depth):
        self.stmt_index = node.stmt
        stmt = self.stmts[node.stmt]
        target_type = self.types[stmt.target]
        acc_type = accumulator_type(target_type)
        self.emit("{", depth)
        self.emit(f"{acc_type.c_type} tcpy_acc = {identity(stmt.reduction, acc_type)};", depth + 1)
        nan_flagged = _nan_flagged(stmt.reduction, acc_type)
        if nan_flagged:
            self.emit("int tcpy_nan = 0;  // int: gcc vectorizes no bool or-reduction", depth + 1)
        self.nodes(node.body, depth + 1)
        if nan_flagged:  # max/min propagate NaN (like numpy.max)
            self.emit(f"if (tcpy_nan) tcpy_acc = ({acc_type.c_type})NAN;", depth + 1)
        self.current_stmt = stmt
        self.env = self._env(node.point)
        if node.part is not None:  # a split reduction: this part's result, combined later
            self.emit(f"{self._partial(stmt, index_c(node.part))} = tcpy_acc;", depth + 1)
            self.emit("}", depth)
            return
        self._store_accumulator(stmt, self.access(stmt.target, stmt.lhs), acc_type, target_type, depth + 1)
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

    def _env(self, point):
        """Index variable -> C text at a point."""
        return {v: index_c(e) for v, e in point}

    def _tile_env(self, node, point):
        env = self._env(point)
        env[node.row_var] = f"{TILE_ROW0} + {TILE_ROW}"
        env[node.col_var] = f"{TILE_COL0} + {TILE_COL}"
        return env

    def _tile_copy(self, node, stmt, template, depth):
        self.env = self._tile_env(node, node.point)
        target = self.access(stmt.target, stmt.lhs)
        self._tile_loops(node, depth)
        self.emit(template.format(target=target), depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def tile_update(self, node, depth):
        stmt = self.stmts[node.stmt]
        self.current_stmt = stmt
        t = self.types[stmt.target]
        self.env = self._tile_env(self.tile, node.point)
        self.env.update(self._env(node.lets))
        rhs = convert(self.value(node.rhs), stmt.rhs.type, t)
        self._tile_loops(self.tile, depth)
        cell = f"tcpy_tile[{TILE_ROW}][{TILE_COL}]"
        self.emit(f"{cell} = {combine(stmt.reduction, cell, rhs, t)};", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def loop(self, node, depth):
        simd = node.simd and (node.simd_reduction or not node.unroll)
        if simd and node.simd_reduction and not node.parallel:
            strips = self._strips(node)
            if strips:
                self.strip_reduction(node, *strips, depth)
                return
        reduction = ""
        if node.simd_reduction:
            reduction = f" reduction({node.simd_reduction}:tcpy_acc)"
            stmt = self.stmts[self.stmt_index]
            if _nan_flagged(node.simd_reduction, accumulator_type(self.types[stmt.target])):
                reduction += " reduction(|:tcpy_nan)"
        if node.parallel:
            collapse = f" collapse({node.parallel})" if node.parallel > 1 else ""
            both = " simd" if simd else ""  # a single loop is both the parallel and the SIMD one
            threads = f"tcpy_num_threads < {node.chunks} ? tcpy_num_threads : {node.chunks}"
            # iterations claimed dynamically; a reduction clause keeps the static split, whose
            # per-thread partials cover the same iterations in every run
            schedule = ("schedule(static)" if simd and reduction
                        else dynamic_schedule(node.chunks, self.ir.options.threads))
            if self.generic is not None:  # chunks counted at the nominal sizes: guided claims fit any count
                threads = "tcpy_num_threads"
                schedule = "schedule(static)" if simd and reduction else "schedule(guided)"
                # in parallel when the call has the work (as the schedule does at fixed sizes)
                work = self.generic.work[self.program.statements[self.stmt_index].origin]
                schedule += f" if(parallel: {index_c(work, top=True)} >= {PARALLEL_MIN_WORK})"
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

    def _strips(self, node):
        """``(lo, strip, hi)`` when the SIMD reduction loop ``node`` runs as REDUCTION_STRIPS
        strips: constant bounds, points only in its body, at least two vectors per strip. A
        strip is whole vectors (no scalar tail per strip); what is left runs after them."""
        if node.step != 1 or not isinstance(node.lo, Const) or not all(isinstance(n, Point) for n in node.body):
            return None
        cond = node.cond
        if not (isinstance(cond, BinOp) and cond.op in ("<", "<=") and cond.lhs == Var(node.var)
                and isinstance(cond.rhs, Const)):
            return None
        lo, hi = node.lo.value, cond.rhs.value + (cond.op == "<=")
        acc_type = accumulator_type(self.types[self.stmts[self.stmt_index].target])
        lanes = self.ir.options.target.lanes(acc_type.bits // 8)
        strip = (hi - lo) // REDUCTION_STRIPS // lanes * lanes
        if strip < 2 * lanes:
            return None
        return lo, strip, hi

    def strip_reduction(self, node, lo, strip, hi, depth):
        """A long SIMD reduction as REDUCTION_STRIPS contiguous strips, each with its own
        accumulator, one loop over all of them: one accumulator's chain of dependent vector adds
        (or compares) bounds a single loop at one vector per add latency. The strips combine in a
        fixed order after the loop (a reduction's order already differs from the sequential one:
        ``omp simd`` reassociates). ``tcpy_acc`` (and ``tcpy_nan``) carry in and out."""
        stmt = self.stmts[self.stmt_index]
        acc_type = accumulator_type(self.types[stmt.target])
        op = node.simd_reduction
        flagged = _nan_flagged(op, acc_type)
        accs = ["tcpy_acc"] + [f"tcpy_acc{k}" for k in range(1, REDUCTION_STRIPS)]
        nans = ["tcpy_nan"] + [f"tcpy_nan{k}" for k in range(1, REDUCTION_STRIPS)]
        clause = f" reduction({op}:{', '.join(accs)})" + (f" reduction(|:{', '.join(nans)})" if flagged else "")
        start = f"{node.var}_strip"
        self.emit("{", depth)
        self.emit(f"{acc_type.c_type} {', '.join(f'{a} = {identity(op, acc_type)}' for a in accs[1:])};", depth + 1)
        if flagged:
            self.emit(f"int {', '.join(f'{n} = 0' for n in nans[1:])};", depth + 1)
        self.emit(f"#pragma omp simd{clause}", depth + 1)
        self.emit(f"for (int64_t {start} = {lo}; {start} < {lo + strip}; {start}++) {{", depth + 1)
        self.in_simd += 1
        for k in range(REDUCTION_STRIPS):
            self.emit(f"{{ const int64_t {node.var} = {start} + {k * strip};", depth + 2)
            self.strip = str(k) if k else ""  # this strip's accumulator
            self.nodes(node.body, depth + 3)
            self.strip = ""
            self.emit("}", depth + 2)
        self.emit("}", depth + 1)
        if lo + REDUCTION_STRIPS * strip < hi:
            self.emit(f"#pragma omp simd reduction({op}:tcpy_acc)" + (" reduction(|:tcpy_nan)" if flagged else ""),
                      depth + 1)
            self.emit(f"for (int64_t {node.var} = {lo + REDUCTION_STRIPS * strip}; {node.var} < {hi}; "
                      f"{node.var}++) {{", depth + 1)
            self.nodes(node.body, depth + 2)
            self.emit("}", depth + 1)
        self.in_simd -= 1
        while len(accs) > 1:  # pairwise: ((acc + acc1) + (acc2 + acc3))
            accs = [combine(op, a, b, acc_type) for a, b in zip(accs[::2], accs[1::2])] + accs[len(accs) // 2 * 2:]
        self.emit(f"tcpy_acc = {accs[0]};", depth + 1)
        if flagged:
            self.emit(f"tcpy_nan |= {' | '.join(nans[1:])};", depth + 1)
        self.emit("}", depth)

    def block_chain(self, node, depth):
        """A fused chain: per-thread block buffers (scratch slot 3), a parallel loop over the
        batch loops and blocks of rows; per block the head product, the rows, the tail product
        (an online chain's: per block of columns, see :meth:`key_blocks`). b is packed where
        the chain's plan says (``node.prepack``): by each thread when its batch changes, or,
        shared (slot 4), by one thread for all, every thread running the batch loops and the
        blocks of the batch split between the threads."""
        keys = node.online
        calls, tail_c = self._block_products(node.head, node.tail, "", node.deferred is not None and not keys,
                                             keys is not None, keys)
        prepacks = " ".join(p for p, _ in calls if p)
        last_calls = None
        if keys is not None:
            if keys.last is not None:
                last_calls = self._block_products(keys.last[0], keys.last[2], "_last", False, False, keys)[0]
            if prepacks:  # b of every block of columns
                if last_calls is not None:
                    last = " ".join(p for p, _ in last_calls if p)
                    prepacks = f"if ({keys.var} + {keys.columns} <= {keys.hi}) {{ {prepacks} }} else {{ {last} }}"
                prepacks = (f"for (int64_t {keys.var} = {keys.lo}; {keys.var} < {keys.hi}; {keys.var} += "
                            f"{keys.columns}) {{ {prepacks} }}")
        self.emit("{", depth)
        shared = node.prepack is Prepack.SHARED
        if shared:
            self._carve("tcpy_shared", 4, node.shared, depth + 1)
        if node.parallel:
            self.emit(f"const int tcpy_nt = tcpy_num_threads < {node.chunks} ? tcpy_num_threads : {node.chunks};",
                      depth + 1)
            self.emit("#pragma omp parallel num_threads(tcpy_nt) if(tcpy_nt > 1)", depth + 1)
        self.emit("{", depth + 1)
        self._carve("tcpy_mem", 3, node.buffers, depth + 2)
        self.emit("int64_t tcpy_batch = -1;  /* the batch whose operands this thread packed */", depth + 2)
        self.emit("(void)tcpy_batch;", depth + 2)
        d = depth + 2
        *batch_loops, (var, lo, hi) = node.loops
        threads = self.ir.options.threads
        if node.parallel and not shared:
            collapse = f" collapse({len(node.loops)})" if len(node.loops) > 1 else ""
            self.emit(f"#pragma omp for {dynamic_schedule(node.chunks, threads)}{collapse}", d)
        for loop_var, lo_, hi_ in batch_loops:
            self.emit(f"for (int64_t {loop_var} = {lo_}; {loop_var} < {hi_}; {loop_var}++)", d)
            d += 1
        if shared:
            self.emit("{", d)
            self.emit("#pragma omp single", d + 1)
            self.emit(f"{{ {prepacks} }}", d + 1)
            if node.parallel:
                blocks = -(-(hi - lo) // node.rows)
                self.emit(f"#pragma omp for {dynamic_schedule(blocks, threads)}", d + 1)
            d += 1
        self.emit(f"for (int64_t {var} = {lo}; {var} < {hi}; {var} += {node.rows}) {{", d)
        self.emit(f"const int64_t {BLOCK_ROWS} = {hi} - {var} < {node.rows} ? {hi} - {var} : {node.rows};", d + 1)
        if node.prepack is Prepack.PER_THREAD:
            batch = "0"
            for loop_var, lo_, hi_ in batch_loops:
                batch = f"({batch}) * {hi_ - lo_} + ({loop_var} - {lo_})"
            self.emit(f"if ({batch} != tcpy_batch) {{ tcpy_batch = {batch}; {prepacks} }}", d + 1)
        if keys is not None:
            self.key_blocks(node, calls, last_calls, tail_c, d + 1)
        else:
            self.emit(calls[0][1], d + 1)
            self.block_rows(node.row_var, node.body, d + 1)
            if node.deferred is None:
                self.emit(calls[1][1], d + 1)
            else:
                self.deferred_tail(node, calls[1][1], tail_c, d + 1)
        self.emit("}", d)
        if shared:
            self.emit("}", d - 1)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def _block_products(self, head, tail, suffix: str, divided: bool, online: bool, keys=None):
        """The C of a chain's two products (helpers added to the file; ``suffix`` tells apart
        the products of one statement): ``([(prepack, call), (prepack, call)], tail's output
        pointer)``. With ``keys`` (an online chain's blocks of columns), b packed once per batch
        is the current block's."""
        names = {name: c_name(name) for name in self._buffer_names()}
        calls, tail_c = [], ""
        for k, product in enumerate((head, tail)):
            pointers = tuple(f"{c_name(tensor)} + {index_c(offset)}" for tensor, offset in product.bases)
            last = product is tail
            prepacked = c_name(product.prepacked) if product.prepacked else None
            if prepacked and keys is not None:
                prepacked = f"{prepacked} + ({keys.var} - {keys.lo}) / {keys.columns} * INT64_C({keys.panels[k]})"
            helpers, prepack, call = contraction_c.render_block(
                product.contraction, product.plan, names, f"{self.symbol}_s{product.stmt}{suffix}", pointers,
                index_c(product.rows), prepacked, divided and last, online and last)
            self.helpers.append(helpers)
            calls.append((prepack, call))
            tail_c = pointers[2]  # the block's rows of the last product's output
        return calls, tail_c

    def block_rows(self, row_var: str, body, depth: int):
        """``body`` for each row of the block (none for a chain of two products)."""
        if not body:
            return
        self.emit(f"for (int64_t {row_var} = {BLOCK_START}; {row_var} < {BLOCK_START} + {BLOCK_ROWS}; "
                  f"{row_var}++) {{", depth)
        self.loops += 1
        self.nodes(body, depth + 1)
        self.loops -= 1
        self.emit("}", depth)

    def key_blocks(self, node, calls, last_calls, tail_c: str, depth: int):
        """An online chain's block of rows (see :class:`tcpy.loopir.Online`): the rows' running
        maximum at -inf and sum at 0, the output rows at 0; per block of columns the head
        product, the rows (folding the block into the running maximum and sum), the output rows
        rescaled by the factor and the tail product adding the block's terms; then the rows
        divided by their sums, and the flagged rows computed again whole."""
        keys = node.online
        T = node.tail.contraction.dtype
        tail_fn = f"{self.symbol}_s{node.tail.stmt}"
        mx, sm, factor = (c_name(b) for b in keys.running)
        redo = c_name(keys.redo)
        self.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{ {mx}[r] = TCPY_MAX_IDENTITY_{T.numpy_name}; "
                  f"{sm}[r] = ({T.c_type})0; }}", depth)
        self.emit(f"{tail_fn}_clear_rows({tail_c}, {BLOCK_ROWS});", depth)
        self.emit(f"for (int64_t {keys.var} = {keys.lo}; {keys.var} < {keys.hi}; {keys.var} += {keys.columns}) {{",
                  depth)
        variants = [(calls, node.body)]
        if keys.last is not None:
            variants.append((last_calls, keys.last[1]))
            self.emit(f"if ({keys.var} + {keys.columns} <= {keys.hi}) {{", depth + 1)
        for k, (variant, body) in enumerate(variants):
            if k:
                self.emit("} else {", depth + 1)
            d = depth + 1 + (keys.last is not None)
            self.emit(variant[0][1], d)
            self.block_rows(node.row_var, body, d)
            self.emit(f"{tail_fn}_scale_rows({tail_c}, {BLOCK_ROWS}, {factor});", d)
            self.emit(variant[1][1], d)
        if keys.last is not None:
            self.emit("}", depth + 1)
        self.emit("}", depth)
        head, body, tail, (numerator, row, divisor) = keys.whole
        whole_calls, _ = self._block_products(head, tail, "_whole", False, False)
        self.emit(f"if ({tail_fn}_finish_rows({tail_c}, {BLOCK_ROWS}, {mx}, {sm}, {redo})) {{", depth)
        self.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{", depth + 1)
        self.emit(f"if (!{redo}[r]) continue;", depth + 2)
        self.emit(f"const int64_t tcpy_row = {BLOCK_START} + r;", depth + 2)
        self.emit("{  /* the row as the statements say: its quotient itself, all its columns at once */", depth + 2)
        self.emit(f"const int64_t {BLOCK_START} = tcpy_row, {BLOCK_ROWS} = 1;", depth + 3)
        self.emit(whole_calls[0][1], depth + 3)
        self.block_rows(node.row_var, body, depth + 3)
        self.quotient_rows(numerator, row, divisor, T.c_type, None, depth + 3)
        self.emit(whole_calls[1][1], depth + 3)
        self.emit("}", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def online_step(self, node, depth):
        """An :class:`tcpy.loopir.OnlineStep`: a block's maximum or sum folded into the row's
        running one (the factor is 0 while the running maximum is -inf: nothing was summed)."""
        self.stmt_index = node.stmt
        self.current_stmt = self.stmts[node.stmt]
        T = self.types[node.local]
        r = index_c(node.row)
        run, factor, local = c_name(node.running), c_name(node.factor), c_name(node.local)
        if node.kind == "sum":
            self.emit(f"{run}[{r}] = {run}[{r}] * {factor}[{r}] + {local}[0];", depth)
            return
        self.env = self._env(node.point)
        self.shapes[OLD_MAXIMUM], self.types[OLD_MAXIMUM] = (), T
        self.emit("{", depth)
        self.emit(f"const {T.c_type} {c_name(OLD_MAXIMUM)}[1] = {{{run}[{r}]}};", depth + 1)
        self.emit(f"{local}[0] = tcpy_max_{T.numpy_name}({c_name(OLD_MAXIMUM)}[0], {local}[0]);", depth + 1)
        rescale = convert(self.value(node.rescale), node.rescale.type, T)
        self.emit(f"{factor}[{r}] = {c_name(OLD_MAXIMUM)}[0] == TCPY_MAX_IDENTITY_{T.numpy_name} ? "
                  f"({T.c_type})0 : {rescale};", depth + 1)
        self.emit(f"{run}[{r}] = {local}[0];", depth + 1)
        self.emit("}", depth)

    def deferred_tail(self, node, call: str, tail_c: str, depth: int):
        """The tail product of a chain whose quotient ``X = Y / Z`` was deferred past it (see
        :class:`tcpy.loopir.Deferral`): rows whose Z is below 1 in magnitude or not finite
        (where Y / Z itself could overflow) divide Y in place (X itself) and set their Z to 1;
        the product runs on Y; its rows are divided by Z; if a row with Z != 1 came out not
        finite (its sum overflowed before the division), every such row takes X and the
        product runs again."""
        numerator, row, divisor = node.deferred
        T = node.tail.contraction.dtype.c_type
        divide = f"{self.symbol}_s{node.tail.stmt}_divide_rows"
        self.quotient_rows(numerator, row, divisor, T, f"!(isfinite(zr) && fabs(zr) >= ({T})1)", depth)
        self.emit(call, depth)
        self.emit(f"if ({divide}({tail_c}, {BLOCK_ROWS}, {c_name(divisor)})) {{", depth)
        self.quotient_rows(numerator, row, divisor, T, f"zr != ({T})1", depth + 1)
        self.emit(call, depth + 1)
        self.emit("}", depth)

    def quotient_rows(self, numerator: str, row: int, divisor: str, T: str, condition, depth: int):
        """A deferred quotient ``X = Y / Z`` itself, in place in Y's block buffer (``row``
        elements of C type ``T`` a row), for the block's rows whose ``zr`` meets ``condition``
        (all, if None); their Z becomes 1."""
        y, z = c_name(numerator), c_name(divisor)
        self.emit(f"for (int64_t r = 0; r < {BLOCK_ROWS}; r++) {{", depth)
        self.emit(f"const {T} zr = {z}[r];", depth + 1)
        self.emit(f"if ({condition or 1}) {{", depth + 1)
        self.emit(f"for (int64_t e = 0; e < {row}; e++) {y}[r * {row} + e] = {y}[r * {row} + e] / zr;", depth + 2)
        self.emit(f"{z}[r] = ({T})1;", depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def _carve(self, base, slot, buffers, depth):
        """Declare ``buffers`` (name, elements, type) in scratch ``slot``, each on a cache line."""
        offsets, total, line = [], 0, self.ir.options.target.cache_line
        for name, elements, type_ in buffers:
            offsets.append((name, type_, total))
            total += -(-elements * (type_.bits // 8) // line) * line
        self.emit(f"char *{base} = (char *)tcpy_scratch({slot}, {max(total, 1)});", depth)
        for name, type_, offset in offsets:
            self.emit(f"{type_.c_type} *TCPY_RESTRICT {c_name(name)} = ({type_.c_type} *)({base} + {offset});", depth)

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
                self.emit("{", depth)
                for name, shape, type_, zeroed in node.buffers:
                    size = 1
                    for d in shape:
                        size *= d
                    init = " = {0}" if zeroed else ""
                    self.emit(f"{type_.c_type} {c_name(name)}[{max(size, 1)}]{init};  /* per iteration */", depth + 1)
                for name, buffer, offset in node.views:
                    ctype = self.types[name].c_type
                    self.emit(f"{ctype} *TCPY_RESTRICT {c_name(name)} = {c_name(buffer)} + {index_c(offset)};  "
                              "/* a row of the block */", depth + 1)
                self.nodes(node.body, depth + 1)
                self.emit("}", depth)
            elif isinstance(node, ContractionNest):
                names = {name: c_name(name) for name in self._buffer_names()}  # (snapshots are copies)
                prefix = f"{self.symbol}_s{node.stmt}"
                epilogue = None
                if node.epilogue is not None:
                    epilogue = f"{prefix}_epilogue"
                    self.helpers.append(self.epilogue(node, epilogue))
                helpers, body = contraction_c.render(node.contraction, node.plan, names, prefix, epilogue)
                self.helpers.append(helpers)
                for line in body.splitlines():
                    self.emit(line, depth)
            elif isinstance(node, BlockChain):
                self.block_chain(node, depth)
            elif isinstance(node, OnlineStep):
                self.online_step(node, depth)
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
        lines = [f"static inline void {name}(void *const *tcpy_buffers, int64_t bi, int64_t m, int64_t j, "
                 f"int64_t cols, const {T} *v) {{"]
        used = set()
        for index in node.epilogue.members:
            stmt = self.stmts[index]
            used.add(stmt.target)
            used.update(a.tensor for a in stmt.rhs.walk() if isinstance(a, ast.Access))
        for slot, tensor in enumerate(self._buffer_names()):
            if tensor in used:
                ctype = self.types[tensor].c_type
                lines.append(f"    {ctype} *TCPY_RESTRICT {c_name(tensor)} = ({ctype} *)tcpy_buffers[{slot}];")
        lines += ["    #pragma omp simd", "    for (int64_t c = 0; c < cols; c++) {"]
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
                lines.append(f"        const int64_t {producer_vars[var]} = INT64_C({lo}) + {text};")
                inner *= hi - lo
        self.registers = {con.c.tensor: "tcpy_e0"}
        lines.append(f"        const {T} tcpy_e0 = v[c];")
        for k, (index, var_map) in enumerate(node.epilogue.statements, start=1):
            self.stmt_index = index
            stmt = self.current_stmt = self.stmts[index]
            self.env = {var: producer_vars[producer_var] for var, producer_var in var_map}
            target_type = self.types[stmt.target]
            rhs = convert(self.value(stmt.rhs), stmt.rhs.type, target_type)
            lines.append(f"        const {target_type.c_type} tcpy_e{k} = {rhs};")
            lines.append(f"        {self.access(stmt.target, stmt.lhs)} = tcpy_e{k};")
            self.registers[stmt.target] = f"tcpy_e{k}"
        self.registers = {}
        self.stmt_index = stmt_index
        lines += ["    }", "}"]
        return "\n".join(lines) + "\n"

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

    def _buffer_names(self):
        """The tensors in the order of the kernel's ``tcpy_buffers``."""
        d = self.program.def_
        return ([p.name for p in d.params] + [r.name for r in d.returns] + [t.name for t in d.temporaries]
                + list(self.program.copies) + [s.name for s in self.ir.scratch])

    def kernel(self):
        ir = self.ir
        d = self.program.def_
        names = self._buffer_names()
        sizes = ", ".join(f"{k}={v}" for k, v in sorted(self.program.sizes.items())) or "none"
        if self.generic is not None:
            sizes = f"any (read from the size block; planned at {sizes})"
        self.lines = [
            GENERIC_MARK if self.generic is not None else "/* Generated by tcpy. */",
            '#include "tcpy_runtime.h"',
            "",
            _PRELUDE,
            f"/* {d.signature()}",
            f" * sizes: {sizes}",
            f" * target: {ir.options.target.describe()} */",
            f"int {self.symbol}(void *const *tcpy_buffers, int tcpy_num_threads, int64_t *err, "
            "const volatile int *tcpy_stop) {",
        ]
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
                comment = "/* fused: " + "\n     *        ".join(str(self.stmts[i]) for i in nest.group.statements)
            elif nest.schedule is not None and nest.kind is NestKind.COMPUTE:
                comment += f"\n     * schedule: {nest.schedule.describe()}"
            self.emit(comment.replace("*/", "* /") + " */", 1)
            self.uses_divzero = None  # the statement that divides, if one does
            n_errors = len(self.errors)
            self.nodes(nest.body, 1)
            if self.uses_divzero is not None:
                self.stmt_index = self.uses_divzero
                code = self.error_code(f"integer division by zero in {self._stmt_label(self.stmts[self.stmt_index])}")
                self.emit(f"if (tcpy_divzero) return {code};", 1)
            if len(self.errors) > n_errors:
                self.emit("if (tcpy_err) return tcpy_err;", 1)
            self.emit("if (*tcpy_stop) return TCPY_INTERRUPTED;", 1)
        self.emit("return 0;", 1)
        self.lines.append("}")
        if self.helpers:  # before the kernel function (its line starts with `int <symbol>(`)
            at = next(i for i, line in enumerate(self.lines) if line.startswith(f"int {self.symbol}("))
            self.lines[at:at] = self.helpers
        return "\n".join(self.lines) + "\n"


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
