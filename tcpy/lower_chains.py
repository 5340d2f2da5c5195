"""Lower a fused chain to its loop IR (:class:`tcpy.loopir.BlockChain`), as its plan says.

Everything here reads the chain's :class:`tcpy.loopir.ChainPlan` (stamped by
:mod:`tcpy.transform.chains`): the loops over the batches and blocks of rows, the per-thread
and shared buffers, the products on a block with their bases in the loops' variables, and an
online chain's blocks of columns (:class:`tcpy.loopir.KeyBlocks`) with the steps folding each
block into the rows' running maximum and sum (:class:`tcpy.loopir.OnlineStep`). The rows
between the products are lowered by the caller's ``group_rows`` (:mod:`tcpy.loopnest`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional

from .lang import ast
from .lang.types import ScalarType
from .lang.visit import map_expr
from .loopir import (
    BLOCK_ROWS, BLOCK_START, KEY_COLUMNS, KEY_START, OLD_MAXIMUM, ROW_PITCH, BinOp, BlockChain, BlockProduct, ChainProduct,
    Const, FusedGroup, IExpr, KeyBlocks, Node, OnlineKind, OnlineStep, Prepack, Program, Var,
)
from .transform.runtime_chains import most_rows

# An online chain's per-thread buffers: each row's running maximum, sum and rescaling factor,
# and its flag (computed again whole).
ONLINE_RUNNING = ("online.max", "online.sum", "online.factor")
ONLINE_FLAGS = "online.redo"

# group_rows(program, group, loop_vars, blocked, steps, context): the nodes of the statements
# between a chain's products at one point of its loops, on views of the ``blocked`` buffers
# (tensor -> (buffer, row elements: a count or an expression)), each statement in ``steps`` followed by its step (a
# generic program's ``context``: its sizes and the chain's loops, else None).
GroupRows = Callable[[Program, FusedGroup, Mapping[str, str], Mapping[str, tuple[str, int | IExpr]],
                      Mapping[int, OnlineStep], object], tuple[Node, ...]]


def lower_chain(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                group_rows: GroupRows) -> BlockChain:
    """The loops of a fused chain (see :class:`tcpy.loopir.BlockChain`), ``loop_vars`` naming
    the shared loops."""
    chain, plan = group.chain, group.chain.plan
    if program.generic is not None:
        return _generic_chain(program, group, loop_vars, group_rows)
    ranges = program.statements[group.statements[0]].ranges
    loops = tuple((loop_vars[v], *ranges[v]) for v in group.shared[:-1])
    loops += ((BLOCK_START, *ranges[chain.block_var]),)
    blocked = {tensor: (buffer, row) for tensor, buffer, row in plan.blocked}
    scratch = [(buffer, plan.rows * row, program.types[tensor]) for tensor, buffer, row in plan.blocked]
    products = _block_products(program, group, loop_vars, plan.products, plan.columns > 0)
    heads, tails = products[:chain.heads], products[chain.heads:]
    if not plan.columns:
        body = group_rows(program, group, loop_vars, blocked, {})
    else:
        body = _online_rows(program, group, loop_vars, blocked, plan.columns, group_rows)
    deferred = online = None
    if chain.deferred is not None:
        deferred = (*blocked[chain.deferred.numerator], blocked[chain.deferred.divisor][0])
    if plan.columns:
        online = _key_blocks(program, group, loop_vars, group_rows)
        scratch += [(name, plan.rows, program.types[chain.deferred.numerator]) for name in ONLINE_RUNNING]
        scratch += [(ONLINE_FLAGS, plan.rows, ScalarType.INT32)]
        scratch += [(buffer, row, program.types[tensor]) for tensor, buffer, row in plan.whole]
    packed = list(plan.packed)
    if plan.prepack is not Prepack.SHARED:
        scratch, packed = scratch + packed, []
    return BlockChain(loops, plan.rows, loop_vars[chain.block_var], tuple(scratch), tuple(packed), heads, body,
                      tails, group.parallel, plan.chunks, deferred, online, plan.prepack)


def _block_products(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                    products: tuple[ChainProduct, ...], on_columns: bool) -> tuple[BlockProduct, ...]:
    """The chain's ``products`` with their operands' bases in the loops' variables (the block's
    first row, and with ``on_columns`` the block's first column)."""
    chain = group.chain
    column = chain.online.column_var if on_columns else None
    out = []
    for product in products:
        ranges = program.statements[product.stmt].ranges
        exprs = []
        for base in product.bases:
            offset: IExpr = Const(base.offset)
            for v, stride in base.strides:
                at = Var(BLOCK_START if v == chain.block_var else KEY_START if v == column else loop_vars[v])
                offset = BinOp("+", offset, BinOp("*", Const(stride), BinOp("-", at, Const(ranges[v][0]))))
            exprs.append((base.tensor, offset))
        out.append(BlockProduct(product.stmt, product.contraction, product.plan, tuple(exprs), Var(BLOCK_ROWS),
                                product.prepacked, product.cleared))
    return tuple(out)


def _online_rows(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                 blocked: Mapping[str, tuple[str, int]], columns: int, group_rows: GroupRows,
                 context=None) -> tuple[Node, ...]:
    """An online chain's rows on one block of ``columns`` columns, with the steps folding the
    block into the running maximum and sum (``context``: a generic program's, whose statements
    come with their loops on a block of columns)."""
    chain, plan = group.chain, group.chain.plan
    online = chain.online
    if context is None:
        statements = list(program.statements)
        stamps = plan.block_loops if columns == plan.columns else plan.last_block_loops
        for i, loops in zip((online.maximum, online.exponential, online.total), stamps):
            ranges = {**statements[i].ranges, online.column_var: (0, columns)}
            statements[i] = dataclasses.replace(statements[i], ranges=ranges, loops=loops)
        program = dataclasses.replace(program, statements=tuple(statements))
    row = BinOp("-", Var(loop_vars[chain.block_var]), Var(BLOCK_START))
    scores = program.statements[online.maximum].stmt.rhs.tensor  # (its row's local name)
    old = ast.Access(OLD_MAXIMUM, (), type=program.types[scores])

    def at_old(e):
        return old if isinstance(e, ast.Access) and e.tensor == scores else None

    rescale = map_expr(program.statements[online.exponential].stmt.rhs, at_old)
    point = tuple((v, Var(loop_vars[v])) for v in group.shared)
    steps = {
        online.maximum: OnlineStep(OnlineKind.MAX, online.exponential, point, row,
                                   program.statements[online.maximum].stmt.target, *ONLINE_RUNNING[0::2], rescale),
        online.total: OnlineStep(OnlineKind.SUM, online.total, point, row,
                                 program.statements[online.total].stmt.target, *ONLINE_RUNNING[1:]),
    }
    return group_rows(program, group, loop_vars, blocked, steps, context)


def _key_blocks(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                group_rows: GroupRows) -> KeyBlocks:
    """The blocks of columns of an online chain, its last shorter block's products and rows,
    and the chain on one whole row (in the plan's ``whole`` buffers)."""
    chain, plan = group.chain, group.chain.plan
    online = chain.online
    lo, hi = program.statements[online.maximum].ranges[online.column_var]
    blocked = {tensor: (buffer, row) for tensor, buffer, row in plan.blocked}
    last: Optional[tuple] = None
    if plan.last_products is not None:
        head, tail = _block_products(program, group, loop_vars, plan.last_products, True)
        last = (head, _online_rows(program, group, loop_vars, blocked, (hi - lo) % plan.columns, group_rows),
                tail)
    whole = {tensor: (buffer, row) for tensor, buffer, row in plan.whole}
    head, tail = _block_products(program, group, loop_vars, plan.whole_products, False)
    whole_deferred = (whole[chain.deferred.numerator][0], hi - lo, whole[chain.deferred.divisor][0])
    whole_rows = (head, group_rows(program, group, loop_vars, whole, {}), tail, whole_deferred)
    return KeyBlocks(KEY_START, lo, hi, plan.columns, last, ONLINE_RUNNING, ONLINE_FLAGS, whole_rows, plan.panels)


def _generic_chain(program: Program, group: FusedGroup, loop_vars: Mapping[str, str],
                   group_rows: GroupRows) -> BlockChain:
    """A size-generic kernel's online chain: its loops over the call's ranges, the rows of a
    block of columns over ``KEY_COLUMNS`` columns (the block's, a run-time value: the last
    block is shorter), and its products' operands where the chain's plan buffer says
    (:mod:`tcpy.transform.runtime_chains`: the bases are the renderer's, from that buffer), its
    block buffers' rows ``ROW_PITCH`` apart (the call's, from that buffer too)."""
    chain, plan = group.chain, group.chain.plan
    online, generic = chain.online, program.generic
    first = program.statements[group.statements[0]]
    context = generic.group_context(first.origin, group.shared, loop_vars)
    loops = tuple((loop_vars[v], *generic.bounds(first.origin, v)) for v in group.shared[:-1])
    loops += ((BLOCK_START, *generic.bounds(first.origin, chain.block_var)),)
    # the block buffers' rows are the call's pitch apart (runtime_chains: fewer columns, more rows)
    blocked = {tensor: (buffer, Var(ROW_PITCH) if row > 1 else row) for tensor, buffer, row in plan.blocked}
    most = most_rows(plan)
    scratch = [(buffer, plan.rows * row if row > 1 else most, program.types[tensor])
               for tensor, buffer, row in plan.blocked]
    scratch += [(name, most, program.types[chain.deferred.numerator]) for name in ONLINE_RUNNING]
    scratch += [(ONLINE_FLAGS, most, ScalarType.INT32)]
    scratch += [(buffer, row, program.types[tensor]) for tensor, buffer, row in plan.whole]  # (row: nominal)

    def products(planned):
        return tuple(BlockProduct(p.stmt, p.contraction, p.plan, tuple((b.tensor, Const(0)) for b in p.bases),
                                  Var(BLOCK_ROWS)) for p in planned)

    heads, tails = products(plan.products[:chain.heads]), products(plan.products[chain.heads:])
    # the three statements on a block of columns: the column variable from 0 to KEY_COLUMNS
    statements = list(program.statements)
    steps = (online.maximum, online.exponential, online.total)
    for i, loops_ in zip(steps, plan.block_loops):
        statements[i] = dataclasses.replace(statements[i], loops=loops_)
    origins = tuple(program.statements[i].origin for i in steps)
    on_block = dataclasses.replace(program, statements=tuple(statements),
                                   generic=generic.counted(origins, online.column_var, KEY_COLUMNS))
    body = _online_rows(on_block, group, loop_vars, blocked, plan.columns, group_rows, context)
    whole = {tensor: (buffer, row) for tensor, buffer, row in plan.whole}
    whole_head, whole_tail = products(plan.whole_products)
    column_lo, column_hi = generic.bounds(program.statements[online.maximum].origin, online.column_var)
    width = BinOp("-", column_hi, column_lo)
    whole_rows = (whole_head, group_rows(program, group, loop_vars, whole, {}, context), whole_tail,
                  (whole[chain.deferred.numerator][0], width, whole[chain.deferred.divisor][0]))
    keys = KeyBlocks(KEY_START, column_lo, column_hi, plan.columns, None, ONLINE_RUNNING, ONLINE_FLAGS, whole_rows)
    deferred = (*blocked[chain.deferred.numerator], blocked[chain.deferred.divisor][0])
    return BlockChain(loops, plan.rows, loop_vars[chain.block_var], tuple(scratch), (), heads, body, tails,
                      group.parallel, 0, deferred, keys, Prepack.NONE)
