"""Sums over nothing: a temporary whose only statement is a ``+=!`` with an empty reduction
range at the bound sizes is zero everywhere (Program -> Program).

The backward of a strided read sums each phase's taps (:mod:`tcpy.autodiff.reverse`); the
number of taps that reach a phase depends on the sizes (a 1x1 window moved by 2 reaches one
phase of four), so the def cannot leave the empty ones out. Here the sizes are known: such a
statement is dropped, its temporary gets no buffer, and its reads become a zero of its type
(the interleaving statement then reads one phase, not four).
"""
from __future__ import annotations

import dataclasses

from ..lang import ast
from ..lang.visit import accesses, map_expr
from ..loopir import Program
from ..options import Options


def drop_empty_sums(program: Program, options: Options) -> Program:
    """``program`` without the statements that sum over an empty range into a temporary
    nothing else writes, their temporaries' reads replaced by zeros. Unchanged for a
    size-generic program (its sizes are nominal: the range may be empty at these sizes only)."""
    if program.generic is not None:
        return program
    temporaries = {t.name for t in program.def_.temporaries}
    writers: dict[str, int] = {}
    for statement in program.statements:
        writers[statement.stmt.target] = writers.get(statement.stmt.target, 0) + 1
    zero = set()
    for statement in program.statements:
        stmt = statement.stmt
        if (stmt.target in temporaries and writers[stmt.target] == 1 and stmt.reduction == "+" and stmt.init
                and any(statement.ranges[v][1] <= statement.ranges[v][0] for v in stmt.reduction_vars)
                and stmt.target not in {a.tensor for a, write in accesses(stmt) if not write}):
            zero.add(stmt.target)
    if not zero:
        return program

    def zeroed(node):
        if isinstance(node, ast.Access) and node.tensor in zero:
            scalar = program.types[node.tensor]
            literal = ast.FloatLit(0.0) if scalar.is_float else ast.IntLit(0)
            return dataclasses.replace(literal, span=node.span, type=node.type)
        return None

    statements = tuple(dataclasses.replace(s, stmt=dataclasses.replace(s.stmt, rhs=map_expr(s.stmt.rhs, zeroed)))
                       for s in program.statements if s.stmt.target not in zero)
    return dataclasses.replace(program, statements=statements, shrunk=program.shrunk + tuple(sorted(zero)))
