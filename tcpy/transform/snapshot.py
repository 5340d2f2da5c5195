"""Reads of a statement's own target see the tensor as it was before the statement.

TC's semantics (and the reference evaluator's): a statement's right-hand side is evaluated
with the tensors as they were before it, after the identity fill of a ``!`` reduction. Loop
nests compute in place, so a statement that reads its own target at a point another of its
iterations writes would see whatever the loop order (tiles, threads, the engine's blocks) has
written by then::

    C(j, i) = C(i, j) + 1        (a transpose of C into itself)
    C(i) = C(N - 1 - i)          (a reversal)
    C(i) += C(i) * A(i, k)       (each k would see the sum of the k before it)

isl's dependence analysis decides it: with ``W`` the write and ``R`` a read of the target, both
maps from the statement's iterations to elements, the statement cannot run in place when
``R . W^-1`` (iterations reading an element -> iterations writing it) holds a pair of distinct
iterations. Such a statement reads a **snapshot** instead, written by a statement of its own
right before it (``snapshot.<n>(p...) = C(p...)``, over the whole target; for a ``!`` reduction
the elements it writes hold the operator's identity, which is what its reads must see). A
``!`` reduction that reads its target at all reads the snapshot: its accumulators in
registers never store the identity where a read could see it. Reads whose indices are not
affine (``C(I(i))``) take the snapshot too.

The snapshot is a Program -> Program rewrite done once, when the program is built, so every
path (loop nests, the contraction engine, fusion, epilogues) computes from the same statements.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import islpy as isl

from ..lang import ast
from ..lang.types import INDEX_TYPE, ScalarType
from ..lang.visit import map_expr
from ..loopir import Program, Statement
from ..ranges.affine import access_map

SNAPSHOT_PREFIX = "snapshot."  # (a "." keeps generated names apart from TC identifiers)

__all__ = ["snapshot_own_reads"]


def snapshot_own_reads(program: Program) -> Program:
    """``program`` with a snapshot statement before every statement whose reads of its own
    target could see what the statement itself writes (see the module docstring)."""
    statements: list[Statement] = []
    shapes, types = dict(program.shapes), dict(program.types)
    snapshots = 0
    for statement in program.statements:
        if _reads_what_it_writes(statement, program):
            name, snapshots = f"{SNAPSHOT_PREFIX}{snapshots}", snapshots + 1
            target = statement.stmt.target
            shapes[name], types[name] = shapes[target], types[target]
            statements.append(_snapshot(statement, name, shapes[target], types[target]))
            statement = dataclasses.replace(statement, stmt=_reading(statement.stmt, name))
        statements.append(statement)
    if not snapshots:
        return program
    return dataclasses.replace(program, statements=tuple(statements), shapes=shapes, types=types)


def _own_reads(stmt: ast.Stmt) -> list[ast.Access]:
    return [n for n in stmt.rhs.walk() if isinstance(n, ast.Access) and n.tensor == stmt.target]


def _reads_what_it_writes(statement: Statement, program: Program) -> bool:
    """Whether an iteration of the statement reads an element of its target that another of
    its iterations writes (or it is a ``!`` reduction reading its target at all)."""
    stmt = statement.stmt
    reads = _own_reads(stmt)
    if not reads:
        return False
    if stmt.init and stmt.reduction_vars:
        return True

    def elements(access: ast.Access) -> Optional[isl.Map]:
        return access_map(access, stmt.index_vars, statement.ranges, program.sizes, program.shapes, "S")

    read_maps = [elements(read) for read in reads]
    if any(read_map is None for read_map in read_maps):
        return True
    write = elements(ast.Access(stmt.target, stmt.lhs))
    for read_map in read_maps:
        readers_to_writers = read_map.apply_range(write.reverse())
        if not readers_to_writers.subtract(isl.Map.identity(readers_to_writers.get_space())).is_empty():
            return True
    return False


def _snapshot(statement: Statement, name: str, shape: tuple[int, ...], type_: ScalarType) -> Statement:
    """``name(p...) = target(p...)`` over the whole target; for a ``!`` reduction, the elements
    the statement writes hold its identity."""
    stmt = statement.stmt
    points = tuple(ast.IndexVar(f"{SNAPSHOT_PREFIX}p{d}", type=INDEX_TYPE) for d in range(len(shape)))
    value: ast.Expr = ast.Access(stmt.target, points, type=type_)
    if stmt.init and stmt.reduction_vars:
        written = None
        for point, var in zip(points, stmt.lhs):
            lo, hi = statement.ranges[var.name]
            inside = ast.Binary("&&", _compare(">=", point, lo), _compare("<", point, hi), type=ScalarType.BOOL)
            written = inside if written is None else ast.Binary("&&", written, inside, type=ScalarType.BOOL)
        identity = _identity(stmt.reduction, type_)
        value = identity if written is None else ast.Ternary(written, identity, value, type=type_)
    copy = ast.Stmt(name, points, None, False, value, span=stmt.span, output_vars=tuple(p.name for p in points))
    return Statement(copy, {p.name: (0, n) for p, n in zip(points, shape)}, -1)


def _compare(op: str, point: ast.IndexVar, bound: int) -> ast.Binary:
    return ast.Binary(op, point, ast.IntLit(bound, type=point.type), type=ScalarType.BOOL)


def _identity(op: str, type_: ScalarType) -> ast.Expr:
    """The identity of reduction ``op`` in ``type_`` as an expression: ``max`` and ``min`` as
    -inf and +inf cast to the type, which saturates to an integer type's minimum and maximum."""
    if op in ("+", "*") or (op == "max" and type_ is ScalarType.BOOL):
        literal: ast.Expr = ast.IntLit(1 if op == "*" else 0, type=ScalarType.INT32)
    else:
        literal = ast.FloatLit(float("-inf") if op == "max" else float("inf"), type=ScalarType.FLOAT32)
    return ast.Cast(type_, literal, type=type_)


def _reading(stmt: ast.Stmt, name: str) -> ast.Stmt:
    """``stmt`` with its reads of its own target reading ``name``."""

    def redirect(e: ast.Expr) -> Optional[ast.Expr]:
        if isinstance(e, ast.Access) and e.tensor == stmt.target:
            return dataclasses.replace(e, tensor=name)
        return None

    return dataclasses.replace(stmt, rhs=map_expr(stmt.rhs, redirect))
