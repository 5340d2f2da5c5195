"""Index values at concrete sizes: the int32 results of TC's index type must not overflow.

An index value (``i``, ``N``, ``i * N + j``; see :func:`~tcpy.lang.visit.is_index_value`) has
TC's type int32 but every backend computes it in 64 bits. Where a statement uses one as an int32
value (:func:`~tcpy.lang.visit.index_value_uses`: stored into an int32 output, added to an int32
tensor, compared, ...), a call's sizes must keep it inside int32; and every index value,
subscripts and cast operands included, must stay inside int64 at every step.
:func:`check_index_results` raises :class:`~tcpy.errors.TCPreconditionError` otherwise, so no
backend ever wraps. Values are bounded over the statement's rectangular domain: exactly for
affine expressions (each variable at its own extreme), by interval arithmetic otherwise (a
product of two variables, a division by a variable), which may reject sizes that a ternary's
condition would have kept safe; ``int64(...)`` around an int32 result is then the way out.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

from ..errors import TCPreconditionError
from ..lang import ast
from .affine import linear_bounds

INT32_RANGE = (-2**31, 2**31 - 1)
INT64_RANGE = (-2**63, 2**63 - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class _Bounds:
    """``lo <= value <= hi``; ``affine`` is ``(constant, {var: coefficient})`` when the value is
    affine in the index variables (then ``lo``/``hi`` are exact over the box)."""

    lo: int
    hi: int
    affine: Optional[tuple] = None


class _Overflow(Exception):
    def __init__(self, node: ast.Expr, bounds: _Bounds):
        super().__init__(str(node))
        self.node, self.bounds = node, bounds


def check_index_results(def_: ast.Def, statements, bound_statements, sizes: Mapping[str, int],
                        shapes: Mapping[str, tuple]) -> None:
    """Raise :class:`~tcpy.errors.TCPreconditionError` naming the statement when, at these sizes,
    an int32 index result of some statement would leave int32 (or an intermediate would leave
    int64). ``statements`` are the :class:`~tcpy.ranges.StmtRanges` of ``def_`` (with their index values),
    ``bound_statements`` their ranges at these sizes (var -> (lo, hi)), ``shapes`` the bound shapes
    of outputs and temporaries."""
    for number, (st, box) in enumerate(zip(statements, bound_statements), 1):
        if any(hi <= lo for lo, hi in box.values()):
            continue  # the statement evaluates nothing
        for value, as_int32 in st.index_uses:
            try:
                bounds = _bounds(value, box, def_, sizes, shapes)
            except _Overflow as exc:
                raise TCPreconditionError(_message(def_, st.stmt, number, sizes, exc.node, exc.bounds,
                                                   "int64", INT64_RANGE)) from None
            if as_int32 and (bounds.lo < INT32_RANGE[0] or bounds.hi > INT32_RANGE[1]):
                raise TCPreconditionError(_message(def_, st.stmt, number, sizes, value, bounds, "int32",
                                                   INT32_RANGE))


def unchecked_magnitude(statements) -> int:
    """The largest magnitude of the sizes and the ranges' bounds up to which no index value of
    ``statements`` (:class:`~tcpy.ranges.StmtRanges`) can leave int32 at any step, its
    operands' magnitudes bounding its own (``|a * b| <= |a| |b|``, ``|a / b| <= |a|``,
    ``|a % b| < |b|``): calls within it need no :func:`check_index_results` (a new call
    shape of a generic kernel binds its ranges). 0 where an index value reads a dimension's
    extent."""
    uses = [value for st in statements for value, _ in st.index_uses]
    low, high = 0, INT32_RANGE[1]  # (the magnitude is monotone in the bound: bisect it)
    while low < high:
        middle = (low + high + 1) // 2
        if all(_magnitude(value, middle) is not None for value in uses):
            low = middle
        else:
            high = middle - 1
    return low


def _magnitude(e: ast.Expr, bound: int) -> Optional[int]:
    """A bound of ``|e|`` at every step when its variables and sizes are at most ``bound`` in
    magnitude; None beyond int32 (or for a dimension's extent: no such bound)."""
    if isinstance(e, ast.IntLit):
        found = abs(int(e.value))
    elif isinstance(e, (ast.IndexVar, ast.SizeVar)):
        found = bound
    elif isinstance(e, ast.Unary) and e.op == "-":
        found = _magnitude(e.operand, bound)
    elif isinstance(e, ast.Binary) and e.op in ("+", "-", "*", "/", "%"):
        a, b = _magnitude(e.lhs, bound), _magnitude(e.rhs, bound)
        if a is None or b is None:
            return None
        found = {"+": a + b, "-": a + b, "*": a * b, "/": a, "%": b}[e.op]
    else:
        return None
    return None if found is None or found > INT32_RANGE[1] else found


def magnitude(sizes: Mapping[str, int], bound_statements) -> int:
    """The largest magnitude of ``sizes`` and of the bounds of the ranges ``bound_statements``
    (var -> (lo, hi)): what :func:`unchecked_magnitude` compares."""
    values = [abs(int(v)) for v in sizes.values()]
    values += [max(abs(lo), abs(hi)) for box in bound_statements for lo, hi in box.values()]
    return max(values, default=0)


def _message(def_, stmt, number, sizes, node, bounds, kind, limits) -> str:
    shown = ", ".join(f"{k}={sizes[k]}" for k in def_.size_vars)
    line = f" (line {stmt.span.line})" if stmt.span and stmt.span.line else ""
    if kind == "int32":
        why = (f"the index value '{node}' is int32 (TC's index type) but takes values "
               f"{bounds.lo}..{bounds.hi}, outside {limits[0]}..{limits[1]}; "
               f"write int64({node}) to use the exact value")
    else:
        why = f"the index value '{node}' takes values {bounds.lo}..{bounds.hi}, more than 64 bits hold"
    return f"in def '{def_.name}', statement {number}{line} '{stmt}': with sizes {shown}, {why}"


def _bounds(e: ast.Expr, box, def_, sizes, shapes) -> _Bounds:
    result = _node_bounds(e, box, def_, sizes, shapes)
    if result.lo < INT64_RANGE[0] or result.hi > INT64_RANGE[1]:
        raise _Overflow(e, result)
    return result


def _affine_bounds(const: int, coeffs: dict, box) -> _Bounds:
    return _Bounds(*linear_bounds(const, coeffs, box), (const, coeffs))


def _constant(b: _Bounds) -> Optional[int]:
    return b.lo if b.affine is not None and not b.affine[1] else None


def _node_bounds(e: ast.Expr, box, def_, sizes, shapes) -> _Bounds:
    if isinstance(e, ast.IntLit):
        return _affine_bounds(int(e.value), {}, box)
    if isinstance(e, ast.IndexVar):
        return _affine_bounds(0, {e.name: 1}, box)
    if isinstance(e, ast.SizeVar):
        return _affine_bounds(int(sizes[e.name]), {}, box)
    if isinstance(e, ast.DimRef):
        return _affine_bounds(_extent(def_, e.tensor, e.dim, sizes, shapes), {}, box)
    if isinstance(e, ast.Unary):  # unary minus
        inner = _bounds(e.operand, box, def_, sizes, shapes)
        if inner.affine is not None:
            return _affine_bounds(-inner.affine[0], {v: -c for v, c in inner.affine[1].items()}, box)
        return _Bounds(-inner.hi, -inner.lo)
    a, b = _bounds(e.lhs, box, def_, sizes, shapes), _bounds(e.rhs, box, def_, sizes, shapes)
    if e.op in ("+", "-"):
        sign = 1 if e.op == "+" else -1
        if a.affine is not None and b.affine is not None:
            coeffs = dict(a.affine[1])
            for v, c in b.affine[1].items():
                coeffs[v] = coeffs.get(v, 0) + sign * c
            return _affine_bounds(a.affine[0] + sign * b.affine[0], coeffs, box)
        return _Bounds(a.lo + b.lo, a.hi + b.hi) if sign > 0 else _Bounds(a.lo - b.hi, a.hi - b.lo)
    if e.op == "*":
        for k, other in ((_constant(a), b), (_constant(b), a)):
            if k is not None and other.affine is not None:
                return _affine_bounds(k * other.affine[0], {v: k * c for v, c in other.affine[1].items()}, box)
        corners = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return _Bounds(min(corners), max(corners))
    return _quotient(e.op, a, b)


def _quotient(op: str, a: _Bounds, b: _Bounds) -> _Bounds:
    """Bounds of ``a / b`` or ``a % b`` with floor (subscripts) or truncating (values) rounding:
    both are monotone in each operand on either side of zero. A zero divisor is a run-time error."""
    divisors = [d for d in (b.lo, b.hi, -1, 1) if b.lo <= d <= b.hi and d != 0]
    if not divisors:
        return _Bounds(0, 0)
    if op == "/":
        values = []
        for x in (a.lo, a.hi):
            for d in divisors:
                values += [x // d, -(-x // d) if (x < 0) != (d < 0) else x // d]
        return _Bounds(min(values), max(values))
    largest = max(abs(d) for d in divisors) - 1
    if a.lo >= 0 and b.lo > 0:
        return _Bounds(0, min(a.hi, largest))
    return _Bounds(-largest, largest)


def _extent(def_: ast.Def, tensor: str, dim: int, sizes, shapes) -> int:
    if tensor in shapes:
        return int(shapes[tensor][dim])
    for p in def_.params:
        if p.name == tensor:
            d = p.type.dims[dim]
            return int(d.value) if isinstance(d, ast.IntLit) else int(sizes[d.name])
    raise KeyError(tensor)
