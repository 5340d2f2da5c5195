"""Lower a checked def with bound ranges into loop nests (:mod:`tcpy.loopir`), with isl.

:func:`build_program` binds a def to concrete sizes: let-inlined statements with their ranges,
shapes and types. :func:`lower` turns each statement into up to two nests over its
(rectangular, shape-specialised) domain:

* an *init* nest for ``!`` reductions that accumulate in memory (sets the target to the
  reduction's identity over the output variables' ranges);
* the *compute* nest, whose loops come from isl: the statement's schedule (see
  :mod:`tcpy.schedule`) is written as an isl map ``S[vars] -> [tiles..., points...]`` and
  ``AstBuild.node_from_schedule_map`` produces the loops, with exact bounds for partial tiles.

Index variables reach isl under generated names (``x0, x1, ...``), never the user's: a user's
``nan`` or ``mod`` would otherwise be read as an isl keyword.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import islpy as isl

from .lang import ast
from .lang.types import ScalarType, accumulator_type
from .lang.visit import inline_lets
from .loopir import (
    BLOCK_START, Accumulate, BinOp, Block, Const, ContractionNest, FusedGroup, Guard, KernelIR, Loop, Mode, Nest,
    NestKind, Node, OnlineStep, Point, Program, Scratch, Statement, Var, first_point, from_isl,
)
from .lower_chains import lower_chain
from .generic import GenericSizes
from .options import Options
from .schedule import Level, StmtSchedule, volume
from .transform.phases import quotient
from .transform.snapshot import snapshot_own_reads


def build_program(def_: ast.Def, bound, types: Mapping[str, ScalarType],
                  generic: Optional[GenericSizes] = None) -> Program:
    """``def_`` bound to concrete sizes (``bound`` from ``DefRanges.bind``); ``types`` maps every
    tensor name to its element type. A statement that reads its own target where it also writes
    reads a snapshot taken before it (:mod:`tcpy.transform.snapshot`). With ``generic`` (see
    :mod:`tcpy.generic`), the sizes are nominal: the passes plan with them, but the loops and
    strides are rendered for the sizes of each call."""
    shapes = {p.name: p.type.shape(bound.sizes) for p in def_.params}
    shapes.update((name, tuple(shape)) for name, shape in bound.shapes.items())
    statements = tuple(Statement(inline_lets(stmt), dict(ranges), origin)
                       for origin, (stmt, ranges) in enumerate(zip(def_.stmts, bound.statements)))
    # every path computes in place: a statement reading what it writes reads a snapshot
    return snapshot_own_reads(Program(def_, statements, shapes, types, bound.sizes, generic=generic))


# ----------------------------------------------------------------------------- isl


def _isl_names(vars_: tuple[str, ...]) -> dict[str, str]:
    return {v: f"x{i}" for i, v in enumerate(vars_)}


def _rect_set(name: str, vars_: tuple[str, ...], ranges: Mapping[str, tuple[int, int]],
              fixed: Mapping[str, str]) -> isl.Set:
    """The statement's rectangular domain; ``fixed`` variables equal the parameters named there
    (the loops of a fused group around the nest)."""
    names = _isl_names(vars_)
    cons = [f"{ranges[v][0]} <= {names[v]} < {ranges[v][1]}" for v in vars_]
    cons += [f"{names[v]} = {param}" for v, param in fixed.items() if v in names]
    params = f"[{', '.join(fixed.values())}] -> " if fixed else ""
    return isl.Set(f"{params}{{ {name}[{', '.join(names[v] for v in vars_)}] : {' and '.join(cons) or 'true'} }}")


def _schedule_map(name: str, vars_: tuple[str, ...], sched: StmtSchedule, domain: isl.Set) -> isl.Map:
    names = _isl_names(vars_)
    outs = list(sched.dim_exprs(names))
    if not outs:  # a scalar statement still needs one schedule dimension
        outs = ["0"]
    text = f"{{ {name}[{', '.join(names[v] for v in vars_)}] -> [{', '.join(outs)}] }}"
    return isl.Map(text).intersect_domain(domain)


def _build_ast(schedule_map: isl.Map, context: isl.Set) -> Optional[isl.AstNode]:
    if schedule_map.is_empty():
        return None
    build = isl.AstBuild.from_context(context)
    return build.node_from_schedule_map(isl.UnionMap.from_map(schedule_map))


def _phase_ast(name: str, vars_: tuple[str, ...], sched: StmtSchedule, domain: isl.Set,
               context: isl.Set) -> Optional[isl.AstNode]:
    """The loops of a statement split by phase (:mod:`tcpy.transform.phases`) over its
    ``domain``: one isl statement ``<name>_<residues>`` per residue combination, over its split
    variables' quotients ``q`` (the points ``s*q + r`` of the domain), scheduled together."""
    names = _isl_names(vars_)
    strides = dict(sched.phases)
    pieces = [()]
    for v, stride in sched.phases:
        pieces = [piece + (r,) for piece in pieces for r in range(stride)]
    points = ", ".join(names[v] for v in vars_)
    schedule = None
    for piece in pieces:
        residues = {v: r for (v, _), r in zip(sched.phases, piece)}
        label = "_".join((name,) + tuple(map(str, piece)))
        values = ", ".join(f"{strides[v]}*{names[v]} + {residues[v]}" if v in residues else names[v] for v in vars_)
        piece_domain = isl.Map(f"{{ {label}[{points}] -> {name}[{values}] }}").intersect_range(domain).domain()
        piece_map = isl.Map(f"{{ {label}[{points}] -> [{', '.join(sched.dim_exprs(names, residues))}] }}")
        piece_map = isl.UnionMap.from_map(piece_map.intersect_domain(piece_domain))
        schedule = piece_map if schedule is None else schedule.union(piece_map)
    if schedule is None or schedule.is_empty():
        return None
    # the innermost (SIMD) loop's last, partial period apart: the loop body holds no guard
    dims = sched.dims()
    inner = max(i for i, (_, level) in enumerate(dims) if level is not Level.PHASE)
    separate = isl.UnionMap(f"{{ [{', '.join(f'd{i}' for i in range(len(dims)))}] -> separate[{inner}] }}")
    return isl.AstBuild.from_context(context).set_options(separate).node_from_schedule_map(schedule)


class _Lowerer:
    """Walks an isl AST and produces loop IR for one nest."""

    def __init__(self, stmt_index: int, stmt: ast.Stmt, sched: Optional[StmtSchedule], mode: Mode,
                 vars_: tuple[str, ...]):
        self.stmt_index = stmt_index
        # a split reduction's part is its outermost (parallel) schedule dimension
        self.part = Var("c0") if sched and sched.split else None
        self.stmt = stmt
        self.sched = sched
        self.mode = mode
        self.vars = vars_
        dims = sched.dims() if sched else tuple((v, Level.POINT) for v in vars_)
        names = [f"c{i}" for i in range(len(dims))]
        self.parallel = set(names[: sched.parallel_dims]) if sched else set()
        loops = [name for name, (_, level) in zip(names, dims) if level is not Level.PHASE]  # (residues: no loop)
        self.innermost = loops[-1] if loops else None
        self.phases = sched.phases if sched else ()
        # Schedule dimensions of the reduction loops that accumulate in a register; the first
        # one isl emits as a loop opens the accumulator (isl drops loops of extent 1).
        self.reduction_dims = {
            name for name, (v, level) in zip(names, dims) if level is Level.POINT and v in stmt.reduction_vars
        } if sched and sched.register_reduction else set()
        self.in_accumulator = False

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
            return (Guard(from_isl(node.if_get_cond()), self.lower(node.if_get_then_node(), in_parallel), other),)
        if kind == isl.ast_node_type.user:
            return (self._point(node.user_get_expr()),)
        if kind == isl.ast_node_type.for_:
            return (self._loop(node, in_parallel),)
        if kind == isl.ast_node_type.mark:
            return self.lower(node.mark_get_node(), in_parallel)
        raise NotImplementedError(f"isl AST node {kind}")

    def _loop(self, node: isl.AstNode, in_parallel: bool) -> Node:
        var = node.for_get_iterator().get_id().get_name()
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
            lo=from_isl(node.for_get_init()),
            cond=from_isl(node.for_get_cond()),
            step=int(node.for_get_inc().get_val().to_python()),
            body=self.lower(node.for_get_body(), in_parallel or collapse > 0),
            parallel=collapse,
            chunks=self.sched.chunks if collapse else 0,
            simd=simd,
            simd_reduction=simd_reduction,
            unroll=self.sched.unroll if (self.sched and var == self.innermost) else 0,
        )
        if opens_accumulator:
            self.in_accumulator = False
            return Accumulate(self.stmt_index, self._output_point(loop), (loop,), self.part)
        return loop

    def _output_point(self, node: Node):
        """The output variables' values, found from the first point below ``node``."""
        return tuple((v, e) for v, e in first_point(node).point if v in self.stmt.output_vars)

    def _point(self, expr: isl.AstExpr) -> Node:
        args = [from_isl(expr.get_op_arg(i + 1)) for i in range(expr.get_op_n_arg() - 1)]
        values = tuple(zip(self.vars, args))
        residues = ()
        if self.phases:  # a piece S<index>_<r0>_<r1>...: its split variables' values are quotients
            names = expr.get_op_arg(0).get_id().get_name().split("_")[1:]
            residues = tuple((v, stride, int(r)) for (v, stride), r in zip(self.phases, names))
            split = {v: (stride, r) for v, stride, r in residues}
            values = tuple((v, BinOp("+", BinOp("*", Const(split[v][0]), e), Const(split[v][1])) if v in split else e)
                           for v, e in values) + tuple((quotient(v), e) for v, e in values if v in split)
        point = Point(self.stmt_index, values, self.mode, residues)
        if self.mode is Mode.REGISTER and not self.in_accumulator:  # every reduction loop had extent 1
            return Accumulate(self.stmt_index, self._output_point(point), (point,), self.part)
        return point


# ----------------------------------------------------------------------------- lowering


def _identity_needed(stmt: ast.Stmt) -> bool:
    return stmt.reduction is not None and bool(stmt.reduction_vars)


def _nest(index: int, stmt: ast.Stmt, sched: StmtSchedule, mode: Mode, vars_, ranges,
          fixed: Mapping[str, str], generic: Optional[tuple[GenericSizes, int, Optional[isl.Set]]] = None
          ) -> tuple[Node, ...]:
    """The loops of one nest over ``vars_``; with ``generic`` (sizes, the statement's origin,
    the context of the fused group's loops around it if any), over the ranges as functions of
    the sizes instead of ``ranges``."""
    name = f"S{index}"
    if generic is not None:
        sizes, origin, group_context = generic
        domain = sizes.domain(name, origin, vars_, _isl_names(vars_), fixed)
        context = group_context if fixed else sizes.context()
    else:
        domain = _rect_set(name, vars_, ranges, fixed)
        # the loops around the nest range over the fixed variables' ranges: isl needs no guards
        bounds = " and ".join(f"{ranges[v][0]} <= {param} < {ranges[v][1]}" for v, param in fixed.items())
        context = isl.Set(f"[{', '.join(fixed.values())}] -> {{ : {bounds} }}" if fixed else "{ : }")
    if sched is not None and sched.phases:
        ast_root = _phase_ast(name, vars_, sched, domain, context)
    else:
        ast_root = _build_ast(_schedule_map(name, vars_, sched, domain), context)
    return _Lowerer(index, stmt, sched, mode, vars_).lower(ast_root)


def lower(program: Program, options: Options) -> KernelIR:
    """Loop nests for every statement of ``program`` (a fused group gives one nest)."""
    nests: list[Nest] = []
    scratch: list[Scratch] = []
    groups = {g.statements[0]: g for g in program.groups}
    fused = {i for g in program.groups for i in g.statements}
    fused.update(i for e in program.epilogues for i in e.members)  # run in their contraction's store
    for index in range(len(program.statements)):
        if index in groups:
            nests.append(_fused_nest(program, groups[index]))
        elif index not in fused:
            nests.extend(_statement_nests(program, index, {}, scratch))
    return KernelIR(program, tuple(nests), options, tuple(scratch))


def _statement_nests(program: Program, index: int, fixed: Mapping[str, str],
                     scratch: list[Scratch], group_context: Optional[isl.Set] = None) -> list[Nest]:
    """The nests of one statement (init, compute, combine); ``fixed`` variables are loops of a
    fused group around them (in a generic program, ``group_context`` bounds them). Split
    reductions add their partials to ``scratch``."""
    statement = program.statements[index]
    stmt, ranges = statement.stmt, statement.ranges
    engine = statement.engine
    # a generic program's loops run over its ranges at the call's sizes
    generic = (program.generic, statement.origin, group_context) if program.generic is not None else None
    if engine is not None:  # GEMM-class: the contraction engine's packed, blocked nest
        epilogue = next((e for e in program.epilogues if e.producer == index), None)
        return [Nest(index, NestKind.COMPUTE, (ContractionNest(index, engine.contraction, engine.plan, epilogue),))]
    sched, outputs_sched = statement.loops.compute, statement.loops.outputs
    if not _identity_needed(stmt):
        # `=`, or a reduction operator with no reduction variable, which TC treats as `=`
        # when it has `!` and as an in-place update otherwise.
        mode = Mode.ASSIGN if stmt.reduction is None or stmt.init else Mode.MEMORY
        sched = dataclasses.replace(sched, register_reduction=False)
        body = _nest(index, stmt, sched, mode, stmt.index_vars, ranges, fixed, generic)
        if statement.scales_sum_over and generic is not None:  # (not where the scaled sum is empty)
            body = (Guard(program.generic.nonempty(statement.origin, statement.scales_sum_over), body),)
        return [Nest(index, NestKind.COMPUTE, body, sched)]
    nests = []
    out_vars = stmt.output_vars
    if stmt.init and not sched.register_reduction:
        nests.append(Nest(index, NestKind.INIT,
                          _nest(index, stmt, outputs_sched, Mode.INIT, out_vars, ranges, fixed, generic),
                          outputs_sched))
    mode = Mode.REGISTER if sched.register_reduction else Mode.MEMORY
    if sched.register_reduction and generic is not None:
        # the reduction may be empty at some sizes: then the identity's nest runs instead
        body = (Guard(program.generic.nonempty(statement.origin, stmt.reduction_vars),
                      _nest(index, stmt, sched, mode, stmt.index_vars, ranges, fixed, generic),
                      _empty_reduction(index, stmt, sched, ranges, fixed, generic)),)
    elif sched.register_reduction and any(ranges[v][1] <= ranges[v][0] for v in stmt.reduction_vars):
        # Empty reduction: isl would emit no loops at all, but every output element
        # still receives the identity (or keeps its value without `!`).
        body = _empty_reduction(index, stmt, sched, ranges, fixed)
    else:
        body = _nest(index, stmt, sched, mode, stmt.index_vars, ranges, fixed, generic)
    nests.append(Nest(index, NestKind.COMPUTE, body, sched))
    if sched.split and body:
        parts = sched.split[2]
        scratch.append(Scratch(f"partial.{index}", (parts,) + tuple(program.shapes[stmt.target]),
                               accumulator_type(program.types[stmt.target]), index))
        nests.append(Nest(index, NestKind.COMBINE,
                          _nest(index, stmt, outputs_sched, Mode.COMBINE, out_vars, ranges, fixed, generic),
                          outputs_sched))
    return nests


def _fused_nest(program: Program, group: FusedGroup) -> Nest:
    """One nest for a fused group: loops over the shared variables (parallel as the group's
    stamp says), around each statement's own nests and the group's per-iteration buffers; a
    chain's as its plan says (:mod:`tcpy.lower_chains`)."""
    first = program.statements[group.statements[0]]
    loop_vars = {v: f"g{k}" for k, v in enumerate(group.shared)}
    if group.chain:
        return Nest(group.statements[0], NestKind.COMPUTE, (lower_chain(program, group, loop_vars, _group_rows),),
                    None, group)
    iterations = volume(max(first.ranges[v][1] - first.ranges[v][0], 0) for v in group.shared)
    generic = program.generic
    context = generic.group_context(first.origin, group.shared, loop_vars) if generic is not None else None
    nodes = _group_rows(program, group, loop_vars, {}, {}, context)
    for depth in reversed(range(len(group.shared))):
        v = group.shared[depth]
        # a generic program's loops run over the call's ranges
        lo, hi = generic.bounds(first.origin, v) if generic is not None else map(Const, first.ranges[v])
        collapse = len(group.shared) if group.parallel and depth == 0 else 0
        nodes = (Loop(loop_vars[v], lo, BinOp("<", Var(loop_vars[v]), hi), 1, nodes,
                      parallel=collapse, chunks=iterations if collapse else 0),)
    return Nest(group.statements[0], NestKind.COMPUTE, nodes, None, group)


def _group_rows(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                blocked: Mapping[str, tuple[str, int]], steps: Mapping[int, OnlineStep],
                context: Optional[isl.Set] = None) -> tuple[Node, ...]:
    """A fused group's statements at one point of the shared loops (a chain's: those between
    its products, on views of the ``blocked`` buffers (tensor -> (buffer, row elements: a count, or
    an expression known at run time))), inside
    a block declaring its per-iteration buffers; each statement in ``steps`` followed by its
    step (an online chain's, :class:`tcpy.loopir.OnlineStep`); ``context``: a generic
    program's sizes and shared loops (:meth:`tcpy.generic.GenericSizes.group_context`)."""
    chain = group.chain
    rows = group.rows
    if chain and chain.deferred:
        rows = tuple(i for i in rows if i != chain.deferred.statement)  # (divides the product's rows)
    body: list[Node] = []
    for index in rows:
        for nest in _statement_nests(program, index, loop_vars, [], context):
            body.extend(nest.body)
        if index in steps:
            body.append(steps[index])
    buffers = tuple((local, tuple(program.shapes[local]), program.types[local], local in group.zeroed)
                    for tensor, local in group.locals if tensor not in blocked)
    views = tuple((local, blocked[tensor][0],
                   BinOp("*", BinOp("-", Var(loop_vars[chain.block_var]), Var(BLOCK_START)),
                         Const(blocked[tensor][1]) if isinstance(blocked[tensor][1], int) else blocked[tensor][1]))
                  for tensor, local in group.locals if tensor in blocked)
    if not body:
        return ()  # (a chain of two products: nothing runs between them)
    return (Block(buffers, tuple(body), views),) if buffers or views else tuple(body)


def _empty_reduction(index, stmt, sched, ranges, fixed, generic=None) -> tuple[Node, ...]:
    out_vars = stmt.output_vars
    if not stmt.init:
        return ()  # T op= (identity) leaves T unchanged
    init_sched = StmtSchedule(order=tuple(v for v in sched.order if v in out_vars), reductions=(), tiles=(),
                              parallel_dims=0, simd=False, register_reduction=False, unroll=0)
    return _nest(index, stmt, init_sched, Mode.INIT, out_vars, ranges, fixed, generic)
