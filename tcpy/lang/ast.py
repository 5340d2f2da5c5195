"""The TC abstract syntax tree: small immutable dataclasses, each with a source :class:`Span`.

The parser builds these nodes; :mod:`tcpy.lang.sema` returns a checked copy in which
identifiers are resolved (``Name`` becomes ``IndexVar``, ``SizeVar``, ``LetVar`` or a rank-0
``Access``), every expression carries its scalar ``type`` and every statement knows its output
and reduction variables. Spans and types do not take part in equality, so
``parse(str(d)) == d`` holds for every checked def ``d``.

``str(node)`` prints canonical TC source with the fewest parentheses that keep its meaning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from .types import ScalarType


@dataclass(frozen=True, slots=True)
class Span:
    """Where a node came from: 1-based line and column, end exclusive, plus character offsets."""

    line: int
    column: int
    end_line: int
    end_column: int
    start_pos: int = 0
    end_pos: int = 0

    def __repr__(self) -> str:
        return f"Span({self.line}:{self.column}-{self.end_line}:{self.end_column})"


NO_SPAN = Span(0, 0, 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


def _type():
    return field(default=None, compare=False, repr=False)


def tuple_text(items) -> str:
    """Strings printed as a Python tuple, as messages show shapes: ``(M, 3)``, ``(M,)``, ``()``."""
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


# ----------------------------------------------------------------------------- expressions

# Binding strength used by the printer; mirrors TC's precedence table (lexer.h).
BINARY_PRECEDENCE = {
    "||": 2,
    "&&": 3,
    "<": 4, ">": 4, "<=": 4, ">=": 4, "==": 4, "!=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6, "%": 6,
}
TERNARY_PRECEDENCE = 1
UNARY_PRECEDENCE = 7
ATOM_PRECEDENCE = 8


class Expr:
    """Base class of expression nodes."""

    __slots__ = ()

    @property
    def precedence(self) -> int:
        return ATOM_PRECEDENCE

    def children(self) -> tuple["Expr", ...]:
        return ()

    def walk(self):
        """Yield this node and all sub-expressions, parents first."""
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True, slots=True)
class IntLit(Expr):
    value: int
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, slots=True)
class FloatLit(Expr):
    value: float
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def __str__(self) -> str:
        text = repr(float(self.value))
        return text if any(c in text for c in ".en") else text + ".0"


@dataclass(frozen=True, slots=True)
class _NamedExpr(Expr):
    """An expression that is a name; the subclasses say what it names (equal only within a kind)."""

    name: str
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Name(_NamedExpr):
    """An identifier as the parser sees it, before sema resolves what it names."""


@dataclass(frozen=True, slots=True)
class IndexVar(_NamedExpr):
    """A loop index variable of a statement (output or reduction)."""


@dataclass(frozen=True, slots=True)
class SizeVar(_NamedExpr):
    """A size variable from the signature, e.g. ``M`` in ``float(M, K) A``."""


@dataclass(frozen=True, slots=True)
class LetVar(_NamedExpr):
    """A name bound by a ``where x = expr`` clause."""


@dataclass(frozen=True, slots=True)
class Access(Expr):
    """A tensor read ``T(i, j + 1)``; rank-0 tensors have no indices and print as ``T``."""

    tensor: str
    indices: tuple[Expr, ...]
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def children(self):
        return self.indices

    def __str__(self) -> str:
        if not self.indices:
            return self.tensor
        return f"{self.tensor}({', '.join(map(str, self.indices))})"


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A builtin function call, including ``min(a, b)`` and ``max(a, b)``."""

    func: str
    args: tuple[Expr, ...]
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def children(self):
        return self.args

    def __str__(self) -> str:
        return f"{self.func}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    """``float(x)``: convert to a scalar type."""

    to: ScalarType
    operand: Expr
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def children(self):
        return (self.operand,)

    def __str__(self) -> str:
        return f"{self.to.tc_name}({self.operand})"


@dataclass(frozen=True, slots=True)
class DimRef(Expr):
    """``T.0``: the size of dimension ``dim`` of tensor ``T``."""

    tensor: str
    dim: int
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    def __str__(self) -> str:
        return f"{self.tensor}.{self.dim}"


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str  # "-" or "!"
    operand: Expr
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    @property
    def precedence(self) -> int:
        return UNARY_PRECEDENCE

    def children(self):
        return (self.operand,)

    def __str__(self) -> str:
        inner = str(self.operand)
        if self.operand.precedence < UNARY_PRECEDENCE:
            inner = f"({inner})"
        return f"{self.op}{inner}"


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    lhs: Expr
    rhs: Expr
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    @property
    def precedence(self) -> int:
        return BINARY_PRECEDENCE[self.op]

    def children(self):
        return (self.lhs, self.rhs)

    def __str__(self) -> str:
        prec = self.precedence
        left, right = str(self.lhs), str(self.rhs)
        if self.lhs.precedence < prec:
            left = f"({left})"
        if self.rhs.precedence <= prec:  # all binary operators associate to the left
            right = f"({right})"
        return f"{left} {self.op} {right}"


@dataclass(frozen=True, slots=True)
class Ternary(Expr):
    """``cond ? then : other``; lazy: only the taken branch is evaluated."""

    cond: Expr
    then: Expr
    other: Expr
    span: Span = _span()
    type: Optional[ScalarType] = _type()

    @property
    def precedence(self) -> int:
        return TERNARY_PRECEDENCE

    def children(self):
        return (self.cond, self.then, self.other)

    def __str__(self) -> str:
        cond = str(self.cond)
        if self.cond.precedence <= TERNARY_PRECEDENCE:
            cond = f"({cond})"
        return f"{cond} ? {self.then} : {self.other}"


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True)
class RangeConstraint:
    """``where i in lo:hi`` (lo inclusive, hi exclusive)."""

    var: str
    lo: Expr
    hi: Expr
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.var} in {self.lo}:{self.hi}"


@dataclass(frozen=True, slots=True)
class Exists:
    """``where exists T(i)``: constrains ranges like an access, computes nothing."""

    expr: Expr
    span: Span = _span()

    def __str__(self) -> str:
        return f"exists {self.expr}"


@dataclass(frozen=True, slots=True)
class Let:
    """``where x = expr``: names a value for use in the statement."""

    name: str
    expr: Expr
    span: Span = _span()

    def __str__(self) -> str:
        return f"{self.name} = {self.expr}"


WhereClause = Union[RangeConstraint, Exists, Let]


@dataclass(frozen=True, slots=True)
class Equivalent:
    """``<=> name(args)``: TC's annotation naming an equivalent library call; no semantics."""

    name: str
    args: tuple[Expr, ...]
    span: Span = _span()

    def __str__(self) -> str:
        return f"<=> {self.name}({', '.join(map(str, self.args))})"


REDUCTIONS = ("+", "*", "min", "max")


@dataclass(frozen=True, slots=True)
class Stmt:
    """``target(indices) op rhs [<=> ...] [where ...]``.

    ``reduction`` is None for ``=`` or one of ``+ * min max``; ``init`` is the ``!`` suffix.
    After sema, ``output_vars`` are the left-hand variables and ``reduction_vars`` those that
    appear on the right only, in order of first appearance.
    """

    target: str
    lhs: tuple[Expr, ...]
    reduction: Optional[str]
    init: bool
    rhs: Expr
    where: tuple[WhereClause, ...] = ()
    equivalent: Optional[Equivalent] = None
    span: Span = _span()
    target_span: Span = _span()
    output_vars: tuple[str, ...] = field(default=(), compare=False)
    reduction_vars: tuple[str, ...] = field(default=(), compare=False)

    @property
    def op(self) -> str:
        if self.reduction is None:
            return "="
        return f"{self.reduction}=" + ("!" if self.init else "")

    @property
    def index_vars(self) -> tuple[str, ...]:
        return self.output_vars + self.reduction_vars

    def __str__(self) -> str:
        lhs = self.target if not self.lhs else f"{self.target}({', '.join(map(str, self.lhs))})"
        text = f"{lhs} {self.op} {self.rhs}"
        if self.equivalent is not None:
            text += f" {self.equivalent}"
        if self.where:
            text += " where " + ", ".join(map(str, self.where))
        return text


# ----------------------------------------------------------------------------- signatures


@dataclass(frozen=True, slots=True)
class TensorType:
    """``float(M, 3)``: scalar type and dims (size-variable ``Name``s or ``IntLit`` constants)."""

    scalar: ScalarType
    dims: tuple[Union[Name, IntLit], ...] = ()
    span: Span = _span()

    @property
    def rank(self) -> int:
        return len(self.dims)

    def shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The concrete shape, given the values of the size variables."""
        return tuple(d.value if isinstance(d, IntLit) else sizes[d.name] for d in self.dims)

    def __str__(self) -> str:
        if not self.dims:
            return self.scalar.tc_name
        return f"{self.scalar.tc_name}({', '.join(map(str, self.dims))})"


@dataclass(frozen=True, slots=True)
class Param:
    """A parameter or a return; ``type`` is None for an inferred return."""

    name: str
    type: Optional[TensorType]
    span: Span = _span()

    def __str__(self) -> str:
        return self.name if self.type is None else f"{self.type} {self.name}"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What sema knows of a tensor: role, element type, rank."""

    name: str
    role: str  # "input", "output" or "temporary"
    scalar: ScalarType
    rank: int


@dataclass(frozen=True, slots=True)
class Def:
    """A TC function. After sema, ``tensors`` describes every tensor by name and
    ``size_vars`` lists the signature's size variables in order of first appearance."""

    name: str
    params: tuple[Param, ...]
    returns: tuple[Param, ...]
    stmts: tuple[Stmt, ...]
    span: Span = _span()
    name_span: Span = _span()
    size_vars: tuple[str, ...] = field(default=(), compare=False)
    tensors: tuple[TensorInfo, ...] = field(default=(), compare=False)

    def tensor(self, name: str) -> TensorInfo:
        for info in self.tensors:
            if info.name == name:
                return info
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors if t.role == "input")

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors if t.role == "output")

    @property
    def temporaries(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors if t.role == "temporary")

    def signature(self) -> str:
        params = ", ".join(map(str, self.params))
        returns = ", ".join(map(str, self.returns))
        return f"def {self.name}({params}) -> ({returns})"

    def __str__(self) -> str:
        body = "".join(f"    {s}\n" for s in self.stmts)
        return f"{self.signature()} {{\n{body}}}"


@dataclass(frozen=True, slots=True)
class Program:
    """All defs of one source text, in order."""

    defs: tuple[Def, ...]
    source: str = field(default="", compare=False, repr=False)

    def __getitem__(self, name: str) -> Def:
        for d in self.defs:
            if d.name == name:
                return d
        raise KeyError(name)

    def __str__(self) -> str:
        return "\n\n".join(map(str, self.defs)) + "\n"
