"""Lower a checked def with bound ranges into a loop-nest IR, using isl's AST generation.

Each statement becomes up to two nests over its (rectangular, shape-specialised) domain:

* an *init* nest for ``!`` reductions that accumulate in memory (sets the target to the
  reduction's identity over the output variables' ranges);
* the *compute* nest, whose loops come from isl: the statement's schedule (see
  :mod:`tcpy.schedule`) is written as an isl map ``S[vars] -> [tiles..., points...]`` and
  ``AstBuild.node_from_schedule_map`` produces the loops, with exact bounds for partial tiles.

Loop bounds in the IR are C expression strings produced from isl's AST expressions; statement
bodies stay TC expressions and are turned into C by :mod:`tcpy.codegen.emit`.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import islpy as isl

from .lang import ast
from .lang.sema import inline_lets, map_expr
from .lang.types import ScalarType
from .options import Options
from .schedule import StmtSchedule, choose_schedule


# ----------------------------------------------------------------------------- IR nodes


@dataclass(frozen=True, slots=True)
class Loop:
    """``for (var = lo; cond; var += step)``; ``parallel`` is the OpenMP collapse depth (0: none)."""

    var: str
    lo: str
    cond: str
    step: int
    body: tuple["Node", ...]
    parallel: int = 0
    simd: bool = False
    simd_reduction: Optional[str] = None  # accumulator combined by an omp simd reduction clause
    unroll: int = 0


@dataclass(frozen=True, slots=True)
class Guard:
    """``if (cond) then else other`` from isl (rare for rectangular domains)."""

    cond: str
    then: tuple["Node", ...]
    other: tuple["Node", ...] = ()


@dataclass(frozen=True, slots=True)
class Point:
    """One instance of statement ``stmt`` at ``point`` (index variable -> C expression).

    ``mode`` is ``"assign"`` (``T = rhs``), ``"memory"`` (``T = T op rhs``), ``"register"``
    (``acc = acc op rhs``) or ``"init"`` (``T = identity``).
    """

    stmt: int
    point: tuple[tuple[str, str], ...]
    mode: str


@dataclass(frozen=True, slots=True)
class Accumulate:
    """A register accumulator around the reduction loops of a statement.

    Starts at the identity, runs ``body``, then stores into the target at the output point
    (``T = acc`` for ``!`` reductions, ``T = T op acc`` otherwise).
    """

    stmt: int
    point: tuple[tuple[str, str], ...]  # output variables only
    body: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class RegisterTile:
    """A ``rows x cols`` block of the target kept in registers across the reduction loops.

    ``fast`` runs when the block is whole (``full``): it loads the block, runs the reduction
    loops whose innermost body is a :class:`TileUpdate`, and stores the block back. ``slow``
    is isl's plain loop nest for partial blocks at the edges.
    """

    stmt: int
    row_var: str
    rows: int
    row_start: str
    col_var: str
    cols: int
    col_start: str
    full: str
    point: tuple[tuple[str, str], ...]  # the other output variables
    fast: tuple["Node", ...]
    slow: tuple["Node", ...]
    # (tensor, panel copy): the fast path reads this operand from its copy in panels
    panel: Optional[tuple[str, str]] = None


@dataclass(frozen=True, slots=True)
class TileUpdate:
    """``tile[r][c] = tile[r][c] op rhs`` over the whole register tile, at ``point`` (all
    variables but the tile's row and column)."""

    stmt: int
    point: tuple[tuple[str, str], ...]


Node = Union[Loop, Guard, Point, Accumulate, RegisterTile, TileUpdate]


@dataclass(frozen=True, slots=True)
class Nest:
    stmt: int
    kind: str  # "init" or "compute"
    body: tuple[Node, ...]
    schedule: Optional[StmtSchedule] = None


@dataclass(frozen=True, slots=True)
class KernelIR:
    """Everything the emitter needs: let-inlined statements, concrete shapes and types, nests."""

    def_: ast.Def
    stmts: tuple[ast.Stmt, ...]
    shapes: Mapping[str, tuple[int, ...]]
    types: Mapping[str, ScalarType]
    sizes: Mapping[str, int]
    nests: tuple[Nest, ...]
    options: Options
    # index in def_.stmts of each statement (-1 for the packing copies tcpy adds)
    origins: tuple[int, ...] = ()
    # temporaries tcpy adds (packed operands), passed after the def's own temporaries
    packs: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- isl helpers

_OP = isl.ast_expr_op_type
_BINARY_C = {
    _OP.add: "+", _OP.sub: "-", _OP.mul: "*", _OP.le: "<=", _OP.lt: "<", _OP.ge: ">=",
    _OP.gt: ">", _OP.eq: "==", _OP.and_: "&&", _OP.and_then: "&&", _OP.or_: "||", _OP.or_else: "||",
}


def isl_expr_to_c(expr: isl.AstExpr, top: bool = False) -> str:
    """C text for an isl AST expression (integer arithmetic on int64 loop variables).

    ``top`` leaves the outermost operation unparenthesised: OpenMP wants ``c0 <= N`` as a
    loop condition, not ``(c0 <= N)``.
    """
    kind = expr.get_type()
    if kind == isl.ast_expr_type.int:
        return str(expr.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        return expr.get_id().get_name()
    op = expr.get_op_type()
    args = [isl_expr_to_c(expr.get_op_arg(i)) for i in range(expr.get_op_n_arg())]
    if op in _BINARY_C:
        text = f"{args[0]} {_BINARY_C[op]} {args[1]}"
        return text if top else f"({text})"
    if op == _OP.minus:
        return f"(-{args[0]})"
    if op in (_OP.min, _OP.max):
        fn = "tcpy_min_int64" if op == _OP.min else "tcpy_max_int64"
        out = args[0]
        for a in args[1:]:
            out = f"{fn}({out}, {a})"
        return out
    if op == _OP.fdiv_q:
        return f"tcpy_floordiv_int64({args[0]}, {args[1]})"
    if op in (_OP.pdiv_q, _OP.div):  # exact or non-negative dividend: C division is right
        return f"({args[0]} / {args[1]})"
    if op in (_OP.pdiv_r, _OP.zdiv_r):
        return f"({args[0]} % {args[1]})"
    if op == _OP.select or op == _OP.cond:
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise NotImplementedError(f"isl AST operation {op} in loop bounds")


def _rect_set(name: str, vars_: tuple[str, ...], ranges: Mapping[str, tuple[int, int]]) -> isl.Set:
    dims = ", ".join(vars_)
    cons = " and ".join(f"{ranges[v][0]} <= {v} < {ranges[v][1]}" for v in vars_) or "true"
    return isl.Set(f"{{ {name}[{dims}] : {cons} }}")


def _schedule_map(name: str, vars_: tuple[str, ...], sched: StmtSchedule, domain: isl.Set) -> isl.Map:
    outs = list(sched.dim_exprs())
    if not outs:  # a scalar statement still needs one schedule dimension
        outs = ["0"]
    text = f"{{ {name}[{', '.join(vars_)}] -> [{', '.join(outs)}] }}"
    return isl.Map(text).intersect_domain(domain)


def _build_ast(schedule_map: isl.Map) -> Optional[isl.AstNode]:
    if schedule_map.is_empty():
        return None
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    return build.node_from_schedule_map(isl.UnionMap.from_map(schedule_map))


class _Lowerer:
    """Walks an isl AST and produces IR nodes for one nest."""

    def __init__(self, stmt_index: int, stmt: ast.Stmt, sched: Optional[StmtSchedule], mode: str,
                 vars_: tuple[str, ...], panel: Optional[tuple[str, str]] = None):
        self.panel = panel
        self.stmt_index = stmt_index
        self.stmt = stmt
        self.sched = sched
        self.mode = mode
        self.vars = vars_
        dims = sched.dims() if sched else tuple((v, "point") for v in vars_)
        names = [f"c{i}" for i in range(len(dims))]
        self.parallel = set(names[: sched.parallel_dims]) if sched else set()
        self.innermost = names[-1] if dims else None
        point_reductions = {
            name for name, (v, level) in zip(names, dims) if level == "point" and v in stmt.reduction_vars
        }
        # Schedule dimensions of the reduction loops that accumulate in a register; the first
        # one isl emits as a loop opens the accumulator (isl drops loops of extent 1).
        self.reduction_dims = point_reductions if sched and sched.register_reduction else set()
        self.in_accumulator = False
        # Register tile: the first loop below the block loops opens it; the row loop ends it.
        self.tile_dims: set[str] = set()
        self.row_dim = self.col_dim = None
        if sched and sched.register_tile and mode == "memory":
            row, _, col, _ = sched.register_tile
            self.row_dim, self.col_dim = names[-2], names[-1]
            self.tile_dims = point_reductions | {self.row_dim, self.col_dim}
        self.in_tile = False
        self.fast = False

    def lower(self, node: Optional[isl.AstNode], in_parallel: bool = False) -> tuple[Node, ...]:
        if node is None:
            return ()
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            out: list[Node] = []
            for i in range(children.n_ast_node()):
                out.extend(self.lower(children.get_at(i), in_parallel))
            return tuple(out)
        if kind == isl.ast_node_type.if_:
            other = self.lower(node.if_get_else_node(), in_parallel) if node.if_has_else_node() else ()
            return (Guard(isl_expr_to_c(node.if_get_cond()), self.lower(node.if_get_then_node(), in_parallel), other),)
        if kind == isl.ast_node_type.user:
            return (self._point(node.user_get_expr()),)
        if kind == isl.ast_node_type.for_:
            return (self._loop(node, in_parallel),)
        if kind == isl.ast_node_type.mark:
            return self.lower(node.mark_get_node(), in_parallel)
        raise NotImplementedError(f"isl AST node {kind}")

    def _loop(self, node: isl.AstNode, in_parallel: bool) -> Node:
        var = node.for_get_iterator().get_id().get_name()
        if var in self.tile_dims and not self.in_tile:
            return self._register_tile(node, in_parallel)
        if self.fast and var == self.row_dim:
            point = _first_point(self._plain(node, in_parallel))
            row, _, col, _ = self.sched.register_tile
            return TileUpdate(self.stmt_index, tuple((v, e) for v, e in point.point if v not in (row, col)))
        collapse = 0
        if var in self.parallel and not in_parallel:
            collapse, inner = 1, node.for_get_body()
            while (inner.get_type() == isl.ast_node_type.for_
                   and inner.for_get_iterator().get_id().get_name() in self.parallel):
                collapse, inner = collapse + 1, inner.for_get_body()
        opens_accumulator = var in self.reduction_dims and not self.in_accumulator
        if opens_accumulator:
            self.in_accumulator = True
        simd = bool(self.sched and self.sched.simd and var == self.innermost)
        simd_reduction = None
        if simd and self.sched.register_reduction and self.stmt.reduction is not None:
            simd_reduction = self.stmt.reduction
        loop = Loop(
            var=var,
            lo=isl_expr_to_c(node.for_get_init()),
            cond=isl_expr_to_c(node.for_get_cond(), top=True),
            step=int(node.for_get_inc().get_val().to_python()),
            body=self.lower(node.for_get_body(), in_parallel or collapse > 0),
            parallel=collapse,
            simd=simd,
            simd_reduction=simd_reduction,
            unroll=self.sched.unroll if (self.sched and var == self.innermost) else 0,
        )
        if opens_accumulator:
            self.in_accumulator = False
            return Accumulate(self.stmt_index, self._output_point(loop), (loop,))
        return loop

    def _plain(self, node: isl.AstNode, in_parallel: bool) -> Node:
        fast, self.fast = self.fast, False
        try:
            return self._loop(node, in_parallel)
        finally:
            self.fast = fast

    def _register_tile(self, node: isl.AstNode, in_parallel: bool) -> Node:
        self.in_tile = True
        try:
            slow = self._loop(node, in_parallel)
            row_loop = _find_for(node, self.row_dim)
            col_loop = _find_for(node, self.col_dim)
            if row_loop is None or col_loop is None:  # a degenerate edge block: plain loops
                return slow
            row, rows, col, cols = self.sched.register_tile
            row_start = isl_expr_to_c(row_loop.for_get_init())
            col_start = isl_expr_to_c(col_loop.for_get_init())
            full = " && ".join(
                _substitute(isl_expr_to_c(loop.for_get_cond()), dim, f"(tcpy_{which}0 + {size - 1})")
                for loop, dim, which, size in ((row_loop, self.row_dim, "row", rows),
                                               (col_loop, self.col_dim, "col", cols)))
            self.fast = True
            fast = self._loop(node, in_parallel)
            self.fast = False
            others = tuple((v, e) for v, e in _first_point(slow).point
                           if v in self.stmt.output_vars and v not in (row, col))
            return RegisterTile(self.stmt_index, row, rows, row_start, col, cols, col_start, full,
                                others, (fast,), (slow,), self.panel)
        finally:
            self.in_tile = False

    def _output_point(self, node: Node) -> tuple[tuple[str, str], ...]:
        """The output variables' C expressions, found from the first point below ``node``."""
        point = _first_point(node)
        return tuple((v, e) for v, e in point.point if v in self.stmt.output_vars)

    def _point(self, expr: isl.AstExpr) -> Node:
        args = [isl_expr_to_c(expr.get_op_arg(i + 1)) for i in range(expr.get_op_n_arg() - 1)]
        point = Point(self.stmt_index, tuple(zip(self.vars, args)), self.mode)
        if self.mode == "register" and not self.in_accumulator:  # every reduction loop had extent 1
            return Accumulate(self.stmt_index, self._output_point(point), (point,))
        return point


def _find_for(node: isl.AstNode, name: str) -> Optional[isl.AstNode]:
    """The loop over iterator ``name`` along the chain of single-loop bodies from ``node``."""
    while node.get_type() == isl.ast_node_type.for_:
        if node.for_get_iterator().get_id().get_name() == name:
            return node
        node = node.for_get_body()
    return None


def _substitute(c_text: str, name: str, replacement: str) -> str:
    return re.sub(rf"\b{name}\b", replacement, c_text)


def _first_point(node: Node) -> Point:
    if isinstance(node, Point):
        return node
    body = node.body if not isinstance(node, Guard) else node.then
    return _first_point(body[0])


# ----------------------------------------------------------------------------- lowering


def input_shape(param: ast.Param, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete shape of an input from its declared dims (size variables or constants)."""
    return tuple(d.value if isinstance(d, ast.IntLit) else sizes[d.name] for d in param.type.dims)


def _identity_needed(stmt: ast.Stmt) -> bool:
    return stmt.reduction is not None and bool(stmt.reduction_vars)


def lower(def_: ast.Def, bound, options: Options, types: Mapping[str, ScalarType]) -> KernelIR:
    """Lower ``def_`` with ranges bound to concrete sizes (``bound`` from ``DefRanges.bind``).

    ``types`` maps every tensor name to its element type.
    """
    shapes = {p.name: input_shape(p, bound.sizes) for p in def_.params}
    shapes.update((name, tuple(shape)) for name, shape in bound.shapes.items())
    types = dict(types)
    stmts, all_ranges, origins, packs = [], [], [], []
    panels: dict[int, tuple[str, str]] = {}  # statement -> (operand, its panel copy)

    def add(stmt, ranges, origin):  # origin -1: a copy tcpy adds, into a temporary of its own
        stmts.append(stmt)
        all_ranges.append(ranges)
        origins.append(origin)
        if origin < 0:
            packs.append(stmt.target)

    for origin, (stmt, ranges) in enumerate(zip(def_.stmts, bound.statements)):
        stmt = inline_lets(stmt)
        if options.register_tile:
            packed = _pack_operand(stmt, ranges, shapes, types, options, f"tcpy_pack{len(packs)}")
            if packed is not None:
                pack_stmt, pack_ranges, stmt = packed
                add(pack_stmt, pack_ranges, -1)
            paneled = _panel_operand(stmt, ranges, shapes, types, options, f"tcpy_pack{len(packs)}")
            if paneled is not None:
                pack_stmt, pack_ranges, panel = paneled
                add(pack_stmt, pack_ranges, -1)
                panels[len(stmts)] = panel  # the statement added next reads the panels
        add(stmt, ranges, origin)
    stmts = tuple(stmts)
    nests: list[Nest] = []
    for index, (stmt, ranges) in enumerate(zip(stmts, all_ranges)):
        name = f"S{index}"
        vars_ = stmt.index_vars
        extents = {v: max(0, ranges[v][1] - ranges[v][0]) for v in vars_}
        if not _identity_needed(stmt):
            # `=`, or a reduction operator with no reduction variable, which TC treats as `=`
            # when it has `!` and as an in-place update otherwise.
            mode = "assign" if stmt.reduction is None or stmt.init else "memory"
            sched = choose_schedule(stmt, extents, shapes, types[stmt.target], options)
            sched = dataclasses.replace(sched, register_reduction=False)
            dom = _rect_set(name, vars_, ranges)
            ast_root = _build_ast(_schedule_map(name, vars_, sched, dom))
            body = _Lowerer(index, stmt, sched, mode, vars_).lower(ast_root)
            nests.append(Nest(index, "compute", body, sched))
            continue
        sched = choose_schedule(stmt, extents, shapes, types[stmt.target], options)
        if stmt.init and not sched.register_reduction:
            out_vars = stmt.output_vars
            init_sched = choose_schedule(
                ast.Stmt(stmt.target, stmt.lhs, None, False, ast.Access(stmt.target, stmt.lhs),
                         output_vars=out_vars),
                extents, shapes, types[stmt.target], options)
            dom = _rect_set(name, out_vars, ranges)
            ast_root = _build_ast(_schedule_map(name, out_vars, init_sched, dom))
            body = _Lowerer(index, stmt, init_sched, "init", out_vars).lower(ast_root)
            nests.append(Nest(index, "init", body, init_sched))
        dom = _rect_set(name, vars_, ranges)
        if sched.register_reduction and any(extents[v] == 0 for v in stmt.reduction_vars):
            # Empty reduction: isl would emit no loops at all, but every output element
            # still receives the identity (or keeps its value without `!`).
            body = _empty_reduction(index, stmt, sched, name, ranges)
        else:
            ast_root = _build_ast(_schedule_map(name, vars_, sched, dom))
            mode = "register" if sched.register_reduction else "memory"
            body = _Lowerer(index, stmt, sched, mode, vars_, panels.get(index)).lower(ast_root)
        nests.append(Nest(index, "compute", body, sched))
    return KernelIR(def_, stmts, shapes, types, dict(bound.sizes), tuple(nests), options,
                    tuple(origins), tuple(packs))


PANEL_MIN_COLUMNS = 512  # narrower operands stay in cache as they are


def _panel_operand(stmt, ranges, shapes, types, options, pack_name):
    """Copy the operand a register tile streams (``B`` in ``A(m,k) * B(k,n)``) into panels.

    The fast path of a register tile reads ``cols`` consecutive elements of ``B`` from each of
    many rows; when rows are long (and their stride a power of two) those reads conflict in
    the caches. The copy ``panel(nb, k, c) = B(k, cols*nb + c)`` makes them one contiguous
    stream. Returns ``(copy statement, its ranges, (B, copy name))`` or None.
    """
    if stmt.reduction is None or not stmt.reduction_vars:
        return None
    extents = {v: max(0, ranges[v][1] - ranges[v][0]) for v in stmt.index_vars}
    sched = choose_schedule(stmt, extents, shapes, types[stmt.target], options)
    if sched.register_reduction or sched.register_tile is None:
        return None
    _, _, col, cols = sched.register_tile
    for node in stmt.rhs.walk():
        if not (isinstance(node, ast.Access) and len(node.indices) >= 2
                and all(isinstance(i, ast.IndexVar) for i in node.indices)
                and not node.tensor.startswith("tcpy_pack")):
            continue
        names = [i.name for i in node.indices]
        if (names[-1] != col or col in names[:-1] or len(set(names)) != len(names)
                or not set(names) & set(stmt.reduction_vars)):
            continue
        shape = shapes[node.tensor]
        if shape[-1] < PANEL_MIN_COLUMNS:
            return None
        index_type = node.indices[0].type
        dims = tuple(f"tcpy_q{p}" for p in range(len(shape) - 1))
        block, lane = ast.IndexVar("tcpy_nb", type=index_type), ast.IndexVar("tcpy_cc", type=index_type)
        column = ast.Binary("+", ast.Binary("*", ast.IntLit(cols, type=index_type), block, type=index_type),
                            lane, type=index_type)
        source = ast.Access(node.tensor, tuple(ast.IndexVar(d, type=index_type) for d in dims) + (column,),
                            type=node.type)
        lhs = (block,) + tuple(ast.IndexVar(d, type=index_type) for d in dims) + (lane,)
        copy = ast.Stmt(pack_name, lhs, None, False, source, span=stmt.span,
                        output_vars=tuple(v.name for v in lhs))
        copy_ranges = {"tcpy_nb": (0, shape[-1] // cols), "tcpy_cc": (0, cols)}
        copy_ranges.update((d, (0, n)) for d, n in zip(dims, shape[:-1]))
        shapes[pack_name] = (shape[-1] // cols,) + tuple(shape[:-1]) + (cols,)
        types[pack_name] = types[node.tensor]
        return copy, copy_ranges, (node.tensor, pack_name)
    return None


def _pack_operand(stmt, ranges, shapes, types, options, pack_name):
    """Copy one operand of a dot-product shaped reduction into a transposed temporary.

    ``S(i,j) +=! Q(i,d) * K(j,d)`` reduces over ``d``, contiguous in both reads, so its best
    plain schedule is a dot product per output. Reading ``K`` through a copy laid out as
    ``(d, j)`` turns it into a GEMM, whose register tiles are several times faster. Returns
    ``(pack statement, its ranges, rewritten statement)`` or None when that does not apply.
    """
    if stmt.reduction is None or not stmt.reduction_vars or not stmt.output_vars:
        return None
    extents = {v: max(0, ranges[v][1] - ranges[v][0]) for v in stmt.index_vars}
    target_type = types[stmt.target]
    sched = choose_schedule(stmt, extents, shapes, target_type, options)
    if not sched.register_reduction or target_type.bits == 16:
        return None
    inner, col = sched.order[-1], stmt.output_vars[-1]
    reads = [n for n in stmt.rhs.walk() if isinstance(n, ast.Access) and n.indices]
    contiguous = [n for n in reads if isinstance(n.indices[-1], ast.IndexVar) and n.indices[-1].name == inner]
    if len(contiguous) < 2:  # a plain row reduction vectorizes as it is: only dot products gain
        return None
    for node in contiguous:
        if not (isinstance(node, ast.Access) and len(node.indices) >= 2
                and all(isinstance(i, ast.IndexVar) for i in node.indices)):
            continue
        names = [i.name for i in node.indices]
        if names[-1] != inner or col not in names[:-1] or len(set(names)) != len(names):
            continue
        pos = names.index(col)
        perm = [p for p in range(len(names)) if p != pos] + [pos]
        shape = shapes[node.tensor]
        pack_vars = tuple(f"tcpy_p{p}" for p in range(len(names)))
        index_type = node.indices[0].type
        # pack(p_perm...) = T(p0, p1, ...): the copy's dims are T's dims in `perm` order
        pack_lhs = tuple(ast.IndexVar(pack_vars[p], type=index_type) for p in perm)
        source = ast.Access(node.tensor, tuple(ast.IndexVar(v, type=index_type) for v in pack_vars),
                            type=node.type)
        pack_stmt = ast.Stmt(pack_name, pack_lhs, None, False, source, span=stmt.span,
                             output_vars=tuple(v.name for v in pack_lhs))
        packed_read = ast.Access(pack_name, tuple(node.indices[p] for p in perm), type=node.type)
        rewritten = dataclasses.replace(stmt, rhs=map_expr(stmt.rhs, lambda e: packed_read if e == node else e))
        new_shapes = dict(shapes)
        new_shapes[pack_name] = tuple(shape[p] for p in perm)
        if choose_schedule(rewritten, extents, new_shapes, target_type, options).register_tile is None:
            return None
        shapes[pack_name] = new_shapes[pack_name]
        types[pack_name] = types[node.tensor]
        pack_ranges = {pack_vars[p]: (0, shape[p]) for p in range(len(names))}
        return pack_stmt, pack_ranges, rewritten
    return None


def _empty_reduction(index, stmt, sched, name, ranges) -> tuple[Node, ...]:
    out_vars = stmt.output_vars
    if not stmt.init:
        return ()  # T op= (identity) leaves T unchanged
    init_sched = StmtSchedule(order=tuple(v for v in sched.order if v in out_vars), reductions=(), tiles=(),
                              parallel_dims=0, simd=False, register_reduction=False, unroll=0)
    dom = _rect_set(name, out_vars, ranges)
    ast_root = _build_ast(_schedule_map(name, out_vars, init_sched, dom))
    return _Lowerer(index, stmt, init_sched, "init", out_vars).lower(ast_root)
