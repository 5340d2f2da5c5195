"""Generic walks over checked expressions, shared by every stage after sema.

``Expr.walk()`` (in :mod:`tcpy.lang.ast`) visits a tree; these helpers query and rebuild one:
the index variables an expression uses, whether it reads a tensor, a bottom-up rewrite, and the
inlining of ``where x = ...`` bindings.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from . import ast

__all__ = ["index_vars", "inline_lets", "is_static_index", "map_expr", "reads_tensor"]


def index_vars(expr: ast.Expr) -> frozenset[str]:
    """The names of the index variables ``expr`` uses."""
    return frozenset(n.name for n in expr.walk() if isinstance(n, ast.IndexVar))


def reads_tensor(expr: ast.Expr) -> bool:
    """Whether ``expr`` reads a tensor (its value depends on data, not only on indices and sizes)."""
    return any(isinstance(n, ast.Access) for n in expr.walk())


def is_static_index(expr: ast.Expr) -> bool:
    """Whether an index expression is affine (literals, index and size variables, ``+ - *``,
    ``/ %`` by positive literals): range inference and preconditions prove those in bounds;
    anything else (data-dependent, ternary, calls, division by non-literals) is checked."""
    if isinstance(expr, (ast.IntLit, ast.IndexVar, ast.SizeVar, ast.DimRef)):
        return True
    if isinstance(expr, ast.Unary) and expr.op == "-":
        return is_static_index(expr.operand)
    if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
        return is_static_index(expr.lhs) and is_static_index(expr.rhs)
    if isinstance(expr, ast.Binary) and expr.op in ("/", "%"):
        return is_static_index(expr.lhs) and isinstance(expr.rhs, ast.IntLit) and expr.rhs.value > 0
    return False


# The Expr fields that hold sub-expressions, per node class.
_EXPR_FIELDS = {
    ast.Access: ("indices",),
    ast.Call: ("args",),
    ast.Cast: ("operand",),
    ast.Unary: ("operand",),
    ast.Binary: ("lhs", "rhs"),
    ast.Ternary: ("cond", "then", "other"),
}


def map_expr(expr: ast.Expr, fn: Callable[[ast.Expr], Optional[ast.Expr]]) -> ast.Expr:
    """Rebuild ``expr`` bottom-up; ``fn(node)`` may return a replacement (or None to keep it)."""
    fields = _EXPR_FIELDS.get(type(expr), ())
    if fields:
        changes = {}
        for name in fields:
            value = getattr(expr, name)
            if isinstance(value, tuple):
                changes[name] = tuple(map_expr(v, fn) for v in value)
            else:
                changes[name] = map_expr(value, fn)
        expr = dataclasses.replace(expr, **changes)
    replaced = fn(expr)
    return expr if replaced is None else replaced


def inline_lets(stmt: ast.Stmt) -> ast.Stmt:
    """``stmt`` with every :class:`~tcpy.lang.ast.LetVar` replaced by its bound expression and
    the ``Let`` clauses removed. Later stages call this and never see a ``LetVar``."""
    bound: dict[str, ast.Expr] = {}

    def substitute(e: ast.Expr) -> ast.Expr:
        return map_expr(e, lambda n: bound[n.name] if isinstance(n, ast.LetVar) else None)

    where = []
    for clause in stmt.where:
        if isinstance(clause, ast.Let):
            bound[clause.name] = substitute(clause.expr)  # lets may use earlier lets
        elif isinstance(clause, ast.Exists):
            where.append(dataclasses.replace(clause, expr=substitute(clause.expr)))
        else:
            where.append(clause)
    if not bound:
        return stmt
    return dataclasses.replace(
        stmt, lhs=stmt.lhs, rhs=substitute(stmt.rhs), where=tuple(where)
    )
