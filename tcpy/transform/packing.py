"""Operand copies that make reductions read memory the way register tiles want it.

Two copies, both added as statements of their own (writing a temporary named ``pack.<n>``)
before the statement that reads them:

* a **transposed copy** of one operand of a dot-product shaped reduction:
  ``S(i,j) +=! Q(i,d) * K(j,d)`` reduces over ``d``, contiguous in both reads, so its best
  plain schedule is a dot product per output. Reading ``K`` through a copy laid out as
  ``(d, j)`` turns it into a GEMM, whose register tiles are several times faster. Only an
  operand that some output variable does not index is copied: its elements serve many outputs.
  One indexed by every output variable (``R(i) +=! X(i,d) * Y(i,d)``, a row sum of products)
  is read once in place by the row reduction; a copy would only add a pass over it.
* a **panel copy** of the operand a register tile streams (``B`` in ``A(m,k) * B(k,n)``):
  the fast path reads ``cols`` consecutive elements of ``B`` from each of many rows; when rows
  are long those reads conflict in the caches. ``panel(nb, k, c) = B(k, cols*nb + c)`` makes
  them one contiguous stream. The statement is marked with a :class:`~tcpy.loopir.Panel`; the
  register-tile pass reads it.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from ..lang import ast
from ..lang.visit import map_expr
from ..loopir import PANEL_BLOCK, PANEL_LANE, Panel, Program, Statement
from ..options import Options
from .engines import restamp, stamp_loops

PANEL_MIN_COLUMNS = 512  # narrower operands stay in cache as they are
COPY_PREFIX = "pack."  # (a "." keeps generated names apart from TC identifiers)


def pack_operands(program: Program, options: Options) -> Program:
    """``program`` with transposed and panel copies added where register tiles gain from them."""
    if not options.register_tile or program.generic is not None:
        return program  # (a generic kernel's register tiles read their operands in place: copies are sized when planned)
    statements: list[Statement] = []
    shapes, types = dict(program.shapes), dict(program.types)
    copies, rewritten = 0, []
    for statement in program.statements:
        if statement.origin >= 0 and statement.engine is None:
            for make in (_transposed_copy, _panel_copy):
                made = make(statement, shapes, types, options, f"{COPY_PREFIX}{copies}")
                if made is not None:
                    copy, statement, shape = made
                    shapes[copy.stmt.target] = shape
                    types[copy.stmt.target] = types[_copied_tensor(copy)]
                    statements.append(stamp_loops(copy, shapes, types, options))
                    copies += 1
                    rewritten.append(len(statements))
        statements.append(statement)
    packed = Program(program.def_, tuple(statements), shapes, types, program.sizes)
    for index in rewritten:  # (they read a copy now)
        statements[index] = restamp(statements[index], packed, options)
    return dataclasses.replace(packed, statements=tuple(statements))


def _copied_tensor(copy: Statement) -> str:
    assert isinstance(copy.stmt.rhs, ast.Access)
    return copy.stmt.rhs.tensor


def _plain_reads(stmt: ast.Stmt):
    """Reads of the statement whose indices are distinct plain index variables, rank >= 2."""
    for node in stmt.rhs.walk():
        if (isinstance(node, ast.Access) and len(node.indices) >= 2
                and all(isinstance(i, ast.IndexVar) for i in node.indices)
                and len({i.name for i in node.indices}) == len(node.indices)):
            yield node


def _copy_statement(name: str, lhs: tuple[ast.IndexVar, ...], source: ast.Access, span,
                    ranges: Mapping[str, tuple[int, int]]) -> Statement:
    stmt = ast.Stmt(name, lhs, None, False, source, span=span, output_vars=tuple(v.name for v in lhs))
    return Statement(stmt, dict(ranges), -1)


def _transposed_copy(statement: Statement, shapes, types, options: Options, name: str):
    """(copy, the statement reading it, the copy's shape) for a dot-product reduction, or None."""
    stmt = statement.stmt
    if stmt.reduction is None or not stmt.reduction_vars or not stmt.output_vars:
        return None
    target_type = types[stmt.target]
    sched = statement.loops.compute
    if not sched.register_reduction or target_type.bits == 16:
        return None
    inner, col = sched.order[-1], stmt.output_vars[-1]
    reads = [n for n in stmt.rhs.walk() if isinstance(n, ast.Access) and n.indices]
    contiguous = [n for n in reads if isinstance(n.indices[-1], ast.IndexVar) and n.indices[-1].name == inner]
    if len(contiguous) < 2:  # a plain row reduction vectorizes as it is: only dot products gain
        return None
    for node in _plain_reads(stmt):
        names = [i.name for i in node.indices]
        if node not in contiguous or col not in names[:-1]:
            continue
        if set(stmt.output_vars) <= set(names):
            continue  # each element serves one output (a row sum of products): no tile reuses it
        pos = names.index(col)
        perm = [p for p in range(len(names)) if p != pos] + [pos]
        shape = shapes[node.tensor]
        index_type = node.indices[0].type
        copy_vars = tuple(ast.IndexVar(f"pack.p{p}", type=index_type) for p in range(len(names)))
        # copy(p_perm...) = T(p0, p1, ...): the copy's dims are T's dims in `perm` order
        source = ast.Access(node.tensor, copy_vars, type=node.type)
        copy_read = ast.Access(name, tuple(node.indices[p] for p in perm), type=node.type)
        rewritten = dataclasses.replace(stmt, rhs=map_expr(stmt.rhs, lambda e: copy_read if e == node else e))
        copy_shape = tuple(shape[p] for p in perm)
        reading = stamp_loops(dataclasses.replace(statement, stmt=rewritten), {**shapes, name: copy_shape}, types,
                              options)
        if reading.loops.compute.register_tile is None:
            return None
        copy = _copy_statement(name, tuple(copy_vars[p] for p in perm), source, stmt.span,
                               {v.name: (0, n) for v, n in zip(copy_vars, shape)})
        return copy, reading, copy_shape
    return None


def _panel_copy(statement: Statement, shapes, types, options: Options, name: str):
    """(panel copy, the statement marked to read it, the copy's shape), or None."""
    stmt = statement.stmt
    if stmt.reduction is None or not stmt.reduction_vars:
        return None
    sched = statement.loops.compute
    if sched.register_reduction or sched.register_tile is None:
        return None
    _, _, col, cols = sched.register_tile
    for node in _plain_reads(stmt):
        names = [i.name for i in node.indices]
        if names[-1] != col or node.tensor.startswith(COPY_PREFIX) or not set(names) & set(stmt.reduction_vars):
            continue
        shape = shapes[node.tensor]
        if shape[-1] < PANEL_MIN_COLUMNS:
            return None
        index_type = node.indices[0].type
        dims = tuple(ast.IndexVar(f"panel.q{p}", type=index_type) for p in range(len(shape) - 1))
        block, lane = ast.IndexVar(PANEL_BLOCK, type=index_type), ast.IndexVar(PANEL_LANE, type=index_type)
        column = ast.Binary("+", ast.Binary("*", ast.IntLit(cols, type=index_type), block, type=index_type),
                            lane, type=index_type)
        source = ast.Access(node.tensor, dims + (column,), type=node.type)
        ranges = {PANEL_BLOCK: (0, shape[-1] // cols), PANEL_LANE: (0, cols)}
        ranges.update((d.name, (0, n)) for d, n in zip(dims, shape[:-1]))
        copy = _copy_statement(name, (block,) + dims + (lane,), source, stmt.span, ranges)
        marked = dataclasses.replace(statement, panel=Panel(node.tensor, name, cols))
        return copy, marked, (shape[-1] // cols,) + tuple(shape[:-1]) + (cols,)
    return None
