"""Index-set splitting by phase: selects on ``v % s`` resolved per residue (Program -> Program).

The input gradient of a strided read is computed per phase and interleaved by one element-wise
statement (:mod:`tcpy.autodiff.reverse`)::

    dI(n, c, h, w) +=! h % 2 == 0 ? (w % 2 == 0 ? P00(n, c, h / 2, w / 2) : P01(...)) : ...

Run as written, every element tests its parities and reads through ``/ 2``: the compiler
vectorises the selects as gathers. Split here, each variable ``v`` that the statement reads as
``v % s`` runs as ``v = s*q + r``: one piece per residue combination, in which ``v % s`` is
``r``, ``v / s`` is ``q`` (any other read of ``v`` is ``s*q + r``) and the selects on them are
resolved, so the interleaving's pieces are plain copies with unit-stride reads. The loops follow the target's dimensions, each residue
right after its quotient's loop: the pieces of the innermost variable write neighbouring
elements in one loop body (an interleaved store), and the outer loops run in parallel.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..lang import ast
from ..lang.visit import map_expr
from ..loopir import Program
from ..options import Options
from ..schedule import phase_schedule

# A statement is split into at most this many pieces (each one a statement in the loop body).
MAX_PIECES = 16


def quotient(var: str) -> str:
    """The name standing for ``var / s`` in a piece (never a TC identifier: no clash)."""
    return f"{var}/q"


def phase_vars(stmt: ast.Stmt) -> tuple[tuple[str, int], ...]:
    """(variable, stride) of each output variable of the element-wise ``stmt`` that its
    right-hand side reads as ``v % s`` (one literal ``s > 1`` per variable, also in ``v / s``;
    elsewhere a piece reads ``v`` as ``s*q + r``); () when there is none, when it reduces, or
    when the pieces would be more than :data:`MAX_PIECES`."""
    if stmt.reduction_vars or any(isinstance(c, ast.Exists) for c in stmt.where):
        return ()
    strides: dict[str, int] = {}
    tested: set[str] = set()
    mixed: set[str] = set()
    for node in stmt.rhs.walk():
        if (isinstance(node, ast.Binary) and node.op in ("%", "/") and isinstance(node.lhs, ast.IndexVar)
                and isinstance(node.rhs, ast.IntLit) and node.rhs.value > 1 and node.lhs.name in stmt.output_vars):
            var = node.lhs.name
            if strides.setdefault(var, node.rhs.value) != node.rhs.value:
                mixed.add(var)
            if node.op == "%":
                tested.add(var)
    phases = tuple((v, strides[v]) for v in stmt.output_vars if v in tested and v not in mixed)
    pieces = 1
    for _, stride in phases:
        pieces *= stride
    return phases if phases and pieces <= MAX_PIECES else ()


def phase_piece(stmt: ast.Stmt, residues: tuple[tuple[str, int, int], ...]) -> ast.Stmt:
    """``stmt`` where each ``(v, s, r)`` of ``residues`` holds ``v = s*q + r``: ``v % s`` is
    ``r``, ``v / s`` the index variable :func:`quotient` (``v``) and the selects whose test
    compares literals are their branch taken (floor semantics: true for any sign of ``v``)."""
    known = {v: (s, r) for v, s, r in residues}

    def resolve(node: ast.Expr) -> Optional[ast.Expr]:
        if (isinstance(node, ast.Binary) and node.op in ("%", "/") and isinstance(node.lhs, ast.IndexVar)
                and node.lhs.name in known and node.rhs == ast.IntLit(known[node.lhs.name][0])):
            stride, residue = known[node.lhs.name]
            if node.op == "%":
                return ast.IntLit(residue, span=node.span, type=node.type)
            return ast.IndexVar(quotient(node.lhs.name), span=node.span, type=node.type)
        if isinstance(node, ast.Ternary):
            test = _decided(node.cond)
            if test is None:
                return None
            branch = node.then if test else node.other
            return branch if branch.type == node.type else ast.Cast(node.type, branch, span=branch.span, type=node.type)
        return None

    return dataclasses.replace(stmt, rhs=map_expr(stmt.rhs, resolve))


def _decided(test: ast.Expr) -> Optional[bool]:
    """The value of ``a == b`` or ``a != b`` between literals, else None."""
    if (isinstance(test, ast.Binary) and test.op in ("==", "!=") and isinstance(test.lhs, ast.IntLit)
            and isinstance(test.rhs, ast.IntLit)):
        return (test.lhs.value == test.rhs.value) == (test.op == "==")
    return None


def split_phases(program: Program, options: Options) -> Program:
    """``program`` with each loop statement that :func:`phase_vars` splits scheduled by phase
    (:func:`tcpy.schedule.phase_schedule`). Statements in a fused group or an epilogue, those
    whose loops the options set keep their schedule."""
    if not options.vectorize:
        return program
    bound = {i for g in program.groups for i in g.statements} | {i for e in program.epilogues for i in e.members}
    statements = list(program.statements)
    for index, statement in enumerate(program.statements):
        stmt = statement.stmt
        if index in bound or statement.engine is not None or statement.loops is None:
            continue
        if set(options.loop_order) & set(stmt.index_vars) or set(options.tile_sizes) & set(stmt.index_vars):
            continue  # the user asked for these loops
        phases = phase_vars(stmt)
        if not phases or not all(isinstance(i, ast.IndexVar) for i in stmt.lhs):
            continue
        compute = phase_schedule(statement.loops.compute, stmt, phases, statement.extents(), options,
                                 program.generic is not None)
        statements[index] = dataclasses.replace(statement, loops=dataclasses.replace(statement.loops, compute=compute))
    return dataclasses.replace(program, statements=tuple(statements))
