"""Semantic checks: unchecked AST (from :mod:`tcpy.lang.parser`) -> checked AST.

Follows TC's sema (``tc/lang/sema.h``): size variables, tensors and index variables share one
namespace; an identifier a statement uses that names nothing else is an index variable of that
statement (created in the order: left-hand side, where-clauses, right-hand side); index variables
that are not on the left are reduction variables. On top of TC, tcpy allows temporaries (tensors
written but neither parameter nor return) and checks more: reading before writing, `+=` into a
fresh tensor, narrowing into any already-typed tensor, integral range bounds.

The checked tree satisfies the invariants documented in :mod:`tcpy.lang.ast`: names resolved,
every expression typed, statements know their output and reduction variables, each def lists
its size variables and tensors. Two things are kept exactly as written: a ``<=>`` annotation
(TC gives it no meaning, so its arguments stay unchecked ``Name``/``Access`` nodes) and the
operator of a ``+=!``-style statement without reduction variables (it behaves like ``=``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from ..errors import TCLookupError, TCSemanticError
from . import ast
from .builtins import BUILTINS, MIN_MAX
from .types import INDEX_TYPE, ScalarType, promote, promote_all

__all__ = ["check_program", "check_def", "caller_accumulations", "select_def", "BUILTINS"]

_INT32_MAX = 2**31 - 1
# The launcher passes shapes through fixed arrays of this many dimensions (NumPy 1.x's limit too).
MAX_RANK = 32
_COMPARISONS = frozenset({"<", ">", "<=", ">=", "==", "!="})
_LOGICAL = frozenset({"&&", "||"})
_IDENTITY = {"+": "0", "*": "1", "min": "the largest value", "max": "the smallest value"}


def check_program(program: ast.Program, filename: str = "<string>") -> ast.Program:
    """Check every def of ``program``; return the checked program.

    Raises :class:`~tcpy.errors.TCSemanticError` for the first broken rule.
    """
    seen: dict[str, ast.Def] = {}
    checked = []
    for d in program.defs:
        if d.name in seen:
            raise TCSemanticError(
                f"def '{d.name}' is defined twice (first at line {seen[d.name].name_span.line})",
                d.name_span, program.source, d.name, filename,
            )
        seen[d.name] = d
        checked.append(check_def(d, program.source, filename))
    return ast.Program(tuple(checked), program.source)


def select_def(program: ast.Program, name: Optional[str] = None) -> ast.Def:
    """The def called ``name``, or the only def when ``name`` is None.

    Raises :class:`~tcpy.errors.TCLookupError` naming the defs the source does define.
    """
    names = [d.name for d in program.defs]
    available = ", ".join(f"'{n}'" for n in names)
    if name is None:
        if len(program.defs) == 1:
            return program.defs[0]
        if not program.defs:
            raise TCLookupError("the source defines no def")
        raise TCLookupError(f"the source defines several defs ({available}); pick one with name=...")
    for d in program.defs:
        if d.name == name:
            return d
    if not program.defs:
        raise TCLookupError(f"no def named '{name}': the source defines no def")
    raise TCLookupError(f"no def named '{name}'; the source defines {available}")


def check_def(def_: ast.Def, source: str = "", filename: str = "<string>") -> ast.Def:
    """Check one def (see :func:`check_program`)."""
    return _DefChecker(def_, source, filename).check()


def caller_accumulations(def_: ast.Def) -> tuple[ast.Stmt, ...]:
    """The statements of a checked def that accumulate (``+=``, ``*=``, ``min=``, ``max=``
    without ``!``) into an output nothing wrote before: as in TC, they start from the output's
    existing values, which are those of the caller's ``out=`` array (zeros without one)."""
    found, written = [], set()
    for s in def_.stmts:
        if s.target not in written and s.reduction is not None and not s.init:
            found.append(s)
        written.add(s.target)
    return tuple(found)


# ----------------------------------------------------------------------------- the checker


@dataclass
class _Tensor:
    name: str
    role: str  # "input", "output", "temporary"
    span: ast.Span
    scalar: Optional[ScalarType] = None
    rank: Optional[int] = None
    declared: bool = False  # type given in the signature
    written: bool = False


@dataclass
class _Scope:
    """Per-statement names: index variables (in order of creation) and let bindings."""

    index_vars: dict[str, str] = field(default_factory=dict)  # name -> "output" | "reduction"
    first_use: dict[str, ast.Span] = field(default_factory=dict)
    lets: dict[str, ScalarType] = field(default_factory=dict)


class _DefChecker:
    def __init__(self, def_: ast.Def, source: str, filename: str):
        self.def_ = def_
        self.source = source
        self.filename = filename
        self.size_vars: dict[str, ast.Span] = {}
        self.tensors: dict[str, _Tensor] = {}
        self.temporaries: list[str] = []

    def error(self, message: str, span: ast.Span) -> TCSemanticError:
        return TCSemanticError(message, span, self.source, self.def_.name, self.filename)

    # -- signature

    def check(self) -> ast.Def:
        d = self.def_
        for p in d.params:
            self.declare_tensor(p, "input")
        for r in d.returns:
            self.declare_tensor(r, "output")
        # Every written tensor is known up front, so that reading a temporary before its
        # statement is reported as such rather than making it an index variable.
        for s in d.stmts:
            if s.target not in self.tensors and s.target not in self.size_vars:
                self.check_new_name(s.target, s.target_span, "a tensor")
                self.tensors[s.target] = _Tensor(s.target, "temporary", s.target_span)
                self.temporaries.append(s.target)
        stmts = tuple(self.check_stmt(s) for s in d.stmts)
        for r in d.returns:
            if not self.tensors[r.name].written:
                raise self.error(f"output '{r.name}' is never written", _tail_span(r.span, r.name))
        order = [p.name for p in d.params] + [r.name for r in d.returns] + self.temporaries
        infos = tuple(
            ast.TensorInfo(n, self.tensors[n].role, self.tensors[n].scalar, self.tensors[n].rank) for n in order
        )
        return dataclasses.replace(d, stmts=stmts, size_vars=tuple(self.size_vars), tensors=infos)

    def check_new_name(self, name: str, span: ast.Span, what: str) -> None:
        """A signature name must be new: not a builtin, size variable or tensor."""
        if name in BUILTINS or name in MIN_MAX:
            raise self.error(f"'{name}' is a builtin function and cannot be used as {what}", span)
        if name in self.size_vars:
            raise self.error(
                f"'{name}' is already a size variable (line {self.size_vars[name].line}); "
                f"it cannot also be {what}",
                span,
            )
        if name in self.tensors:
            other = self.tensors[name]
            kind = "a parameter" if other.role == "input" else "an output"
            raise self.error(f"duplicate name '{name}': already {kind} (line {other.span.line})", span)

    def declare_tensor(self, p: ast.Param, role: str) -> None:
        if p.type is not None:
            for dim in p.type.dims:
                if isinstance(dim, ast.Name):
                    self.declare_size_var(dim, role, p.name)
        self.check_new_name(p.name, _tail_span(p.span, p.name), "a tensor")
        info = _Tensor(p.name, role, p.span)
        if p.type is not None and p.type.rank > MAX_RANK:
            raise self.error(f"'{p.name}' has {p.type.rank} dimensions; tensors have at most {MAX_RANK}",
                             _tail_span(p.span, p.name))
        if p.type is not None:
            info.scalar, info.rank, info.declared = p.type.scalar, p.type.rank, True
        info.written = role == "input"
        self.tensors[p.name] = info

    def declare_size_var(self, dim: ast.Name, role: str, tensor: str) -> None:
        name = dim.name
        if name in self.size_vars:
            return
        if name in BUILTINS or name in MIN_MAX:
            raise self.error(f"'{name}' is a builtin function and cannot be used as a size variable", dim.span)
        if name in self.tensors:
            raise self.error(
                f"'{name}' is a tensor (line {self.tensors[name].span.line}); it cannot also be a size variable",
                dim.span,
            )
        if role == "output":
            raise self.error(
                f"size variable '{name}' of output '{tensor}' does not appear in any input; "
                "output sizes must be given by input sizes",
                dim.span,
            )
        self.size_vars[name] = dim.span

    # -- statements

    def check_stmt(self, s: ast.Stmt) -> ast.Stmt:
        target = self.check_target(s)
        scope = _Scope()
        lhs = []
        for index in s.lhs:
            if not isinstance(index, ast.Name):
                raise self.error(
                    f"the left-hand side of '{s.target}' must list plain index variables, found '{index}'",
                    index.span,
                )
            if index.name in scope.index_vars:
                raise self.error(
                    f"index variable '{index.name}' appears twice on the left-hand side of '{s.target}'",
                    index.span,
                )
            self.check_index_name(index.name, index.span)
            scope.index_vars[index.name] = "output"
            scope.first_use[index.name] = index.span
            lhs.append(ast.IndexVar(index.name, span=index.span, type=INDEX_TYPE))

        rank = len(s.lhs)
        if rank > MAX_RANK:
            raise self.error(f"'{s.target}' is written with {rank} indices; tensors have at most {MAX_RANK} dimensions",
                             s.target_span)
        if target.rank is not None and target.rank != rank:
            what = "declared" if target.declared else "first written"
            raise self.error(
                f"'{s.target}' is {what} with {_count(target.rank, 'dimension')} "
                f"but written here with {_count(rank, 'index', 'indices')}",
                s.target_span,
            )

        where = tuple(self.check_clause(c, scope) for c in s.where)
        rhs = self.check_expr(s.rhs, scope)
        reduction_vars = tuple(n for n, kind in scope.index_vars.items() if kind == "reduction")

        if reduction_vars and s.reduction is None:
            var = reduction_vars[0]
            raise self.error(
                f"'{var}' appears only on the right-hand side, so it is a reduction variable, "
                f"but the statement uses '='; write a reduction such as '+=!' or 'max=!'",
                scope.first_use[var],
            )
        if s.reduction is not None and not s.init and not target.written and target.role != "output":
            raise self.error(
                f"temporary '{s.target}' is accumulated with '{s.op}' but was not written before; "
                f"write '{s.reduction}=!' to start from {_IDENTITY[s.reduction]} (only outputs "
                "accumulate into existing values: those of the caller's out= array)",
                s.target_span,
            )
        self.check_assign_type(s, target, rhs.type)

        target.written = True
        if target.rank is None:
            target.rank = rank
        equivalent = s.equivalent  # TC's annotation: no semantics, kept as written
        return dataclasses.replace(
            s,
            lhs=tuple(lhs),
            rhs=rhs,
            where=where,
            equivalent=equivalent,
            output_vars=tuple(ix.name for ix in lhs),
            reduction_vars=reduction_vars,
        )

    def check_target(self, s: ast.Stmt) -> _Tensor:
        name = s.target
        if name in self.size_vars:
            raise self.error(f"cannot write to '{name}': it is a size variable, not a tensor", s.target_span)
        target = self.tensors[name]
        if target.role == "input":
            raise self.error(f"cannot write to '{name}': inputs are immutable", s.target_span)
        return target

    def check_assign_type(self, s: ast.Stmt, target: _Tensor, value: ScalarType) -> None:
        if target.scalar is None:
            target.scalar = value
            return
        if promote(value, target.scalar) is not target.scalar:
            kind = {"output": "output", "temporary": "temporary"}[target.role]
            raise self.error(
                f"assigning {value} to {target.scalar} {kind} '{s.target}' needs a cast: "
                f"write {target.scalar}(...) around the value",
                s.rhs.span,
            )

    def check_index_name(self, name: str, span: ast.Span) -> None:
        """An index variable may not reuse the name of a size variable, tensor or builtin."""
        if name in self.size_vars:
            raise self.error(f"'{name}' is a size variable and cannot also be used as an index variable", span)
        if name in self.tensors:
            raise self.error(f"'{name}' is a tensor and cannot also be used as an index variable", span)
        if name in BUILTINS:
            raise self.error(f"'{name}' is a builtin function and cannot be used as an index variable", span)

    def check_clause(self, clause, scope: _Scope):
        if isinstance(clause, ast.RangeConstraint):
            name = clause.var
            span = _head_span(clause.span, name)
            if name in scope.lets:
                raise self.error(f"'{name}' is bound by a let; a range constraint needs an index variable", span)
            if name not in scope.index_vars:
                self.check_index_name(name, span)
                scope.index_vars[name] = "reduction"
                scope.first_use[name] = span
            lo = self.check_size_expr(clause.lo, clause, scope)
            hi = self.check_size_expr(clause.hi, clause, scope)
            return dataclasses.replace(clause, lo=lo, hi=hi)
        if isinstance(clause, ast.Let):
            name = clause.name
            span = _head_span(clause.span, name)
            if name in scope.index_vars or name in scope.lets:
                raise self.error(f"'{name}' is already defined in this statement", span)
            if name in self.size_vars or name in self.tensors or name in BUILTINS:
                what = "size variable" if name in self.size_vars else (
                    "tensor" if name in self.tensors else "builtin function")
                raise self.error(f"'{name}' is a {what} and cannot be bound by a let", span)
            expr = self.check_expr(clause.expr, scope)
            scope.lets[name] = expr.type
            return dataclasses.replace(clause, expr=expr)
        return dataclasses.replace(clause, expr=self.check_expr(clause.expr, scope))

    # -- expressions

    def check_expr(self, e: ast.Expr, scope: _Scope) -> ast.Expr:
        """Resolve names and set types in a right-hand-side expression."""
        if isinstance(e, ast.IntLit):
            return self.int_lit(e)
        if isinstance(e, ast.FloatLit):
            return dataclasses.replace(e, type=ScalarType.FLOAT32)
        if isinstance(e, ast.Name):
            return self.resolve_name(e, scope)
        if isinstance(e, ast.Access):
            return self.check_access(e, scope)
        if isinstance(e, ast.DimRef):
            return self.check_dim_ref(e)
        if isinstance(e, ast.Call):
            args = tuple(self.check_expr(a, scope) for a in e.args)
            return self.typed_call(e, args)
        if isinstance(e, ast.Cast):
            return dataclasses.replace(e, operand=self.check_expr(e.operand, scope), type=e.to)
        if isinstance(e, ast.Unary):
            return self.typed_unary(e, self.check_expr(e.operand, scope))
        if isinstance(e, ast.Binary):
            return self.typed_binary(e, self.check_expr(e.lhs, scope), self.check_expr(e.rhs, scope))
        if isinstance(e, ast.Ternary):
            return self.typed_ternary(
                e, self.check_expr(e.cond, scope), self.check_expr(e.then, scope), self.check_expr(e.other, scope)
            )
        raise TypeError(f"not an unchecked expression: {e!r}")

    def int_lit(self, e: ast.IntLit) -> ast.IntLit:
        if e.value > _INT32_MAX:
            raise self.error(f"integer constant {e.value} does not fit in int32", e.span)
        return dataclasses.replace(e, type=ScalarType.INT32)

    def resolve_name(self, e: ast.Name, scope: _Scope) -> ast.Expr:
        name = e.name
        if name in scope.index_vars:
            return ast.IndexVar(name, span=e.span, type=INDEX_TYPE)
        if name in scope.lets:
            return ast.LetVar(name, span=e.span, type=scope.lets[name])
        if name in self.size_vars:
            return ast.SizeVar(name, span=e.span, type=INDEX_TYPE)
        if name in self.tensors:
            info = self.readable(name, e.span)
            if info.rank:
                raise self.error(
                    f"'{name}' is a tensor with {_count(info.rank, 'dimension')}; "
                    f"it cannot be used as a scalar or an index variable (read it as {name}(...))",
                    e.span,
                )
            return ast.Access(name, (), span=e.span, type=info.scalar)
        if name in BUILTINS or name in MIN_MAX:
            raise self.error(f"'{name}' is a builtin function; call it as {name}(...)", e.span)
        scope.index_vars[name] = "reduction"
        scope.first_use[name] = e.span
        return ast.IndexVar(name, span=e.span, type=INDEX_TYPE)

    def readable(self, name: str, span: ast.Span) -> _Tensor:
        info = self.tensors[name]
        if not info.written:
            kind = "output" if info.role == "output" else "temporary"
            raise self.error(f"{kind} '{name}' is read before it is written", span)
        return info

    def check_access(self, e: ast.Access, scope: _Scope) -> ast.Expr:
        name = e.tensor
        if name not in self.tensors:
            if name in self.size_vars:
                raise self.error(f"'{name}' is a size variable, not a tensor or function", e.span)
            if name in scope.index_vars or name in scope.lets:
                raise self.error(f"'{name}' is a scalar variable, not a tensor or function", e.span)
            raise self.error(f"unknown function or tensor '{name}'", e.span)
        info = self.readable(name, e.span)
        if len(e.indices) != info.rank:
            raise self.error(
                f"expected {_count(info.rank, 'index', 'indices')} for '{name}' but found {len(e.indices)}", e.span
            )
        indices = tuple(self.check_expr(i, scope) for i in e.indices)
        for pos, index in enumerate(indices):
            if not index.type.is_integral:
                raise self.error(
                    f"index {pos} of '{name}' must be an integer but is {index.type}", index.span
                )
        return dataclasses.replace(e, indices=indices, type=info.scalar)

    def check_dim_ref(self, e: ast.DimRef) -> ast.DimRef:
        if e.tensor not in self.tensors:
            raise self.error(f"unknown tensor '{e.tensor}' in '{e}'", e.span)
        info = self.readable(e.tensor, e.span)
        if e.dim >= info.rank:
            raise self.error(
                f"'{e.tensor}' has {_count(info.rank, 'dimension')}, so '{e}' does not exist", e.span
            )
        return dataclasses.replace(e, type=INDEX_TYPE)

    def typed_call(self, e: ast.Call, args: tuple) -> ast.Call:
        if e.func in MIN_MAX:
            return dataclasses.replace(e, args=args, type=promote_all(a.type for a in args))
        arity = BUILTINS[e.func]
        if len(args) != arity:
            raise self.error(
                f"builtin '{e.func}' takes {_count(arity, 'argument')} but is given {len(args)}", e.span
            )
        return dataclasses.replace(e, args=args, type=promote_all((a.type for a in args), ScalarType.FLOAT32))

    def typed_unary(self, e: ast.Unary, operand: ast.Expr) -> ast.Unary:
        if e.op == "!":
            self.expect_bool(operand, "the operand of '!'")
            return dataclasses.replace(e, operand=operand, type=ScalarType.BOOL)
        return dataclasses.replace(e, operand=operand, type=operand.type)

    def typed_binary(self, e: ast.Binary, lhs: ast.Expr, rhs: ast.Expr) -> ast.Binary:
        if e.op in _LOGICAL:
            self.expect_bool(lhs, f"the left operand of '{e.op}'")
            self.expect_bool(rhs, f"the right operand of '{e.op}'")
            type_ = ScalarType.BOOL
        elif e.op in _COMPARISONS:
            type_ = ScalarType.BOOL
        else:
            type_ = promote(lhs.type, rhs.type)
        return dataclasses.replace(e, lhs=lhs, rhs=rhs, type=type_)

    def typed_ternary(self, e: ast.Ternary, cond, then, other) -> ast.Ternary:
        self.expect_bool(cond, "the condition of '?:'")
        return dataclasses.replace(e, cond=cond, then=then, other=other, type=promote(then.type, other.type))

    def expect_bool(self, e: ast.Expr, what: str) -> None:
        if e.type is not ScalarType.BOOL:
            raise self.error(f"{what} must be bool but is {e.type} (compare it, e.g. x > 0)", e.span)

    # -- size expressions (range bounds)

    def check_size_expr(self, e: ast.Expr, clause: ast.RangeConstraint, scope: _Scope) -> ast.Expr:
        """A range bound: integral, over size variables, constants and ``T.d`` only."""
        checked = self._size_expr(e, clause, scope)
        if not checked.type.is_integral:
            raise self.error(f"the range bound '{e}' of '{clause.var}' must be an integer but is {checked.type}", e.span)
        return checked

    def _size_expr(self, e: ast.Expr, clause: ast.RangeConstraint, scope: _Scope) -> ast.Expr:
        hint = "range bounds may use size variables, integer constants and dimensions of known tensors (T.0)"
        if isinstance(e, ast.Name):
            if e.name in self.size_vars:
                return ast.SizeVar(e.name, span=e.span, type=INDEX_TYPE)
            if e.name in self.tensors:
                raise self.error(f"tensor '{e.name}' cannot be read in the range of '{clause.var}': {hint}", e.span)
            if e.name in scope.index_vars or e.name in scope.lets:
                kind = "index variable" if e.name in scope.index_vars else "let-bound name"
                raise self.error(f"{kind} '{e.name}' cannot be used in the range of '{clause.var}': {hint}", e.span)
            raise self.error(f"unknown name '{e.name}' in the range of '{clause.var}': {hint}", e.span)
        if isinstance(e, ast.Access):
            raise self.error(f"tensor '{e.tensor}' cannot be read in the range of '{clause.var}': {hint}", e.span)
        if isinstance(e, ast.DimRef):
            return self.check_dim_ref(e)
        if isinstance(e, ast.IntLit):
            return self.int_lit(e)
        if isinstance(e, ast.FloatLit):
            return dataclasses.replace(e, type=ScalarType.FLOAT32)
        if isinstance(e, ast.Call):
            return self.typed_call(e, tuple(self._size_expr(a, clause, scope) for a in e.args))
        if isinstance(e, ast.Cast):
            return dataclasses.replace(e, operand=self._size_expr(e.operand, clause, scope), type=e.to)
        if isinstance(e, ast.Unary):
            return self.typed_unary(e, self._size_expr(e.operand, clause, scope))
        if isinstance(e, ast.Binary):
            return self.typed_binary(e, self._size_expr(e.lhs, clause, scope), self._size_expr(e.rhs, clause, scope))
        if isinstance(e, ast.Ternary):
            parts = (self._size_expr(x, clause, scope) for x in (e.cond, e.then, e.other))
            return self.typed_ternary(e, *parts)
        raise TypeError(f"not an unchecked expression: {e!r}")


def _head_span(span: ast.Span, name: str) -> ast.Span:
    """The span of ``name`` at the start of ``span`` (a where clause starts with its name)."""
    return ast.Span(span.line, span.column, span.line, span.column + len(name), span.start_pos, span.start_pos + len(name))


def _tail_span(span: ast.Span, name: str) -> ast.Span:
    """The span of ``name`` at the end of ``span`` (a parameter ends with its name)."""
    n = len(name)
    return ast.Span(span.end_line, span.end_column - n, span.end_line, span.end_column, span.end_pos - n, span.end_pos)


def _count(n: int, singular: str, plural: Optional[str] = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"
