"""Generic walks over checked expressions, shared by every stage after sema.

``Expr.walk()`` (in :mod:`tcpy.lang.ast`) visits a tree; these helpers query and rebuild one:
the index variables an expression uses, whether it reads a tensor, a bottom-up rewrite, and the
inlining of ``where x = ...`` bindings.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from . import ast
from .types import INDEX_VALUE_TYPE

__all__ = ["exact_index_value", "index_value_uses", "index_vars", "inline_lets", "is_index_value", "is_static_index",
           "map_expr", "reads_tensor"]


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


_INDEX_LEAVES = (ast.IndexVar, ast.SizeVar, ast.DimRef)


def is_index_value(expr: ast.Expr) -> bool:
    """Whether ``expr`` is an index value: integer literals, index and size variables and
    dimension references combined with ``+ - * / %`` and unary minus, using at least one
    variable or dimension. Its type is TC's int32 (``INDEX_TYPE``), but every backend computes
    it in ``INDEX_VALUE_TYPE`` (64 bits), so intermediate results never wrap."""
    def only_index_nodes(e: ast.Expr) -> bool:
        if isinstance(e, (ast.IntLit,) + _INDEX_LEAVES):
            return True
        if isinstance(e, ast.Unary) and e.op == "-":
            return only_index_nodes(e.operand)
        if isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "%"):
            return only_index_nodes(e.lhs) and only_index_nodes(e.rhs)
        return False

    return only_index_nodes(expr) and any(isinstance(n, _INDEX_LEAVES) for n in expr.walk())


def exact_index_value(expr: ast.Expr) -> ast.Expr:
    """An index value retyped to ``INDEX_VALUE_TYPE`` at every node (the exact computation
    backends perform); any other expression unchanged."""
    if not is_index_value(expr) or expr.type is INDEX_VALUE_TYPE:
        return expr
    return map_expr(expr, lambda n: dataclasses.replace(n, type=INDEX_VALUE_TYPE))


def index_value_uses(expr: ast.Expr) -> tuple[tuple[ast.Expr, bool], ...]:
    """The largest index-value subtrees of ``expr``, each with whether it is used as an int32
    value: everywhere but as a tensor subscript (bounds-checked) or a cast's operand
    (``int64(i * N)`` converts the exact value). Backends compute them all in 64 bits; one used
    as int32 must also fit in int32 (a call whose sizes would make it overflow raises)."""
    found: list[tuple[ast.Expr, bool]] = []

    def visit(e: ast.Expr, exact: bool) -> None:
        if is_index_value(e):
            found.append((e, not exact))
            return
        exact_children = isinstance(e, (ast.Access, ast.Cast))
        for child in e.children():
            visit(child, exact_children)

    visit(expr, False)
    return tuple(found)


# The Expr fields that hold sub-expressions, per node class.
_EXPR_FIELDS = {
    ast.Access: ("indices",),
    ast.Call: ("args",),
    ast.Cast: ("operand",),
    ast.Unary: ("operand",),
    ast.Binary: ("lhs", "rhs"),
    ast.Ternary: ("cond", "then", "other"),
}


def accesses(stmt: ast.Stmt):
    """``(access, is_write)`` of every tensor access of a statement: its left-hand side first,
    then the reads of its right-hand side and ``exists`` clauses (a reduction without ``!``
    also reads its target: callers that care add it)."""
    yield ast.Access(stmt.target, stmt.lhs), True
    for node in stmt.rhs.walk():
        if isinstance(node, ast.Access):
            yield node, False
    for clause in stmt.where:
        if isinstance(clause, ast.Exists):
            for node in clause.expr.walk():
                if isinstance(node, ast.Access):
                    yield node, False


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
